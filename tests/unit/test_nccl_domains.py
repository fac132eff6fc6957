"""The validator: every emitted value against NCCL's documented domains and versions."""

from __future__ import annotations

import pytest
from nccl_helpers import (
    ALL_VERSIONS,
    TORCH_NEW,
    TORCH_OLD,
    V_2_16,
    V_2_21,
    V_2_24,
    V_OLD,
    link,
    nic,
    node,
    two_region,
    wan,
)

from netopt.errors import ValidationError
from netopt.nccl.domains import VARIABLES, check_settings, check_value, reads
from netopt.nccl.model import EnvValue, TuneOptions
from netopt.nccl.tuner import tune_nccl


@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize("torch_version", [TORCH_OLD, TORCH_NEW])
def test_every_emitted_value_is_in_its_documented_domain(version, torch_version) -> None:
    nodes, links = two_region()
    options = TuneOptions(torch_version=torch_version, params=10**8, step_compute_ms=300)
    settings = tune_nccl(nodes, links, version, options)
    check_settings(settings, torch_version)  # raises on any bad value
    emitted = {v.key for v in settings.all_values()}
    for key in emitted:
        assert reads(key, version, torch_version), f"{key} emitted for a version that ignores it"
    assert "NCCL_PROTO" not in emitted


def test_version_gates_follow_nccl_releases() -> None:
    nodes, links = two_region()
    links = [*links[:2], *(wan(x.a, x.b, outages_s=(90,)) for x in links[2:])]
    old = {v.key: v.value for v in tune_nccl(nodes, links, V_2_16).all_values()}
    new = {v.key: v.value for v in tune_nccl(nodes, links, V_2_24).all_values()}
    # Per-collective NCCL_ALGO and the socket retry knobs arrived in 2.24.
    assert "NCCL_ALGO" not in old
    assert new["NCCL_ALGO"].startswith("allreduce:")
    assert "NCCL_SOCKET_RETRY_CNT" not in old
    assert int(new["NCCL_SOCKET_RETRY_CNT"]) > 34
    # Channel counts: NCCL_MIN_NCHANNELS before 2.17, NCCL_MIN_CTAS from 2.17.
    assert "NCCL_MIN_NCHANNELS" in old
    assert "NCCL_MIN_CTAS" not in old
    assert "NCCL_MIN_CTAS" in new
    assert "NCCL_MIN_NCHANNELS" not in new
    oldest = {v.key: v.value for v in tune_nccl(nodes, links, V_OLD).all_values()}
    assert oldest["NCCL_SOCKET_IFNAME"] == "eth0"  # no '=' before 2.5.6
    assert new["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert "NCCL_NET" not in oldest  # NCCL_NET is read from 2.10


def test_torch_error_handling_name_depends_on_pytorch_version() -> None:
    nodes, links = two_region()
    old = tune_nccl(nodes, links, V_2_21, TuneOptions(torch_version=TORCH_OLD))
    new = tune_nccl(nodes, links, V_2_21, TuneOptions(torch_version=TORCH_NEW))
    assert {v.key for v in old.common} >= {"NCCL_ASYNC_ERROR_HANDLING"}
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in {v.key for v in old.common}
    assert {v.key for v in new.common} >= {"TORCH_NCCL_ASYNC_ERROR_HANDLING"}


@pytest.mark.parametrize(
    ("key", "value", "version"),
    [
        ("NCCL_SOCKET_NTHREADS", "17", V_2_21),  # MAX_THREADS 16
        ("NCCL_SOCKET_NTHREADS", "0", V_2_21),
        ("NCCL_NSOCKS_PERTHREAD", "65", V_2_21),  # MAX_SOCKETS 64
        ("NCCL_BUFFSIZE", "5000000", V_2_21),  # not a power of two
        ("NCCL_BUFFSIZE", "-4", V_2_21),
        ("NCCL_ALGO", "allreduce:ring", V_2_21),  # per-collective syntax needs 2.24
        ("NCCL_ALGO", "allreduce:ring;tree", V_2_24),  # only the first entry may lack a prefix
        ("NCCL_ALGO", "allgatherv:ring", V_2_24),  # unknown collective
        ("NCCL_ALGO", "allreduce:hypercube", V_2_24),  # unknown algorithm
        ("NCCL_SOCKET_IFNAME", "=eth0", V_OLD),  # '=' needs 2.5.6
        ("NCCL_SOCKET_IFNAME", "e", V_2_21),  # socket.cc ignores values of length <= 1
        ("NCCL_SOCKET_IFNAME", "=eth0 eth1", V_2_21),
        ("NCCL_SOCKET_FAMILY", "inet", V_2_21),
        ("NCCL_SOCKET_RETRY_CNT", "50", V_2_21),  # not read before 2.24
        ("NCCL_MIN_CTAS", "4", V_2_16),  # not read before 2.17
        ("NCCL_MIN_CTAS", "33", V_2_24),
        ("NCCL_NET", "Socket", V_OLD),  # not read before 2.10
        ("NCCL_NET", "socket", V_2_21),  # the module is called "Socket"
        ("NCCL_IB_DISABLE", "yes", V_2_21),
        ("GLOO_SOCKET_IFNAME", "=eth0", V_2_21),  # Gloo takes plain names
        ("NCCL_PROTO", "Simple", V_2_21),  # not in the table: never emitted
    ],
)
def test_validator_refuses_values_outside_the_domain(key, value, version) -> None:
    with pytest.raises(ValidationError):
        check_value(key, value, version, TORCH_NEW)


@pytest.mark.parametrize(
    ("key", "value", "version"),
    [
        ("NCCL_SOCKET_NTHREADS", "16", V_2_21),
        ("NCCL_NSOCKS_PERTHREAD", "64", V_2_21),
        ("NCCL_BUFFSIZE", str(8 * 2**20), V_OLD),
        ("NCCL_ALGO", "Ring", V_2_21),
        ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", V_2_24),
        ("NCCL_ALGO", "^tree", V_2_21),
        ("NCCL_SOCKET_IFNAME", "^=docker0", V_2_21),
        ("NCCL_SOCKET_IFNAME", "=bond0,eth1", V_2_21),
        ("NCCL_SOCKET_FAMILY", "AF_INET6", V_2_21),
        ("NCCL_SOCKET_RETRY_SLEEP_MSEC", "100", V_2_24),
        ("GLOO_SOCKET_IFNAME", "eth0,eth1", V_2_21),
    ],
)
def test_validator_accepts_documented_values(key, value, version) -> None:
    check_value(key, value, version, TORCH_NEW)


def test_validator_enforces_the_socket_product_and_reasons() -> None:
    nodes, links = two_region()
    settings = tune_nccl(nodes, links, V_2_21)
    common = tuple(
        EnvValue(v.key, "16", v.reason) if v.key == "NCCL_SOCKET_NTHREADS" else v
        for v in settings.common
    )
    common = tuple(
        EnvValue(v.key, "8", v.reason) if v.key == "NCCL_NSOCKS_PERTHREAD" else v for v in common
    )
    from dataclasses import replace

    with pytest.raises(ValidationError, match="exceeds 64"):
        check_settings(replace(settings, common=common), TORCH_NEW)
    no_reason = tuple(EnvValue(v.key, v.value, "") for v in settings.common)
    with pytest.raises(ValidationError, match="reason"):
        check_settings(replace(settings, common=no_reason), TORCH_NEW)


def test_every_table_row_names_its_source() -> None:
    for spec in VARIABLES.values():
        assert spec.source, spec.name
        assert spec.until is None or spec.until > spec.since


def test_single_region_lan_needs_few_sockets_and_the_default_buffer() -> None:
    nodes = [node(f"n{i}", "hk", nic("eth0", f"10.0.0.{i}/24")) for i in (1, 2)]
    settings = tune_nccl(nodes, [link("n1", "n2")], V_2_21)
    env = settings.env_for("n1")
    assert env["NCCL_SOCKET_NTHREADS"] == "1"
    assert env["NCCL_NSOCKS_PERTHREAD"] == "2"
    assert env["NCCL_BUFFSIZE"] == str(4 * 2**20)  # never below NCCL's default
    check_settings(settings, TORCH_NEW)

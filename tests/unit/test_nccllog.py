"""The NCCL_DEBUG=INFO log checker and the gpu_check report (pure parts)."""

from __future__ import annotations

import json

from netopt.torch.gpucheck_report import (
    StepResult,
    exit_code,
    node_name,
    report_document,
    verdict,
    write_report,
)
from netopt.torch.nccllog import (
    check_env_log,
    ifname_admits,
    loaded_variables,
    merge_checks,
    parse_env0,
)

ENV = {
    "GLOO_SOCKET_IFNAME": "eth0",
    "NCCL_BUFFSIZE": "33554432",
    "NCCL_IB_DISABLE": "1",
    "NCCL_MIN_CTAS": "4",
    "NCCL_NET": "Socket",
    "NCCL_SOCKET_FAMILY": "AF_INET",
    "NCCL_SOCKET_IFNAME": "=eth0",
    "NCCL_SOCKET_NTHREADS": "8",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}

# What NCCL 2.2x prints for a one-rank communicator with the env file loaded.
ACCEPTED_LOG = """\
gpu1:4242:4242 [0] NCCL INFO NCCL_SOCKET_FAMILY set by environment to AF_INET
gpu1:4242:4242 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =eth0
gpu1:4242:4242 [0] NCCL INFO Bootstrap : Using eth0:10.1.2.3<0>
gpu1:4242:4242 [0] NCCL INFO cudaDriverVersion 12080
NCCL version 2.27.5+cuda12.9
gpu1:4242:4260 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
gpu1:4242:4260 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
gpu1:4242:4260 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.2.3<0>
gpu1:4242:4260 [0] NCCL INFO Using network Socket
gpu1:4242:4260 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 33554432.
gpu1:4242:4260 [0] NCCL INFO NCCL_MIN_CTAS set by environment to 4.
gpu1:4242:4260 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0
"""


def _status(log: str, env: dict[str, str] = ENV) -> dict[str, str]:
    return {v.name: v.status for v in check_env_log(env, log).verdicts}


def test_every_variable_nccl_echoes_or_uses_counts_as_accepted() -> None:
    status = _status(ACCEPTED_LOG)
    for name in ("NCCL_BUFFSIZE", "NCCL_IB_DISABLE", "NCCL_MIN_CTAS", "NCCL_NET",
                 "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_IFNAME"):  # fmt: skip
        assert status[name] == "accepted", name


def test_unread_variables_are_not_echoed_never_accepted() -> None:
    check = check_env_log(ENV, ACCEPTED_LOG)
    assert set(check.named("not_echoed")) == {
        "NCCL_SOCKET_NTHREADS",  # read only when ranks connect over NCCL's sockets
        "GLOO_SOCKET_IFNAME",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
    why = {v.name: v.evidence for v in check.verdicts}
    assert "not echoed by NCCL" in why["NCCL_SOCKET_NTHREADS"]
    assert "PyTorch" in why["TORCH_NCCL_ASYNC_ERROR_HANDLING"]


def test_evidence_from_outside_the_log_confirms_a_torch_variable() -> None:
    check = check_env_log(ENV, ACCEPTED_LOG, {"GLOO_SOCKET_IFNAME": "a Gloo group formed"})
    assert "GLOO_SOCKET_IFNAME" in check.named("accepted")


def test_an_invalid_value_is_rejected() -> None:
    log = ACCEPTED_LOG.replace(
        "NCCL INFO NCCL_BUFFSIZE set by environment to 33554432.",
        "NCCL INFO Invalid value 33554432x for NCCL_BUFFSIZE, using default 4194304.",
    )
    check = check_env_log(ENV, log)
    assert check.named("rejected") == ("NCCL_BUFFSIZE",)
    assert "Invalid value" in next(v.evidence for v in check.verdicts if v.status == "rejected")


def test_a_different_value_read_is_rejected() -> None:
    env = {**ENV, "NCCL_MIN_CTAS": "4x"}  # strtoll reads 4 and stops: not what was set
    assert _status(ACCEPTED_LOG, env)["NCCL_MIN_CTAS"] == "rejected"
    assert _status(ACCEPTED_LOG, {**ENV, "NCCL_BUFFSIZE": "8388608"})["NCCL_BUFFSIZE"] == "rejected"


def test_unknown_ignored_and_warned_variables_are_rejected() -> None:
    lines = {
        "NCCL_MIN_CTAS": "gpu1:1:1 [0] NCCL INFO NCCL_MIN_CTAS is unknown, ignoring it",
        "NCCL_IB_DISABLE": "gpu1:1:1 [0] NCCL WARN NCCL_IB_DISABLE: bad setting",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "[W] TORCH_NCCL_ASYNC_ERROR_HANDLING is deprecated",
    }
    for name, line in lines.items():
        assert _status(ACCEPTED_LOG + line + "\n")[name] == "rejected", name


def test_a_fallback_to_another_interface_or_network_is_rejected() -> None:
    other_nic = ACCEPTED_LOG.replace("Using [0]eth0:10.1.2.3<0>", "Using [0]ib0:10.9.9.9<0>")
    assert _status(other_nic)["NCCL_SOCKET_IFNAME"] == "rejected"
    ib = ACCEPTED_LOG.replace("Using network Socket", "Using network IB")
    assert _status(ib)["NCCL_NET"] == "rejected"
    ipv6 = ACCEPTED_LOG.replace(
        "Bootstrap : Using eth0:10.1.2.3<0>", "Bootstrap : Using eth0:fd00::3<0>"
    )
    assert _status(ipv6)["NCCL_SOCKET_FAMILY"] == "rejected"
    none = ACCEPTED_LOG + "gpu1:1:1 [0] NCCL WARN Bootstrap : no socket interface found\n"
    assert _status(none)["NCCL_SOCKET_IFNAME"] == "rejected"
    assert _status(ACCEPTED_LOG, {"NCCL_SOCKET_FAMILY": "INET"})["NCCL_SOCKET_FAMILY"] == "rejected"


def test_interface_names_keep_a_trailing_dot_free_comparison() -> None:
    env = {"NCCL_SOCKET_IFNAME": "=bond0.2093"}
    log = "h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =bond0.2093\n"
    assert _status(log, env)["NCCL_SOCKET_IFNAME"] == "accepted"


def test_ifname_admits_follows_nccls_match_rules() -> None:
    assert ifname_admits("=eth0", "eth0")
    assert not ifname_admits("=eth0", "eth0.5")
    assert ifname_admits("eth", "eth0.5")
    assert not ifname_admits("^docker,lo", "lo")
    assert ifname_admits("^docker,lo", "eth0")
    assert not ifname_admits("^=eth0", "eth0")


def test_merge_keeps_a_rejection_and_adds_confirmations() -> None:
    one_rank = check_env_log(ENV, ACCEPTED_LOG)
    socket_run = check_env_log(
        ENV, "h:1:1 [0] NCCL INFO NCCL_SOCKET_NTHREADS set by environment to 8.\n"
        "h:1:1 [0] NCCL INFO Invalid value x for NCCL_MIN_CTAS, using default 0.\n",
    )  # fmt: skip
    merged = merge_checks(one_rank, socket_run)
    status = {v.name: v.status for v in merged.verdicts}
    assert status["NCCL_SOCKET_NTHREADS"] == "accepted"
    assert status["NCCL_MIN_CTAS"] == "rejected"
    assert status["NCCL_BUFFSIZE"] == "accepted"


def test_loaded_variables_are_what_sourcing_added() -> None:
    before = parse_env0(b"PATH=/bin\0SHLVL=1\0HOME=/root\0")
    after = parse_env0(b"PATH=/bin\0SHLVL=2\0HOME=/root\0NCCL_NET=Socket\0A=x=y\0")
    assert loaded_variables(before, after) == {"A": "x=y", "NCCL_NET": "Socket"}


def test_report_verdicts_and_exit_codes(tmp_path) -> None:
    accepted = check_env_log({"NCCL_BUFFSIZE": "33554432"}, ACCEPTED_LOG)
    unconfirmed = check_env_log(ENV, ACCEPTED_LOG)
    rejected = check_env_log({"NCCL_BUFFSIZE": "1"}, ACCEPTED_LOG)
    ok = [StepResult("probe", "pass"), StepResult("busbw", "skipped", "1 GPU")]
    assert verdict(ok, accepted) == "pass"
    assert verdict(ok, unconfirmed) == "unconfirmed"
    assert verdict(ok, rejected) == "fail"
    assert verdict(ok, None) == "fail"
    assert verdict([*ok, StepResult("doctor", "fail", "no nvidia-smi")], accepted) == "fail"
    assert [exit_code(v) for v in ("pass", "fail", "unconfirmed")] == [0, 1, 3]
    document = report_document(
        {"mode": "cuda"}, [*ok, StepResult("doctor", "fail", "x")], unconfirmed
    )
    path = tmp_path / "report.json"
    write_report(str(path), document)
    loaded = json.loads(path.read_text())
    assert loaded["verdict"] == "fail"
    assert loaded["steps"][2] == {"name": "doctor", "status": "fail", "reason": "x",
                                  "elapsed_s": 0.0, "details": {}}  # fmt: skip
    assert "NCCL_SOCKET_NTHREADS" in loaded["not_echoed"]
    assert list(tmp_path.iterdir()) == [path]


def test_node_name_falls_back_for_hostnames_the_links_file_refuses() -> None:
    assert node_name("gpu-7.example.com") == "gpu-7"
    assert node_name("GPU_NODE") == "gpu-check-host"

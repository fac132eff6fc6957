"""tune_nccl's rules: sockets, buffers, algorithm, retries, transport, advice, errors."""

from __future__ import annotations

import itertools
import math

import pytest
from nccl_helpers import V_2_21, V_2_24, V_2_26, link, nic, node, two_region, wan

from netopt.errors import ValidationError
from netopt.nccl.advice import BUCKET_CAPS_MB, TARGET_SHARE, overlap_buckets
from netopt.nccl.costmodel import (
    Fabric,
    Hop,
    fabric_from_links,
    flow_ceiling_bps,
    gloo_hierarchical_allreduce_s,
    gloo_message_s,
    gloo_ring_allreduce_s,
    predict,
    ring_allreduce_s,
    tree_allreduce_s,
)
from netopt.nccl.fewer_syncs import (
    MAX_MICRO_BATCHES,
    accumulation,
    averaging,
)
from netopt.nccl.model import TuneOptions, parse_version
from netopt.nccl.tuner import tune_nccl


def two_nodes(**wan_kwargs):
    nodes = [
        node("a", "hk", nic("eth0", "10.0.0.1/24")),
        node("b", "us", nic("eth0", "10.0.1.1/24")),
    ]
    return nodes, [wan("a", "b", **wan_kwargs)]


def env(settings, node_name="a"):
    return settings.env_for(node_name)


# ---------------------------------------------------------------- sockets


def expected_sockets(link_mbps, single_mbps, rtt_ms, loss, mss=1448):
    mathis = mss * 8 / (rtt_ms / 1000) * 1.22 / math.sqrt(loss) if loss else math.inf
    flow = min(single_mbps * 1e6, mathis)
    return max(1, min(64, math.ceil(link_mbps * 1e6 / flow)))


@pytest.mark.parametrize(
    ("link_mbps", "single_mbps", "rtt_ms", "loss"),
    [
        (100, 30, 80, 0.005),  # Mathis (2.5 Mbit/s) binds: 40 flows
        (100, 30, 80, 0.0),  # no loss: the single stream binds: 4 flows
        (10000, 9400, 0.2, 0.0),  # LAN: 2 flows
        (100, 100, 1, 0.0),  # one flow fills it
        (10000, 50, 150, 0.01),  # far more than 64 needed: clamped to 64
        (1000, 120, 30, 0.0001),
    ],
)
def test_sockets_follow_the_flow_ceiling(link_mbps, single_mbps, rtt_ms, loss) -> None:
    nodes, links = two_nodes(
        link_mbps=link_mbps, single_stream_mbps=single_mbps, rtt_ms=rtt_ms, loss_ratio=loss
    )
    values = env(tune_nccl(nodes, links, V_2_21))
    threads = int(values["NCCL_SOCKET_NTHREADS"])
    per_thread = int(values["NCCL_NSOCKS_PERTHREAD"])
    total = expected_sockets(link_mbps, single_mbps, rtt_ms, loss)
    assert 1 <= threads <= 16
    assert threads * per_thread <= 64
    assert total <= threads * per_thread < total + threads  # no more than one short row


def test_bbr_hosts_are_not_held_to_the_mathis_bound() -> None:
    cubic = two_nodes(single_stream_mbps=90, loss_ratio=0.005)
    bbr = two_nodes(single_stream_mbps=90, loss_ratio=0.005, congestion_control="bbr")
    assert flow_ceiling_bps(cubic[1][0], 1448) < 3e6
    assert flow_ceiling_bps(bbr[1][0], 1448) == 90e6
    assert env(tune_nccl(*bbr, V_2_21))["NCCL_NSOCKS_PERTHREAD"] == "2"


def test_the_worst_pair_sets_the_socket_count() -> None:
    nodes, links = two_region()
    values = env(tune_nccl(nodes, links, V_2_21))
    sockets = int(values["NCCL_SOCKET_NTHREADS"]) * int(values["NCCL_NSOCKS_PERTHREAD"])
    assert sockets >= expected_sockets(100, 30, 80, 0.005)


# ---------------------------------------------------------------- buffers


@pytest.mark.parametrize(
    ("link_mbps", "rtt_ms", "single"),
    [(100, 80, 90), (1000, 160, 900), (10000, 150, 9000), (25000, 0.1, 20000), (5000, 300, 4000)],
)
def test_buffsize_is_a_power_of_two_covering_the_bdp(link_mbps, rtt_ms, single) -> None:
    nodes, links = two_nodes(
        link_mbps=link_mbps, rtt_ms=rtt_ms, single_stream_mbps=single, loss_ratio=0.0
    )
    settings = tune_nccl(nodes, links, V_2_26)
    values = env(settings)
    buffsize = int(values["NCCL_BUFFSIZE"])
    channels = int(values["NCCL_MIN_CTAS"])
    bdp = link_mbps * 1e6 / 8 * rtt_ms / 1000
    assert buffsize & (buffsize - 1) == 0
    assert buffsize >= 4 * 2**20  # never below NCCL's 4 MiB default
    assert buffsize <= 32 * 2**20
    assert 2 <= channels <= 32
    if channels < 32:
        assert channels * buffsize >= bdp  # the pipe is filled
    sockets = int(values["NCCL_SOCKET_NTHREADS"]) * int(values["NCCL_NSOCKS_PERTHREAD"])
    assert buffsize >= 8 * sockets * 64 * 1024  # a step spreads over every socket


def test_huge_bdp_raises_channels_not_the_buffer() -> None:
    nodes, links = two_nodes(link_mbps=100000, rtt_ms=20, single_stream_mbps=10000, loss_ratio=0)
    values = env(tune_nccl(nodes, links, V_2_26))
    assert int(values["NCCL_BUFFSIZE"]) == 32 * 2**20
    assert int(values["NCCL_MIN_CTAS"]) == math.ceil(100e9 / 8 * 0.02 / (32 * 2**20))
    nodes, links = two_nodes(link_mbps=100000, rtt_ms=300, single_stream_mbps=10000, loss_ratio=0)
    settings = tune_nccl(nodes, links, V_2_26)
    assert env(settings)["NCCL_MIN_CTAS"] == "32"  # clamped: said in a warning
    assert any("underfilled" in w for w in settings.warnings)


# ---------------------------------------------------------------- algorithm and model


def test_cost_model_formulas() -> None:
    assert ring_allreduce_s(4, 1e6, 0.01, 1e8) == pytest.approx(6 * 0.01 + 1.5 * 8e6 / 1e8)
    assert tree_allreduce_s(4, 1e6, 0.01, 1e8) == pytest.approx(4 * 0.01 + 2 * 8e6 / 1e8)
    assert ring_allreduce_s(1, 1e6, 0.01, 1e8) == 0.0


def test_gloo_waits_two_one_way_latencies_per_message() -> None:
    # a message waits for its receiver's ready notice (one way), then travels (one way)
    wan = Hop(alpha_s=0.04, rate_bps=1e8)
    assert gloo_message_s(1e6, wan) == pytest.approx(2 * 0.04 + 8e6 / 1e8)
    # two ranks: a reduce-scatter step and an all-gather step, each a message: 2 RTT
    # (measured on the lab: a 1 KB all-reduce of hk-1 and us-1 took 0.16 s at 80 ms RTT)
    assert gloo_ring_allreduce_s(2, 1e3, 0.04, 1e8) == pytest.approx(4 * 0.04 + 8e3 / 1e8)
    assert gloo_ring_allreduce_s(4, 1e6, 0.01, 1e8) == pytest.approx(6 * 2 * 0.01 + 1.5 * 8e6 / 1e8)
    assert gloo_ring_allreduce_s(1, 1e6, 0.01, 1e8) == 0.0
    local = Hop(alpha_s=0.0001, rate_bps=1e9)
    two = Fabric(n=4, ring=wan, tree=wan, region_sizes=(3, 1), local=local, wan=wan,
                 wan_link_bps=1e8)  # fmt: skip
    # reduce and broadcast in the region (a message each), the leaders' exchange: one
    # message each way at once, one round trip where Gloo's all-reduce takes two
    assert gloo_hierarchical_allreduce_s(two, 1e6) == pytest.approx(
        2 * gloo_message_s(1e6, local) + gloo_message_s(1e6, wan)
    )
    three = Fabric(n=4, ring=wan, tree=wan, region_sizes=(2, 1, 1), local=local, wan=wan,
                   wan_link_bps=1e8)  # fmt: skip
    assert gloo_hierarchical_allreduce_s(three, 1e6) == pytest.approx(
        2 * gloo_message_s(1e6, local) + gloo_ring_allreduce_s(3, 1e6, 0.04, 1e8)
    )
    one = Fabric(n=2, ring=local, tree=local, region_sizes=(2,), local=local, wan=None,
                 wan_link_bps=None)  # fmt: skip
    assert gloo_hierarchical_allreduce_s(one, 1e6) is None


def test_latency_bound_small_messages_prefer_tree_large_prefer_ring() -> None:
    names = [f"n{i}" for i in range(16)]
    nodes = [node(n, "r", nic("eth0", f"10.0.0.{i + 1}/24")) for i, n in enumerate(names)]
    links = [
        link(a, b, rtt_ms=10, single_stream_mbps=900, link_mbps=1000)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    fabric = fabric_from_links(nodes, links, flows=4)
    small, large = predict(fabric, 1024), predict(fabric, 256 * 2**20)
    assert small["tree"] < small["ring"]
    assert large["ring"] < large["tree"]


def test_two_level_beats_flat_ring_across_regions() -> None:
    nodes, links = two_region()
    times = predict(fabric_from_links(nodes, links, flows=8), 64 * 2**20)
    assert times["two-level"] < times["ring"]
    settings = tune_nccl(nodes, links, V_2_24)
    assert any("two-level" in note for note in settings.advice.notes)


def test_nccl_algo_is_per_collective_and_from_the_model() -> None:
    nodes, links = two_region()
    settings = tune_nccl(nodes, links, V_2_24)
    value = env(settings, "hk-1")["NCCL_ALGO"]
    assert value in ("allreduce:ring", "allreduce:tree")
    flows = settings.extra["sockets"] * settings.extra["channels"]
    times = predict(fabric_from_links(nodes, links, flows=flows), 25 * 2**20)
    assert value.endswith("ring" if times["ring"] < times["tree"] else "tree")
    assert "NCCL_PROTO" not in env(settings, "hk-1")


def test_tuner_csv_rows_cover_all_sizes_and_drop_nccl_algo() -> None:
    nodes, links = two_region()
    settings = tune_nccl(nodes, links, V_2_26, TuneOptions(tuner_csv=True))
    rows = settings.tuner_rows
    assert rows[0].min_bytes == 0
    assert rows[-1].max_bytes == 4294967295
    for before, after in itertools.pairwise(rows):
        assert after.min_bytes == before.max_bytes + 1
        assert after.algorithm != before.algorithm
    assert all(r.protocol == "simple" and r.n_nodes == 4 for r in rows)
    assert "NCCL_ALGO" not in env(settings, "hk-1")


# ---------------------------------------------------------------- retries and transport


def test_retry_window_covers_twice_the_longest_outage() -> None:
    nodes, links = two_nodes(outages_s=(5, 150))
    values = env(tune_nccl(nodes, links, V_2_24))
    count, sleep_ms = (
        int(values["NCCL_SOCKET_RETRY_CNT"]),
        int(values["NCCL_SOCKET_RETRY_SLEEP_MSEC"]),
    )
    window_s = sleep_ms * count * (count + 1) / 2 / 1000  # retry i sleeps i x sleep
    assert window_s >= 300
    assert sleep_ms * (count - 1) * count / 2 / 1000 < 300  # the smallest count that does


def test_no_outage_keeps_nccls_default_window() -> None:
    values = env(tune_nccl(*two_nodes(), V_2_24))
    assert values["NCCL_SOCKET_RETRY_CNT"] == "34"


def test_old_nccl_warns_when_outages_outlast_its_fixed_retries() -> None:
    settings = tune_nccl(*two_nodes(outages_s=(60,)), V_2_21)
    assert any("retries" in w for w in settings.warnings)


def test_socket_transport_forced_unless_rdma_everywhere() -> None:
    nodes, links = two_nodes()
    values = env(tune_nccl(nodes, links, V_2_21))
    assert values["NCCL_IB_DISABLE"] == "1"
    assert values["NCCL_NET"] == "Socket"
    rdma_links = [wan("a", "b", rdma=True)]
    values = env(tune_nccl(nodes, rdma_links, V_2_21))
    assert "NCCL_IB_DISABLE" not in values
    assert "NCCL_NET" not in values


# ---------------------------------------------------------------- advice


def test_timeout_never_below_torch_default_and_grows_with_outages() -> None:
    quiet = tune_nccl(*two_nodes(), V_2_24).advice
    stormy = tune_nccl(*two_nodes(outages_s=(900,)), V_2_24).advice
    assert quiet.timeout_s == 600
    assert stormy.timeout_s >= 2 * 1800 + 3 * 900
    assert stormy.timeout_s % 60 == 0


@pytest.mark.parametrize(
    ("params", "compute_ms", "hook"),
    [
        (1_000_000, 10_000, "none"),
        (3_000_000, 2_000, "bf16_compress_hook"),
        (1_000_000_000, 1_000, "powerSGD_hook"),
    ],
)
def test_hook_follows_the_predicted_comm_share(params, compute_ms, hook) -> None:
    nodes, links = two_nodes(single_stream_mbps=90, loss_ratio=0.0)
    options = TuneOptions(params=params, step_compute_ms=compute_ms)
    advice = tune_nccl(nodes, links, V_2_24, options).advice
    assert advice.hook == hook
    assert advice.comm_share is not None
    if hook == "none":
        assert advice.comm_share <= TARGET_SHARE
    else:
        assert advice.comm_share > TARGET_SHARE
    if hook == "powerSGD_hook":
        assert advice.powersgd_rank is not None
        assert advice.powersgd_rank >= 1


def test_no_model_size_no_hook_advice() -> None:
    advice = tune_nccl(*two_nodes(), V_2_24).advice
    assert advice.hook == "none"
    assert "--params" in advice.hook_reason


# ---------------------------------------------------------------- bad input


def test_missing_pair_is_named() -> None:
    nodes, links = two_region()
    links = [x for x in links if {x.a, x.b} != {"hk-2", "us-1"}]
    with pytest.raises(ValidationError, match="hk-2 <-> us-1"):
        tune_nccl(nodes, links, V_2_21)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"params": 10}, "both"),
        ({"step_compute_ms": 5.0}, "both"),
        ({"params": -1, "step_compute_ms": 5.0}, "positive"),
        ({"mss_bytes": 10}, "MSS"),
    ],
)
def test_contradictory_options_are_refused(kwargs, match) -> None:
    with pytest.raises(ValidationError, match=match):
        TuneOptions(**kwargs)


def test_too_few_nodes_old_versions_and_bad_version_strings() -> None:
    nodes, links = two_nodes()
    with pytest.raises(ValidationError, match="two nodes"):
        tune_nccl(nodes[:1], links, V_2_21)
    with pytest.raises(ValidationError, match="older"):
        tune_nccl(nodes, links, (2, 3, 7))
    with pytest.raises(ValidationError, match=r"MAJOR\.MINOR"):
        parse_version("two.twenty")
    assert parse_version("2.21.5+cuda12.4") == (2, 21, 5)
    assert parse_version("2.24") == (2, 24, 0)


# ------------------------------------------------- fewer all-reduces per sample


def test_accumulation_k_is_the_least_that_meets_the_target() -> None:
    assert accumulation(0.1, 1.0, TARGET_SHARE) is None  # already under
    acc = accumulation(3.0, 1.0, TARGET_SHARE)  # 75%: K=9 gives 3/(3+9) = 25%
    assert acc is not None
    assert acc.micro_batches == 9
    assert acc.comm_share_after == pytest.approx(0.25)
    assert "DDP.no_sync() for the first 8" in acc.reason
    assert "effective batch becomes 9 x" in acc.reason
    assert "learning rate by 9" in acc.reason
    capped = accumulation(1000.0, 1.0, TARGET_SHARE)
    assert capped is not None
    assert capped.micro_batches == MAX_MICRO_BATCHES
    assert capped.comm_share_after > TARGET_SHARE
    assert "needs K=3000" in capped.reason


def test_averaging_period_from_border_and_region_times() -> None:
    # in-region 0.1 s, compute 0.9 s, averaging across the border 6 s: the least H
    # with (0.1 + 6/H) / (1.0 + 6/H) <= 25% is 30 (6/30 = 0.2: 0.3 / 1.2 = 25%)
    avg = averaging(6.0, 0.1, 0.9, TARGET_SHARE)
    assert avg is not None
    assert avg.period_steps == 30
    assert avg.comm_share_after == pytest.approx(TARGET_SHARE)
    assert averaging(6.0, 0.1, 0.9, 0.5).period_steps < 30  # type: ignore[union-attr]
    assert "PeriodicModelAverager(period=30" in avg.reason
    assert "drift" in avg.caveat
    assert averaging(6.0, 2.0, 1.0, TARGET_SHARE) is None  # the region's link bounds it


def test_communication_bound_cross_region_job_gets_both_advices() -> None:
    nodes, links = two_region()
    options = TuneOptions(params=5_000_000, step_compute_ms=200)
    advice = tune_nccl(nodes, links, V_2_24, options).advice
    assert advice.accumulation is not None
    assert advice.accumulation.micro_batches > 1
    assert advice.averaging is not None  # even PowerSGD rank 1 leaves it over the target
    assert advice.averaging.period_steps >= 2
    relaxed = tune_nccl(nodes, links, V_2_24, TuneOptions(params=1000, step_compute_ms=1e4))
    assert relaxed.advice.accumulation is None
    assert relaxed.advice.averaging is None


# ---------------------------------------------------------------- across regions, overlap


def test_overlap_buckets_smaller_when_bandwidth_bound_default_when_latency_bound() -> None:
    grad = 23 * 2**20
    # 1 s of communication per 23 MiB, backward 1.2 s: one 23 MiB bucket leaves all 1 s
    # after backward; 2 MiB buckets start early and leave ~1/12 of it
    cap, exposed, default = overlap_buckets(grad, 1.2, lambda b: b / grad)
    assert default == pytest.approx(1.0, rel=1e-6)
    assert cap < 25
    assert exposed < 0.2
    # 0.2 s per bucket whatever its size: more buckets only add waits
    cap, exposed, default = overlap_buckets(grad, 1.2, lambda b: 0.2)
    assert cap == 25
    assert exposed == pytest.approx(default)


def test_lab_like_regions_get_hierarchical_powersgd_and_a_bucket_cap() -> None:
    names = ["hk-1", "hk-2", "hk-3", "us-1"]
    nodes = [node(n, n[:2], nic("eth0", f"10.0.{i}.1/24")) for i, n in enumerate(names)]
    links = [
        (wan if a[:2] != b[:2] else link)(a, b, **(
            {"single_stream_mbps": 90.0, "congestion_control": "bbr"} if a[:2] != b[:2]
            else {"single_stream_mbps": 900.0, "link_mbps": 1000.0}
        ))
        for i, a in enumerate(names) for b in names[i + 1 :]
    ]  # fmt: skip
    options = TuneOptions(params=5_700_000, step_compute_ms=2000, layer_dim=256)
    advice = tune_nccl(nodes, links, V_2_24, options).advice
    assert advice.hook == "hierarchical_powerSGD_hook"
    assert advice.powersgd_rank is not None
    assert "flat ring" in advice.hook_reason
    assert advice.bucket_cap_mb in BUCKET_CAPS_MB
    assert "gradient_as_bucket_view=True" in advice.bucket_reason
    # one region: nothing to be hierarchical about, the flat hook stays
    one = [node(n, "hk", nic("eth0", f"10.0.0.{i + 1}/24")) for i, n in enumerate(names)]
    flat = [wan(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    assert tune_nccl(one, flat, V_2_24, options).advice.hook == "powerSGD_hook"

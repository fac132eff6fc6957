"""Gloo's bucket and PowerSGD rank advice: the backward pass simulated,
each bucket charged Gloo's fixed waits, on the bench lab's links and on a LAN."""

from __future__ import annotations

import pytest

from netopt.errors import ValidationError
from netopt.nccl import glooplan
from netopt.nccl.advice import ALTERNATING_RANK_FACTOR, BUCKET_CAPS_MB, POWERSGD_RANKS
from netopt.nccl.costmodel import Fabric, Hop, fabric_from_links, gloo_message_s
from netopt.nccl.model import TuneOptions
from netopt.nccl.tuner import tune_nccl
from netopt.torch.trainbench import ModelShape
from tests.unit.nccl_helpers import V_2_21, link, nic, node, wan

BENCH = ModelShape(256, 7, 4, 128)  # netopt bench train's default model
NAMES = ["hk-1", "hk-2", "hk-3", "us-1"]
MIB = 2**20


def lab(cc: str = "bbr", single_stream_mbps: float = 90.0):  # type: ignore[no-untyped-def]
    """configs/lab/train-bench.yaml as the bench measures it: 3 hk + 1 us, 100 Mbit/s,
    80 ms RTT, 0.5% loss across; 1 Gbit/s inside hk."""
    nodes = [node(n, n[:2], nic("eth0", f"198.18.0.{i + 1}/32")) for i, n in enumerate(NAMES)]
    links = [
        wan(a, b, rtt_ms=80.5, single_stream_mbps=single_stream_mbps, congestion_control=cc)
        if a[:2] != b[:2]
        else link(a, b, rtt_ms=0.2, single_stream_mbps=950.0, link_mbps=1000.0)
        for i, a in enumerate(NAMES)
        for b in NAMES[i + 1 :]
    ]
    return nodes, links


def lab_fabric() -> Fabric:
    nodes, links = lab()
    return fabric_from_links(nodes, links, flows=1)


def gloo_advice(nodes, links, compute_ms: float, shape: ModelShape = BENCH):  # type: ignore[no-untyped-def]
    options = TuneOptions(params=shape.params, step_compute_ms=compute_ms, layer_dim=shape.dim,
                          backend="gloo", grad_layout=shape.grad_layout())  # fmt: skip
    return tune_nccl(nodes, links, V_2_21, options).advice


# ------------------------------------------------------------------ the pieces


def test_ddp_buckets_fill_in_reverse_order_and_close_at_the_cap() -> None:
    layout = ((1024, 1), (256, 1), (512, 1), (2048, 1))  # 4, 1, 2 and 8 KiB of fp32
    buckets = glooplan.ddp_buckets(layout, 3 * 1024)
    # the last tensor first (the backward pass produces it first): 8 KiB closes bucket 0,
    # 2 KiB + 1 KiB close bucket 1 at exactly 3 KiB, 4 KiB is the last
    assert buckets == [[(2048, 1)], [(512, 1), (256, 1)], [(1024, 1)]]
    assert glooplan.ddp_buckets(layout, 25 * MIB) == [list(reversed(layout))]
    bench = glooplan.ddp_buckets(BENCH.grad_layout(), 16 * MIB)
    assert len(bench) == 2
    assert sum(r * c for b in bench for r, c in b) == BENCH.params


def test_powersgd_bytes_compress_matrices_and_send_the_rest_whole() -> None:
    # 768x256 at rank 8: P 768x8, Q 256x8; a bias goes whole with P; 8x8 is not worth it
    # (64 < 2 x 16 x 8), nor compressed at rank 8
    p, q = glooplan.powersgd_bytes([(768, 256), (768, 1), (8, 8)], 8)
    assert p == 4 * (768 * 8 + 768 + 64)
    assert q == 4 * (256 * 8)
    p16, q16 = glooplan.powersgd_bytes([(768, 256)], 16)
    assert (p16, q16) == (4 * 768 * 16, 4 * 256 * 16)


def test_uniform_layout_holds_the_parameters() -> None:
    assert sum(r * c for r, c in glooplan.uniform_layout(70_000, 256)) == 70_000
    assert glooplan.uniform_layout(0, 256) == ()


def test_every_hierarchical_powersgd_bucket_pays_two_border_round_trips() -> None:
    fabric = lab_fabric()
    wan_hop = fabric.wan
    assert wan_hop is not None
    small = [(64, 64)]  # rank 8: P and Q of 2 KiB each, nothing but the fixed waits
    border = [s for s in glooplan.stages(fabric, "hierarchical-powersgd", small, 8)
              if s.resource == "border"]  # fmt: skip
    assert len(border) == 2  # P, then Q
    assert sum(s.seconds for s in border) == pytest.approx(2 * gloo_message_s(2048, wan_hop))
    rtt = 2 * wan_hop.alpha_s
    assert 2 * rtt < sum(s.seconds for s in border) < 2.05 * rtt
    # one bucket with nothing to overlap: its whole chain, local reduce and broadcast too
    alone = glooplan.exposed_s(fabric, "hierarchical-powersgd", [small], 0.0, 8)
    assert alone == pytest.approx(glooplan.total_s(fabric, "hierarchical-powersgd", [small], 8))
    assert alone > sum(s.seconds for s in border)
    # vectors only: nothing compressed, so no Q exchange (netopt.torch.lowrank skips it)
    vectors = glooplan.stages(fabric, "hierarchical-powersgd", [(4, 1)], 8)
    assert [s.resource for s in vectors] == ["p-reduce", "border", "p-broadcast"]
    with pytest.raises(ValueError, match="unknown hook"):
        glooplan.stages(fabric, "bogus", small)


def test_the_simulation_overlaps_buckets_with_backward_and_serialises_the_border() -> None:
    fabric = lab_fabric()
    buckets = [[(1, 1)], [(1, 1)]]
    hook = "hierarchical-powersgd"
    chain = glooplan.total_s(fabric, hook, buckets[:1])
    # backward far longer than a bucket's chain: only the last bucket's is left after it
    assert glooplan.exposed_s(fabric, hook, buckets, 100.0) == pytest.approx(chain)
    # no backward to hide behind: both buckets, their border exchanges one at a time
    both = glooplan.exposed_s(fabric, hook, buckets, 0.0)
    assert chain < both <= 2 * chain


# ------------------------------------------------------------- caps and ranks


def test_ties_within_one_round_trip_go_to_the_larger_cap() -> None:
    hop = Hop(0.0401, 90e6)
    fabric = Fabric(4, hop, hop, (3, 1), Hop(0.0001, 950e6), hop, 100e6)
    layout = BENCH.grad_layout()
    plans = {
        cap: glooplan.exposed_s(fabric, "hierarchical-powersgd",
                                glooplan.ddp_buckets(layout, cap * MIB), 1.0, 8)
        for cap in BUCKET_CAPS_MB
    }  # fmt: skip
    chosen = glooplan.choose_cap(fabric, "hierarchical-powersgd", layout, 1.0, BUCKET_CAPS_MB, 8)
    least = min(plans.values())
    assert chosen.exposed_s <= least + glooplan.tie_s(fabric)
    assert glooplan.tie_s(fabric) == pytest.approx(0.0802)
    larger = [c for c in BUCKET_CAPS_MB if c > chosen.cap_mb]
    assert all(plans[c] > least + glooplan.tie_s(fabric) for c in larger)


def test_lab_links_and_the_bench_model_get_few_large_buckets_and_a_modest_rank() -> None:
    nodes, links = lab()
    for compute_ms in (1300, 1900, 2500):  # the defaults' compute in the bench's runs
        advice = gloo_advice(nodes, links, compute_ms)
        assert advice.hook == "hierarchical_powerSGD_hook"
        assert advice.bucket_cap_mb is not None
        assert advice.bucket_cap_mb >= 16, (compute_ms, advice.bucket_reason)
        assert advice.powersgd_rank in (4, 8), (compute_ms, advice.hook_reason)
        assert "round trip" in advice.bucket_reason
    # small buckets pay the fixed waits ~11 times: predicted well behind 16 MiB
    fabric, layout = lab_fabric(), BENCH.grad_layout()

    def exposed(cap: int) -> float:
        buckets = glooplan.ddp_buckets(layout, cap * MIB)
        return glooplan.exposed_s(fabric, "hierarchical-powersgd", buckets, 2 / 3 * 1.9, 8)

    assert exposed(2) > exposed(16) + 2 * glooplan.tie_s(fabric)


def test_a_larger_rank_only_where_it_costs_under_one_percent_of_the_step() -> None:
    fabric, layout = lab_fabric(), BENCH.grad_layout()
    hook = "hierarchical-powersgd"
    for compute_s in (1.3, 1.9, 3.5, 8.0):
        plan = glooplan.choose_rank(fabric, hook, layout, compute_s, 2 / 3 * compute_s,
                                    BUCKET_CAPS_MB, POWERSGD_RANKS)  # fmt: skip
        best = dict(plan.exposed_by_rank)
        least = compute_s + min(best.values())
        assert compute_s + best[plan.rank] <= least * (1 + glooplan.RANK_PRICE)
        assert all(compute_s + best[r] > least * 1.01 for r in best if r > plan.rank)
        assert plan.rank >= glooplan.MIN_POWERSGD_RANK
        assert min(best) == glooplan.MIN_POWERSGD_RANK  # ranks 2 and 1 never weighed
    # a long step hides the bytes: the closer approximation is affordable there
    long = glooplan.choose_rank(fabric, hook, layout, 8.0, 2 / 3 * 8.0, BUCKET_CAPS_MB,
                                POWERSGD_RANKS)  # fmt: skip
    short = glooplan.choose_rank(fabric, hook, layout, 1.3, 2 / 3 * 1.3, BUCKET_CAPS_MB,
                                 POWERSGD_RANKS)  # fmt: skip
    assert long.rank > short.rank


def test_a_lan_still_gets_small_buckets_where_overlap_pays() -> None:
    names = ["a-1", "a-2", "a-3", "a-4"]
    nodes = [node(n, "dc", nic("eth0", f"10.0.0.{i + 1}/24")) for i, n in enumerate(names)]
    links = [link(a, b, rtt_ms=0.2, single_stream_mbps=940.0, link_mbps=1000.0)
             for i, a in enumerate(names) for b in names[i + 1 :]]  # fmt: skip
    advice = gloo_advice(nodes, links, 2000)
    assert advice.hook == "none"  # ~0.3 s of a 2 s step's ring: no compression
    # one 23 MB bucket would leave its whole ring after backward; small ones overlap
    assert advice.bucket_cap_mb is not None
    assert advice.bucket_cap_mb <= 4, advice.bucket_reason
    assert "DDP's default 25 MiB leaves" in advice.bucket_reason


def test_gloo_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="backend"):
        TuneOptions(backend="mpi")
    with pytest.raises(ValidationError, match="holds 10 parameters"):
        TuneOptions(params=11, step_compute_ms=5.0, grad_layout=((5, 2),))
    with pytest.raises(ValidationError, match="rows >= 1"):
        TuneOptions(params=0 + 1, step_compute_ms=5.0, grad_layout=((1, 0), (1, 1)))
    assert BENCH.params == sum(r * c for r, c in BENCH.grad_layout())


def test_a_lossy_hop_makes_each_gloo_message_wait_for_its_retransmission() -> None:
    from netopt.nccl.costmodel import gloo_ring_allreduce_s, loss_recovery_s

    rtt = 0.08
    assert loss_recovery_s(100_000, rtt / 2, 0.0) == 0.0
    assert loss_recovery_s(1448, rtt / 2, 0.005) == pytest.approx(0.005 * rtt)
    # 100 KB: 70 segments, one of them lost 30% of the time
    assert loss_recovery_s(100_000, rtt / 2, 0.005) == pytest.approx((1 - 0.995**70) * rtt)
    assert 0.29 * rtt < loss_recovery_s(100_000, rtt / 2, 0.005) < 0.31 * rtt
    # a long message loses some segment almost surely, and waits about one round trip
    assert loss_recovery_s(20e6, rtt / 2, 0.005) == pytest.approx(rtt, rel=1e-6)
    clean, lossy = Hop(rtt / 2, 90e6), Hop(rtt / 2, 90e6, 0.005)
    assert gloo_message_s(1e6, lossy) - gloo_message_s(1e6, clean) == pytest.approx(
        loss_recovery_s(1e6, rtt / 2, 0.005)
    )
    # a ring of 4: six steps, each waiting for its quarter of the bytes
    ring = gloo_ring_allreduce_s(4, 4e6, rtt / 2, 90e6, 0.005)
    assert ring - gloo_ring_allreduce_s(4, 4e6, rtt / 2, 90e6) == pytest.approx(
        6 * loss_recovery_s(1e6, rtt / 2, 0.005)
    )
    assert fabric_from_links(*lab(), flows=1).wan.loss_ratio == 0.005  # type: ignore[union-attr]


def test_the_alternating_variant_crosses_the_border_once_with_the_two_steps_mean() -> None:
    fabric = lab_fabric()
    bucket = [(64, 64), (64, 1)]  # rank 8: P and Q of 2 KiB each, a 256-byte vector
    plain, p, q = glooplan.powersgd_parts(bucket, 8)
    assert (plain, p, q) == (256, 2048, 2048)
    assert glooplan.powersgd_bytes(bucket, 8) == (plain + p, q)
    alt = glooplan.stages(fabric, "hierarchical-powersgd-alternating", bucket, 8)
    assert [s.resource for s in alt] == ["reduce", "border", "broadcast"]
    wan_hop = fabric.wan
    assert wan_hop is not None
    assert alt[1].seconds == pytest.approx(gloo_message_s(plain + (p + q) / 2, wan_hop))
    two = glooplan.total_s(fabric, "hierarchical-powersgd", [bucket], 8)
    one = glooplan.total_s(fabric, "hierarchical-powersgd-alternating", [bucket], 8)
    assert one < 0.55 * two  # one round trip of the border instead of two


def test_lab_links_advise_the_alternating_variant() -> None:
    nodes, links = lab()
    for compute_ms in (800, 1100, 1900):  # the defaults' compute in the bench's runs
        advice = gloo_advice(nodes, links, compute_ms)
        assert advice.hook == "hierarchical_powerSGD_hook"
        assert advice.powersgd_alternate is True, advice.hook_reason
        # PowerSGD's rule gives rank 4; half a power iteration a step needs twice it
        assert advice.powersgd_rank == 2 * 4 == ALTERNATING_RANK_FACTOR * 4
        assert "PowerSGD rank 4:" in advice.hook_reason
        assert "at rank 8 (2 x 4)" in advice.hook_reason
        assert "one border exchange a bucket and step instead of two" in advice.hook_reason
        assert "half a power iteration" in advice.hook_reason  # what it costs, said
    # a LAN: no compression at all, so nothing to alternate
    names = ["a-1", "a-2", "a-3", "a-4"]
    lan_nodes = [node(n, "dc", nic("eth0", f"10.0.0.{i + 1}/24")) for i, n in enumerate(names)]
    lan = [link(a, b, rtt_ms=0.2, single_stream_mbps=940.0, link_mbps=1000.0)
           for i, a in enumerate(names) for b in names[i + 1 :]]  # fmt: skip
    assert gloo_advice(lan_nodes, lan, 2000).powersgd_alternate is False

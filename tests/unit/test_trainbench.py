"""The pure parts of ``netopt bench train``: data order, node order, hook choice,
shards from real text, the model's parameter count, the cost model's step."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from netopt.cli.bench_train import choose_hook, interleave
from netopt.errors import NetworkError, ValidationError
from netopt.nccl.costmodel import Fabric, Hop
from netopt.nccl.model import Advice
from netopt.tcpmath import idle_restart_s
from netopt.torch.trainbench import (
    ModelShape,
    batch_indices,
    make_shards,
    predicted_comm_s,
    run_train_ranks,
    sample_order,
    shard_name,
    text_sources,
)

REGION = {"hk-1": "hk", "hk-2": "hk", "hk-3": "hk", "us-1": "us", "us-2": "us"}


def test_interleave_alternates_regions_in_listed_order() -> None:
    nodes = ("hk-1", "hk-2", "hk-3", "us-1", "us-2")
    assert interleave(nodes, REGION.__getitem__) == ("hk-1", "us-1", "hk-2", "us-2", "hk-3")


def test_sample_order_is_a_seeded_permutation_and_ranks_do_not_overlap() -> None:
    order = sample_order(3, 4096, 63, seed=5)
    assert order == sample_order(3, 4096, 63, seed=5)
    assert order != sample_order(3, 4096, 63, seed=6)
    assert sorted(order) == [(s, w * 64) for s in range(3) for w in range(64)]
    seen = [i for step in range(2) for r in range(4) for i in batch_indices(step, r, 4, 3)]
    assert seen == list(range(24))
    with pytest.raises(ValidationError):
        sample_order(1, 10, 63, seed=0)


def test_shards_are_real_text_and_the_same_twice(tmp_path: Path) -> None:
    written = make_shards(tmp_path / "a", 2, 4096, text_sources())
    make_shards(tmp_path / "b", 2, 4096, text_sources())
    assert written == 8192
    for i in range(2):
        data = (tmp_path / "a" / shard_name(i)).read_bytes()
        assert len(data) == 4096
        assert data == (tmp_path / "b" / shard_name(i)).read_bytes()
    assert sum(32 <= b < 127 or b in (9, 10) for b in data) > 0.9 * len(data)


def test_model_shape_counts_parameters_and_refuses_bad_heads() -> None:
    assert ModelShape(256, 7, 4, 128).params == 5_692_928  # as torch counts it (the lab run)
    with pytest.raises(ValidationError):
        ModelShape(30, 1, 4, 16)


def _advice(hook: str) -> Advice:
    return Advice(timeout_s=600, timeout_reason="", hook=hook, hook_reason="why")


def test_choose_hook_follows_the_advice() -> None:
    assert choose_hook(_advice("powerSGD_hook"), True)[0] == "powersgd"
    assert choose_hook(_advice("hierarchical_powerSGD_hook"), True)[0] == "hierarchical-powersgd"
    alternating = Advice(timeout_s=600, timeout_reason="", hook="hierarchical_powerSGD_hook",
                         hook_reason="why", powersgd_rank=8, powersgd_alternate=True)  # fmt: skip
    assert choose_hook(alternating, True)[0] == "hierarchical-powersgd-alternating"
    assert choose_hook(_advice("bf16_compress_hook"), True)[0] == "hierarchical-fp16"
    assert choose_hook(_advice("bf16_compress_hook"), False)[0] == "fp16"
    assert choose_hook(_advice("none"), True)[0] == "hierarchical"
    assert choose_hook(_advice("none"), False)[0] == "none"


def test_hierarchical_prediction_beats_the_flat_ring_on_a_slow_border() -> None:
    wan = Hop(alpha_s=0.04, rate_bps=90e6)
    fabric = Fabric(
        n=4, ring=wan, tree=wan, region_sizes=(3, 1), local=Hop(0.0001, 950e6), wan=wan,
        wan_link_bps=100e6,
    )  # fmt: skip
    grad = 20 * 2**20
    flat = predicted_comm_s(fabric, grad, "none")
    hier = predicted_comm_s(fabric, grad, "hierarchical")
    assert predicted_comm_s(fabric, grad, "hierarchical-fp16") < hier < flat
    # the flat ring moves 2(n-1)/n = 1.5 S per hop over the border, the leaders' ring S
    assert flat > 1.4 * grad * 8 / 90e6
    assert hier < 1.2 * grad * 8 / 90e6 + 0.5
    # PowerSGD's P and Q through the hierarchy: two small leader exchanges per bucket,
    # about 2 x 2 border latencies each, against a flat ring's 2 x 6
    low = predicted_comm_s(fabric, grad, "hierarchical-powersgd", powersgd_rank=8)
    assert low < predicted_comm_s(fabric, grad, "powersgd", powersgd_rank=8)
    assert 2 * 2 * (2 * 0.04) < low < 0.6
    # hosts that restart idle connections: the step's first border message pays the ramp
    restart = predicted_comm_s(fabric, grad, "none", idle_restart=True) - flat
    assert restart == pytest.approx(idle_restart_s(2**20 / 4, 0.08, 90e6))
    assert restart > 3 * 0.08
    # smaller buckets: more of them, each paying the latencies
    smaller = predicted_comm_s(fabric, grad, "hierarchical-powersgd", powersgd_rank=8,
                               bucket_bytes=4 * 2**20)  # fmt: skip
    assert smaller > low


def test_a_failed_rank_stops_the_others_at_once() -> None:
    scripts = [
        "import sys; print('boom', file=sys.stderr); sys.exit(2)",
        "import time; time.sleep(60)",
    ]

    def start(rank: int, argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    started = time.monotonic()
    with pytest.raises(NetworkError, match="rank 0 exited 2: boom"):
        run_train_ranks(start, lambda r: [sys.executable, "-c", scripts[r]], 2, 30)
    assert time.monotonic() - started < 10


def test_grad_layout_is_the_models_parameters_in_order() -> None:
    torch = pytest.importorskip("torch")
    from netopt.torch.trainbench import build_model

    shape = ModelShape(32, 2, 4, 16)
    model = build_model(torch, shape, 0)
    seen = tuple((int(p.shape[0]), int(p.numel()) // int(p.shape[0])) for p in model.parameters())
    assert seen == shape.grad_layout()
    assert sum(r * c for r, c in seen) == shape.params


def test_summary_keeps_the_busiest_ranks_exposed_time_beside_the_slowest_steps() -> None:
    from netopt.torch.trainbench import goals, summarize

    def doc(rank: int, compute: float, exposed: float, step: float) -> dict[str, object]:
        record = {"step_s": step, "data_wait_s": 0.0, "comm_exposed_s": exposed,
                  "compute_s": compute}  # fmt: skip
        return {"rank": rank, "hook": "none", "grad_bytes": 1000, "elapsed_s": 3 * step,
                "losses": [3.0, 2.0, 1.0], "records": [record] * 3}  # fmt: skip

    # both ranks wait for each other: rank 0 computes 0.5 s and waits 0.5 s (0.4 s of it
    # for rank 1's backward), rank 1 computes 0.9 s and waits 0.1 s on the network
    docs = [doc(0, 0.5, 0.5, 1.01), doc(1, 0.9, 0.1, 1.0)]
    run = summarize("netopt", ("a", "b"), docs)
    assert run.comm_exposed_s == pytest.approx(0.5)  # the slowest step's rank: rank 0
    assert run.critical_comm_exposed_s == pytest.approx(0.1)
    assert [r["compute_s"] for r in run.per_rank] == [0.5, 0.9]
    out = run.to_dict()
    assert out["critical_exposed_share"] == pytest.approx(0.1 / 1.01)
    defaults = summarize("defaults", ("a", "b"), [doc(0, 0.5, 2.0, 2.5), doc(1, 0.5, 2.0, 2.5)])
    report = goals(defaults, run, "bbr")
    assert report["exposed_comm_share"]["met"] is False
    assert report["exposed_comm_share_busiest_rank"]["met"] is True


def test_time_no_rank_computed_runs_from_the_last_backward_to_the_first_rank_free() -> None:
    from netopt.torch.trainbench import goals, idle_comm_s, summarize

    def rec(start: float, end: float) -> dict[str, object]:
        return {
            "step_s": 1.0,
            "data_wait_s": 0.0,
            "comm_exposed_s": end - start,
            "compute_s": 1.0 - (end - start),
            "comm_from_s": start,
            "comm_to_s": end,
        }

    # rank 0's backward ends at 10.2, rank 1's at 10.5; rank 1 is free at 10.8, rank 0 at 10.9
    assert idle_comm_s([rec(10.2, 10.9), rec(10.5, 10.8)]) == pytest.approx(0.3)
    assert idle_comm_s([rec(10.2, 10.4), rec(10.5, 10.8)]) == 0.0  # a rank computed throughout
    no_hook = {"step_s": 1.0, "data_wait_s": 0.0, "comm_exposed_s": 0.0, "compute_s": 1.0,
               "comm_from_s": None, "comm_to_s": None}  # fmt: skip
    assert idle_comm_s([rec(10.2, 10.9), no_hook]) == 0.0

    def doc(rank: int, start: float, end: float) -> dict[str, object]:
        return {
            "rank": rank,
            "hook": "none",
            "grad_bytes": 1000,
            "elapsed_s": 3.0,
            "losses": [3.0, 2.0, 1.0],
            "records": [rec(start + i, end + i) for i in range(3)],
        }

    run = summarize("netopt", ("a", "b"), [doc(0, 10.2, 10.9), doc(1, 10.5, 10.8)])
    assert run.idle_comm_s == pytest.approx(0.3)
    assert run.comm_exposed_s == pytest.approx(0.7)  # the slowest step's rank's own meter
    # the goal's measure: rank 0 waited 0.3 s for rank 1's backward, then 0.4 s
    assert run.comm_exposed_after_backward_s == pytest.approx(0.4)
    assert set(run.per_step[0]) == {"step_s", "data_wait_s", "comm_exposed_s", "compute_s"}
    assert run.to_dict()["idle_comm_share"] == pytest.approx(0.3)
    report = goals(run, run, "bbr")
    assert report["exposed_comm_share"]["value"] == pytest.approx(0.4)
    assert report["exposed_comm_share"]["met"] is False  # 0.4 of a 1 s step
    assert "beside_the_goal" not in report["exposed_comm_share"]
    assert report["exposed_comm_share_own_meter"]["value"] == pytest.approx(0.7)
    assert report["exposed_comm_share_own_meter"]["beside_the_goal"] is True
    assert report["exposed_comm_share_no_rank_computing"]["met"] is False  # 0.3 > 0.25
    assert report["exposed_comm_share_no_rank_computing"]["beside_the_goal"] is True


def test_the_alternating_prediction_pays_one_border_exchange_a_bucket() -> None:
    wan = Hop(alpha_s=0.04, rate_bps=90e6)
    fabric = Fabric(
        n=4, ring=wan, tree=wan, region_sizes=(3, 1), local=Hop(0.0001, 950e6), wan=wan,
        wan_link_bps=100e6,
    )  # fmt: skip
    grad = 22_771_712
    two = predicted_comm_s(fabric, grad, "hierarchical-powersgd", powersgd_rank=4)
    one = predicted_comm_s(fabric, grad, "hierarchical-powersgd-alternating", powersgd_rank=4)
    assert one == pytest.approx(two / 2)


def _timed(start: float, end: float, step: float = 1.0) -> dict[str, object]:
    return {"step_s": step, "data_wait_s": 0.0, "comm_exposed_s": end - start,
            "compute_s": step - (end - start), "comm_from_s": start, "comm_to_s": end}  # fmt: skip


def test_exposed_after_backward_leaves_out_the_wait_for_a_peers_backward() -> None:
    from netopt.torch.trainbench import exposed_after_backward_s

    # rank 0 is done at 10.0 and waits to 10.9; rank 1 computes until 10.6, done at 10.8:
    # nothing could be exchanged before 10.6, so 0.3 s (rank 0's last 0.3 s) is exposed
    assert exposed_after_backward_s([_timed(10.0, 10.9), _timed(10.6, 10.8)]) == (
        pytest.approx(0.3)
    )
    # the ranks' backward passes end together: each rank's own wait, the longest
    assert exposed_after_backward_s([_timed(10.5, 10.7), _timed(10.5, 10.9)]) == (
        pytest.approx(0.4)
    )
    # never more than a rank's own exposed time (its future done before its step's end)
    clipped = {**_timed(10.0, 10.9), "comm_exposed_s": 0.1}
    assert exposed_after_backward_s([clipped, _timed(10.6, 10.7)]) == pytest.approx(0.1)
    # a communication that ended before the last backward pass (another step's): none
    assert exposed_after_backward_s([_timed(10.0, 10.2), _timed(10.6, 10.6)]) == 0.0
    # without every rank's times: the slowest step's rank's own meter
    untimed = {"step_s": 1.5, "data_wait_s": 0.0, "comm_exposed_s": 0.6, "compute_s": 0.9}
    assert exposed_after_backward_s([untimed, _timed(10.6, 10.7)]) == pytest.approx(0.6)
    assert exposed_after_backward_s([]) == 0.0

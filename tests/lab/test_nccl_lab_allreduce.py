"""The all-reduce cost model against Gloo across the two-region lab.

hk <-> us is 100 Mbit/s, 40 ms one-way, 0.5% loss per direction. One Gloo rank
per node (ring order hk-1, hk-2, us-1, us-2, so the ring crosses the border once
each way); the model gets the lab's configured figures plus one measured single
TCP stream across the border, and must land within a factor of 1.5 of the
measurement for messages of 16 MiB and more. Small messages are reported, not
asserted: see the printed table (run with -s).
"""

from __future__ import annotations

import importlib.util

import pytest

from netopt.cli.bench_cmd import cross_region_flows
from netopt.config import load_settings
from netopt.lab import Lab
from netopt.nccl.costmodel import fabric_from_links
from netopt.torch.bench import run_on_lab, with_predictions
from netopt.torch.labfigures import lab_link_figures, lab_nodes
from tests.lab.conftest import CONFIGS

pytestmark = [
    pytest.mark.lab,
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

MIB = 2**20
NODES = ("hk-1", "hk-2", "us-1", "us-2")


def test_gloo_allreduce_across_regions_matches_the_model(two_region_lab: Lab) -> None:
    lab = two_region_lab
    topology = load_settings(CONFIGS / "lab" / "two-region.yaml", "lab")
    report = run_on_lab(
        lab,
        NODES,
        (4 * 1024, 16 * MIB, 32 * MIB),
        ifnames=[lab.plan.node(n).ifname for n in NODES],
        iters=2,
        warmup=0,  # the worker's correctness all-reduce already warms every connection
        timeout_s=240,
    )
    flows = cross_region_flows(lab, topology, NODES)
    links = lab_link_figures(lab, topology, NODES, flows)
    fabric = fabric_from_links(lab_nodes(topology, NODES), links, flows=1)
    report = with_predictions(report, fabric)
    print(f"\ncross-border single stream: {flows}")
    for row in report.rows:
        assert row.predicted_s is not None
        print(
            f"{row.size_bytes:>10} B  measured {row.time_s * 1000:9.1f} ms  "
            f"predicted {row.predicted_s * 1000:9.1f} ms  "
            f"ratio {row.predicted_s / row.time_s:.2f}  "
            f"busbw {row.busbw_gbps * 8000:.1f} Mbit/s"
        )
    for row in report.rows:
        if row.size_bytes >= 16 * MIB:
            assert row.predicted_s is not None
            ratio = row.predicted_s / row.time_s
            assert 1 / 1.5 <= ratio <= 1.5, f"{row.size_bytes} B: predicted/measured {ratio:.2f}"

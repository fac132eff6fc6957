"""The SQL link matrix (MatrixReader) equals the Python reference over the same summaries."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from netopt.coordinator.matrix import link_figures, region_figures
from netopt.coordinator.matrix_query import MatrixReader
from netopt.coordinator.store import BatchToStore, Store
from netopt.wire.schema import LinkSummary, RttFigures

NODES = ("hk-1", "hk-2", "sg-1", "us-1", "us-2", "xx-1")
REGIONS = {"hk-1": "hk", "hk-2": "hk", "sg-1": "sg", "us-1": "us", "us-2": "us"}  # xx-1: none


def _summary(rng: random.Random, src: str, dst: str, taken_at_s: float) -> LinkSummary:
    if rng.random() < 0.2:
        single = rng.choice([None, rng.uniform(1e8, 1e10)])
        aggregate = None if single is not None and rng.random() < 0.5 else rng.uniform(1e8, 1e10)
        return LinkSummary(src, dst, taken_at_s, 5.0, "bulk-tcp", single_stream_bps=single,
                           aggregate_bps=aggregate)  # fmt: skip
    sent = rng.randint(1, 100)
    received = rng.randint(0, sent)
    rtt = None
    if received:
        base = rng.choice([rng.uniform(0.1, 300.0), 10.0])  # repeated values too
        rtt = RttFigures(base * 0.9, base, base, base * 1.1, base * 1.2, base * 1.3)
    jitter = None if rtt is None or rng.random() < 0.3 else rng.uniform(0, 5)
    return LinkSummary(src, dst, taken_at_s, 5.0, "udp", sent, received, rtt, jitter,
                       loss_ratio=(sent - received) / sent)  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sql_matrix_equals_reference(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "coordinator.db")
    store = Store(path, durable_commits=False)
    batches = []
    for b in range(60):
        src = rng.choice(NODES)
        summaries = []
        for _ in range(rng.randint(1, 6)):
            dst = rng.choice([n for n in NODES if n != src])
            # Whole seconds, so pairs often share a taken_at_s (ties go to the later row).
            summaries.append(_summary(rng, src, dst, float(rng.randint(0, 40))))
        batches.append(BatchToStore(src, f"b{b}", summaries, 100.0, 0.0))
    store.ingest(batches)
    reader = MatrixReader(path)
    try:
        for since_s in (0.0, 20.0, 39.0, 41.0):
            rows = store.link_rows(since_s)
            links, pairs = reader.links(since_s, REGIONS, with_regions=True)
            expected = link_figures(rows, REGIONS)
            assert links == expected
            assert pairs == region_figures(expected, rows, REGIONS)
            assert (len(links) > 0) == (since_s < 41)
        links, pairs = reader.links(0.0, REGIONS)
        assert pairs == []
        assert sum(link["summary_count"] for link in links) == store.counts()[1]
    finally:
        reader.close()
        store.close()


def test_reader_sees_later_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "coordinator.db")
    store = Store(path, durable_commits=False)
    reader = MatrixReader(path)
    try:
        assert reader.links(0.0, REGIONS, with_regions=True) == ([], [])
        rng = random.Random(7)
        store.ingest([BatchToStore("hk-1", "b1", [_summary(rng, "hk-1", "us-1", 5.0)], 9.0, 0.0)])
        links, pairs = reader.links(0.0, REGIONS, with_regions=True)
        assert [(link["src"], link["dst"]) for link in links] == [("hk-1", "us-1")]
        assert [(p["src_region"], p["dst_region"]) for p in pairs] == [("hk", "us")]
    finally:
        reader.close()
        store.close()

"""Ingest schema: round trips, field-named refusals, limits, LinkStats compatibility."""

from __future__ import annotations

from typing import Any

import pytest

from netopt.coordinator.matrix import LinkRow, link_figures, region_figures
from netopt.wire.fields import RequestInvalid, parse_json_body
from netopt.wire.schema import LinkSummary, Registration, SummaryBatch


def summary(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "src": "hk-1",
        "dst": "us-1",
        "taken_at_s": 1_700_000_000.0,
        "window_s": 10,
        "method": "udp",
        "probes_sent": 200,
        "probes_received": 198,
        "rtt_ms": {"min": 80, "mean": 81, "p50": 80.9, "p90": 82, "p99": 90, "max": 95},
        "jitter_ms": 0.4,
        "loss_ratio": 0.01,
        "loss_ratio_ci95": [0.003, 0.036],
        "outages": [{"start_s": 1.0, "duration_s": 0.5}],
    }
    base.update(over)
    return base


def test_round_trip() -> None:
    parsed = LinkSummary.from_dict(summary())
    assert LinkSummary.from_dict(parsed.to_dict()) == parsed
    batch = SummaryBatch("b-1", (parsed,))
    assert SummaryBatch.from_dict(batch.to_dict()) == batch


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"src": "HK 1"}, "src"),
        ({"dst": "hk-1"}, "dst"),
        ({"loss_ratio": 1.5}, "loss_ratio"),
        ({"probes_received": 201}, "probes_received"),
        (
            {"rtt_ms": {"min": 90, "mean": 81, "p50": 80, "p90": 82, "p99": 90, "max": 95}},
            "rtt_ms.min",
        ),
        ({"method": "icmp"}, "method"),
        ({"taken_at_s": True}, "taken_at_s"),
        ({"rtt_p50": 3}, ""),
        ({"loss_ratio_ci95": [0.5, 0.1]}, "loss_ratio_ci95"),
        ({"method": "iperf3", "probes_sent": 0, "probes_received": 0}, "aggregate_bps"),
        ({"outages": [{"start_s": 0, "duration_s": 1}] * 257}, "outages"),
    ],
)
def test_refusals_name_the_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestInvalid) as info:
        LinkSummary.from_dict(summary(**over))
    assert info.value.field == field
    assert info.value.to_dict()["field"] == field


def test_batch_limit_and_nan_and_bad_json() -> None:
    with pytest.raises(RequestInvalid, match="at most 3"):
        SummaryBatch.from_dict({"batch_id": "x", "summaries": [summary()] * 4}, max_summaries=3)
    with pytest.raises(RequestInvalid, match="NaN"):
        parse_json_body(b'{"a": NaN}')
    with pytest.raises(RequestInvalid, match="not JSON"):
        parse_json_body(b"{")
    with pytest.raises(RequestInvalid, match="UTF-8"):
        parse_json_body(b"\xff")


def test_bandwidth_summary_without_probes_is_accepted() -> None:
    parsed = LinkSummary.from_dict(
        {"src": "a", "dst": "b", "taken_at_s": 1.0, "window_s": 5, "method": "bulk-tcp",
         "aggregate_bps": 9.1e7, "streams": 8, "congestion_control": "bbr"}
    )  # fmt: skip
    assert parsed.aggregate_bps == pytest.approx(9.1e7)
    assert parsed.loss_ratio is None


def test_accepts_measure_linkstats_to_dict() -> None:
    from netopt.measure import samples, stats

    series = samples.ProbeSeries(
        method="udp",
        target="198.18.0.2:7471",
        sent_at_s=tuple(0.1 * i for i in range(20)),
        replies=tuple(samples.Reply(seq=i, rtt_ms=10.0 + i % 3, received_at_s=0.1 * i + 0.01)
                      for i in range(20) if i != 5),
        timeout_s=1.0,
    )  # fmt: skip
    link_stats = stats.summarise(series)
    data = {**link_stats.to_dict(), "src": "hk-1", "dst": "hk-2", "taken_at_s": 1e9, "window_s": 2}
    parsed = LinkSummary.from_dict(data)
    assert parsed.probes_sent == 20
    assert parsed.probes_received == 19
    assert parsed.target == "198.18.0.2:7471"


def test_registration_normalises_addresses() -> None:
    reg = Registration.from_dict(
        {"node": "hk-1", "region": "hk", "netopt_version": "0.1.0", "cpu_count": 4,
         "nics": [{"name": "eth0", "addresses": ["198.18.0.1/24", "::1"], "mtu": 9000}]}
    )  # fmt: skip
    assert reg.nics[0].addresses == ("198.18.0.1/24", "::1/128")
    with pytest.raises(RequestInvalid) as info:
        Registration.from_dict({**reg.to_dict(), "nics": [{"name": "eth0", "addresses": ["x"]}]})
    assert info.value.field == "nics[0].addresses[0]"


def row(src: str, dst: str, t: float, rtt: float | None, sent: int, recv: int,
        bps: float | None = None) -> LinkRow:  # fmt: skip
    return LinkRow(src, dst, t, rtt, rtt, rtt, None, None if not sent else 1 - recv / sent,
                   sent, recv, None, bps)  # fmt: skip


def test_matrix_pools_loss_and_takes_latest_bandwidth() -> None:
    rows = [
        row("a", "b", 1, 10, 100, 100),
        row("a", "b", 2, 30, 100, 90),
        row("a", "b", 3, None, 0, 0, bps=5e8),
        row("c", "a", 2, 50, 10, 10),
    ]
    regions = {"a": "hk", "b": "hk", "c": "us"}
    links = link_figures(rows, regions)
    ab = next(link for link in links if (link["src"], link["dst"]) == ("a", "b"))
    assert ab["summary_count"] == 3
    assert ab["window"]["loss_ratio"] == pytest.approx(0.05)
    assert ab["window"]["rtt_p50_ms"]["p50"] == pytest.approx(20)
    assert ab["bandwidth"]["aggregate_bps"] == 5e8
    assert ab["latest"]["rtt_p50_ms"] == 30
    pairs = {(p["src_region"], p["dst_region"]): p for p in region_figures(links, rows, regions)}
    assert set(pairs) == {("hk", "hk"), ("hk", "us")}
    assert pairs[("hk", "us")]["rtt_p50_ms"]["p50"] == 50

"""The demo report's PNG plots: real files, real pixels, blank cells for missing figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from netopt.demo.plots import (
    SyncSpan,
    matrix_grid,
    plot_link_matrix,
    plot_transfer_timeline,
    span_label,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NODES = ["hk-1", "hk-2", "us-1", "us-2"]


def _row(src: str, dst: str, rtt_ms: float | None, loss: float | None) -> dict[str, Any]:
    # Shaped like DemoReport.matrix: src, dst, the latest figures, the window.
    return {
        "src": src,
        "dst": dst,
        "taken_at_s": 100.0,
        "rtt_p50_ms": rtt_ms,
        "rtt_p99_ms": None if rtt_ms is None else rtt_ms + 2,
        "jitter_ms": 0.5,
        "loss_ratio": loss,
        "window": {"rtt_p50_ms": None, "loss_ratio": loss, "probes_sent": 200},
    }


def _full_matrix() -> list[dict[str, Any]]:
    rows = []
    for a in NODES:
        for b in NODES:
            if a != b:
                cross = a[:2] != b[:2]
                rows.append(_row(a, b, 80.4 if cross else 0.2, 0.005 if cross else 0.0))
    return rows


def _assert_real_png(path: Path, *, min_colours: int) -> np.ndarray:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    pixels = imread(path)
    height, width = pixels.shape[:2]
    assert 200 <= height <= 4000
    assert 300 <= width <= 4000
    assert float(pixels[..., :3].std()) > 0.05, "the image is (nearly) one flat colour"
    rgb = (pixels[..., :3] * 255).round().astype(np.uint32).reshape(-1, 3)
    packed = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]  # one int per colour: fast unique
    assert len(np.unique(packed)) > min_colours
    return pixels


def test_link_matrix_png_is_a_real_nonblank_image(tmp_path: Path) -> None:
    path = plot_link_matrix(_full_matrix(), tmp_path / "report" / "links.png")
    assert path == tmp_path / "report" / "links.png"
    _assert_real_png(path, min_colours=50)
    assert not list(path.parent.glob("*.tmp*")), "a temporary file was left behind"


def test_matrix_grid_places_figures_and_leaves_missing_ones_blank() -> None:
    rows = _full_matrix()
    rows[0] = _row("hk-1", "hk-2", None, None)  # measured nothing yet
    rows[1] = {"src": "hk-1", "dst": "us-1", "rtt_p50_ms": 81.0}  # no loss, no window
    rows[2]["window"] = {"loss_ratio": None}  # the window has none: the latest is used
    grid = matrix_grid(rows)
    assert grid.nodes == tuple(NODES)
    hk1, hk2, us1, us2 = range(4)
    assert grid.rtt_ms[hk1][hk2] is None
    assert grid.loss_pct[hk1][hk2] is None
    assert grid.rtt_ms[hk1][us1] == 81.0
    assert grid.loss_pct[hk1][us1] is None
    assert grid.loss_pct[hk1][us2] == pytest.approx(0.5)
    assert grid.rtt_ms[us2][hk2] == pytest.approx(80.4)
    assert all(grid.rtt_ms[i][i] is None for i in range(4))


def test_matrix_grid_prefers_pooled_window_loss_and_honours_node_order() -> None:
    row = _row("a", "b", 10.0, 0.01)
    row["window"]["loss_ratio"] = 0.02
    grid = matrix_grid([row, _row("a", "zz", 5.0, 0.0)], nodes=["b", "a"])
    assert grid.nodes == ("b", "a")
    assert grid.loss_pct[1][0] == pytest.approx(2.0)
    assert grid.rtt_ms == ((None, None), (10.0, None))


def test_matrix_with_missing_or_no_values_still_plots(tmp_path: Path) -> None:
    blank = [_row(a, b, None, None) for a in NODES for b in NODES if a != b]
    _assert_real_png(plot_link_matrix(blank, tmp_path / "blank.png"), min_colours=5)
    _assert_real_png(plot_link_matrix([], tmp_path / "empty.png"), min_colours=5)


def test_matrix_row_without_node_names_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no src/dst"):
        plot_link_matrix([{"dst": "b", "rtt_p50_ms": 1.0}], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _spans() -> list[SyncSpan]:
    mb32 = 32_000_000
    return [
        SyncSpan("hk-1", "origin", 0.1, 4.0, mb32, 9_000_000, 9_400_000),
        SyncSpan("hk-2", "peer", 4.1, 4.9, mb32, 9_000_000, 12_000),
        SyncSpan("hk-2", "naive", 5.0, 9.0, mb32, 9_000_000, 9_300_000),
        SyncSpan("hk-3", "shared", 9.1, 9.1, mb32, 0, None),  # zero length: a sliver
    ]


def test_transfer_timeline_png_is_a_real_nonblank_image(tmp_path: Path) -> None:
    pixels = _assert_real_png(
        plot_transfer_timeline(_spans(), tmp_path / "timeline.png"), min_colours=30
    )
    # Every kind's colour is on the image (bars, legend).
    rgb = (pixels[..., :3] * 255).round().astype(int).reshape(-1, 3)
    for colour in ((0xD6, 0x27, 0x28), (0x2C, 0xA0, 0x2C), (0x7F, 0x7F, 0x7F), (0x1F, 0x77, 0xB4)):
        assert (np.abs(rgb - colour).sum(axis=1) <= 3).sum() > 100, colour


def test_empty_timeline_still_plots(tmp_path: Path) -> None:
    _assert_real_png(plot_transfer_timeline([], tmp_path / "none.png"), min_colours=5)


def test_span_label_gives_sizes_and_rate() -> None:
    span = SyncSpan("hk-1", "origin", 1.0, 3.0, 25_000_000, 10_000_000, 10_500_000)
    assert span.duration_s == 2.0
    assert span.goodput_mbps == pytest.approx(100.0)
    assert span_label(span) == "25.0 MB · wire 10.0 MB · border 10.5 MB · 100.0 Mbit/s"
    instant = SyncSpan("hk-2", "peer", 3.0, 3.0, 1_000_000, 0, None)
    assert instant.goodput_mbps is None
    assert span_label(instant) == "1.0 MB · wire 0.0 MB · - Mbit/s"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"started_s": 5.0, "ended_s": 2.0}, "negative duration"),
        ({"started_s": -1.0}, "started_s must be a finite number >= 0"),
        ({"ended_s": float("nan")}, "ended_s must be a finite number >= 0"),
        ({"logical_bytes": -1}, "logical_bytes must be >= 0"),
        ({"border_bytes": -5}, "border_bytes must be >= 0"),
        ({"kind": ""}, "non-empty"),
    ],
)
def test_bad_sync_span_is_refused_with_a_clear_message(
    kwargs: dict[str, Any], message: str
) -> None:
    fields: dict[str, Any] = {
        "node": "hk-1",
        "kind": "origin",
        "started_s": 0.0,
        "ended_s": 1.0,
        "logical_bytes": 1,
        "wire_bytes": 1,
        "border_bytes": None,
    }
    with pytest.raises(ValueError, match=message):
        SyncSpan(**(fields | kwargs))


def test_timeline_refuses_items_that_are_not_spans(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not a SyncSpan"):
        plot_transfer_timeline([{"node": "hk-1"}], tmp_path / "t.png")  # type: ignore[list-item]

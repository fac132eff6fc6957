"""Loss is never shown as a bare 0: ``loss_text`` and where it is used."""

from __future__ import annotations

import pytest

from netopt.demo.plots import matrix_grid
from netopt.measure.losstext import loss_text


@pytest.mark.parametrize(
    ("ratio", "probes", "text"),
    [
        (0.0, 100, "0 (< 3.7%)"),  # the example: a 0.5% link, 100 probes
        (0.0, 10_000, "0 (< 0.038%)"),
        (0.01, 1000, "1% (0.54-1.8%)"),
        (0.3, 50, "30% (19-44%)"),
        (0.02, None, "2%"),
        (None, 100, "n/a"),
    ],
)
def test_loss_text(ratio: float | None, probes: int | None, text: str) -> None:
    assert loss_text(ratio, probes) == text


def test_compact_cells_keep_the_bound() -> None:
    assert loss_text(0.0, 100, compact=True) == "<3.7%"
    assert loss_text(0.012, 1000, compact=True) == "1.2%"


def test_the_heatmap_labels_a_zero_with_its_bound() -> None:
    rows = [
        {"src": "a", "dst": "b", "rtt_p50_ms": 1.0, "window": {"loss_ratio": 0.0,
                                                              "probes_sent": 100}},
        {"src": "b", "dst": "a", "rtt_p50_ms": 1.0, "window": {"loss_ratio": 0.02,
                                                              "probes_sent": 500}},
    ]  # fmt: skip
    grid = matrix_grid(rows)
    assert grid.loss_pct[0][1] == 0.0
    assert grid.loss_labels[0][1] == "<3.7%"
    assert grid.loss_labels[1][0] == "2%"
    assert grid.loss_labels[0][0] is None

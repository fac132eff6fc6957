"""PNG plots for ``netopt demo``'s report directory: the link matrix and the transfers.

Two layers: pure functions turn the report's data into what is drawn
(:func:`matrix_grid`, :func:`span_label`), and the ``plot_*`` functions render it
with matplotlib's Agg canvas (no global pyplot state, no display needed) and
write the PNG atomically. matplotlib is imported inside the plot functions so
the CLI starts without it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netopt.fsutil import atomic_write_bytes
from netopt.measure.losstext import loss_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "KIND_COLOURS",
    "MatrixGrid",
    "SyncSpan",
    "matrix_grid",
    "plot_link_matrix",
    "plot_transfer_timeline",
    "span_label",
]

KIND_COLOURS: Mapping[str, str] = {
    "origin": "#d62728",  # across the border from the origin
    "peer": "#2ca02c",  # from a peer in the node's own region
    "shared": "#1f77b4",  # region-aware sharing: peers first, the border once
    "naive": "#7f7f7f",  # each node straight from the origin, for comparison
}
_OTHER_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e")
_DPI = 100


@dataclass(frozen=True)
class SyncSpan:
    """One sync of the demo's transfer phase, as the timeline draws it.

    ``started_s``/``ended_s`` are seconds since the transfer phase started;
    ``logical_bytes`` is the dataset as the node sees it, ``wire_bytes`` what the
    sync received (compressed), ``border_bytes`` what crossed a region border
    during it (None where nothing counted it). Raises ValueError on a negative
    or non-finite time, an end before the start, or a negative byte count.
    """

    node: str
    kind: str
    started_s: float
    ended_s: float
    logical_bytes: int
    wire_bytes: int
    border_bytes: int | None = None

    def __post_init__(self) -> None:
        what = f"sync of {self.node or '?'} ({self.kind or '?'})"
        if not self.node or not self.kind:
            raise ValueError(f"{what}: node and kind must be non-empty")
        for name, value in (("started_s", self.started_s), ("ended_s", self.ended_s)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{what}: {name} must be a finite number >= 0, not {value}")
        if self.ended_s < self.started_s:
            raise ValueError(
                f"{what} has a negative duration: ended_s {self.ended_s:g} < "
                f"started_s {self.started_s:g}"
            )
        for name, count in (
            ("logical_bytes", self.logical_bytes),
            ("wire_bytes", self.wire_bytes),
            ("border_bytes", self.border_bytes),
        ):
            if count is not None and count < 0:
                raise ValueError(f"{what}: {name} must be >= 0, not {count}")

    @property
    def duration_s(self) -> float:
        """Seconds the sync took."""
        return self.ended_s - self.started_s

    @property
    def goodput_mbps(self) -> float | None:
        """Logical Mbit/s (the dataset over the duration); None for a zero duration."""
        if self.duration_s <= 0:
            return None
        return self.logical_bytes * 8 / self.duration_s / 1e6


def span_label(span: SyncSpan) -> str:
    """The annotation next to a sync's bar: MB, wire MB, border MB, Mbit/s."""
    parts = [f"{span.logical_bytes / 1e6:.1f} MB", f"wire {span.wire_bytes / 1e6:.1f} MB"]
    if span.border_bytes is not None:
        parts.append(f"border {span.border_bytes / 1e6:.1f} MB")
    rate = span.goodput_mbps
    parts.append(f"{rate:.1f} Mbit/s" if rate is not None else "- Mbit/s")
    return " · ".join(parts)


@dataclass(frozen=True)
class MatrixGrid:
    """Node x node figures; ``None`` where a pair has no figure (drawn blank).

    ``rtt_ms[i][j]`` and ``loss_pct[i][j]`` are for ``nodes[i] -> nodes[j]``.
    """

    nodes: tuple[str, ...]
    rtt_ms: tuple[tuple[float | None, ...], ...]
    loss_pct: tuple[tuple[float | None, ...], ...]
    loss_labels: tuple[tuple[str | None, ...], ...] = ()
    """The loss cells' text (``loss_text``, compact: "<3.7%" for 0 lost of 100 probes)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _row_loss_ratio(row: Mapping[str, Any]) -> float | None:
    # The window's pooled loss counts more probes than the latest summary alone.
    window = row.get("window")
    if isinstance(window, Mapping):
        pooled = _number(window.get("loss_ratio"))
        if pooled is not None:
            return pooled
    return _number(row.get("loss_ratio"))


def matrix_grid(
    rows: Iterable[Mapping[str, Any]], nodes: Sequence[str] | None = None
) -> MatrixGrid:
    """Arrange report matrix rows (``src``, ``dst``, ``rtt_p50_ms``, ``loss_ratio``,
    ``window``) on a node x node grid.

    RTT is the latest p50; loss is the window's pooled ratio (the latest one where
    the window has none), as a percentage. ``nodes`` fixes the order (default:
    every node named, sorted); rows naming other nodes are ignored. Missing,
    null or non-numeric figures become None. Raises ValueError for a row without
    ``src``/``dst``.
    """
    row_list = list(rows)
    for i, row in enumerate(row_list):
        if not isinstance(row.get("src"), str) or not isinstance(row.get("dst"), str):
            raise ValueError(f"matrix row {i} has no src/dst node names: {dict(row)!r}")
    if nodes is None:
        nodes = sorted({row["src"] for row in row_list} | {row["dst"] for row in row_list})
    order = tuple(nodes)
    index = {node: i for i, node in enumerate(order)}
    rtt: list[list[float | None]] = [[None] * len(order) for _ in order]
    loss: list[list[float | None]] = [[None] * len(order) for _ in order]
    labels: list[list[str | None]] = [[None] * len(order) for _ in order]
    for row in row_list:
        src_i, dst_i = index.get(row["src"]), index.get(row["dst"])
        if src_i is None or dst_i is None:
            continue
        i, j = src_i, dst_i
        rtt[i][j] = _number(row.get("rtt_p50_ms"))
        ratio = _row_loss_ratio(row)
        loss[i][j] = None if ratio is None else 100.0 * ratio
        if ratio is not None:
            labels[i][j] = loss_text(ratio, _row_probes(row), compact=True)
    return MatrixGrid(
        order, tuple(map(tuple, rtt)), tuple(map(tuple, loss)), tuple(map(tuple, labels))
    )


def _row_probes(row: Mapping[str, Any]) -> float | None:
    window = row.get("window")
    return _number(window.get("probes_sent")) if isinstance(window, Mapping) else None


def _render_png(figure: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg, no pyplot state
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _heatmap(
    axes: Axes,
    grid: MatrixGrid,
    values: tuple[tuple[float | None, ...], ...],
    title: str,
    digits: int,
    labels: tuple[tuple[str | None, ...], ...] = (),
) -> None:
    import matplotlib as mpl
    import numpy as np

    data = np.array([[math.nan if v is None else v for v in row] for row in values], dtype=float)
    finite = data[np.isfinite(data)]
    vmax = max(float(finite.max()) if finite.size else 0.0, 1.0)
    cmap = mpl.colormaps["viridis"].with_extremes(bad="#eeeeee")
    image = axes.imshow(
        np.ma.masked_invalid(data), cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest"
    )
    axes.figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    ticks = list(range(len(grid.nodes)))
    axes.set_xticks(ticks, grid.nodes, rotation=45, ha="right")
    axes.set_yticks(ticks, grid.nodes)
    axes.set_xlabel("to (dst)")
    axes.set_ylabel("from (src)")
    axes.set_title(title)
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            if value is None:
                if i != j:
                    axes.text(j, i, "n/a", ha="center", va="center", color="#888888", fontsize=8)
                continue
            colour = "black" if value / vmax > 0.6 else "white"
            text = (labels[i][j] if labels else None) or f"{value:.{digits}f}"
            axes.text(j, i, text, ha="center", va="center", color=colour, fontsize=9)


def plot_link_matrix(
    matrix_rows: Iterable[Mapping[str, Any]],
    path: str | Path,
    *,
    nodes: Sequence[str] | None = None,
    title: str = "netopt demo: measured link matrix",
) -> Path:
    """Write a two-panel heatmap PNG (RTT p50 in ms, loss in %) over node x node.

    ``matrix_rows`` are shaped like ``DemoReport.matrix`` (see :func:`matrix_grid`);
    pairs without a figure are drawn as grey, blank cells, and no rows at all
    give a figure that says so. Returns the path. Raises ValueError for a row
    without node names and StorageError when the file cannot be written.
    """
    from matplotlib.figure import Figure

    grid = matrix_grid(matrix_rows, nodes)
    side_in = max(4.0, 0.9 * len(grid.nodes) + 2.0)
    figure = Figure(figsize=(2 * side_in + 1.5, side_in + 0.8), dpi=_DPI, layout="constrained")
    figure.suptitle(title)
    rtt_axes, loss_axes = figure.subplots(1, 2)
    if not grid.nodes:
        for axes in (rtt_axes, loss_axes):
            axes.set_axis_off()
            axes.text(0.5, 0.5, "no link measurements", ha="center", va="center")
    else:
        _heatmap(rtt_axes, grid, grid.rtt_ms, "RTT p50 (ms)", digits=1)
        _heatmap(
            loss_axes, grid, grid.loss_pct, "loss (%), 95% upper end where 0 lost", digits=2,
            labels=grid.loss_labels,
        )  # fmt: skip
    return _render_png(figure, Path(path))


def _kind_colours(kinds: Iterable[str]) -> dict[str, str]:
    colours: dict[str, str] = {}
    others = iter(_OTHER_COLOURS * 10)
    for kind in kinds:
        if kind not in colours:
            colours[kind] = KIND_COLOURS.get(kind) or next(others, "#444444")
    return colours


def plot_transfer_timeline(
    syncs: Sequence[SyncSpan],
    path: str | Path,
    *,
    title: str = "netopt demo: transfer timeline",
) -> Path:
    """Write a horizontal bar timeline PNG: one bar per sync, top to bottom in order.

    Bars run from ``started_s`` to ``ended_s``, coloured by kind (origin, peer,
    shared, naive; other kinds get colours of their own) and annotated with
    :func:`span_label`. No syncs give a figure that says so. Returns the path.
    Raises TypeError for an item that is not a SyncSpan and StorageError when
    the file cannot be written.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    spans = list(syncs)
    for i, span in enumerate(spans):
        if not isinstance(span, SyncSpan):
            raise TypeError(f"syncs[{i}] is a {type(span).__name__}, not a SyncSpan")
    figure = Figure(figsize=(11.0, 1.6 + 0.55 * max(len(spans), 2)), dpi=_DPI, layout="constrained")
    axes = figure.subplots()
    axes.set_title(title)
    if not spans:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no transfers", ha="center", va="center")
        return _render_png(figure, Path(path))
    colours = _kind_colours(span.kind for span in spans)
    end_s = max(max(span.ended_s for span in spans), 1e-3)
    for y, span in enumerate(spans):
        # A zero-length bar would vanish: draw at least a sliver of the axis.
        width = max(span.duration_s, end_s * 0.004)
        axes.barh(y, width, left=span.started_s, height=0.6, color=colours[span.kind])
        axes.text(
            span.started_s + width + end_s * 0.01, y, span_label(span), va="center", fontsize=8
        )
    axes.set_yticks(range(len(spans)), [f"{s.node} ({s.kind})" for s in spans])
    axes.invert_yaxis()
    axes.set_xlim(0.0, end_s * 1.6)  # room for the labels right of the bars
    axes.set_xlabel("seconds since the transfer phase started")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(
        handles=[Patch(color=colour, label=kind) for kind, colour in colours.items()],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    return _render_png(figure, Path(path))

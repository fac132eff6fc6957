"""Loss as people read it: never a bare 0, always with what the probes can tell.

A window of 100 probes with none lost says only that the loss is under ~3.7% (the
upper end of its 95% Wilson interval); showing "0" would claim a clean link. Every
place that shows a loss ratio (``netopt status``, the demo's table and heatmap) uses
:func:`loss_text`.
"""

from __future__ import annotations

from netopt.measure.stats import wilson_interval

__all__ = ["loss_text"]


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.2g}" if ratio < 0.1 else f"{100 * ratio:.0f}"


def loss_text(ratio: float | None, probes: int | float | None, *, compact: bool = False) -> str:
    """``"0 (< 3.7%)"`` for 0 lost of 100, ``"1.2% (0.62-2.3%)"`` otherwise, ``"n/a"``
    without a ratio; without a probe count the ratio alone (``"1.2%"``). ``compact``
    drops the brackets (``"<3.7%"``, ``"1.2%"``) for heatmap cells."""
    if ratio is None:
        return "n/a"
    if not probes or probes <= 0:
        return f"{_pct(ratio)}%"
    trials = int(probes)
    lost = max(0, min(trials, round(ratio * trials)))
    low, high = wilson_interval(lost, trials)
    if lost == 0:
        return f"<{_pct(high)}%" if compact else f"0 (< {_pct(high)}%)"
    if compact:
        return f"{_pct(ratio)}%"
    return f"{_pct(ratio)}% ({_pct(low)}-{_pct(high)}%)"

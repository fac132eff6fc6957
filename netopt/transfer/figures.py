"""The link figures a fetch is planned with, and where each came from. Pure.

A plan is only as good as its figures, so each one carries its source: the RTT from
real round trips on the connection to the server (a handshake that really happened,
a request's time to first byte), the rate and loss from the coordinator's measured
link between the two nodes, from flags, or from this client's own rate limit. With
none of those the rate is a default guess, said so, and the adaptive level
(`netopt.transfer.adapt`) corrects what the guess got wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from netopt.transfer.planner import CongestionControl, LinkProfile

__all__ = [
    "DEFAULT_RATE_BPS",
    "RATE_GUESS",
    "Figure",
    "LinkFigures",
    "choose_figures",
]

DEFAULT_RATE_BPS = 1e9
RATE_GUESS = (
    "default guess (1 Gbit/s: no coordinator measurement, --link-rate-mbps or "
    "--rate-limit-mbps); the level adapts to the link while the transfer runs"
)
LOSS_GUESS = "assumed 0 (no coordinator measurement or --link-loss)"


@dataclass(frozen=True)
class Figure:
    """One figure and where it came from."""

    value: float
    source: str

    def to_dict(self) -> dict[str, object]:
        return {"value": round(self.value, 6), "source": self.source}


@dataclass(frozen=True)
class LinkFigures:
    """What a plan assumes of the link. ``measured``: the coordinator's link, kept for its
    single-stream figure."""

    rtt_ms: Figure
    rate_bps: Figure
    loss_ratio: Figure
    measured: LinkProfile | None = None
    notes: tuple[str, ...] = ()
    """Why a source was not used (the coordinator had no figures for the pair, say)."""

    @property
    def rate_known(self) -> bool:
        """False when the rate is the default guess."""
        return self.rate_bps.source != RATE_GUESS

    def link(self, congestion_control: CongestionControl) -> LinkProfile:
        """The figures as the planner's input."""
        return LinkProfile(
            rate_bps=self.rate_bps.value,
            rtt_ms=max(self.rtt_ms.value, 0.1),
            loss_ratio=self.loss_ratio.value,
            congestion_control=congestion_control,
            single_stream_bps=self.measured.single_stream_bps if self.measured else None,
        )

    def describe(self) -> str:
        """One line for the plan's reasons."""
        return (
            f"link figures: rtt {self.rtt_ms.value:.2f} ms ({self.rtt_ms.source}), rate "
            f"{self.rate_bps.value / 1e6:g} Mbit/s ({self.rate_bps.source}), loss "
            f"{self.loss_ratio.value:g} ({self.loss_ratio.source})"
        )

    def to_dict(self) -> dict[str, object]:
        """``link_figures`` of ``netopt sync --json``."""
        out: dict[str, object] = {
            "rtt_ms": self.rtt_ms.to_dict(),
            "rate_bps": self.rate_bps.to_dict(),
            "loss_ratio": self.loss_ratio.to_dict(),
        }
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def choose_figures(
    rtt: Figure,
    *,
    rate_flag_bps: float | None = None,
    loss_flag: float | None = None,
    measured: LinkProfile | None = None,
    measured_source: str = "coordinator",
    rate_limit_bps: float | None = None,
) -> LinkFigures:
    """The figures to plan with, each from the best source there is.

    RTT: ``rtt`` (this connection's own round trips; the coordinator's only when none
    was measured, value 0). Rate: the flag, else the coordinator's ``measured`` link,
    else the default guess; this client's rate limit caps it. Loss: the flag, else the
    measured link, else 0.
    """
    if rtt.value <= 0 and measured is not None:
        rtt = Figure(measured.rtt_ms, measured_source)
    if rate_flag_bps is not None:
        rate = Figure(rate_flag_bps, "--link-rate-mbps")
    elif measured is not None:
        rate = Figure(measured.rate_bps, measured_source)
    else:
        rate = Figure(DEFAULT_RATE_BPS, RATE_GUESS)
    if rate_limit_bps is not None and (rate_limit_bps < rate.value or rate.source == RATE_GUESS):
        rate = Figure(rate_limit_bps, "--rate-limit-mbps (this client's limit)")
    if loss_flag is not None:
        loss = Figure(loss_flag, "--link-loss")
    elif measured is not None:
        loss = Figure(measured.loss_ratio, measured_source)
    else:
        loss = Figure(0.0, LOSS_GUESS)
    return LinkFigures(rtt, rate, loss, measured)

"""Fewer all-reduces per sample: gradient accumulation and local SGD with model averaging.

Pure: times in, advice out. ``comm_s`` is a step's predicted gradient
all-reduce (``advice.step_comm_s``), ``compute_s`` the step's compute.

- **Gradient accumulation**: ``DDP.no_sync()`` for K-1 of K micro-batches, so
  one all-reduce carries K micro-batches' gradients; the comm share becomes
  ``comm / (comm + K x compute)``. K is the smallest that reaches the target.
- **Local SGD** (``post_localSGD_hook`` + ``PeriodicModelAverager``): every step
  all-reduces gradients inside the region only; every ``H`` steps the models
  are averaged across all ranks (the one border crossing). ``H`` is the smallest
  period that brings the border's share under the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "LOCALSGD_WARMUP_STEPS",
    "MAX_MICRO_BATCHES",
    "MAX_PERIOD_STEPS",
    "Accumulation",
    "Averaging",
    "accumulation",
    "averaging",
    "smallest_multiplier",
]

MAX_MICRO_BATCHES = 64
"""Beyond this the effective batch changes training more than a faster link would."""
MAX_PERIOD_STEPS = 64
"""Local SGD's published results hold for periods of a few to tens of steps."""
LOCALSGD_WARMUP_STEPS = 1000
"""Synchronous steps before local SGD starts (post-local SGD, Lin et al. 2020)."""


@dataclass(frozen=True)
class Accumulation:
    """``DDP.no_sync()`` for ``micro_batches - 1`` of every ``micro_batches`` micro-batches."""

    micro_batches: int
    comm_share_before: float
    comm_share_after: float
    reason: str


@dataclass(frozen=True)
class Averaging:
    """``post_localSGD_hook`` with the region as its subgroup, and a model averager."""

    period_steps: int
    warmup_steps: int
    comm_share_after: float
    reason: str
    caveat: str


def smallest_multiplier(comm_s: float, compute_s: float, target_share: float) -> int:
    """The least ``m >= 1`` with ``comm / (comm + m x compute) <= target`` (no cap)."""
    if comm_s <= 0:
        return 1
    needed = comm_s * (1 - target_share) / (target_share * compute_s)
    # a hair below an integer is that integer (float error), not the next one
    return max(1, math.ceil(needed - 1e-9))


def _share(comm_s: float, compute_s: float) -> float:
    return comm_s / (comm_s + compute_s) if comm_s + compute_s > 0 else 0.0


def accumulation(comm_s: float, compute_s: float, target_share: float) -> Accumulation | None:
    """K for gradient accumulation, or None when the step already meets the target."""
    before = _share(comm_s, compute_s)
    if before <= target_share:
        return None
    wanted = smallest_multiplier(comm_s, compute_s, target_share)
    k = min(wanted, MAX_MICRO_BATCHES)
    after = _share(comm_s, k * compute_s)
    short = (
        f" (the target needs K={wanted}: more than {MAX_MICRO_BATCHES} changes the training "
        "too much to advise)"
        if wanted > k
        else ""
    )
    reason = (
        f"if the job can take a larger batch per all-reduce: K={k} micro-batches per "
        f"optimizer step, DDP.no_sync() for the first {k - 1}, brings communication from "
        f"{before:.0%} to {after:.0%} of the time{short}. The effective batch becomes "
        f"{k} x the per-rank batch x the world size, with {k} x fewer optimizer steps per "
        f"epoch: divide each micro-batch's loss by {k}, and scale the learning rate by {k} "
        f"(linear scaling, with warm-up) to keep the progress per sample; where the batch "
        f"size must stay as it is, accumulation does not apply"
    )
    return Accumulation(k, before, after, reason)


def averaging(
    global_s: float, region_s: float, compute_s: float, target_share: float
) -> Averaging | None:
    """H for local SGD over regions, or None when in-region sync alone misses the target.

    ``global_s``: averaging the model across all ranks (the border crossing);
    ``region_s``: a step's gradient all-reduce inside the largest region.
    """
    per_step_s = compute_s + region_s
    # (region + global/H) / (step + global/H) <= t
    #   <=>  H >= global (1-t) / (t compute - (1-t) region)
    spare_s = target_share * compute_s - (1 - target_share) * region_s
    if spare_s <= 0:
        return None  # the region's own link bounds the step: averaging cannot help
    wanted = max(1, math.ceil(global_s * (1 - target_share) / spare_s - 1e-9))
    period = min(max(2, wanted), MAX_PERIOD_STEPS)
    after = (region_s + global_s / period) / (per_step_s + global_s / period)
    reason = (
        f"post_localSGD_hook(PostLocalSGDState(subgroup=<this rank's region>, "
        f"start_localSGD_iter={LOCALSGD_WARMUP_STEPS})) with "
        f"PeriodicModelAverager(period={period}, warmup_steps={LOCALSGD_WARMUP_STEPS}) "
        f"after each optimizer step: "
        f"gradients all-reduced inside the region every step ({region_s:.3g}s), the models "
        f"averaged across regions every {period} steps ({global_s:.3g}s each): communication "
        f"{after:.0%} of the time"
        + (f" (the target needs H={wanted}, above {MAX_PERIOD_STEPS})" if wanted > period else "")
        + " (netopt.torch.apply_local_sgd builds it from the regions)"
    )
    caveat = (
        "local SGD is not the same optimisation as synchronous SGD: between averages the "
        "regions' models drift apart, so loss per step can be worse, more so with longer "
        "periods, higher learning rates and more heterogeneous data; start it after "
        "synchronous warm-up steps and compare the loss curve against a synchronous run"
    )
    return Averaging(period, LOCALSGD_WARMUP_STEPS, after, reason, caveat)

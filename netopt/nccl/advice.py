"""Training-script advice: the process-group timeout and the DDP communication hook.

The hook is chosen from the predicted share of communication in a step,
``T_comm / (T_comm + T_compute)``, counting DDP's gradient buckets one after
another and no overlap with the backward pass (an upper bound: DDP overlaps
some of it). The least lossy hook that brings the share under ``TARGET_SHARE``
wins: none, then ``bf16_compress_hook`` (half the bytes), then PowerSGD with the
largest matrix-approximation rank that fits. Beside the hook: gradient
accumulation (K micro-batches per all-reduce) when the share is over the
target, and local SGD over the regions when even PowerSGD leaves it over
(``nccl.fewer_syncs``).

Across regions the hook's all-reduces can go through the region hierarchy
(reduce inside the region, one exchange between the region leaders, broadcast):
PowerSGD's two small all-reduces per bucket then wait on the border's latency
twice, not ``2(n-1)`` times each, and ``hierarchical_powerSGD_hook`` is advised
where that is predicted faster. DDP's ``bucket_cap_mb`` is chosen so that the
buckets' communication overlaps the backward pass (:func:`overlap_buckets`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from netopt.nccl import glooplan
from netopt.nccl.costmodel import Fabric, predict, ring_allreduce_s
from netopt.nccl.fewer_syncs import accumulation, averaging
from netopt.nccl.model import Advice, TuneOptions

__all__ = [
    "ALTERNATING_RANK_FACTOR",
    "BACKWARD_SHARE",
    "BUCKET_CAPS_MB",
    "POWERSGD_RANKS",
    "TARGET_SHARE",
    "TORCH_DEFAULT_NCCL_TIMEOUT_S",
    "advise",
    "hierarchical_allreduce_s",
    "overlap_buckets",
    "step_comm_s",
]

TARGET_SHARE = 0.25
"""Communication share of a step we aim to stay under."""
POWERSGD_RANKS = (32, 16, 8, 4, 2, 1)
TORCH_DEFAULT_NCCL_TIMEOUT_S = 600
"""PyTorch's default init_process_group timeout for NCCL (10 minutes)."""
NCCL_ALGORITHMS = ("ring", "tree")
BACKWARD_SHARE = 2 / 3
"""The backward pass's share of a step's compute (backward costs about 2 x forward)."""
BUCKET_CAPS_MB = (25, 16, 8, 4, 2, 1)
"""The ``bucket_cap_mb`` values weighed, DDP's default (25) first."""
MIB = 2**20
ALTERNATING_RANK_FACTOR = 2
"""The alternating variant is weighed and advised at this multiple of the rank chosen
for PowerSGD's two exchanges: it advances the power iteration half a step per step, so
at the same rank it approximates the gradient worse. Measured on ``netopt bench train``
(20 steps, the loss after them against uncompressed training): PowerSGD rank 4 +0.8%,
the alternating variant rank 4 +2.9%, rank 8 +1.6% (README)."""


def _best_nccl_s(fabric: Fabric, size_bytes: int) -> float:
    times = predict(fabric, size_bytes)
    return min(times[a] for a in NCCL_ALGORITHMS)


def step_comm_s(fabric: Fabric, grad_bytes: int, bucket_bytes: int) -> float:
    """All-reduce time (s) of ``grad_bytes`` sent as DDP buckets of ``bucket_bytes``."""
    if grad_bytes <= 0:
        return 0.0
    full, rest = divmod(grad_bytes, bucket_bytes)
    total = full * _best_nccl_s(fabric, bucket_bytes)
    return total + (_best_nccl_s(fabric, rest) if rest else 0.0)


def hierarchical_allreduce_s(fabric: Fabric, size_bytes: float) -> float | None:
    """Region reduce, the leaders' ring over the border, region broadcast (None: one region)."""
    if fabric.wan is None or len(fabric.region_sizes) < 2:
        return None
    local = 0.0
    if fabric.local is not None and max(fabric.region_sizes) > 1:
        local = 2 * (fabric.local.alpha_s + size_bytes * 8 / fabric.local.rate_bps)
    regions = len(fabric.region_sizes)
    return local + ring_allreduce_s(regions, size_bytes, fabric.wan.alpha_s, fabric.wan.rate_bps)


def overlap_buckets(
    grad_bytes: int, backward_s: float, bucket_s: Callable[[int], float]
) -> tuple[int, float, float]:
    """The ``bucket_cap_mb`` whose communication leaves the least of it after backward.

    Model: gradients become ready evenly over ``backward_s``, a bucket's collective
    (``bucket_s(bytes)``) starts when its gradients are ready and the previous
    bucket's is done. Returns (cap in MiB, exposed seconds at that cap, exposed at
    DDP's default 25); ties go to the larger cap (fewer collectives).
    """

    def exposed(cap_mb: int) -> float:
        cap = cap_mb * MIB
        sizes = [cap] * (grad_bytes // cap) + ([grad_bytes % cap] if grad_bytes % cap else [])
        done, ready = 0.0, 0.0
        for size in sizes:
            ready += backward_s * size / grad_bytes
            done = max(done, ready) + bucket_s(size)
        return max(0.0, done - backward_s)

    default = exposed(BUCKET_CAPS_MB[0])
    best = min(BUCKET_CAPS_MB, key=lambda c: (round(exposed(c), 3), -c))
    return best, exposed(best), default


def _share(comm_s: float, compute_s: float) -> float:
    return comm_s / (comm_s + compute_s) if comm_s + compute_s > 0 else 0.0


@dataclass(frozen=True)
class _Choice:
    """The hook, its rank, why, the share it leaves, and DDP's bucket cap with why."""

    hook: str
    rank: int | None
    reason: str
    after: float
    cap_mb: int
    bucket_reason: str
    alternate: bool = False


def advise(
    fabric: Fabric, options: TuneOptions, retry_window_s: float, max_outage_s: float
) -> Advice:
    """Advice for ``fabric``: timeout always, a hook when the model size and step time are given.

    ``options.backend == "gloo"``: the hook, rank and bucket cap from
    :mod:`netopt.nccl.glooplan` (Gloo's per-message waits, the backward pass simulated);
    ``fabric`` should then count one flow per pair, as Gloo opens.
    """
    grad_bytes = (options.params or 0) * options.grad_bytes_per_param
    if options.backend == "gloo":
        layout = _layout(options)
        comm_s = glooplan.total_s(
            fabric, "none", glooplan.ddp_buckets(layout, options.bucket_bytes)
        )
    else:
        comm_s = step_comm_s(fabric, grad_bytes, options.bucket_bytes)
    wanted = 2 * retry_window_s + 3 * max_outage_s + 20 * comm_s
    timeout_s = max(TORCH_DEFAULT_NCCL_TIMEOUT_S, math.ceil(wanted / 60) * 60)
    timeout_reason = (
        f"timeout={timeout_s}s covers 2 x the {retry_window_s:.0f}s connect-retry window, "
        f"3 x the longest outage seen ({max_outage_s:g}s) and 20 x a step's "
        f"all-reduce ({comm_s:.2f}s); never below PyTorch's 600s default for NCCL"
    )
    if options.params is None or options.step_compute_ms is None:
        return Advice(
            timeout_s=timeout_s,
            timeout_reason=timeout_reason,
            hook="none",
            hook_reason="no --params/--step-compute-ms given: cannot predict the comm share",
        )
    compute_s = options.step_compute_ms / 1000
    share = _share(comm_s, compute_s)
    if options.backend == "gloo":
        choice = _gloo_choice(fabric, _layout(options), share, compute_s)
    else:
        choice = _nccl_choice(fabric, options, grad_bytes, share, compute_s)
    local_averaging = None
    if choice.after > TARGET_SHARE and len(fabric.region_sizes) > 1:
        region_s = _region_comm_s(fabric, grad_bytes, options.bucket_bytes)
        local_averaging = averaging(comm_s, region_s, compute_s, TARGET_SHARE)
    return Advice(
        timeout_s=timeout_s,
        timeout_reason=timeout_reason,
        hook=choice.hook,
        hook_reason=choice.reason,
        powersgd_rank=choice.rank,
        comm_share=share,
        accumulation=accumulation(comm_s, compute_s, TARGET_SHARE),
        averaging=local_averaging,
        bucket_cap_mb=choice.cap_mb,
        bucket_reason=choice.bucket_reason,
        powersgd_alternate=choice.alternate,
    )


def _layout(options: TuneOptions) -> tuple[tuple[int, int], ...]:
    if options.grad_layout is not None:
        return options.grad_layout
    return glooplan.uniform_layout(options.params or 0, options.layer_dim)


def _nccl_choice(
    fabric: Fabric, options: TuneOptions, grad_bytes: int, share: float, compute_s: float
) -> _Choice:
    def share_with(factor: float, allreduces: int = 1) -> float:
        size = int(grad_bytes * factor / allreduces)
        return _share(allreduces * step_comm_s(fabric, size, options.bucket_bytes), compute_s)

    hook, rank, reason, after = _pick_hook(share, share_with, options.layer_dim)
    per_bucket = functools.partial(_bucket_comm_s, fabric, hook, rank, options.layer_dim)
    if hook == "powerSGD_hook" and rank is not None:
        flat = sum(per_bucket(b) for b in _bucket_sizes(grad_bytes, options.bucket_bytes))
        hier = functools.partial(_bucket_comm_s, fabric, "hierarchical_powerSGD_hook", rank,
                                 options.layer_dim)  # fmt: skip
        two_level = sum(hier(b) for b in _bucket_sizes(grad_bytes, options.bucket_bytes))
        if two_level < flat:
            hook, per_bucket = "hierarchical_powerSGD_hook", hier
            after = _share(two_level, compute_s)
            reason += (
                f"; its P and Q all-reduces through the region hierarchy (reduce in the "
                f"region, the leaders' exchange, broadcast) take {two_level:.3g}s a step "
                f"instead of a flat ring's {flat:.3g}s ({after:.0%} of a step): "
                f"apply_comm_hook(model, 'hierarchical_powerSGD_hook', regions=..., "
                f"powersgd_rank={rank})"
            )
    backward_s = BACKWARD_SHARE * compute_s
    cap, exposed_s, default_s = overlap_buckets(grad_bytes, backward_s, per_bucket)
    return _Choice(hook, rank, reason, after, cap, _bucket_text(cap, backward_s, exposed_s,
                   default_s if cap != 25 else None, ""))  # fmt: skip


def _bucket_text(
    cap: int, backward_s: float, exposed_s: float, default_s: float | None, why: str
) -> str:
    return (
        f"DDP(bucket_cap_mb={cap}, gradient_as_bucket_view=True): each bucket's all-reduce "
        f"starts when its gradients are ready in the backward pass ({backward_s:.3g}s "
        f"predicted); {exposed_s:.3g}s of communication predicted left after it"
        + (f" (DDP's default 25 MiB leaves {default_s:.3g}s)" if default_s is not None else "")
        + why
        + "; gradient_as_bucket_view saves one copy of the gradients per step"
    )


_GLOO_NAMES = {
    "none": "none", "bf16": "bf16_compress_hook", "powersgd": "powerSGD_hook",
    "hierarchical-powersgd": "hierarchical_powerSGD_hook",
    "hierarchical-powersgd-alternating": "hierarchical_powerSGD_hook",
}  # fmt: skip


def _gloo_choice(
    fabric: Fabric, layout: tuple[tuple[int, int], ...], share: float, compute_s: float
) -> _Choice:
    """Gloo: the least lossy hook whose communication, none of it overlapped, stays
    under the target; PowerSGD's rank and every cap from the backward pass simulated."""
    backward_s = BACKWARD_SHARE * compute_s
    default_buckets = glooplan.ddp_buckets(layout, BUCKET_CAPS_MB[0] * MIB)
    regions = fabric.wan is not None and len(fabric.region_sizes) > 1
    bf16 = _share(glooplan.total_s(fabric, "bf16", default_buckets), compute_s)
    tie = glooplan.tie_s(fabric)
    why = (
        f"; every bucket pays Gloo's fixed waits (each message waits for its receiver's "
        f"ready notice), so caps within one round trip ({tie * 1e3:.3g} ms) of the least "
        f"exposed go to the largest"
    )
    rank: int | None = None
    if share <= TARGET_SHARE:
        hook, reason = "none", f"communication is {share:.0%} of a step: no compression needed"
    elif bf16 <= TARGET_SHARE:
        hook = "bf16"
        reason = f"communication is {share:.0%} of a step; bf16 gradients bring it to {bf16:.0%}"
    else:
        hook = "hierarchical-powersgd" if regions else "powersgd"
        plan = glooplan.choose_rank(fabric, hook, layout, compute_s, backward_s,
                                    BUCKET_CAPS_MB, POWERSGD_RANKS)  # fmt: skip
        rank = plan.rank
        weighed = ", ".join(f"r{r} {s:.3g}s" for r, s in plan.exposed_by_rank)
        reason = (
            f"communication is {share:.0%} of a step (bf16 still {bf16:.0%}); PowerSGD rank "
            f"{rank}: the least predicted step, or a larger rank within "
            f"{glooplan.RANK_PRICE:.0%} of it (exposed after backward: {weighed}; ranks "
            f"under {glooplan.MIN_POWERSGD_RANK} not advised)"
        )
        if regions:
            flat = glooplan.choose_cap(fabric, "powersgd", layout, backward_s, BUCKET_CAPS_MB,
                                       rank)  # fmt: skip
            reason += (
                f"; its P and Q through the region hierarchy (reduce in the region, the "
                f"leaders' exchange, broadcast) leave {plan.cap.exposed_s:.3g}s after "
                f"backward, a flat ring's {flat.exposed_s:.3g}s: apply_comm_hook(model, "
                f"'hierarchical_powerSGD_hook', regions=..., powersgd_rank={rank})"
            )
            alt_rank = min(ALTERNATING_RANK_FACTOR * rank, max(POWERSGD_RANKS))
            alt = _alternating(fabric, layout, compute_s, backward_s, alt_rank, rank,
                               plan.cap.exposed_s)  # fmt: skip
            if alt is not None:
                hook, reason, rank = "hierarchical-powersgd-alternating", reason + alt, alt_rank
    cap = glooplan.choose_cap(fabric, hook, layout, backward_s, BUCKET_CAPS_MB, rank or 4)
    default = glooplan.exposed_s(fabric, hook, default_buckets, backward_s, rank or 4)
    after = _share(cap.exposed_s, compute_s)
    text = _bucket_text(cap.cap_mb, backward_s, cap.exposed_s,
                        default if cap.cap_mb != BUCKET_CAPS_MB[0] else None, why)  # fmt: skip
    return _Choice(_GLOO_NAMES[hook], rank, reason, after, cap.cap_mb, text,
                   alternate=hook.endswith("-alternating"))  # fmt: skip


def _alternating(
    fabric: Fabric, layout: tuple[tuple[int, int], ...], compute_s: float, backward_s: float,
    rank: int, two_exchanges_rank: int, two_exchanges_s: float,
) -> str | None:  # fmt: skip
    """Why the alternating variant (P or Q in turn, one border exchange per bucket) is
    advised at ``rank`` (:data:`ALTERNATING_RANK_FACTOR` x ``two_exchanges_rank``, the
    rank PowerSGD's two exchanges were weighed at), or None where it does not shorten
    the step by more than ``RANK_PRICE``: each step's approximation is one-sided and a
    step behind (half a power iteration a step), left to error feedback, so it must pay
    for itself at a rank that keeps the loss near PowerSGD's."""
    cap = glooplan.choose_cap(fabric, "hierarchical-powersgd-alternating", layout,
                              backward_s, BUCKET_CAPS_MB, rank)  # fmt: skip
    two, one = compute_s + two_exchanges_s, compute_s + cap.exposed_s
    if one >= two * (1 - glooplan.RANK_PRICE):
        return None
    return (
        f"; sending P and Q in turn, one border exchange a bucket and step instead of two "
        f"(apply_comm_hook(..., powersgd_alternate=True)), at rank {rank} "
        f"({ALTERNATING_RANK_FACTOR} x {two_exchanges_rank}), leaves {cap.exposed_s:.3g}s "
        f"after backward instead of {two_exchanges_s:.3g}s; "
        f"each step then projects the mean gradient on one side only, on the subspace "
        f"of the step before (half a power iteration a step), the rest left to error "
        f"feedback: hence the larger rank"
    )


def _bucket_sizes(grad_bytes: int, bucket_bytes: int) -> list[int]:
    full, rest = divmod(grad_bytes, bucket_bytes)
    return [bucket_bytes] * full + ([rest] if rest else [])


def _bucket_comm_s(
    fabric: Fabric, hook: str, rank: int | None, layer_dim: int, size_bytes: int
) -> float:
    """One bucket's communication under ``hook`` (PowerSGD: two all-reduces of P and Q)."""
    factor, allreduces = 1.0, 1
    if hook == "bf16_compress_hook":
        factor = 0.5
    elif rank is not None and "powerSGD" in hook:
        factor, allreduces = min(1.0, 2 * rank / layer_dim), 2
    size = int(size_bytes * factor / allreduces)
    if hook.startswith("hierarchical"):
        two_level = hierarchical_allreduce_s(fabric, size)
        if two_level is not None:
            return allreduces * two_level
    return allreduces * step_comm_s(fabric, size, max(1, size))


def _region_comm_s(fabric: Fabric, grad_bytes: int, bucket_bytes: int) -> float:
    """A step's gradient all-reduce inside the largest region (a ring on the local hop)."""
    ranks = max(fabric.region_sizes)
    if fabric.local is None or ranks < 2 or grad_bytes <= 0:
        return 0.0
    full, rest = divmod(grad_bytes, bucket_bytes)
    alpha, rate = fabric.local.alpha_s, fabric.local.rate_bps
    total = full * ring_allreduce_s(ranks, bucket_bytes, alpha, rate)
    return total + (ring_allreduce_s(ranks, rest, alpha, rate) if rest else 0.0)


def _pick_hook(
    share: float, share_with: Callable[..., float], layer_dim: int
) -> tuple[str, int | None, str, float]:
    """The hook, its PowerSGD rank, why, and the comm share it leaves."""
    if share <= TARGET_SHARE:
        reason = f"communication is {share:.0%} of a step: no compression needed"
        return "none", None, reason, share
    bf16 = share_with(0.5)
    if bf16 <= TARGET_SHARE:
        return (
            "bf16_compress_hook",
            None,
            f"communication is {share:.0%} of a step; bf16 gradients bring it to {bf16:.0%}",
            bf16,
        )
    for rank in POWERSGD_RANKS:
        # PowerSGD sends P and Q (two all-reduces) of about 2*rank/dim of each matrix.
        compressed = share_with(min(1.0, 2 * rank / layer_dim), allreduces=2)
        if compressed <= TARGET_SHARE:
            return (
                "powerSGD_hook",
                rank,
                f"communication is {share:.0%} of a step (bf16 still {bf16:.0%}); "
                f"PowerSGD rank {rank} brings it to {compressed:.0%}",
                compressed,
            )
    lowest = share_with(min(1.0, 2 / layer_dim), allreduces=2)
    return (
        "powerSGD_hook",
        1,
        f"communication is {share:.0%} of a step; even PowerSGD rank 1 leaves {lowest:.0%}: "
        f"the link bounds this job, consider fewer cross-region ranks",
        lowest,
    )

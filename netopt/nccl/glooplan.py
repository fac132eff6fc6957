"""DDP bucket size and PowerSGD rank for a Gloo job: the backward pass, simulated.

Pure: the fabric, the gradients' layout and the backward pass's duration in; the
predicted communication left after backward out. No clock, no torch.

On Gloo every collective pays fixed waits that do not shrink with its size: each
message waits for its receiver's ready notice (two one-way latencies, see
:func:`~netopt.nccl.costmodel.gloo_message_s`), and PowerSGD sends two of them per
bucket (P, then Q, which needs the summed P). So each DDP bucket costs at least two
border round trips under the hierarchical PowerSGD hook, whatever its size, and
small buckets buy overlap with the backward pass at that price.

The model (:func:`exposed_s`):

- DDP's buckets (:func:`ddp_buckets`): the gradients in reverse definition order (the
  order the backward pass produces them), a bucket closed once it holds ``cap``
  bytes; torch sizes the first bucket like the others when ``bucket_cap_mb`` is given.
- A bucket is ready when the backward pass has produced its share of the gradient
  bytes (evenly over ``backward_s``).
- A bucket's collective is a chain of stages, each on one resource (:func:`stages`):
  Gloo's flat ring is one stage on the ring; the region hierarchy is the reduce in
  the region, the leaders' exchange over the border, the broadcast in the region;
  PowerSGD does that for P, then for Q (the alternating variant for P or Q in turn:
  one hierarchy of the two steps' mean bytes). A resource serves one stage at a time,
  in bucket order; P's and Q's border exchanges share the one border link.
- Exposed: how long after the backward pass the last stage ends.

:func:`choose_cap` takes the cap with the least exposed time, and among caps within
one border round trip of it the largest (fewer collectives, less the model can get
wrong). :func:`choose_rank` weighs PowerSGD's bytes against its approximation: the
rank with the least predicted step wins, and a larger rank (a better approximation of
the gradient, less left to error feedback) only where it costs under ``RANK_PRICE``
(1%) of the step more; never below ``MIN_POWERSGD_RANK``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from netopt.nccl.costmodel import Fabric, Hop, gloo_message_s, gloo_ring_allreduce_s

__all__ = [
    "GLOO_HOOKS",
    "MIN_POWERSGD_RANK",
    "RANK_PRICE",
    "BucketPlan",
    "RankPlan",
    "Stage",
    "choose_cap",
    "choose_rank",
    "ddp_buckets",
    "exposed_s",
    "powersgd_bytes",
    "powersgd_parts",
    "stages",
    "tie_s",
    "total_s",
    "uniform_layout",
]

GLOO_HOOKS = (
    "none", "bf16", "powersgd", "hierarchical", "hierarchical-powersgd",
    "hierarchical-powersgd-alternating",
)  # fmt: skip
MIN_POWERSGD_RANK = 4
"""The least rank advised: PowerSGD's paper (Vogels et al., 2019) trains its language
model to full accuracy at rank 4; below it the approximation error grows quickly."""
RANK_PRICE = 0.01
"""The most of a step a larger PowerSGD rank may cost. The rank sets how much of the
gradient each step sends now and how much it leaves to error feedback: rank 8 kept the
bench's loss within 0.7% of uncompressed training (README), and doubling the rank
doubles the bytes of P and Q, which on a slow border is time on every step."""
MIN_COMPRESSION_RATE = 2.0
"""A matrix is compressed only where ``rows*cols >= rate * (rows+cols) * rank``
(``netopt.torch.lowrank.LowRankState``, PyTorch's PowerSGD the same)."""
MIB = 2**20

Shape = tuple[int, int]
"""A gradient tensor as the model sees it: (rows, columns); a vector is (n, 1)."""


@dataclass(frozen=True)
class Stage:
    """One step of a bucket's collective: the resource it holds and for how long."""

    resource: str
    seconds: float


@dataclass(frozen=True)
class BucketPlan:
    """A ``bucket_cap_mb`` and what the simulation predicts for it."""

    cap_mb: int
    buckets: int
    exposed_s: float
    comm_s: float
    """All the buckets' collectives one after another (no overlap): an upper bound."""


@dataclass(frozen=True)
class RankPlan:
    """A PowerSGD rank, the cap chosen for it, and every rank's exposed seconds."""

    rank: int
    cap: BucketPlan
    exposed_by_rank: tuple[tuple[int, float], ...]
    """Each rank weighed and the least exposed seconds any cap gives it."""


def uniform_layout(params: int, dim: int) -> tuple[Shape, ...]:
    """``params`` as ``dim x dim`` matrices and one vector of the rest (no layout given)."""
    dim = max(1, dim)
    full, rest = divmod(max(0, params), dim * dim)
    return (*((dim, dim) for _ in range(full)), *(((rest, 1),) if rest else ()))


def ddp_buckets(
    layout: Sequence[Shape], cap_bytes: int, bytes_per_element: int = 4
) -> list[list[Shape]]:
    """DDP's buckets, in the order it reduces them: the tensors in reverse definition
    order, a bucket closed once it holds ``cap_bytes`` (torch's assignment by size)."""
    buckets: list[list[Shape]] = []
    current: list[Shape] = []
    size = 0
    for shape in reversed(layout):
        current.append(shape)
        size += shape[0] * shape[1] * bytes_per_element
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def powersgd_bytes(
    bucket: Sequence[Shape], rank: int, bytes_per_element: int = 4
) -> tuple[int, int]:
    """(P bytes, Q bytes) of one bucket: ``rows x r`` and ``cols x r`` of each matrix
    compressed, every other tensor whole with P (``netopt.torch.lowrank``'s layout)."""
    plain, p, q = powersgd_parts(bucket, rank, bytes_per_element)
    return plain + p, q


def powersgd_parts(
    bucket: Sequence[Shape], rank: int, bytes_per_element: int = 4
) -> tuple[int, int, int]:
    """(uncompressed, P, Q) bytes of one bucket. The alternating variant sends the
    uncompressed tensors and P on one step, them and Q on the next."""
    plain = p = q = 0
    for rows, cols in bucket:
        r = min(rows, cols, rank)
        if cols > 1 and rows * cols >= MIN_COMPRESSION_RATE * (rows + cols) * r:
            p, q = p + rows * r, q + cols * r
        else:
            plain += rows * cols
    return plain * bytes_per_element, p * bytes_per_element, q * bytes_per_element


def _hierarchy(fabric: Fabric, size_bytes: float, tag: str) -> list[Stage]:
    """The region hierarchy's three stages (netopt.torch.hierarchical), two regions or
    more; an empty region hop where every region holds one rank."""
    wan = fabric.wan
    assert wan is not None
    out = []
    local = fabric.local is not None and max(fabric.region_sizes) > 1
    if local:
        assert fabric.local is not None
        out.append(Stage(f"{tag}reduce", gloo_message_s(size_bytes, fabric.local)))
    regions = len(fabric.region_sizes)
    border = (
        gloo_message_s(size_bytes, wan)
        if regions == 2
        else gloo_ring_allreduce_s(regions, size_bytes, wan.alpha_s, wan.rate_bps, wan.loss_ratio)
    )
    out.append(Stage("border", border))
    if local:
        assert fabric.local is not None
        out.append(Stage(f"{tag}broadcast", gloo_message_s(size_bytes, fabric.local)))
    return out


def stages(fabric: Fabric, hook: str, bucket: Sequence[Shape], rank: int = 4) -> list[Stage]:
    """One bucket's collective under ``hook`` (one of ``GLOO_HOOKS``), stage by stage.

    The hierarchical hooks fall back to the flat ring where the nodes sit in one region.
    """
    if hook not in GLOO_HOOKS:
        raise ValueError(f"unknown hook {hook!r}: one of {', '.join(GLOO_HOOKS)}")
    full = sum(r * c for r, c in bucket) * 4
    ring = fabric.ring

    def flat(size: float, resource: str = "ring") -> Stage:
        seconds = gloo_ring_allreduce_s(fabric.n, size, ring.alpha_s, ring.rate_bps,
                                        ring.loss_ratio)  # fmt: skip
        return Stage(resource, seconds)

    regions = fabric.wan is not None and len(fabric.region_sizes) > 1
    if hook == "none" or (hook == "hierarchical" and not regions):
        return [flat(full)]
    if hook == "bf16":
        return [flat(full / 2)]
    if hook == "hierarchical":
        return _hierarchy(fabric, full, "")
    if hook == "hierarchical-powersgd-alternating" and regions:
        plain, p_only, q_only = powersgd_parts(bucket, rank)
        return _hierarchy(fabric, plain + (p_only + q_only) / 2, "")  # the two steps' mean
    p, q = powersgd_bytes(bucket, rank)
    # nothing compressed in the bucket (vectors only): P alone, no Q to exchange
    if hook == "powersgd" or not regions:
        return [flat(p), flat(q)] if q else [flat(p)]
    return [*_hierarchy(fabric, p, "p-"), *(_hierarchy(fabric, q, "q-") if q else [])]


def exposed_s(
    fabric: Fabric, hook: str, buckets: Sequence[Sequence[Shape]], backward_s: float, rank: int = 4
) -> float:
    """Seconds of communication left after the backward pass (the module's model)."""
    total = sum(r * c for bucket in buckets for r, c in bucket) or 1
    free: dict[str, float] = {}
    ready = end = 0.0
    for bucket in buckets:
        ready += backward_s * sum(r * c for r, c in bucket) / total
        end = ready
        for stage in stages(fabric, hook, bucket, rank):
            end = max(end, free.get(stage.resource, 0.0)) + stage.seconds
            free[stage.resource] = end
    return max(0.0, end - backward_s)


def total_s(fabric: Fabric, hook: str, buckets: Sequence[Sequence[Shape]], rank: int = 4) -> float:
    """Every bucket's collective one after another, none overlapped (an upper bound)."""
    return sum(s.seconds for b in buckets for s in stages(fabric, hook, b, rank))


def tie_s(fabric: Fabric) -> float:
    """One round trip of the slowest hop the collectives wait on (the border, if any)."""
    hop: Hop = fabric.wan or fabric.ring
    return 2 * hop.alpha_s


def _plans(
    fabric: Fabric, hook: str, layout: Sequence[Shape], backward_s: float,
    caps_mb: Sequence[int], rank: int,
) -> list[BucketPlan]:  # fmt: skip
    """Every cap's plan, the largest cap first."""
    plans = []
    for cap in sorted(set(caps_mb), reverse=True):
        buckets = ddp_buckets(layout, cap * MIB)
        plans.append(BucketPlan(cap, len(buckets), exposed_s(fabric, hook, buckets, backward_s,
                                rank), total_s(fabric, hook, buckets, rank)))  # fmt: skip
    return plans


def _pick_cap(plans: Sequence[BucketPlan], tie: float) -> BucketPlan:
    least = min(p.exposed_s for p in plans)
    return next(p for p in plans if p.exposed_s <= least + tie)


def choose_cap(
    fabric: Fabric, hook: str, layout: Sequence[Shape], backward_s: float,
    caps_mb: Sequence[int], rank: int = 4,
) -> BucketPlan:  # fmt: skip
    """The cap with the least exposed time; among those within :func:`tie_s` of it, the
    largest (each bucket pays the fixed waits again)."""
    return _pick_cap(_plans(fabric, hook, layout, backward_s, caps_mb, rank), tie_s(fabric))


def choose_rank(
    fabric: Fabric, hook: str, layout: Sequence[Shape], compute_s: float, backward_s: float,
    caps_mb: Sequence[int], ranks: Sequence[int],
) -> RankPlan:  # fmt: skip
    """PowerSGD's rank: the least predicted step (``compute_s`` plus the least exposed
    time over the caps); a larger rank, a closer approximation of the gradient, only
    where its step is within ``RANK_PRICE`` of that; none below ``MIN_POWERSGD_RANK``
    unless no rank that high is offered. Then the rank's cap (:func:`choose_cap`)."""
    allowed = sorted({r for r in ranks if r >= MIN_POWERSGD_RANK} or set(ranks), reverse=True)
    plans = {r: _plans(fabric, hook, layout, backward_s, caps_mb, r) for r in allowed}
    best = {r: min(p.exposed_s for p in plans[r]) for r in allowed}
    least = compute_s + min(best.values())
    rank = next(r for r in allowed if compute_s + best[r] <= least * (1 + RANK_PRICE))
    return RankPlan(rank, _pick_cap(plans[rank], tie_s(fabric)), tuple(best.items()))

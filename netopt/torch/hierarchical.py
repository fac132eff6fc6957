"""A region-hierarchical all-reduce DDP comm hook: border bytes grow with regions, not nodes.

Per DDP bucket: reduce inside each region to its leader (the region's lowest
rank), all-reduce among the leaders (the only traffic that crosses a border;
between exactly two leaders a point-to-point exchange, :func:`exchange_sum`: one
round trip where Gloo's all-reduce takes two), broadcast from the leader inside
the region, divide by the world size. With
``R`` regions each leader sends ``2(R-1)/R x S`` across borders for a bucket of
``S`` bytes (``S`` for two regions) however many nodes each region holds; a
flat ring pays ``2(n-1)/n x S`` on each border hop and waits ``2(n-1)`` times on
the border's latency.

Gloo matches collectives by the order they are enqueued on a group, and DDP
calls the hook for bucket 0, 1, ... on every rank. So the three steps are a
pipeline of three worker threads, each on its own group (the in-region reduce,
the leaders' all-reduce, the in-region broadcast on a second group of the
region's ranks), each taking the buckets in the order they were submitted:
every group sees the same order on every rank, bucket k+1's reduce runs while
bucket k crosses the border, and the backward pass goes on computing meanwhile
(the hook only queues). A failed or timed-out collective fails that bucket's
future (DDP raises in ``backward()``); nothing waits forever: each blocking call
is bounded by the group's timeout.

:func:`hierarchical_powersgd_state` puts netopt's low-rank hook on top: its P
and Q all-reduces (small: ``r x (rows + cols)`` per matrix) go through two such
pipelines, so the border sees two small exchanges between the leaders per bucket
instead of a flat ring's ``2(n-1)`` border-latency steps each; with
``alternate=True`` one exchange per bucket (P or Q in turn).

Every rank must call :func:`region_groups` at the same point, with the same
``regions`` (``dist.new_group`` is collective over the whole world).
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from netopt.errors import ValidationError
from netopt.names import NODE_NAME_RULE, is_node_name
from netopt.torch.lowrank import LowRankState

__all__ = [
    "HierarchicalState",
    "RegionGroups",
    "exchange_sum",
    "gather_regions",
    "hierarchical_hook",
    "hierarchical_powersgd_state",
    "region_groups",
    "region_members",
]


def region_members(regions: Sequence[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The ranks of each region, regions in order of first appearance (pure).

    ``regions[r]`` is the region of rank ``r``. Raises ValidationError for an empty
    list or a name that is not a region name.
    """
    if not regions:
        raise ValidationError("the region of each rank is needed (got none)")
    members: dict[str, list[int]] = {}
    for rank, region in enumerate(regions):
        if not is_node_name(region):
            raise ValidationError(
                f"rank {rank}'s region {region!r} is not a region name: {NODE_NAME_RULE}"
            )
        members.setdefault(region, []).append(rank)
    return tuple((name, tuple(ranks)) for name, ranks in members.items())


@dataclass(frozen=True)
class RegionGroups:
    """This rank's view of the region subgroups.

    ``region_group`` is None where the rank's region has one rank; ``leader_group``
    is None on non-leaders and where there is one region.
    """

    rank: int
    world: int
    members: tuple[tuple[str, tuple[int, ...]], ...]
    leader: int
    region_group: Any
    leader_group: Any
    broadcast_group: Any = None
    """A second group of the region's ranks for the broadcasts (None: ``region_group``)."""
    peer_leader: int | None = None
    """With exactly two regions, the other region's leader (on a leader; else None): the
    leaders exchange their sums point to point (:func:`exchange_sum`), no all-reduce."""

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader


def gather_regions(torch: Any, my_region: str) -> tuple[str, ...]:
    """Every rank's region, from each rank's own (a collective on the default group).

    Raises ValidationError if any rank's region is not a region name.
    """
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, my_region)
    region_members(gathered)  # checks every name
    return tuple(gathered)


def region_groups(
    torch: Any,
    regions: Sequence[str],
    *,
    timeout_s: float | None = None,
    backend: str | None = None,
) -> RegionGroups:
    """Create one group per region of two or more ranks and one of the region leaders.

    Collective: every rank of the default group calls it with the same
    ``regions`` (one region name per rank, see :func:`gather_regions`).
    ``timeout_s`` bounds each collective on the new groups (default: the default
    group's). Raises ValidationError when ``regions`` does not name every rank.
    """
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(regions) != world:
        raise ValidationError(f"{len(regions)} regions given for a world of {world} ranks")
    members = region_members(regions)
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    leader, region_group, broadcast_group = rank, None, None
    for _name, ranks in members:
        group = second = None
        if len(ranks) > 1:
            group = dist.new_group(ranks=list(ranks), timeout=timeout, backend=backend)
            second = dist.new_group(ranks=list(ranks), timeout=timeout, backend=backend)
        if rank in ranks:
            leader, region_group, broadcast_group = ranks[0], group, second
    leaders = [ranks[0] for _name, ranks in members]
    leader_group, peer = None, None
    if len(leaders) > 1:
        group = dist.new_group(ranks=leaders, timeout=timeout, backend=backend)
        leader_group = group if rank in leaders else None
        if len(leaders) == 2 and rank in leaders:
            peer = leaders[1] if rank == leaders[0] else leaders[0]
    return RegionGroups(
        rank, world, members, leader, region_group, leader_group, broadcast_group, peer
    )


def exchange_sum(torch: Any, tensor: Any, peer: int, group: Any) -> None:
    """``tensor`` plus the same-shaped tensor of ``peer``, in place (both ranks call it).

    Between two ranks this is one message each way at once: one round trip plus the
    bytes. Gloo's all-reduce takes two (its reduce-scatter, then its all-gather, each
    a message that waits for the receiver's ready notice; see
    :func:`netopt.nccl.costmodel.gloo_ring_allreduce_s`). ``a + b`` equals ``b + a``
    exactly, so both ranks hold the same sum. Each wait is bounded by ``group``'s
    timeout.
    """
    dist = torch.distributed
    received = torch.empty_like(tensor)
    works = [
        dist.irecv(received, src=peer, group=group),
        dist.isend(tensor, dst=peer, group=group),
    ]
    for work in works:
        work.wait()
    tensor.add_(received)


_STAGES = ("reduce", "leaders", "broadcast")


@dataclass
class HierarchicalState:
    """The hook's state: the groups and the three worker threads that run the collectives."""

    torch: Any
    groups: RegionGroups
    _queues: tuple[queue.SimpleQueue[tuple[Any, Any, bool]], ...] = field(
        default_factory=lambda: tuple(queue.SimpleQueue() for _ in _STAGES)
    )
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, buffer: Any, *, average: bool = True) -> Any:
        """Queue ``buffer``'s all-reduce; the future completes with the buffer averaged
        over the world (``average=False``: summed), in place."""
        future = self.torch.futures.Future()
        with self._lock:
            if not self._workers:
                for index, name in enumerate(_STAGES):
                    worker = threading.Thread(
                        target=self._run, args=(index,),
                        name=f"netopt-hierarchical-{name}", daemon=True,
                    )  # fmt: skip
                    worker.start()
                    self._workers.append(worker)
            self._queues[0].put((buffer, future, average))
        return future

    def _run(self, stage: int) -> None:
        while True:
            buffer, future, average = self._queues[stage].get()
            try:
                self._step(stage, buffer)
                if stage == len(_STAGES) - 1 and average:
                    buffer.div_(self.groups.world)
            except Exception as exc:  # handed to DDP, which raises it in backward()
                future.set_exception(exc)
                continue
            if stage == len(_STAGES) - 1:
                future.set_result(buffer)
            else:
                self._queues[stage + 1].put((buffer, future, average))

    def _step(self, stage: int, tensor: Any) -> None:
        dist, g = self.torch.distributed, self.groups
        if stage == 0 and g.region_group is not None:
            dist.reduce(tensor, dst=g.leader, group=g.region_group)
        elif stage == 1 and g.leader_group is not None:
            if g.peer_leader is None:
                dist.all_reduce(tensor, group=g.leader_group)
            else:
                exchange_sum(self.torch, tensor, g.peer_leader, g.leader_group)
        elif stage == 2 and g.region_group is not None:
            group = g.broadcast_group if g.broadcast_group is not None else g.region_group
            dist.broadcast(tensor, src=g.leader, group=group)

    def allreduce(self, tensor: Any) -> None:
        """Sum ``tensor`` over the world in place: region, leaders, region (blocking)."""
        for stage in range(len(_STAGES)):
            self._step(stage, tensor)


def hierarchical_powersgd_state(
    torch: Any, regions: Sequence[str], rank: int, start_iter: int, *, alternate: bool = False
) -> tuple[Any, RegionGroups]:
    """A :class:`~netopt.torch.lowrank.LowRankState` whose P and Q all-reduces run
    through the region hierarchy (two pipelines, each on its own groups), and this
    rank's groups. ``alternate``: one exchange per step, P or Q in turn (after a first
    low-rank step of both; see :mod:`netopt.torch.lowrank`). Collective: every rank
    calls it at the same point with the same arguments."""
    p_groups = region_groups(torch, regions)
    q_groups = region_groups(torch, regions)
    p_state, q_state = HierarchicalState(torch, p_groups), HierarchicalState(torch, q_groups)
    state = LowRankState(
        torch=torch, process_group=None, q_group=None, matrix_approximation_rank=rank,
        start_iter=start_iter, alternate=alternate,
        sum_p=lambda t: p_state.submit(t, average=False),
        sum_q=lambda t: q_state.submit(t, average=False),
    )  # fmt: skip
    return state, p_groups


def hierarchical_hook(state: HierarchicalState, bucket: Any) -> Any:
    """DDP comm hook: the bucket averaged over all ranks, crossing borders once per region."""
    return state.submit(bucket.buffer())


# DDP refuses a hook whose ``bucket`` annotation is not ``dist.GradBucket`` (this
# module's are strings: it does not import torch), so it is shown none.
hierarchical_hook.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("state", "bucket")]
)

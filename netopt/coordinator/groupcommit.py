"""Group commit for ingest: batches that arrive together are stored in one write.

Every batch an agent posts waits in a bounded queue; one drain task takes the
oldest ones as a group (at most ``max_group_batches`` batches and
``max_group_summaries`` summaries) and stores them with a single store call: one
statement (PostgreSQL) or one transaction (SQLite), one hand-off to the database
thread and one answer back, however many batches it holds.

``linger_s`` and ``linger_until_batches`` (Kafka's ``linger.ms`` and
``batch.size``): a group is written once its oldest batch has waited
``linger_s``, or as soon as ``linger_until_batches`` wait; it then takes every
batch waiting, up to the group bounds. A replica taking a few
hundred batches a second then writes a few per statement instead of one, and
the per-write costs (the thread hand-off, the round trip, the loop's wake-up for
the answer) are paid once per group, at the price of latency: each batch waits
at most ``linger_s`` more. Off (0) by default: see ``ingest_linger_s``.

Bounds: at most ``max_pending_batches`` wait; a batch offered beyond that is
refused at once with :class:`~netopt.errors.StorageError` (503 JSON: the agent
keeps it in its spool and replays it, to this replica or another), so a peer
cannot grow the queue without bound. A group's write is atomic (the stores
write all of it or nothing): when it fails, every batch in it gets the same
error and nothing of it is stored; the batches outside it are not affected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from netopt.coordinator.storeapi import BatchToStore, IngestResult
from netopt.errors import StorageError

__all__ = ["GroupCommit", "GroupLimits", "group_size"]


@dataclass(frozen=True)
class GroupLimits:
    """How long a group may wait and how large groups and the queue may grow."""

    linger_s: float = 0.0
    linger_until_batches: int = 256
    max_group_batches: int = 256
    max_group_summaries: int = 8192
    max_pending_batches: int = 4096

    def __post_init__(self) -> None:
        if not (0 <= self.linger_s <= 1 and self.max_group_batches >= 1
                and self.linger_until_batches >= 1
                and self.max_group_summaries >= 1 and self.max_pending_batches >= 1):  # fmt: skip
            raise ValueError(f"bad group commit limits: {self}")


def group_size(summary_counts: Sequence[int], limits: GroupLimits) -> int:
    """How many of the waiting batches (their summary counts, oldest first) form the
    next group: at least one (a batch larger than the summary bound goes alone), at
    most ``max_group_batches``, and no more summaries than ``max_group_summaries``."""
    total = 0
    for taken, count in enumerate(summary_counts[: limits.max_group_batches]):
        total += count
        if taken and total > limits.max_group_summaries:
            return taken
    return min(len(summary_counts), limits.max_group_batches)


@dataclass
class _Waiting:
    batch: BatchToStore
    future: asyncio.Future[IngestResult]
    arrived_s: float  # the loop's clock


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(group: list[_Waiting], exc: BaseException) -> None:
    for waiting in group:
        if not waiting.future.done():
            waiting.future.set_exception(exc)


class GroupCommit:
    """The ingest queue of one store; ``write`` stores a group (atomic; StorageError)."""

    def __init__(
        self,
        write: Callable[[list[BatchToStore]], Awaitable[list[IngestResult]]],
        limits: GroupLimits,
    ) -> None:
        self.limits = limits
        self._write = write
        self._pending: list[_Waiting] = []
        self._pending_summaries = 0
        self._drain_task: asyncio.Task[None] | None = None
        self._full: asyncio.Future[None] | None = None  # set while the drain lingers

    @property
    def waiting(self) -> int:
        """Batches waiting to be written (not those being written)."""
        return len(self._pending)

    async def submit(self, batch: BatchToStore) -> IngestResult:
        """Store ``batch`` with the next group; returns once that group is written.

        Raises StorageError when the queue is full (nothing queued) or the group's
        write failed (nothing of the group stored).
        """
        if len(self._pending) >= self.limits.max_pending_batches:
            raise StorageError(
                f"ingest queue full ({len(self._pending)} batches waiting for the"
                " database): try again later"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[IngestResult] = loop.create_future()
        self._pending.append(_Waiting(batch, future, loop.time()))
        self._pending_summaries += len(batch.summaries)
        if self._drain_task is None:
            self._drain_task = loop.create_task(self._drain())
        elif self._full is not None and self._group_full():
            _settle(self._full)
        return await future

    def _group_full(self) -> bool:
        limits = self.limits
        return (
            len(self._pending) >= min(limits.linger_until_batches, limits.max_group_batches)
            or self._pending_summaries >= limits.max_group_summaries
        )

    async def _linger(self) -> None:
        """Wait until the oldest batch has waited ``linger_s`` or a group is full."""
        loop = asyncio.get_running_loop()
        delay_s = self._pending[0].arrived_s + self.limits.linger_s - loop.time()
        if delay_s <= 0 or self._group_full():
            return
        self._full = full = loop.create_future()
        timer = loop.call_later(delay_s, _settle, full)
        try:
            await full
        finally:
            timer.cancel()
            self._full = None

    async def _drain(self) -> None:
        try:
            while self._pending:
                if self.limits.linger_s:
                    await self._linger()
                counts = [len(w.batch.summaries) for w in self._pending]
                taken = group_size(counts, self.limits)
                group, self._pending = self._pending[:taken], self._pending[taken:]
                self._pending_summaries -= sum(counts[:taken])
                try:
                    results = await self._write([w.batch for w in group])
                except Exception as exc:  # every waiter of this group gets the failure
                    _fail(group, exc)
                    continue
                except BaseException:  # cancelled: no waiter is left hanging
                    _fail(group + self._pending, StorageError("ingest stopped"))
                    self._pending, self._pending_summaries = [], 0
                    raise
                for waiting, result in zip(group, results, strict=True):
                    if not waiting.future.done():
                        waiting.future.set_result(result)
        finally:
            self._drain_task = None

    async def close(self) -> None:
        """Wait for the groups already queued to be written."""
        task = self._drain_task
        if task is not None:
            await asyncio.shield(task)

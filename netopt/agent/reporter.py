"""Send link summaries to the coordinator through the on-disk spool.

Every batch is spooled before it is sent, and leaves the spool only when the
coordinator has acknowledged it, so a coordinator outage (or an agent crash)
loses nothing: batches are replayed oldest first when the coordinator returns.
Batch ids are random and travel with the batch, so a replay after a lost
acknowledgement is recognised by the coordinator as a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Protocol

from netopt.agent.metrics import AgentMetrics
from netopt.agent.spool import Spool
from netopt.errors import NetoptError, NetworkError
from netopt.wire.client import CoordinatorRejected
from netopt.wire.schema import LinkSummary, SummaryBatch

__all__ = ["FlushResult", "NeedsRegistration", "Reporter", "SummarySubmitter"]

log = logging.getLogger(__name__)

MAX_SUMMARIES_PER_BATCH = 500


class SummarySubmitter(Protocol):
    """The part of the coordinator client the reporter needs."""

    async def submit(self, node: str, batch: SummaryBatch) -> dict[str, object]: ...


class NeedsRegistration(NetoptError):
    """The coordinator does not know this node (404): register again."""


class FlushResult:
    """What one flush did."""

    def __init__(self) -> None:
        self.sent = 0
        self.rejected = 0
        self.reachable = True


class Reporter:
    """Collects summaries, spools them in batches and replays the spool in order."""

    def __init__(self, node: str, spool: Spool, metrics: AgentMetrics) -> None:
        self.node = node
        self.spool = spool
        self.metrics = metrics
        self._pending: list[LinkSummary] = []
        self.produced = 0
        self.acknowledged = 0

    def add(self, summary: LinkSummary) -> None:
        """Queue one summary for the next batch."""
        self._pending.append(summary)
        self.produced += 1
        self.metrics.summaries.labels(summary.method).inc()

    async def spool_pending(self) -> int:
        """Write queued summaries to the spool as batches; returns how many batches."""
        batches = 0
        while self._pending:
            chunk = self._pending[:MAX_SUMMARIES_PER_BATCH]
            del self._pending[:MAX_SUMMARIES_PER_BATCH]
            batch = SummaryBatch(uuid.uuid4().hex, tuple(chunk))
            await asyncio.to_thread(self.spool.put, batch.to_dict())
            batches += 1
        self._update_gauges()
        return batches

    async def flush(self, client: SummarySubmitter) -> FlushResult:
        """Send spooled batches oldest first; stop at the first unreachable answer.

        Raises NeedsRegistration when the coordinator no longer knows this node.
        """
        result = FlushResult()
        for spooled in await asyncio.to_thread(self.spool.pending):
            try:
                batch = SummaryBatch.from_dict(spooled.body)
            except NetoptError as exc:
                log.error("dropping spooled batch %s: %s", spooled.path.name, exc)
                await asyncio.to_thread(self.spool.ack, spooled)
                result.rejected += 1
                continue
            try:
                await client.submit(self.node, batch)
            except CoordinatorRejected as exc:
                if exc.status == 404:
                    raise NeedsRegistration(str(exc)) from exc
                log.error("coordinator refused batch %s, dropping it: %s", batch.batch_id, exc)
                self.metrics.batches_rejected.inc()
                result.rejected += 1
            except NetworkError as exc:
                log.info("coordinator unreachable, %d batches kept: %s", len(self.spool), exc)
                self.metrics.report_failures.inc()
                result.reachable = False
                break
            else:
                self.metrics.batches_sent.inc()
                self.acknowledged += len(batch.summaries)
                result.sent += 1
            await asyncio.to_thread(self.spool.ack, spooled)
        self._update_gauges()
        return result

    def _update_gauges(self) -> None:
        self.metrics.spool_bytes.set(self.spool.size_bytes)
        self.metrics.spool_dropped.set(self.spool.dropped_batches)

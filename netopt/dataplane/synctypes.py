"""What goes into a sync and what comes out: its options, progress snapshots and summary.

Plain frozen dataclasses with no I/O, shared by the sync engine (`netopt.dataplane.sync`)
and its callers; `netopt.dataplane.sync` re-exports them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ProgressCallback", "SyncOptions", "SyncProgress", "SyncSummary"]


@dataclass(frozen=True)
class SyncOptions:
    """How hard to try: parallel fetches and the retry schedule."""

    streams: int = 8
    part_connections: int = 0
    """A sync of fewer chunks than this cuts each chunk into parts, one per connection
    (see `netopt.dataplane.streamwork.parts_per_chunk`); 0: ``streams``. When the plan
    chose the streams, the set-up's warm connections (at least 8): a small dataset then
    rides 8 slow starts instead of the plan's 4."""
    retry_window_s: float = 60.0
    """A chunk whose fetch keeps failing on the network (a server restarting, a link
    cut) is retried until it has been failing for this long (s), counted per chunk
    from its first failure; then the sync fails. A chunk that arrives is forgiven."""
    max_attempts: int = 6
    """Copies of one chunk that may fail their check (BLAKE3, length) before the sync
    fails with IntegrityError."""
    backoff_initial_s: float = 0.2
    """First wait (s) after a stream fails; it doubles with each failure in a row, with
    jitter (x 0.5..1), up to `backoff_max_s`."""
    backoff_max_s: float = 1.0
    """Longest wait (s) between tries: while a server or link is down, each stream
    probes it with a fresh connection about this often."""
    worker_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    batch_bytes: int = 8 * 1024 * 1024
    """At most this many logical bytes per request; less near the end, to keep streams even."""
    writer_process_min_files: int | None = 2000
    """A sync with at least this many small one-chunk files to fetch has them written by
    a helper process (`netopt.dataplane.writerproc`), not on its event loop; None: never.
    On loopback a 100,000-file tree of 1-4 KB files took 17% less time with it; below a
    few thousand files the helper's start (~50 ms) is not paid back."""
    hold_bytes: int = 128 * 1024 * 1024
    """Verified chunks kept in memory until their files are written (no read-back, no re-hash)."""
    stream_ahead_bytes: int = 3 * 1024 * 1024 // 2
    """Over a streaming source: bytes on the wire (estimated from the compression ratio so
    far) each stream keeps asked for, and at least two chunks, so the server always has
    the next chunk ready to send; the last chunks still go to whichever stream is free."""
    steal_after_s: float = 0.25
    """Over a streaming source, an idle stream asks again for a chunk another stream has
    queued only when that chunk is expected there later than this (s)."""
    start_fraction: float = 0.0
    """Where in the chunk order to start (0..1), wrapping around: nodes syncing the same
    dataset at once start at different places, so they fetch different chunks first."""


@dataclass(frozen=True)
class SyncProgress:
    """A snapshot for progress bars: logical bytes done of total, bytes on the wire."""

    logical_total_bytes: int
    logical_done_bytes: int
    wire_bytes: int
    fetched_logical_bytes: int
    chunks_total: int
    chunks_done: int


@dataclass(frozen=True)
class SyncSummary:
    """What a sync did. ``logical_bytes`` counts the files written by this run."""

    dataset: str
    files: int
    files_written: int
    files_skipped: int
    chunks_fetched: int
    chunks_reused: int
    chunk_retries: int
    wire_bytes: int
    fetched_logical_bytes: int
    logical_bytes: int
    seconds: float
    link_returns: int = 0
    """Times the server answered again after an outage (a link cut, a restart) that failed
    fetches, each ending the wait of the connections left dead
    (`netopt.dataplane.linkwatch`)."""

    @property
    def throughput_bps(self) -> float:
        """Effective throughput: logical bits written per second."""
        return self.logical_bytes * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def goodput_bps(self) -> float:
        """Bits on the wire (chunk payloads) per second."""
        return self.wire_bytes * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def compression_ratio(self) -> float:
        """Logical bytes fetched per byte on the wire."""
        return self.fetched_logical_bytes / self.wire_bytes if self.wire_bytes else 1.0

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON-able data."""
        return {
            "dataset": self.dataset,
            "files": self.files,
            "files_written": self.files_written,
            "files_skipped": self.files_skipped,
            "chunks_fetched": self.chunks_fetched,
            "chunks_reused": self.chunks_reused,
            "chunk_retries": self.chunk_retries,
            "link_returns": self.link_returns,
            "wire_bytes": self.wire_bytes,
            "logical_bytes": self.logical_bytes,
            "fetched_logical_bytes": self.fetched_logical_bytes,
            "compression_ratio": round(self.compression_ratio, 3),
            "seconds": round(self.seconds, 3),
            "throughput_mbps": round(self.throughput_bps / 1e6, 2),
            "goodput_mbps": round(self.goodput_bps / 1e6, 2),
        }


ProgressCallback = Callable[[SyncProgress], None]

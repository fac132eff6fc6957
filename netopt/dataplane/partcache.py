"""The chunks a server is answering in parts, each read from disk once.

A client fetches a chunk in parts (a lagging stream's chunk fetched again,
`netopt.dataplane.tailhedge`; a sync of fewer chunks than connections) by asking for
up to `MAX_CHUNK_PARTS` slices of it at once, each a request of its own. Every part
comes from one verified copy of the whole chunk, so each request read the whole chunk
and hashed it: a hedge in 32 parts read and hashed a 2 MiB chunk 32 times, on the pool
that also compresses every stream's frames.

`PartCache.get` reads a chunk once: the first request for it reads (and verifies) it,
requests arriving meanwhile wait for that read and get its bytes or its error, and later
ones take the bytes kept. Keyed by chunk name alone: a name is the BLAKE3 of its bytes,
so the bytes kept are that chunk's whichever dataset or version asked (the route still
answers only names its dataset lists). A failed read is not kept: the next request reads
again. Bounded: `PART_CACHE_BYTES` in all, the least recently used dropped first, and
nothing kept past `KEEP_S` unused (the parts of one chunk come within a round trip or
two): each request drops what went unused, and the route sweeps (`sweep`) while anything
is kept, so an idle server holds nothing. A chunk larger than the bound is shared by the
requests waiting for its read and not kept. Thread-safe: the reads run on the server's
pool.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["KEEP_S", "PART_CACHE_BYTES", "PartCache"]

PART_CACHE_BYTES = 64 * 1024 * 1024
"""Bytes of chunks kept in all: a few chunks being fetched in parts at once."""

KEEP_S = 10.0
"""A chunk not asked for this long is dropped."""


class PartCache:
    """Verified chunk bytes for part requests, read once (module doc). Thread-safe."""

    def __init__(
        self,
        max_bytes: int = PART_CACHE_BYTES,
        keep_s: float = KEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.keep_s = keep_s
        self._clock = clock
        self._kept: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        """Chunk name -> (bytes, last asked), least recently asked first."""
        self._kept_bytes = 0
        self._reading: dict[str, Future[bytes]] = {}
        self._lock = threading.Lock()
        self.reads = 0
        """Reads started (for tests and traces)."""
        self.shared = 0
        """Requests answered without a read of their own: from the bytes kept, or from a
        read another request had started."""
        self.sweep_due = False
        """Whether a `sweep` is scheduled (the route's, on its event loop)."""

    @property
    def kept_bytes(self) -> int:
        """Bytes kept now."""
        with self._lock:
            return self._kept_bytes

    def get(self, chunk_id: str, read: Callable[[], bytes]) -> bytes:
        """``chunk_id``'s bytes: kept ones, those of a read in progress, or ``read()``'s
        (which must return them verified). Raises what the read raised."""
        now_s = self._clock()
        with self._lock:
            self._drop_unused(now_s)
            kept = self._kept.get(chunk_id)
            if kept is not None:
                self._kept[chunk_id] = (kept[0], now_s)
                self._kept.move_to_end(chunk_id)
                self.shared += 1
                return kept[0]
            pending = self._reading.get(chunk_id)
            if pending is None:
                mine: Future[bytes] = Future()
                self._reading[chunk_id] = mine
                self.reads += 1
            else:
                self.shared += 1
        if pending is not None:
            return pending.result()
        try:
            data = read()
        except BaseException as exc:
            with self._lock:
                del self._reading[chunk_id]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._reading[chunk_id]
            self._keep(chunk_id, data, self._clock())
        mine.set_result(data)
        return data

    def sweep(self) -> bool:
        """Drop what went unused `KEEP_S`; True while anything is still kept."""
        with self._lock:
            self._drop_unused(self._clock())
            return bool(self._kept)

    def _keep(self, chunk_id: str, data: bytes, now_s: float) -> None:
        if len(data) > self.max_bytes:
            return
        self._kept[chunk_id] = (data, now_s)
        self._kept_bytes += len(data)
        while self._kept_bytes > self.max_bytes:
            _, (dropped, _) = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped)

    def _drop_unused(self, now_s: float) -> None:
        while self._kept:
            chunk_id, (data, asked_s) = next(iter(self._kept.items()))
            if now_s - asked_s < self.keep_s:
                return
            del self._kept[chunk_id]
            self._kept_bytes -= len(data)

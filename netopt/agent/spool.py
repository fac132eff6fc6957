"""A bounded on-disk spool of report batches, for when the coordinator is away.

Each batch is one JSON file named by a sequence number, written atomically.
Batches leave the spool only when the coordinator has acknowledged them, and
always oldest first, so replay keeps their order. When the spool would exceed
its byte budget the oldest batches are dropped first and counted. A batch id
travels with each batch, so a batch sent twice (crash between send and
acknowledgement) is recognised by the coordinator and not counted twice.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netopt.errors import StorageError
from netopt.fsutil import atomic_write_bytes

__all__ = ["Spool", "SpooledBatch"]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^batch-(\d{12})\.json$")


@dataclass(frozen=True)
class SpooledBatch:
    """One batch waiting in the spool."""

    seq: int
    path: Path
    size_bytes: int
    body: dict[str, Any]


class Spool:
    """Batches on disk under ``directory``, at most ``max_bytes`` of them."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.dropped_batches = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create spool {self.directory}: {exc.strerror}") from exc
        self._clean_temporaries()
        # seq -> (path, size): kept in memory so sizes and counts cost no disk I/O
        # (they are read on the event loop); rebuilt from the directory by pending().
        self._index: dict[int, tuple[Path, int]] = {}
        self._rescan()

    def _clean_temporaries(self) -> None:
        for leftover in self.directory.glob(".batch-*.tmp"):
            leftover.unlink(missing_ok=True)

    def _rescan(self) -> None:
        index: dict[int, tuple[Path, int]] = {}
        for path in self.directory.iterdir():
            match = _NAME_RE.match(path.name)
            if match:
                try:
                    index[int(match.group(1))] = (path, path.stat().st_size)
                except FileNotFoundError:
                    continue
        self._index = dict(sorted(index.items()))

    def _entries(self) -> list[tuple[int, Path, int]]:
        return [(seq, path, size) for seq, (path, size) in self._index.items()]

    @property
    def size_bytes(self) -> int:
        """Bytes the spooled batches take (from memory: no disk I/O)."""
        return sum(size for _, size in self._index.values())

    def __len__(self) -> int:
        return len(self._index)

    def put(self, body: dict[str, Any]) -> int:
        """Spool one batch (a JSON-able mapping); returns its sequence number.

        Drops the oldest batches while the spool would exceed ``max_bytes``.
        Raises StorageError when the disk refuses the write.
        """
        data = json.dumps(body, separators=(",", ":")).encode()
        entries = self._entries()
        seq = entries[-1][0] + 1 if entries else 1
        total = sum(size for _, _, size in entries) + len(data)
        while entries and total > self.max_bytes:
            oldest_seq, oldest, size = entries.pop(0)
            oldest.unlink(missing_ok=True)
            del self._index[oldest_seq]
            total -= size
            self.dropped_batches += 1
            log.warning("spool full (%d bytes): dropped oldest batch %s", self.max_bytes, oldest)
        if len(data) > self.max_bytes:
            self.dropped_batches += 1
            log.warning("batch of %d bytes exceeds the whole spool; dropped", len(data))
            return seq
        path = self.directory / f"batch-{seq:012d}.json"
        atomic_write_bytes(path, data)
        self._index[seq] = (path, len(data))
        return seq

    def pending(self) -> list[SpooledBatch]:
        """Every spooled batch, oldest first. Unreadable files are dropped and counted."""
        self._rescan()
        batches = []
        for seq, path, size in self._entries():
            try:
                body = json.loads(path.read_bytes())
            except (OSError, ValueError):
                log.warning("dropping unreadable spooled batch %s", path)
                path.unlink(missing_ok=True)
                self._index.pop(seq, None)
                self.dropped_batches += 1
                continue
            batches.append(SpooledBatch(seq, path, size, body))
        return batches

    def ack(self, batch: SpooledBatch) -> None:
        """The coordinator has the batch: remove it."""
        batch.path.unlink(missing_ok=True)
        self._index.pop(batch.seq, None)

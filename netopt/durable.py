"""Put finished files into place in batches, each only once its bytes are durable.

A writer (the sync's file assembler, the chunk cache) writes a file under a
temporary name in its final directory and hands it to a `BatchFlusher` instead
of fsyncing and renaming it on the spot. The flusher's thread takes whatever is
pending as one batch and, per filesystem: applies the modes and mtimes, makes
the bytes durable (one ``syncfs`` for `netopt.fsutil.SYNCFS_MIN_FILES` files or
more, else an fsync each from a few threads), renames every file into place and
makes the renames durable (a second ``syncfs``, or an fsync of each directory
touched). So a file appears under its final name only once its bytes are on
disk, the writer never waits for the disk, and the cost of durability is paid
once per batch rather than once per file. `BatchFlusher.flush` returns once
everything handed over before it is in place and durable: a sync reports
success only after it.

A kill or a crash leaves at most the batch's temporary files behind, never a
torn file under a final name; whoever owns the directory removes (or, for
content-named chunks, verifies and adopts) them on the next run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from netopt.errors import StorageError
from netopt.fsutil import SYNCFS_MIN_FILES, fsync_dirs, in_threads, syncfs

__all__ = ["BatchFlusher", "backlog_full", "commit_failure", "gather", "run_callbacks"]

log = logging.getLogger(__name__)

MAX_PENDING_FILES = 16384
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Files (bytes) handed over and not yet in place beyond which `BatchFlusher.add` waits:
a disk slower than the network slows the writers instead of growing the backlog."""

GATHER_S = 0.1
"""How long the thread lets a batch grow (a flush does not wait), so files arriving at a
few dozen a second still share one ``syncfs`` and a tree arriving at thousands a second
pays about ten a second, not one per few dozen files (``syncfs`` writes back the whole
filesystem, and each woke the writers' threads)."""
GATHER_FILES = MAX_PENDING_FILES // 2
GATHER_BYTES = MAX_PENDING_BYTES // 2
"""A batch this large is committed at once (the writers would soon wait for room)."""


@dataclass
class _Item:
    tmp: str | Path
    final: str | Path
    size_bytes: int
    dev: int
    mode: int | None
    mtime_ns: int | None
    on_commit: Callable[[bool], None] | None


def _prepare(item: _Item) -> bool:
    """Apply the mode and mtime; False when the file was withdrawn (is gone)."""
    try:
        if item.mode is not None:
            os.chmod(item.tmp, item.mode)
        if item.mtime_ns is not None:
            os.utime(item.tmp, ns=(item.mtime_ns, item.mtime_ns))
    except FileNotFoundError:
        return False
    return True


def _prepare_and_fsync(item: _Item) -> bool:
    """`_prepare` and fsync the file. Opened before the mode is applied, so a mode
    without read (or write) permission for the owner cannot keep it from being synced."""
    try:
        try:
            fd = os.open(item.tmp, os.O_RDONLY)
        except PermissionError:
            fd = os.open(item.tmp, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        if item.mode is not None:
            os.fchmod(fd, item.mode)
        if item.mtime_ns is not None:
            os.utime(fd, ns=(item.mtime_ns, item.mtime_ns))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _commit_one_filesystem(items: list[_Item]) -> list[bool]:
    """Durable bytes, then renames, then durable renames; per item, whether it is in
    place (False: its temporary file was withdrawn meanwhile). OSError on disk failures."""
    anchor = os.path.dirname(items[0].tmp)
    by_syncfs = False
    if len(items) >= SYNCFS_MIN_FILES:
        present = [_prepare(item) for item in items]
        by_syncfs = syncfs(anchor)
    if not by_syncfs:
        present = in_threads(_prepare_and_fsync, items)
    placed: list[bool] = []
    for item, ok in zip(items, present, strict=True):
        try:
            if ok:
                os.replace(item.tmp, item.final)
        except FileNotFoundError:
            ok = False  # withdrawn by its owner (e.g. an evicted chunk)
        placed.append(ok)
    if not (by_syncfs and syncfs(anchor)):
        dirs = {os.path.dirname(item.final) for item, ok in zip(items, placed, strict=True) if ok}
        fsync_dirs(Path(d) for d in dirs)
    return placed


class BatchFlusher:
    """Renames files into place in batches once their bytes are durable (module doc).

    Thread-safe. ``name`` names the thread and the errors. After a disk failure every
    later `add` and `flush` raises StorageError; the files not yet placed stay under
    their temporary names for the owner to clean up.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._pending_bytes = 0
        self._added = 0
        self._done = 0
        self._urgent = 0
        self._error: StorageError | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self.batches = 0
        """Batches committed (for tests and traces)."""

    def add(
        self,
        tmp: str | Path,
        final: str | Path,
        size_bytes: int,
        dev: int,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        on_commit: Callable[[bool], None] | None = None,
    ) -> None:
        """Hand over a written and closed file: ``tmp`` becomes ``final`` (same directory)
        once durable, with ``mode`` and ``mtime_ns`` when given. ``dev`` is the device of
        its filesystem (``st_dev``). ``on_commit(placed)`` runs on the flusher's thread
        afterwards. Waits while the backlog is full; StorageError after a disk failure."""
        with self._cond:
            while self._error is None and backlog_full(
                len(self._pending), self._pending_bytes, size_bytes,
                MAX_PENDING_FILES, MAX_PENDING_BYTES,
            ):  # fmt: skip
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._closing:
                raise StorageError(f"{self.name}: the flusher is closed")
            self._pending.append(_Item(tmp, final, size_bytes, dev, mode, mtime_ns, on_commit))
            self._pending_bytes += size_bytes
            self._added += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if len(self._pending) == 1 or self._batch_full():
                # Only then can the thread act on it (it waits for a first file, or
                # gathers until GATHER_S or a full batch): a wake-up per file, thousands
                # a second for a tree, only cost the writers the GIL.
                self._cond.notify_all()

    def _batch_full(self) -> bool:
        return len(self._pending) >= GATHER_FILES or self._pending_bytes >= GATHER_BYTES

    def flush(self) -> None:
        """Wait until every file handed over so far is in place and durable.

        StorageError when the disk refused a batch (with the OS reason)."""
        with self._cond:
            target = self._added
            self._urgent += 1
            self._cond.notify_all()
            try:
                while self._done < target and self._error is None:
                    self._cond.wait()
            finally:
                self._urgent -= 1
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """`flush`, then stop the thread (the thread stops even when `flush` raises)."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
                thread = self._thread
            if thread is not None:
                thread.join()

    def _take(self) -> list[_Item] | None:
        with self._cond:
            started = gather(
                self._cond,
                has_work=lambda: bool(self._pending),
                closing=lambda: self._closing,
                enough=lambda: self._batch_full() or bool(self._urgent),
            )
            if not started:
                return None
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._cond.notify_all()  # room for waiting writers
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            placed = [False] * len(batch)
            try:
                if self._error is None:
                    placed = self._commit(batch)
            except Exception as exc:  # a disk failure, or a bug: never a flush waiting forever
                where = f"files durable under {os.path.dirname(batch[0].final)}"
                with self._cond:
                    self._error = commit_failure(self.name, where, exc)
            run_callbacks(self.name, zip([item.on_commit for item in batch], placed, strict=True))
            with self._cond:
                self._done += len(batch)
                self.batches += 1
                self._cond.notify_all()

    @staticmethod
    def _commit(batch: list[_Item]) -> list[bool]:
        by_dev: dict[int, list[int]] = {}
        for index, item in enumerate(batch):
            by_dev.setdefault(item.dev, []).append(index)
        placed = [False] * len(batch)
        for indexes in by_dev.values():
            results = _commit_one_filesystem([batch[i] for i in indexes])
            for i, ok in zip(indexes, results, strict=True):
                placed[i] = ok
        return placed


def backlog_full(
    files: int, size_bytes: int, adding_bytes: int, max_files: int, max_bytes: int
) -> bool:
    """Whether a writer adding ``adding_bytes`` to a backlog of ``files`` (``size_bytes``)
    must wait for room: at ``max_files`` files, or past ``max_bytes`` with it (an empty
    backlog always takes one, however large)."""
    return files > 0 and (files >= max_files or size_bytes + adding_bytes > max_bytes)


def commit_failure(name: str, what: str, exc: Exception) -> StorageError:
    """The error a committing thread keeps (and logs) when making ``what`` durable failed:
    a disk error with its reason, anything else (a bug) with its traceback in the log."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    error = StorageError(f"{name}: cannot make {what}: {reason}")
    log.warning("%s", error, exc_info=not isinstance(exc, OSError))
    return error


def run_callbacks(
    name: str, callbacks: Iterable[tuple[Callable[[bool], None] | None, bool]]
) -> None:
    """Run each ``on_commit(placed)``; a callback's bug is logged and must not stop
    durability."""
    for on_commit, placed in callbacks:
        if on_commit is not None:
            try:
                on_commit(placed)
            except Exception:
                log.exception("%s: commit callback failed", name)


def gather(
    cond: threading.Condition,
    *,
    has_work: Callable[[], bool],
    closing: Callable[[], bool],
    enough: Callable[[], bool],
) -> bool:
    """For a committing thread holding ``cond``: wait for a first piece of work, then let
    more arrive for up to `GATHER_S` (one ``syncfs`` or ``fdatasync`` for them all) unless
    there is ``enough`` or the owner is closing. False when closing with nothing to do."""
    while not has_work() and not closing():
        cond.wait()
    if not has_work():
        return False
    deadline_s = time.monotonic() + GATHER_S
    while not enough() and not closing():
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            break
        cond.wait(left_s)
    return True


def discard(tmp: Path) -> None:
    """Remove a temporary file that will not be handed over (errors ignored)."""
    with contextlib.suppress(OSError):
        tmp.unlink()

"""Write a file from its chunks as they arrive: in order, under a temporary name, then rename.

A `FileAssembler` appends each chunk as soon as it and every chunk before it
are in the sink, so a large file is mostly written by the time its last chunk
lands; the remaining work is one fsync and a rename. The file appears under
its real name only complete, with the manifest's mode and mtime.
"""

from __future__ import annotations

import ctypes
import os
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Set
from pathlib import Path
from typing import IO, Any

from netopt.dataplane import trace
from netopt.dataplane.chunkio import ChunkSink
from netopt.errors import IntegrityError, PathTraversalError, StorageError
from netopt.transfer.manifest import FileEntry, Manifest

__all__ = ["FileAssembler", "scan_destination"]

RunInThread = Callable[..., Awaitable[Any]]


_SYNC_FILE_RANGE_WRITE = 2


def _load_start_writeback() -> Callable[[int, int, int], None] | None:
    """Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: start writing a
    range to disk without waiting; None where libc does not offer it."""
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int

    def start(fd: int, offset_bytes: int, length_bytes: int) -> None:
        func(fd, offset_bytes, length_bytes, _SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored

    return start


_start_writeback = _load_start_writeback()


def _write(f: IO[bytes], data: bytes) -> None:
    """Append ``data`` and start writing it to disk at once, so the file's final fsync
    finds little left to do (it otherwise flushes the whole file after the last chunk)."""
    offset_bytes = f.tell()
    f.write(data)
    if _start_writeback is not None:
        f.flush()
        _start_writeback(f.fileno(), offset_bytes, len(data))


def _open_tmp(target: Path) -> tuple[Path, IO[bytes]]:
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.netopt-tmp")
    return tmp, tmp.open("wb")


def _finish(f: IO[bytes], tmp: Path, target: Path, entry: FileEntry) -> None:
    trace.mark("file_fsync_start")
    f.flush()
    with trace.timed("file_fsync"):
        os.fsync(f.fileno())
    f.close()
    os.chmod(tmp, entry.mode)
    os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))
    os.replace(tmp, target)


def _discard(f: IO[bytes] | None, tmp: Path | None) -> None:
    if f is not None and not f.closed:
        f.close()
    if tmp is not None:
        tmp.unlink(missing_ok=True)


class FileAssembler:
    """Builds one file; `poke` it whenever a chunk it may need has been stored.

    ``available`` is the live set of chunk names in the sink; ``refetch`` fetches
    and verifies a chunk again when the sink lost it or it no longer verifies;
    ``on_done(entry)`` runs once the file is in place.
    """

    def __init__(
        self,
        entry: FileEntry,
        target: Path,
        sink: ChunkSink,
        available: Set[str],
        run_in_thread: RunInThread,
        refetch: Callable[[str], Awaitable[bytes]],
        on_done: Callable[[FileEntry], None],
    ) -> None:
        self.entry = entry
        self.target = target
        self.sink = sink
        self.available = available
        self._run = run_in_thread
        self._refetch = refetch
        self._on_done = on_done
        self._next = 0
        self._running = False
        self.done = False
        self._tmp: Path | None = None
        self._file: IO[bytes] | None = None

    def needs(self) -> set[str]:
        """The chunk names this file is made of."""
        return {ref.chunk_id for ref in self.entry.chunks}

    def poke(self) -> Coroutine[Any, Any, None] | None:
        """A coroutine that writes what is writable now, or None if one is already running."""
        if self._running or self.done:
            return None
        self._running = True
        return self._advance()

    def abandon(self) -> None:
        """Drop the partial temporary file of an unfinished file (the sync stopped)."""
        if not self.done:
            _discard(self._file, self._tmp)
            self._file = None
            self._tmp = None
            self._next = 0

    async def _chunk(self, chunk_id: str) -> bytes:
        try:
            return await self.sink.get(chunk_id)
        except (KeyError, IntegrityError):
            data = await self._refetch(chunk_id)
            await self.sink.put(chunk_id, data)
            return data

    async def _advance(self) -> None:
        chunks = self.entry.chunks
        try:
            if self._file is None:
                # Opened on the loop (one quick syscall): a thread could finish opening
                # after a cancellation and leak the handle.
                self._tmp, self._file = _open_tmp(self.target)
            while self._next < len(chunks) and chunks[self._next].chunk_id in self.available:
                data = await self._chunk(chunks[self._next].chunk_id)
                with trace.timed("file_write_await"):
                    await self._run(_write, self._file, data)
                self._next += 1
            if self._next == len(chunks):
                await self._run(_finish, self._file, self._tmp, self.target, self.entry)
                self.done = True
                trace.mark_last("files_written")
                self._on_done(self.entry)
        except OSError as exc:
            _discard(self._file, self._tmp)
            raise StorageError(f"cannot write {self.target}: {exc}") from exc
        except BaseException:
            _discard(self._file, self._tmp)
            raise
        finally:
            self._running = False


def _up_to_date(target: Path, entry: FileEntry) -> bool:
    try:
        st = target.lstat()
    except OSError:
        return False
    return target.is_file() and st.st_size == entry.size_bytes and st.st_mtime_ns == entry.mtime_ns


def _safe_target(dest_real: Path, entry: FileEntry) -> Path:
    """``dest/entry.path``, refusing a path that a symlink under dest would lead outside."""
    target = dest_real / entry.path
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {target.parent}: {exc}") from exc
    parent_real = target.parent.resolve()
    if parent_real != dest_real and dest_real not in parent_real.parents:
        raise PathTraversalError(f"{entry.path} leads outside {dest_real} through a symlink")
    return parent_real / target.name


def scan_destination(
    dest: Path, manifest: Manifest
) -> tuple[Path, list[tuple[FileEntry, Path]], int]:
    """Create ``dest``; the files still to write (with their targets) and the count skipped."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {dest}: {exc}") from exc
    dest_real = dest.resolve()
    pending: list[tuple[FileEntry, Path]] = []
    skipped = 0
    for entry in manifest.files:
        target = _safe_target(dest_real, entry)
        if _up_to_date(target, entry):
            skipped += 1
        else:
            pending.append((entry, target))
    return dest_real, pending, skipped

"""Write a file from its chunks as they arrive: in order, under a temporary name, then rename.

A `FileAssembler` appends each chunk as soon as it and every chunk before it
are in the sink, so a large file is mostly written by the time its last chunk
lands. The finished file is handed to the sync's `netopt.durable.BatchFlusher`,
which applies the manifest's mode and mtime, makes it durable together with the
other files finished meanwhile (one ``syncfs`` for many) and only then renames it
into place: the file appears under its real name complete and on disk, and no
writer waits for an fsync of its own.

A sync may have hundreds of thousands of files pending: a temporary file is
opened only once its first chunk is there, and an `OpenFiles` budget keeps at
most `MAX_OPEN_FILES` of them open (a handle between chunks is closed when
another file needs the slot, and reopened for appending later), so a sync runs
under ``ulimit -n 256``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import itertools
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from netopt.dataplane import trace
from netopt.dataplane.chunkio import ChunkSink
from netopt.dataplane.filewrite import create_whole
from netopt.dataplane.writerproc import WriterProcess
from netopt.durable import BatchFlusher
from netopt.errors import IntegrityError, PathTraversalError, StorageError
from netopt.fsutil import process_umask
from netopt.transfer.manifest import FileEntry, Manifest

__all__ = [
    "MAX_OPEN_FILES",
    "TMP_SUFFIX",
    "ClaimedWrite",
    "FileAssembler",
    "OpenFiles",
    "files_to_write",
    "place_files",
    "scan_destination",
    "tmp_stem",
    "write_claimed",
]

MAX_OPEN_FILES = 64
"""Temporary files one sync keeps open at once (sockets, cache and chunk files need the rest
of a 256 descriptor limit)."""

RunInThread = Callable[..., Awaitable[Any]]
"""Runs ``func(*args)`` on a pool thread; takes ``weight_bytes=`` (bytes the call handles,
for batching: `netopt.dataplane.batchrun`)."""


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


WRITEBACK_FROM_BYTES = 1024 * 1024
"""Files at least this large start writing each chunk to disk as it is appended."""


def _write(f: IO[bytes], data: bytes, writeback: bool) -> None:
    """Append ``data``; with ``writeback``, start writing it to disk at once, so the
    flusher finds little left to do for a large file (it otherwise writes the whole
    file after the last chunk). Small files are left to the flusher's batch."""
    offset_bytes = f.tell()
    f.write(data)
    if writeback and _start_writeback is not None:
        f.flush()
        _start_writeback(f.fileno(), offset_bytes, len(data))


_TMP_PREFIX = secrets.token_hex(4)
_tmp_serial = itertools.count()


TMP_SUFFIX = ".netopt-tmp"
_TMP_STEM_MAX_BYTES = 200
"""Longest file name a temporary name carries whole: with the dot, the token and the
suffix (at most ~30 bytes) it stays within NAME_MAX (255 bytes)."""


def tmp_stem(name: str) -> str:
    """What names the file ``name`` in its temporary names (``.STEM.TOKEN.netopt-tmp``):
    the name itself, or ``~`` and a digest of a name too long to take the suffix (a
    255-byte name would otherwise be unwritable: ENAMETOOLONG)."""
    raw = os.fsencode(name)
    if len(raw) <= _TMP_STEM_MAX_BYTES:
        return name
    return "~" + hashlib.blake2b(raw, digest_size=12).hexdigest()


def _tmp_name(target: str) -> str:
    """A fresh temporary name beside ``target``: one random prefix per process and a
    serial (a random token per file cost a ``getrandom`` call each, 20,000 for a tree).
    A string, not a path object: a tree of small files makes one per file, and every
    call that takes it converts a path object back to a string."""
    parent, _, name = target.rpartition("/")
    return f"{parent}/.{tmp_stem(name)}.{_TMP_PREFIX}{next(_tmp_serial):x}{TMP_SUFFIX}"


def _finish(f: IO[bytes], tmp: str, target: str, entry: FileEntry, flusher: BatchFlusher) -> None:
    """Close the complete file and hand it to ``flusher`` (which may wait while its
    backlog is full)."""
    f.flush()
    dev = os.fstat(f.fileno()).st_dev
    f.close()
    with trace.timed("file_handover"):
        flusher.add(tmp, target, entry.size_bytes, dev, mode=entry.mode, mtime_ns=entry.mtime_ns)


WHOLE_FILE_BYTES = WRITEBACK_FROM_BYTES
"""A file up to this size whose chunks are all in the sink when its writer first runs is
written in one go on a worker thread (create, write, close, hand over): one thread hop
per file instead of an open on the loop and a hop per chunk plus one to finish."""


def _write_whole(
    tmp: str,
    parts: list[bytes],
    target: str,
    where: Placement,
    entry: FileEntry,
    flusher: BatchFlusher,
) -> None:
    """Create ``tmp`` with ``parts`` (`netopt.dataplane.filewrite.create_whole`) and hand
    it to ``flusher``; on failure ``tmp`` is gone. The descriptor never outlives this
    call, so a cancelled writer leaks nothing: the file is either handed over whole or
    removed here (the flusher refuses it once closed). Its device is its directory's
    (`Placement`), not asked per file."""
    left_mode, left_mtime_ns = create_whole(tmp, parts, entry.mode, entry.mtime_ns, where.umask)
    try:
        with trace.timed("file_handover"):
            flusher.add(
                tmp, target, entry.size_bytes, where.dev, mode=left_mode, mtime_ns=left_mtime_ns
            )
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def written_whole(entry: FileEntry) -> bool:
    """Whether ``entry`` is one small chunk, written whole from its bytes when it arrives
    (`FileAssembler.claim`, `write_claimed`)."""
    return len(entry.chunks) == 1 and entry.size_bytes <= WHOLE_FILE_BYTES


ClaimedWrite = tuple[str, str, "Placement", FileEntry, BatchFlusher]
"""A whole file to write from one chunk's bytes: (temporary name, target, where it goes,
entry, flusher)."""


def write_claimed(
    data: bytes, claims: list[ClaimedWrite], writer: WriterProcess | None = None
) -> list[OSError | None]:
    """Write each claimed one-chunk file from ``data`` (`_write_whole`); per file, None
    once handed over, else the OSError (its temporary file is gone). With ``writer`` the
    files are handed to that helper process instead (its errors come at its next
    `WriterProcess.submit` or its flush, as StorageError)."""
    if writer is not None:
        writer.submit(
            [(tmp, target, data, entry.mode, entry.mtime_ns, where.umask, where.dev)
             for tmp, target, where, entry, _ in claims]
        )  # fmt: skip
        return [None] * len(claims)
    errors: list[OSError | None] = []
    for tmp, target, where, entry, flusher in claims:
        try:
            _write_whole(tmp, [data], target, where, entry, flusher)
        except OSError as exc:
            errors.append(exc)
        else:
            errors.append(None)
    return errors


def _discard(f: IO[bytes] | None, tmp: str | None) -> None:
    if f is not None and not f.closed:
        f.close()
    if tmp is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class OpenFiles:
    """The budget of temporary files one sync may hold open: at most ``limit``.

    A file being written holds one of ``limit`` slots (`acquire` / `release`); its
    handle may stay open after it (it is then *idle*, waiting for its next chunk)
    only while writers and idle handles together stay within the limit: a writer
    that needs the room closes the oldest idle handle. A slot is held only while
    chunks already in the sink are written, never across a fetch, so every waiting
    file gets one.
    """

    def __init__(self, limit: int = MAX_OPEN_FILES) -> None:
        self.limit = max(1, limit)
        self._slots = asyncio.Semaphore(self.limit)
        self._writing = 0
        self._idle: OrderedDict[FileAssembler, None] = OrderedDict()
        self.most_open = 0
        """The most handles open at once (writers plus idle), for tests and traces."""

    async def acquire(self, owner: FileAssembler) -> None:
        """Wait for a slot for ``owner``; close idle handles of others to make room."""
        await self._slots.acquire()
        self._writing += 1
        self._idle.pop(owner, None)
        while self._idle and self._writing + len(self._idle) > self.limit:
            victim, _ = self._idle.popitem(last=False)
            victim.close_idle()
        self.most_open = max(self.most_open, self._writing + len(self._idle))

    def release(self, owner: FileAssembler, keep_open: bool) -> None:
        """Give the slot back; ``keep_open``: ``owner``'s handle stays open, idle."""
        self._writing -= 1
        if keep_open:
            self._idle[owner] = None
        self._slots.release()

    def forget(self, owner: FileAssembler) -> None:
        """``owner`` closed its handle itself (done or abandoned)."""
        self._idle.pop(owner, None)


class FileAssembler:
    """Builds one file; `poke` it whenever a chunk it may need has been stored.

    ``available`` is the live set of chunk names in the sink; ``refetch`` fetches
    and verifies a chunk again when the sink lost it or it no longer verifies;
    ``on_done(entry)`` runs once the file is complete and handed to ``flusher``
    (which puts it in place once durable). ``open_files`` is the sync's budget of
    open temporary files (one of its own when not given).
    """

    def __init__(
        self,
        entry: FileEntry,
        target: str,
        where: Placement,
        sink: ChunkSink,
        available: Set[str],
        run_in_thread: RunInThread,
        refetch: Callable[[str], Awaitable[bytes]],
        on_done: Callable[[FileEntry], None],
        flusher: BatchFlusher,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.entry = entry
        self.target = target
        self.where = where
        self.sink = sink
        self.available = available
        self._run = run_in_thread
        self._refetch = refetch
        self._on_done = on_done
        self._flusher = flusher
        self._writeback = entry.size_bytes >= WRITEBACK_FROM_BYTES
        self._open_files = open_files or OpenFiles()
        self._next = 0
        self._running = False
        self.done = False
        self._tmp: str | None = None
        self._file: IO[bytes] | None = None

    def needs(self) -> set[str]:
        """The chunk names this file is made of."""
        return {ref.chunk_id for ref in self.entry.chunks}

    def _writable(self) -> bool:
        chunks = self.entry.chunks
        return self._next == len(chunks) or chunks[self._next].chunk_id in self.available

    def poke(self) -> Coroutine[Any, Any, None] | None:
        """A coroutine that writes what is writable now; None if one is already running or
        the next chunk is not in the sink yet."""
        if self._running or self.done or not self._writable():
            return None
        self._running = True
        return self._advance()

    def close_idle(self) -> None:
        """Close the handle between chunks (the budget needs the slot); reopened later."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def claim(self, chunk_id: str) -> ClaimedWrite | None:
        """Take this file to be written whole from ``chunk_id``'s bytes, on the pool thread
        that verifies the chunk (`write_claimed`): one hand-off per small file instead of
        one to verify and one to write. None unless the file is that one chunk, small
        (`WHOLE_FILE_BYTES`) and not started; else the write, and `claimed` must follow."""
        if (
            not written_whole(self.entry)
            or self.entry.chunks[0].chunk_id != chunk_id
            or self._running
            or self.done
            or self._tmp is not None
        ):
            return None
        self._running = True
        self._tmp = _tmp_name(self.target)
        return self._tmp, self.target, self.where, self.entry, self._flusher

    def claimed(self, written: bool, error: OSError | None = None) -> None:
        """The claimed write's outcome: done (``written``), not run (the chunk failed its
        check: the file waits for a good copy) or failed (StorageError)."""
        self._running = False
        if not written:
            self._tmp = None
            if error is not None:
                raise StorageError(f"cannot write {self.target}: {error}") from error
            return
        self._next = len(self.entry.chunks)
        self.done = True
        trace.mark_last("files_written")
        self._on_done(self.entry)

    def abandon(self) -> None:
        """Drop the partial temporary file of an unfinished file (the sync stopped)."""
        if not self.done:
            self._open_files.forget(self)
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

    def _open(self) -> IO[bytes]:
        # Opened on the loop (one quick syscall): a thread could finish opening after a
        # cancellation and leak the handle.
        if self._tmp is None:
            self._tmp = _tmp_name(self.target)
            self._file = open(self._tmp, "wb")  # noqa: SIM115 (open between chunks)
        else:
            self._file = open(self._tmp, "ab")  # noqa: SIM115  # closed between chunks for the budget
        return self._file

    async def _advance(self) -> None:
        try:
            if self._tmp is None and self._whole_now():
                # No slot: the call opens and closes the file on a pool thread (at most
                # one per thread), and a file queued for it must not hold one meanwhile.
                await self._write_whole()
                return
            await self._open_files.acquire(self)
            keep_open = False
            try:
                keep_open = await self._write_available()
            finally:
                self._open_files.release(self, keep_open)
        finally:
            self._running = False

    def _whole_now(self) -> bool:
        return self.entry.size_bytes <= WHOLE_FILE_BYTES and all(
            ref.chunk_id in self.available for ref in self.entry.chunks
        )

    async def _write_whole(self) -> None:
        """Write the whole small file at once (see `WHOLE_FILE_BYTES`)."""
        parts = [await self._chunk(ref.chunk_id) for ref in self.entry.chunks]
        tmp = self._tmp = _tmp_name(self.target)
        try:
            with trace.timed("file_write_await"):
                await self._run(
                    _write_whole, tmp, parts, self.target, self.where, self.entry, self._flusher,
                    weight_bytes=self.entry.size_bytes,
                )  # fmt: skip
        except OSError as exc:
            raise StorageError(f"cannot write {self.target}: {exc}") from exc
        self._next = len(self.entry.chunks)
        self.done = True
        trace.mark_last("files_written")
        self._on_done(self.entry)

    async def _write_available(self) -> bool:
        """Append the chunks in the sink, finish the file if that was the last; True when
        the handle stays open for the next chunk."""
        chunks = self.entry.chunks
        try:
            f = self._file or self._open()
            while self._next < len(chunks) and chunks[self._next].chunk_id in self.available:
                data = await self._chunk(chunks[self._next].chunk_id)
                with trace.timed("file_write_await"):
                    await self._run(_write, f, data, self._writeback, weight_bytes=len(data))
                self._next += 1
            if self._next < len(chunks):
                return True
            # A hand-over cut short (cancelled) races with the discard below: either the
            # file is withdrawn before its rename or it is placed whole; both are fine.
            await self._run(_finish, f, self._tmp, self.target, self.entry, self._flusher)
            self._file = None
            self.done = True
            trace.mark_last("files_written")
            self._on_done(self.entry)
            return False
        except OSError as exc:
            _discard(self._file, self._tmp)
            self._file = None
            raise StorageError(f"cannot write {self.target}: {exc}") from exc
        except BaseException:
            _discard(self._file, self._tmp)
            self._file = None
            raise


def _up_to_date(target: str, entry: FileEntry) -> bool:
    try:
        st = os.lstat(target)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_size == entry.size_bytes
        and st.st_mtime_ns == entry.mtime_ns
    )


def _dev_of(directory: Path) -> int:
    try:
        return os.stat(directory).st_dev
    except OSError as exc:
        raise StorageError(f"cannot stat {directory}: {exc}") from exc


def _safe_parent(dest_real: Path, rel_dir: str) -> tuple[Path, bool]:
    """``dest/rel_dir`` created and resolved, refusing one that a symlink under dest would
    lead outside; and whether it was created just now (then it holds nothing yet)."""
    parent = dest_real / rel_dir if rel_dir else dest_real
    fresh = False
    try:
        try:
            parent.mkdir(parents=True)
            fresh = True
        except FileExistsError:
            if not parent.is_dir():
                raise
    except OSError as exc:
        raise StorageError(f"cannot create {parent}: {exc}") from exc
    parent_real = parent.resolve()
    if parent_real != dest_real and dest_real not in parent_real.parents:
        raise PathTraversalError(f"{rel_dir} leads outside {dest_real} through a symlink")
    return parent_real, fresh


@dataclass(frozen=True)
class Placement:
    """What the files of one destination directory share: the device of its filesystem
    (``st_dev``: the flusher syncs a file through its directory) and the process's umask
    when the sync began (None: unknown, every file gets an ``fchmod``)."""

    dev: int
    umask: int | None


_Dir = tuple[str, bool, Placement]
"""A destination directory: its resolved path, whether this sync created it (then it
holds nothing yet), and its `Placement`."""


def _directory(dest_real: Path, rel_dir: str, known: dict[str, _Dir], umask: int | None) -> _Dir:
    """``rel_dir`` under ``dest_real``, created if missing, and every directory above it,
    each noted in ``known``. One created in a directory this sync created needs neither a
    resolve nor a stat: nothing in it can be a symlink, and it is on its parent's
    filesystem (a tree of packages has thousands of directories: ~0.2 s of its start)."""
    chain: list[str] = []
    above = rel_dir
    while above and above not in known:
        chain.append(above)
        above = above.rpartition("/")[0]
    if above not in known:  # the destination itself
        real, fresh = _safe_parent(dest_real, "")
        known[""] = (str(real), fresh, Placement(_dev_of(real), umask))
    parent = known[above]
    for rel in reversed(chain):
        made: _Dir | None = None
        if parent[1]:
            path = os.path.join(parent[0], rel.rpartition("/")[2])
            try:
                os.mkdir(path)
                made = (path, True, parent[2])
            except FileExistsError:
                pass  # came meanwhile: checked as any existing directory is
            except OSError as exc:
                raise StorageError(f"cannot create {path}: {exc}") from exc
        if made is None:
            real, fresh = _safe_parent(dest_real, rel)
            made = (str(real), fresh, Placement(_dev_of(real), umask))
        known[rel] = parent = made
    return parent


def _make_dest(dest: Path) -> Path:
    """``dest`` created if missing, resolved."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {dest}: {exc}") from exc
    return dest.resolve()


def files_to_write(
    manifest: Manifest, present: Mapping[str, tuple[int, int]]
) -> tuple[list[FileEntry], int]:
    """The manifest's files to write, and the count skipped, from ``present``: the
    (size, mtime_ns) of the regular files a listing of the destination found just before
    (`netopt.cache.syncer.scan_dest`). Touches no disk: the fetch can begin while
    `place_files` makes their directories."""
    pending = [
        entry
        for entry in manifest.files
        if present.get(entry.path) != (entry.size_bytes, entry.mtime_ns)
    ]
    return pending, len(manifest.files) - len(pending)


def place_files(
    dest: Path, entries: list[FileEntry]
) -> tuple[Path, list[tuple[FileEntry, str, Placement]]]:
    """Create ``dest`` and the directories of ``entries`` (files `files_to_write` chose);
    ``dest`` resolved, and each file with its target and `Placement`. Raises
    PathTraversalError where a symlink under ``dest`` would lead a directory outside it.

    The targets are strings joined to each directory's resolved path: a path object per
    file cost 0.8 s of a 100,000-file sync's start, and every call that takes a target
    converts it back to a string."""
    dest_real = _make_dest(dest)
    umask = process_umask()
    parents: dict[str, _Dir] = {}
    placed: list[tuple[FileEntry, str, Placement]] = []
    for entry in entries:
        rel_dir, _, name = entry.path.rpartition("/")
        parent = parents.get(rel_dir)
        if parent is None:
            parent = _directory(dest_real, rel_dir, parents, umask)
        placed.append((entry, os.path.join(parent[0], name), parent[2]))
    return dest_real, placed


def scan_destination(
    dest: Path, manifest: Manifest
) -> tuple[Path, list[tuple[FileEntry, str, Placement]], int]:
    """Create ``dest``; the files still to write (with their targets and `Placement`) and
    the count skipped, each file stat'ed: for a sync without a listing of ``dest`` (with
    one, `files_to_write` and `place_files`)."""
    dest_real = _make_dest(dest)
    pending: list[tuple[FileEntry, str, Placement]] = []
    skipped = 0
    umask = process_umask()
    # Each directory is created, resolved and stat'ed once (a tree of many files has
    # few); the files of a directory created just now need no stat: none of them is
    # there yet. A file's filesystem is its directory's: the flusher syncs it through
    # that directory.
    parents: dict[str, _Dir] = {}
    for entry in manifest.files:
        rel_dir, _, name = entry.path.rpartition("/")
        parent = parents.get(rel_dir)
        if parent is None:
            parent = _directory(dest_real, rel_dir, parents, umask)
        target = os.path.join(parent[0], name)
        # A directory created just now holds nothing yet.
        if not parent[1] and _up_to_date(target, entry):
            skipped += 1
        else:
            pending.append((entry, target, parent[2]))
    return dest_real, pending, skipped

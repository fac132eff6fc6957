"""Downloads of a source without a manifest (a web directory, an S3 prefix), kept until
the sync that needed them succeeds, and resumed where a failed try left them.

Such a source is chunked here after each changed file is downloaded whole. A link cut
or an origin restart in the middle of a large file used to end the open with the
spool deleted, and the open's retry (`netopt.cache.openretry`), or the next run after a
killed one, downloaded every file again from byte 0. The spool now lives in the
source's state directory (`spool-KIND-HASH`, one per source URL, held by one sync at
a time) and each download in it is named by its remote
key and remembers the validator (size, ETag, Last-Modified) it was started for:

- a complete download of the same validator is taken as it is (no request);
- a partial one is continued from its length with a range request that names the
  validator (`If-Range` for HTTP, `IfMatch` for S3); a server that answers with the
  whole file instead (it ignores ranges, or the file changed) starts it again;
- one of another validator, or longer than its file, is started again.

A file of `PARTS_MIN_BYTES` or more from an origin that serves ranges comes in parts
at once, on up to `MAX_PARTS` connections (as ``aria2c -x`` splits one): the origin's
congestion control sets one connection's rate, and a loss-based one holds it to a few
Mbit/s on a lossy long link. The parts are not fixed: a connection whose part is in
takes the second half of the part with the most left (while that half is
`TAKE_MIN_BYTES` or more), so no connection idles while a slow one holds the file
back. Each part is its own file, named by the byte it starts at (``HASH.parts/atN``)
and holding bytes from there on, so a kill or a cut leaves files that say exactly
which bytes are in: the next try asks only for the bytes between them. The files are
joined when all bytes are in.

A download never grows past its listed size: an answer that goes on is cut there and
fails the try, as one that ends short does; one listed without a size stops at
`UNSIZED_MAX_BYTES`. The
spool is removed once the sync using it has every chunk (`Spool.release`, while the
files are made durable) or ends well, and kept when it fails before, for the next try.
Without a state directory it is a temporary directory, removed either way.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import BinaryIO

from netopt.cache.remotefiles import RemoteFile, at_most
from netopt.dataplane import trace
from netopt.dataplane.manifestpieces import PiecesBroken, content_range
from netopt.dataplane.onloop import blocking
from netopt.errors import NetworkError, ProtocolError
from netopt.fsutil import atomic_write_bytes

__all__ = [
    "LISTED_ONLY",
    "LISTINGS_NAME",
    "MAX_PARTS",
    "PARTS_MIN_BYTES",
    "PART_BYTES",
    "TAKE_MIN_BYTES",
    "UNSIZED_MAX_BYTES",
    "WRITE_BYTES",
    "FetchFrom",
    "FetchUnlisted",
    "Spool",
    "content_range_start",
    "missing_spans",
    "open_spool",
    "parts_worth",
    "split_spans",
]

FetchFrom = Callable[
    [RemoteFile, int, int | None], AbstractAsyncContextManager[tuple[int, AsyncIterable[bytes]]]
]
"""Ask for ``remote`` from byte ``offset`` (0: all of it) up to byte ``end`` (exclusive;
None: to its end): (the offset the answer starts at, either ``offset`` or 0, and its
bytes)."""

PARTS_MIN_BYTES = 2 << 20
"""A file at least this large, from an origin that serves ranges, is downloaded in parts
at once, as ``aria2c -x`` does (two `PART_BYTES` or more): one connection's rate on a
lossy long link is set by the origin's congestion control, which a loss-based one (reno,
cubic) holds to a few Mbit/s, so the rate grows with the connections (on the lab, 5
Parquet files of 20 MB in 4 parts each took 85 s from a reno origin, `aria2c -x16` 21
s; with files of 4 MiB or more in 16 parts, the four 24 MB files were in after 18 s,
while the set's 3.3 MB file, on one connection, held the sync to 44 s)."""
PART_BYTES = 1 << 20
"""The smallest part a file is cut into at first (``aria2c -k 1M``)."""
TAKE_MIN_BYTES = 256 << 10
"""The smallest half of a part a connection that is done takes over. With 1 MiB halves
the last parts of a 100 MB file ran alone for ~4 s on the lab's bbr link (16 parts
ended between 7.9 and 14.0 s); a half this size takes ~0.5 s on one connection there,
several round trips more than asking for it costs."""
MAX_PARTS = 16
"""The most connections one file's parts use at once (``aria2c -x16``)."""

FetchUnlisted = Callable[
    [str, "tuple[RemoteFile, int] | None"],
    AbstractAsyncContextManager[tuple[RemoteFile, int, AsyncIterable[bytes]]],
]
"""Ask for the file ``key`` not listed yet, from where a kept download (the file as
listed then, bytes kept) stopped if it is still that file: (the file as the answer lists
it, the offset the answer starts at, its bytes)."""

UNSIZED_MAX_BYTES = 4 << 30
"""The most a download of a file listed without a size may take (a GET answered
without ``Content-Length``): an unbounded one let a hostile origin fill the disk."""

WRITE_BYTES = 256 << 10
"""A download's bytes are written in writes of about this size, on a pool thread (a
file's last bytes, fewer, on the loop): a thread hand-off per piece of the answer (16-64
KiB) cost more than the write, and with one per file for each of the spool's steps the
benchmark's 4,800 images took 17.5 CPU s on loopback (1.4 million futex calls). A file
of `netopt.dataplane.onloop.ON_LOOP_MAX_BYTES` or less is written, its listing kept and
its download begun on the loop itself. A ``kill -9`` loses at most this much of each
download under way (a cut loses nothing: what came is written)."""

LISTINGS_NAME = "listings.jsonl"
"""The spool's journal of each download's listing (the file as listed when it began: size
and validator), one JSON line appended per download begun, the last for a key the one
that holds: one write a file, where a file per download cost its create, write, two
reads and a removal (the spool's per-file work on a tree of small files)."""

LISTED_ONLY = -1
"""The offset a `FetchUnlisted` answer gives for a file it only listed: one to download
in parts (`parts_worth`), whose whole answer it dropped."""


def parts_worth(remote: RemoteFile) -> bool:
    """Whether ``remote`` is downloaded in parts (large, from an origin serving ranges)."""
    return remote.ranges and remote.size_bytes >= PARTS_MIN_BYTES


def content_range_start(header: str | None) -> int:
    """The first byte of a ranged answer, by its ``Content-Range`` (read by the project's
    one parser of it, `netopt.dataplane.manifestpieces.content_range`); -1 when it is
    missing or malformed (a resumed download then refuses the answer)."""
    try:
        start, _, _ = content_range(header)
    except PiecesBroken:
        return -1
    return -1 if start is None else start


class Spool:
    """Downloads named by remote key in ``root`` (see the module doc)."""

    def __init__(self, root: Path, listed: dict[str, RemoteFile] | None = None) -> None:
        """The spool in ``root`` (an existing directory), its journal opened for appends
        (blocking: one open); OSError when it cannot be."""
        self.root = root
        # Each download's listing when it began, by key (`LISTINGS_NAME`), and each
        # key's download path, made once (5-6 times a file before: ~7% of a tree's
        # download CPU); as many of each as the source lists and earlier tries began.
        self._listed = dict(listed or {})
        self._named: dict[str, Path] = {}
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._listings_fd: int | None = os.open(root / LISTINGS_NAME, flags, 0o600)
        self._removing: asyncio.Future[None] | None = None

    @classmethod
    def load(cls, root: Path) -> Spool:
        """The spool in ``root`` with the listings its journal keeps (blocking). A line
        that does not read as one is skipped (a crash may tear the last line): its
        download then begins again. A torn journal, or one of mostly replaced lines, is
        rewritten with the listings it holds."""
        listed: dict[str, RemoteFile] = {}
        try:
            journal = (root / LISTINGS_NAME).read_bytes()
        except FileNotFoundError:
            journal = b""
        lines = journal.splitlines()
        for line in lines:
            try:
                remote = RemoteFile(**json.loads(line))
            except (ValueError, TypeError):
                continue
            if isinstance(remote.key, str):
                listed[remote.key] = remote
        # Rewritten when torn (the next line would be appended to the torn one) or
        # mostly replaced lines.
        torn = bool(journal) and not journal.endswith(b"\n")
        if torn or len(lines) > 2 * len(listed) + 1000:
            atomic_write_bytes(root / LISTINGS_NAME, b"".join(map(_listing_line, listed.values())))
        return cls(root, listed)

    def close(self) -> None:
        """Close the listings' journal (blocking: one close)."""
        if self._listings_fd is not None:
            os.close(self._listings_fd)
            self._listings_fd = None

    def release(self) -> None:
        """Nothing more is read from the spool (the sync has every chunk): its removal
        starts now, on a thread, while the sync makes its files durable. Its files
        then need no write-back, and the end of a sync of 4,800 images no longer waits
        0.6-0.9 s for 4,800 unlinks. The source's state is saved before the sync
        begins, so a sync that fails after this fetches what it lacks by range, as a
        re-sync does, rather than from the spool."""
        if self._removing is None:
            self.close()
            trace.mark("spool_released")
            removal = asyncio.to_thread(shutil.rmtree, self.root, True)
            self._removing = asyncio.ensure_future(removal)

    async def removed(self) -> bool:
        """Wait for the removal `release` began; False when none began."""
        if self._removing is None:
            return False
        await asyncio.shield(self._removing)
        return True

    def _path(self, key: str) -> Path:
        path = self._named.get(key)
        if path is None:
            name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40]
            path = self._named[key] = self.root / f"{name}.part"
        return path

    def _kept(self, key: str) -> tuple[RemoteFile, int] | None:
        """What the spool holds of ``key`` (blocking: a stat): the file as it was listed
        when its download began, and the bytes kept; None when nothing."""
        listed = self._listed.get(key)
        # No download file yet: none begun, or one in parts (``HASH.parts/atN``).
        return None if listed is None else (listed, _size_or_zero(self._path(key)))

    def _parts_dir(self, key: str) -> Path:
        """The directory of ``key``'s parts (``HASH.parts/atN``): its own, so finding or
        removing them never lists the spool (a glob of the spool per file took a tree of
        4,800 images from 30 to 75 CPU s, and its sync from 50 to 81 s, on the lab)."""
        data = self._path(key)
        return data.with_name(f"{data.name}s")

    def _kept_parts(self, remote: RemoteFile) -> list[tuple[int, Path, int]]:
        """(first byte, file, bytes in it) of each part of ``remote`` kept (blocking), in
        order of first byte; bytes past the file's listed size are not counted."""
        kept: list[tuple[int, Path, int]] = []
        try:
            entries = list(os.scandir(self._parts_dir(remote.key)))
        except FileNotFoundError:
            return kept
        for entry in entries:
            first_text = entry.name.removeprefix("at")
            if not first_text.isdigit() or len(first_text) > 20:
                continue  # not a part file
            first = int(first_text)
            have = min(_size_or_zero(Path(entry.path)), remote.size_bytes - first)
            if have > 0:
                kept.append((first, Path(entry.path), have))
        return sorted(kept, key=lambda k: k[0])

    def _begin(self, remote: RemoteFile) -> None:
        """Start ``remote``'s download afresh (blocking): no bytes, its listing appended
        to the journal (before any byte of it is written: a kill in between leaves the
        listing with no bytes, never bytes under another file's listing)."""
        self._path(remote.key).unlink(missing_ok=True)
        shutil.rmtree(self._parts_dir(remote.key), ignore_errors=True)
        if self._listings_fd is None:
            raise OSError(f"{self.root}: the spool is closed")
        line = _listing_line(remote)
        if os.write(self._listings_fd, line) != len(line):
            raise OSError(f"{self.root / LISTINGS_NAME}: a listing only partly written")
        self._listed[remote.key] = remote

    def _resume_offset(self, remote: RemoteFile) -> int:
        """Bytes already downloaded for ``remote``'s validator (blocking); 0 after a reset."""
        kept = self._kept(remote.key)
        if kept is not None and kept[0].validator == remote.validator:
            have = kept[1]
            if remote.size_bytes < 0 or have <= remote.size_bytes:
                return have
        self._begin(remote)
        return 0

    async def download(self, remote: RemoteFile, fetch_from: FetchFrom) -> tuple[Path, int]:
        """``remote`` whole in the spool: (its path, bytes this call took on the wire).

        Raises what ``fetch_from`` raises; NetworkError for an answer that ends short of
        the listed size or goes past it (the file changed: the open's next try lists it
        again), ProtocolError for one from another offset than asked.
        """
        data = self._path(remote.key)
        have = await blocking(remote.size_bytes, self._resume_offset, remote)
        # A file of unknown size is never taken as complete: it is asked for whole.
        if remote.size_bytes >= 0 and have == remote.size_bytes:
            return data, 0
        if remote.size_bytes < 0:
            have = 0
        if parts_worth(remote):
            return data, await self._download_parts(remote, fetch_from)
        async with fetch_from(remote, have, None) as (start, pieces):
            if start not in (0, have):
                raise ProtocolError(f"{remote.key}: answered from byte {start}, asked {have}")
            got = await self._write(remote, start, pieces)
        return data, got

    async def _download_parts(self, remote: RemoteFile, fetch_from: FetchFrom) -> int:
        """``remote`` in parts at once (see the module doc), the bytes kept from an earlier
        try not asked for again, then joined into its download: the bytes taken."""
        kept = await asyncio.to_thread(self._kept_parts, remote)
        await asyncio.to_thread(self._parts_dir(remote.key).mkdir, exist_ok=True)
        spans = missing_spans([(first, have) for first, _, have in kept], remote.size_bytes)
        missing_bytes = sum(end - first for first, end in spans)
        connections = min(MAX_PARTS, max(len(spans), missing_bytes // PART_BYTES))
        planned = split_spans(spans, connections)
        waiting = collections.deque(_Span(first, first, end) for first, end in planned)
        active: list[_Span] = []
        got = 0

        async def connection(_: int) -> None:
            nonlocal got
            while (span := waiting.popleft() if waiting else _take_half(active)) is not None:
                active.append(span)
                try:
                    taken = await self._fetch_part(remote, span, fetch_from)
                    got += taken  # not ``got += await``: that reads ``got`` before the wait
                finally:
                    active.remove(span)

        await at_most(connections, connections, connection)
        trace.mark_last("spool_parts_in")
        await asyncio.to_thread(self._join, remote)
        trace.mark_last("spool_joined")
        return got

    async def _fetch_part(self, remote: RemoteFile, span: _Span, fetch_from: FetchFrom) -> int:
        """``span``'s bytes into its own part file, up to its end, which may move down
        while they come (another connection took the rest): the bytes taken."""
        path = self._parts_dir(remote.key) / f"at{span.first}"
        trace.count("spool_parts")
        async with fetch_from(remote, span.first, span.end) as (start, pieces):
            trace.mark("spool_first_part_answer")
            if start != span.first:
                raise ProtocolError(f"{remote.key}: answered from byte {start}, asked {span.first}")
            with path.open("wb") as f:
                async with _Pending(f) as pending:
                    async for piece in pieces:
                        take = min(len(piece), span.end - span.next)
                        # Counted before the write: a connection taking half of this
                        # part meanwhile splits it after these bytes.
                        span.next += take
                        await pending.add(piece[:take])
                        if span.next >= span.end:
                            break  # not asked for, or another connection has the rest
        if span.next < span.end:
            raise NetworkError(f"{remote.key}: a part ended at byte {span.next} of {span.end}")
        return span.next - span.first

    def _join(self, remote: RemoteFile) -> None:
        """The kept parts, in order, as ``remote``'s download (blocking); their directory
        removed once all are copied. NetworkError when they leave a byte out."""
        data = self._path(remote.key)
        parts = self._kept_parts(remote)
        done = 0
        with data.open("wb") as out:
            for first, path, have in parts:
                if first > done:
                    raise NetworkError(f"{remote.key}: bytes {done}-{first - 1} never came")
                if first + have > done:
                    with path.open("rb") as f:
                        f.seek(done - first)
                        _copy(f, out, first + have - done)
                    done = first + have
        if done != remote.size_bytes:
            raise NetworkError(f"{remote.key}: ended at byte {done} of {remote.size_bytes}")
        shutil.rmtree(self._parts_dir(remote.key), ignore_errors=True)

    async def download_unlisted(
        self, key: str, fetch: FetchUnlisted
    ) -> tuple[RemoteFile, Path, int]:
        """``key`` whole in the spool without a listing first (no HEAD: its GET's answer
        lists it): (the file as answered, its path, bytes on the wire). A partial
        download is resumed as `download` does; one complete for the file as the server
        answers it now is then taken by `download` without a request."""
        kept = self._kept(key)  # one small file read and a stat: on the loop
        async with fetch(key, kept) as (remote, start, pieces):
            if start == LISTED_ONLY:
                # Large enough for parts: `download` asks for them all at once (reading
                # this answer's first part here held the others back until it was in),
                # the parts kept so far too.
                if kept is None or kept[0] != remote:
                    await asyncio.to_thread(self._begin, remote)
                return remote, self._path(key), 0
            if start == 0:
                await blocking(remote.size_bytes, self._begin, remote)
            elif kept is None or start != kept[1] or remote != kept[0]:
                raise ProtocolError(f"{key}: answered from byte {start}, not where it stopped")
            got = await self._write(remote, start, pieces)
        return remote, self._path(key), got

    async def _write(self, remote: RemoteFile, start: int, pieces: AsyncIterable[bytes]) -> int:
        """Write ``pieces`` into ``remote``'s download from byte ``start``: the bytes
        taken. NetworkError when they end short of its listed size or go past it."""
        data = self._path(remote.key)
        got = 0
        with data.open("r+b" if start and data.exists() else "wb") as f:
            f.truncate(start)
            f.seek(start)
            size = start
            # What came before a cut is written (the next try resumes after it); a piece
            # over the bounds below is not.
            async with _Pending(f) as pending:
                async for piece in pieces:
                    size += len(piece)
                    got += len(piece)
                    if 0 <= remote.size_bytes < size:
                        # Changed since it was listed (or a hostile server): a new
                        # listing, on the open's next try, sees what it is now.
                        raise NetworkError(
                            f"{remote.key}: more than its listed {remote.size_bytes} bytes"
                        )
                    if remote.size_bytes < 0 and size > UNSIZED_MAX_BYTES:
                        raise ProtocolError(
                            f"{remote.key}: listed without a size and over {UNSIZED_MAX_BYTES} "
                            "bytes, the most such a file may take"
                        )
                    await pending.add(piece)
        if 0 <= remote.size_bytes != size:
            raise NetworkError(f"{remote.key}: ended at byte {size} of {remote.size_bytes}")
        return got


class _Pending:
    """Pieces of a download kept until there are `WRITE_BYTES` of them, then written to
    ``f`` on a pool thread; those left when the block ends, fewer, are written on the loop
    (after a cut too: the next try resumes after them)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.pieces: list[bytes] = []
        self.size_bytes = 0

    async def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.size_bytes += len(piece)
        if self.size_bytes >= WRITE_BYTES:
            # Taken before the write: bytes a failed write may have half written are
            # never written twice.
            pieces, self.pieces, self.size_bytes = self.pieces, [], 0
            await asyncio.to_thread(self.f.writelines, pieces)

    async def __aenter__(self) -> _Pending:
        return self

    async def __aexit__(self, *_: object) -> None:
        pieces, self.pieces, self.size_bytes = self.pieces, [], 0
        self.f.writelines(pieces)


def _listing_line(remote: RemoteFile) -> bytes:
    return json.dumps(dataclasses.asdict(remote)).encode() + b"\n"


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def missing_spans(kept: list[tuple[int, int]], size_bytes: int) -> list[tuple[int, int]]:
    """The (first byte, end byte exclusive) of each run of a file's ``size_bytes`` that
    no kept part holds; ``kept``: (first byte, bytes held) of each part, in order."""
    spans: list[tuple[int, int]] = []
    done = 0
    for first, have in kept:
        if first > done:
            spans.append((done, first))
        done = max(done, first + have)
    if done < size_bytes:
        spans.append((done, size_bytes))
    return spans


def split_spans(spans: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """``spans`` (first byte, end byte exclusive) cut into about ``count`` equal parts
    (``aria2c -x``): each span its share of ``count`` by its length, at least one, and
    no more than it holds `PART_BYTES`; in order of first byte."""
    total = sum(end - first for first, end in spans)
    parts: list[tuple[int, int]] = []
    for first, end in spans:
        length = end - first
        share = round(count * length / total) if total else 1
        cuts = max(1, min(share, length // PART_BYTES))
        parts += [
            (first + length * i // cuts, first + length * (i + 1) // cuts) for i in range(cuts)
        ]
    return parts


@dataclasses.dataclass
class _Span:
    """A part being downloaded: bytes ``first`` to ``end`` (exclusive), ``next`` the next
    to come; ``end`` moves down when another connection takes the rest."""

    first: int
    next: int
    end: int


def _take_half(active: list[_Span]) -> _Span | None:
    """The second half of the part with the most bytes still to come, taken from it (its
    end moved to the half); None while no part has two `TAKE_MIN_BYTES` left."""
    if not active:
        return None
    most = max(active, key=lambda span: span.end - span.next)
    left = most.end - most.next
    if left < 2 * TAKE_MIN_BYTES:
        return None
    half = most.next + left // 2
    taken = _Span(half, half, most.end)
    most.end = half
    trace.count("spool_part_takes")
    return taken


def _copy(src: BinaryIO, dst: BinaryIO, count: int) -> None:
    """``count`` bytes from ``src``'s position to ``dst``'s (blocking)."""
    while count > 0:
        piece = src.read(min(count, 1 << 20))
        if not piece:
            raise OSError(f"{src.name}: shorter than it was a moment ago")
        dst.write(piece)
        count -= len(piece)


@asynccontextmanager
async def open_spool(state_dir: str | None, kind: str, source: str) -> AsyncIterator[Spool]:
    """The spool of the downloads from ``source`` (its URL), a source of ``kind``:
    ``STATE_DIR/spool-KIND-HASH``, removed when the block ends well (or already, once
    `Spool.release` began its removal) and kept when it raises before that. Without
    ``state_dir``, or while another sync holds that spool, a temporary one, removed
    either way. OSError when it cannot be made."""
    if state_dir is not None:
        digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        root = Path(state_dir) / f"spool-{kind}-{digest}"
        lock_fd = await asyncio.to_thread(_lock_spool, root)
        if lock_fd is not None:
            try:
                spool = await asyncio.to_thread(Spool.load, root)
                try:
                    yield spool
                finally:
                    spool.close()
                    released = await spool.removed()
                if not released:
                    await asyncio.to_thread(shutil.rmtree, root, True)
            finally:
                os.close(lock_fd)
            return
    temporary = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=f"netopt-{kind}-"))
    spool = Spool(temporary)
    try:
        yield spool
    finally:
        spool.close()
        if not await spool.removed():
            await asyncio.to_thread(shutil.rmtree, temporary, True)


def _lock_spool(root: Path) -> int | None:
    """Make ``root`` and hold its lock (blocking); None when another process holds it."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd

"""A web-directory source whose download breaks in the middle of a large file resumes it
from where it stopped, within the sync and in the next run, and starts it again when the
file changed or the server ignores ranges; a server that sends more than a file's
listed size cannot grow the spool past it.

The origin is a real aiohttp server on loopback that lists a directory, answers HEAD
and ranged GETs (``If-Range`` against its ETag) and can cut a download after a given
number of bytes, as a link cut or an origin restart does, or stall it (the connection
open, nothing more sent), as a cut TCP has not noticed does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

import netopt.cache.spool as spool_module
from netopt.cache.spool import MAX_PARTS, PARTS_MIN_BYTES, missing_spans, split_spans
from netopt.cache.syncer import run_sync
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import NetworkError
from tests.service.cache_helpers import listing_page, request, tree, web_origin

BIG_BYTES = 3 << 20
CUT_AT = 1_300_000
STALL_HELD_S = 60.0
"""How long the origin holds a stalled answer open at most (the read timeout a web
origin's answers had before stall detection)."""


@dataclass
class Origin:
    """The served files and what happened to each GET of them."""

    files: dict[str, bytes]
    etag: str = '"v1"'
    cuts: list[int] = field(default_factory=list)
    """Cut the next GETs of ``big.bin`` after this many body bytes (one per GET)."""
    honour_ranges: bool = True
    honour_if_range: bool = True
    """False: answer a range whatever the If-Range names (a server that ignores it)."""
    extra_bytes: int = 0
    """Bytes sent after ``big.bin``'s own (a hostile or changing server)."""
    gets: list[tuple[str, str | None, int]] = field(default_factory=list)
    """(name, Range header, body bytes sent) of each GET, once it has ended."""
    slow_running: int = 0
    """Slow answers being sent."""
    slow_idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no slow answer is being sent."""
    accept_ranges: bool = False
    """Say ``Accept-Ranges: bytes``: a large file is then asked for in parts."""
    cut_ranged: list[int] = field(default_factory=list)
    """Cut the next ranged GETs of ``large.bin`` after this many body bytes."""
    slow_ranged: int = 0
    """Send the next this many ranged GETs of ``large.bin`` slowly (`SLOW_PIECE_BYTES` a
    `SLOW_PAUSE_S`), as connections held back by loss are."""

    stalls: list[int] = field(default_factory=list)
    """Stall the next GETs of ``big.bin`` after this many body bytes: the connection stays
    open and nothing more comes (a link cut that TCP has not noticed), until `released`."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    listings: int = 0
    """Listing pages answered."""

    async def listing(self, request: web.Request) -> web.Response:
        self.listings += 1
        return listing_page(self.files)

    async def file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = self.files[name]
        headers = {"ETag": self.etag, "Last-Modified": "Mon, 30 Nov 2026 10:00:00 GMT"}
        if self.accept_ranges:
            headers["Accept-Ranges"] = "bytes"
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        asked = request.headers.get("Range")
        start, stop = 0, len(data)
        status = 200
        same = request.headers.get("If-Range") == self.etag or not self.honour_if_range
        if asked and self.honour_ranges and same:
            first, _, last = asked.removeprefix("bytes=").partition("-")
            start, stop = int(first), int(last) + 1 if last else len(data)
            if start >= len(data):  # unsatisfiable, as nginx answers it
                self.gets.append((name, asked, 0))
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        body = data[start:stop] + os.urandom(self.extra_bytes if name == "big.bin" else 0)
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = len(body)
        await resp.prepare(request)
        limit = self.cuts.pop(0) if name == "big.bin" and self.cuts else len(body)
        if name == "big.bin" and self.stalls:
            limit = self.stalls.pop(0)
            await resp.write(body[:limit])
            self.gets.append((name, asked, limit))
            with contextlib.suppress(TimeoutError):  # bounded: the test ends well before
                await asyncio.wait_for(self.released.wait(), STALL_HELD_S)
            assert request.transport is not None
            request.transport.close()
            return resp
        if name == "large.bin" and status == 206 and self.cut_ranged:
            limit = self.cut_ranged.pop(0)
        slow = name == "large.bin" and status == 206 and self.slow_ranged > 0
        if slow:
            self.slow_ranged -= 1
            self.slow_running += 1
            self.slow_idle.clear()
            try:
                await _send_slowly(resp, body, self.gets, (name, asked))
            finally:
                self.slow_running -= 1
                if not self.slow_running:
                    self.slow_idle.set()
            return resp
        await resp.write(body[:limit])
        self.gets.append((name, asked, min(limit, len(body))))
        if limit < len(body):
            # What was sent reaches the client before the cut, as on a real link (on
            # loopback it would all wait in the client's buffer, which a broken
            # response's reader drops).
            await asyncio.sleep(0.3)
            assert request.transport is not None
            request.transport.close()  # the link or the origin went away mid-file
            return resp
        await resp.write_eof()
        return resp


SLOW_PIECE_BYTES = 64 << 10
SLOW_PAUSE_S = 0.05


async def _send_slowly(
    resp: web.StreamResponse,
    body: bytes,
    gets: list[tuple[str, str | None, int]],
    get: tuple[str, str | None],
) -> None:
    """``body`` a piece at a time, until the client has it or goes away; what was sent
    recorded in ``gets`` either way."""
    sent = 0
    try:
        while sent < len(body):
            await resp.write(body[sent : sent + SLOW_PIECE_BYTES])
            sent = min(len(body), sent + SLOW_PIECE_BYTES)
            await asyncio.sleep(SLOW_PAUSE_S)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client stopped reading and went away
    finally:
        gets.append((*get, sent))


@pytest.fixture
async def origin() -> AsyncIterator[tuple[Origin, str]]:
    served = Origin(
        files={
            "big.bin": os.urandom(BIG_BYTES),
            "small.txt": b"a small file\n" * 100,
        }
    )
    async with web_origin(served.listing, served.file) as url:
        try:
            yield served, url
        finally:
            served.released.set()  # stalled answers end with the test


def _options(window_s: float) -> SyncOptions:
    return SyncOptions(retry_window_s=window_s, backoff_initial_s=0.05, backoff_max_s=0.1)


def _big_gets(served: Origin) -> list[tuple[str | None, int]]:
    return [(asked, sent) for name, asked, sent in served.gets if name == "big.bin"]


def _resumed_from(asked: str | None) -> int:
    assert asked is not None
    assert asked.startswith("bytes=")
    assert asked.endswith("-")
    return int(asked.removeprefix("bytes=").removesuffix("-"))


def _spools(cache: Path) -> list[Path]:
    return sorted((cache / "sources").glob("spool-httpdir-*"))


async def _a_run_cut_mid_file(
    tmp_path: Path, origin: tuple[Origin, str]
) -> tuple[Origin, str, Path, Path]:
    """A sync with no retry window whose download of ``big.bin`` is cut: it fails."""
    served, url = origin
    served.cuts = [CUT_AT]
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    with pytest.raises(NetworkError):
        await run_sync(request(url, dest, cache, sync_options=_options(0)))
    return served, url, cache, dest


async def test_a_download_cut_mid_file_resumes_within_the_sync(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    served, url = origin
    served.cuts = [CUT_AT]
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    report = await run_sync(request(url, dest, cache, sync_options=_options(10)))
    assert tree(dest) == served.files
    (first, cut), (resumed, rest) = _big_gets(served)
    kept = _resumed_from(resumed)
    # What arrived before the cut was kept, but for the piece being read when it broke.
    assert (first, cut) == (None, CUT_AT)
    assert 0 < kept <= CUT_AT
    assert rest == BIG_BYTES - kept
    assert report.overhead_bytes < BIG_BYTES + CUT_AT  # not the whole file twice
    assert _spools(cache) == []  # removed once the sync succeeded


async def test_a_cut_mid_file_is_asked_again_alone_without_listing_again(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """The cut download is asked again by itself (`netopt.cache.weblink`): the listing
    is read once and the other file asked once, where the open's retry read the listing
    again and asked every file again."""
    served, url = origin
    served.cuts = [CUT_AT]
    await run_sync(request(url, tmp_path / "dest", tmp_path / "cache", sync_options=_options(10)))
    assert tree(tmp_path / "dest") == served.files
    assert served.listings == 1
    assert [name for name, _, _ in served.gets].count("small.txt") == 1
    (_, cut), (resumed, rest) = _big_gets(served)
    assert cut == CUT_AT
    assert rest == BIG_BYTES - _resumed_from(resumed)


async def test_a_stalled_download_is_dropped_and_resumed(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """An answer that stops coming while its connection stays open (a cut TCP has not
    noticed) fails after the stall timeout (`stall_timeout_s` of loopback's round trip:
    its floor, 2 s), not the 60 s read timeout, and is resumed from what came."""
    served, url = origin
    served.stalls = [CUT_AT]
    syncing = run_sync(
        request(url, tmp_path / "dest", tmp_path / "cache", sync_options=_options(30))
    )
    # Bounded well under the origin's hold (STALL_HELD_S): a sync that waited for the
    # read timeout, or for the origin to let go, fails here.
    await asyncio.wait_for(syncing, STALL_HELD_S / 4)
    assert tree(tmp_path / "dest") == served.files
    (_, stalled), (resumed, rest) = _big_gets(served)
    kept = _resumed_from(resumed)
    assert stalled == CUT_AT
    assert 0 < kept <= CUT_AT
    assert rest == BIG_BYTES - kept
    assert served.listings == 1


async def test_a_failed_sync_leaves_its_download_for_the_next_run(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    served, url, cache, dest = await _a_run_cut_mid_file(tmp_path, origin)
    assert not (dest / "big.bin").exists()
    (spool,) = _spools(cache)
    (kept,) = [p.stat().st_size for p in spool.glob("*.part") if p.stat().st_size > 2000]
    assert 0 < kept <= CUT_AT
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    assert _big_gets(served)[-1] == (f"bytes={kept}-", BIG_BYTES - kept)
    assert _spools(cache) == []


async def test_files_complete_in_a_failed_runs_spool_are_not_downloaded_again(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """A file the failed run had whole is asked for its last byte only, naming its
    version (an origin answers a range from its end with 416), and taken as it is."""
    served, url, cache, dest = await _a_run_cut_mid_file(tmp_path, origin)
    small = served.files["small.txt"]
    assert ("small.txt", None, len(small)) in served.gets  # whole in the failed run
    since = len(served.gets)
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    again = [(asked, sent) for name, asked, sent in served.gets[since:] if name == "small.txt"]
    assert again == [(f"bytes={len(small) - 1}-", 1)]
    # Changed since: its last byte's request names the old version and gets it whole.
    cache2 = tmp_path / "cache2"
    served.cuts = [CUT_AT]
    with pytest.raises(NetworkError):
        await run_sync(request(url, tmp_path / "dest2", cache2, sync_options=_options(0)))
    served.files["small.txt"] = small.upper()
    served.etag = '"v2"'
    since = len(served.gets)
    await run_sync(request(url, tmp_path / "dest2", cache2, sync_options=_options(0)))
    assert tree(tmp_path / "dest2") == served.files
    again = [(asked, sent) for name, asked, sent in served.gets[since:] if name == "small.txt"]
    assert again == [(f"bytes={len(small) - 1}-", len(small))]


async def _synced_again_changed(
    tmp_path: Path, origin: tuple[Origin, str], size_bytes: int, *, honour_if_range: bool
) -> tuple[Path, list[tuple[str | None, int]]]:
    """After `_a_run_cut_mid_file`, ``big.bin`` changed (another version of
    ``size_bytes``) and synced again: the cache and the GETs of ``big.bin`` since."""
    served, url, cache, dest = await _a_run_cut_mid_file(tmp_path, origin)
    served.files["big.bin"] = os.urandom(size_bytes)
    served.etag = '"v2"'
    served.honour_if_range = honour_if_range
    since = len(served.gets)
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    return cache, [(asked, sent) for name, asked, sent in served.gets[since:] if name == "big.bin"]


async def test_a_file_changed_since_the_cut_is_downloaded_again_whole(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    # The same size, another version.
    _, gets = await _synced_again_changed(tmp_path, origin, BIG_BYTES, honour_if_range=True)
    asked, sent = gets[-1]
    assert _resumed_from(asked) > 0  # the rest of v1 was asked for ...
    assert sent == BIG_BYTES  # ... v2 came whole, and replaced the partial copy


async def test_a_range_of_a_changed_file_from_a_server_ignoring_if_range_is_not_joined(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """A server that ignores If-Range answers a changed file's range from its new
    version: its ETag says so, and the file is asked for whole instead of joining the
    old version's bytes to the new one's."""
    # The same size, another version.
    _, asked = await _synced_again_changed(tmp_path, origin, BIG_BYTES, honour_if_range=False)
    # The rest of v1 was asked for and a range of v2 came (the server may not see the
    # client drop it: then the GET is not recorded), then v2 was asked for whole.
    assert asked[-1] == (None, BIG_BYTES)
    assert all(_resumed_from(ranged) > 0 for ranged, _ in asked[:-1])


async def test_a_file_now_shorter_than_its_kept_bytes_comes_whole_from_a_server_ignoring_if_range(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """A file that shrank below what a failed run kept of it: a server that ignores
    If-Range answers the resume's range with 416 (nothing there to send), and the file
    is asked for whole; the 416 failed every later run before."""
    # Shorter than any kept start: the cut keeps what came before the piece being
    # read (at most 1 MiB, `httpdir._body`), so at least CUT_AT - 1 MiB.
    shrunk = 100_000
    cache, asked = await _synced_again_changed(tmp_path, origin, shrunk, honour_if_range=False)
    (resumed, unsatisfied), whole = asked
    assert _resumed_from(resumed) > shrunk
    assert unsatisfied == 0  # the 416
    assert whole == (None, shrunk)
    assert _spools(cache) == []


async def test_a_server_that_ignores_ranges_gives_the_whole_file_again(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    served, url = origin
    served.cuts = [CUT_AT]
    served.honour_ranges = False
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    await run_sync(request(url, dest, cache, sync_options=_options(10)))
    assert tree(dest) == served.files
    (first, cut), (resumed, whole) = _big_gets(served)
    assert (first, cut) == (None, CUT_AT)
    assert _resumed_from(resumed) > 0  # asked from where it stopped ...
    assert whole == BIG_BYTES  # ... and was given all of it, which replaced the partial copy


async def test_a_server_sending_more_than_the_listed_size_cannot_grow_the_spool(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    served, url = origin
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    # A re-sync lists the known file by HEAD (its size), then gets far more.
    served.etag = '"v2"'
    served.extra_bytes = 4 << 20
    with pytest.raises(NetworkError, match="more than its listed"):
        await run_sync(request(url, dest, cache, sync_options=_options(0.5)))
    assert (dest / "big.bin").read_bytes() == served.files["big.bin"]  # the first copy stays
    (spool,) = _spools(cache)
    assert max(p.stat().st_size for p in spool.glob("*.part")) <= BIG_BYTES


def _ranged_spans(served: Origin, since: int = 0) -> list[tuple[int, int, int]]:
    """(first byte, end byte exclusive, bytes sent) of each ranged GET of ``large.bin``
    from the ``since``-th GET on."""
    spans = []
    for name, asked, sent in served.gets[since:]:
        if name == "large.bin" and asked:
            first, _, last = asked.removeprefix("bytes=").partition("-")
            spans.append((int(first), int(last) + 1, sent))
    return spans


def _planned(size: int) -> list[tuple[int, int]]:
    """The parts a fresh download of a file of ``size`` bytes asks for first."""
    return split_spans([(0, size)], min(MAX_PARTS, size // (1 << 20)))


async def test_a_large_file_comes_in_ranged_parts_and_a_cut_part_resumes(
    tmp_path: Path, origin: tuple[Origin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, url = origin
    # No half taken over (`test_a_slow_part_is_shared_...`): only the cut moves bytes twice.
    monkeypatch.setattr(spool_module, "TAKE_MIN_BYTES", 1 << 40)
    large = os.urandom(PARTS_MIN_BYTES * 3 + 12_345)
    planned = _planned(len(large))
    assert len(planned) > 1
    served.files = {"large.bin": large, "small.txt": b"small\n"}
    served.accept_ranges = True
    cut_at = (planned[1][1] - planned[1][0]) // 2
    served.cut_ranged = [cut_at]
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    report = await run_sync(request(url, dest, cache, sync_options=_options(10)))
    assert tree(dest) == served.files
    ranged = _ranged_spans(served)
    asked = {(first, end) for first, end, _ in ranged}
    # The GET that listed the file was dropped; then each part asked by range ...
    assert set(planned) <= asked
    resumed = asked - set(planned)
    assert len(resumed) == 1  # ... one cut, and asked again from where it stopped
    ((first, end),) = resumed
    part = next(p for p in planned if p[0] < first < p[1])
    assert first - part[0] <= cut_at
    assert end == part[1]  # the rest of that part only
    # Moved once, but for the cut part's lost tail and what the listing GET had in flight.
    assert sum(sent for _, _, sent in ranged) < len(large) + cut_at
    assert report.overhead_bytes < len(large) + (2 << 20)
    assert _spools(cache) == []


async def test_a_slow_part_is_shared_by_a_connection_that_is_done(
    tmp_path: Path, origin: tuple[Origin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection whose part is in takes the second half of the part with the most
    left, so one slow connection does not hold the file back: that part's connection
    stops at the half, and another asks for the rest."""
    served, url = origin
    monkeypatch.setattr(spool_module, "MAX_PARTS", 2)
    large = os.urandom(8 << 20)
    served.files = {"large.bin": large}
    served.accept_ranges = True
    served.slow_ranged = 1  # 4 MiB at 64 KiB a 50 ms: 3.2 s alone
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    # The slow answer is recorded once its handler sees the client gone (its next write).
    await asyncio.wait_for(served.slow_idle.wait(), 10)
    ranged = _ranged_spans(served)
    (slow,) = [(first, end, sent) for first, end, sent in ranged if (first, end) in [
        span for span in split_spans([(0, len(large))], 2)
    ] and sent < end - first]  # fmt: skip
    # Its second half came on the other connection, then halves of what it had left
    # while they were `TAKE_MIN_BYTES` or more ...
    taken = [first for first, end, _ in ranged if slow[0] < first < slow[1]]
    assert taken
    # ... and it stopped where the last half taken from it began (what it sent past
    # that was in flight), well short of its part.
    assert slow[2] < min(taken) - slow[0] + SLOW_PIECE_BYTES * 4
    assert slow[2] < (slow[1] - slow[0]) // 2
    assert _spools(cache) == []


async def test_kept_parts_are_not_asked_again_under_another_split(
    tmp_path: Path, origin: tuple[Origin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts left by a failed run are named by their first byte, so the next run asks
    only for the bytes between them, even one that splits the file otherwise (another
    release), and joins a file of one version."""
    served, url = origin
    large = os.urandom(PARTS_MIN_BYTES * 3 + 12_345)
    served.files = {"large.bin": large}
    served.accept_ranges = True
    served.cut_ranged = [200_000]
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    with pytest.raises(NetworkError):
        await run_sync(request(url, dest, cache, sync_options=_options(0)))
    kept = _kept_parts(cache)
    kept_bytes = sum(have for _, have in kept)
    assert 200_000 <= kept_bytes < len(large)  # parts kept for the next run
    monkeypatch.setattr(spool_module, "MAX_PARTS", 5)
    since = len(served.gets)
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    missing = missing_spans(sorted(kept), len(large))
    for first, end, _ in _ranged_spans(served, since):
        # Each ask lies within bytes that were missing: none kept is asked again.
        assert any(a <= first and end <= b for a, b in missing), (first, end, missing)


async def test_a_killed_sync_leaves_parts_the_next_run_does_not_ask_again(
    tmp_path: Path, origin: tuple[Origin, str]
) -> None:
    """``netopt sync`` killed (-9) while a large file comes in parts: what the parts'
    files hold on disk is never asked for again, and the file joins byte for byte."""
    served, url = origin
    large = os.urandom(12 << 20)
    served.files = {"large.bin": large}
    served.accept_ranges = True
    served.slow_ranged = 1_000_000  # 12 parts of 1 MiB, ~0.8 s each
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    argv = [sys.executable, "-m", "netopt", "sync", url, str(dest), "--cache-dir", str(cache),
            "--json", "--retry-window-s", "0"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(60):
            while _kept_bytes(cache) < len(large) // 4:
                assert proc.returncode is None, "the sync ended before it was killed"
                await asyncio.sleep(0.05)
    finally:
        proc.kill()
        await proc.wait()
    kept = _kept_parts(cache)
    assert 0 < sum(have for _, have in kept) < len(large)
    served.slow_ranged = 0
    async with asyncio.timeout(10):  # the killed run's answers have seen it go
        await served.slow_idle.wait()
    since = len(served.gets)
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    missing = missing_spans(kept, len(large))
    asked = _ranged_spans(served, since)
    assert asked
    for first, end, _ in asked:
        assert any(a <= first and end <= b for a, b in missing), (first, end, missing)
    assert _spools(cache) == []


def _kept_parts(cache: Path) -> list[tuple[int, int]]:
    """(first byte, bytes on disk) of each part file in the cache's spools, in order."""
    kept = []
    for spool in _spools(cache):
        for path in spool.glob("*.parts/at*"):
            kept.append((int(path.name.removeprefix("at")), path.stat().st_size))
    return sorted(kept)


def _kept_bytes(cache: Path) -> int:
    try:
        return sum(have for _, have in _kept_parts(cache))
    except OSError:  # a part renamed or removed while it was read
        return 0


async def test_a_sync_failing_once_it_has_every_chunk_has_let_the_spool_go(
    tmp_path: Path, origin: tuple[Origin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the sync has every chunk, the spool goes while the files are made durable
    (`Spool.release`). When a later step fails (here the disk refuses the cache's
    durability), the next run takes what it lacks by range, naming the version (the
    source's state was saved before the sync), and ends byte for byte."""
    from netopt.cache.store import Cache
    from netopt.errors import StorageError

    served, url = origin
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    real_flush = Cache.flush
    refusing = [True]

    def flush(self: Cache) -> None:
        if refusing[0]:
            raise StorageError("the disk refused (test)")
        real_flush(self)

    monkeypatch.setattr(Cache, "flush", flush)
    with pytest.raises(StorageError, match="refused"):
        await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert _big_gets(served) == [(None, BIG_BYTES)]
    assert _spools(cache) == []  # let go before the failing step
    refusing[0] = False
    since = len(served.gets)
    await run_sync(request(url, dest, cache, sync_options=_options(0)))
    assert tree(dest) == served.files
    again = [asked for name, asked, _ in served.gets[since:] if name == "big.bin"]
    assert all(asked is not None and asked.startswith("bytes=") for asked in again), again
    assert _spools(cache) == []

"""A dataset served as a directory listing by any web server (nginx, ``python -m http.server``).

The listing is crawled (links under the base URL only, at most `MAX_FILES`
files, `MAX_PAGES` directories, `MAX_DEPTH` levels; `PAGES_AT_ONCE` pages read at
once, each parsed as it arrives). Such a server has no manifest, so a file is chunked
here after one full download; what it was cut into is remembered per URL with
its size, ETag and Last-Modified (in ``state_dir``), so a re-sync downloads
only the files that changed and asks for chunks it lacks with range requests
(see `netopt.cache.remotefiles`, shared with the S3 source).
"""

from __future__ import annotations

import asyncio
import codecs
import email.utils
import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp

from netopt.cache.remotefiles import (
    CONNECTIONS_AT_ONCE,
    DOWNLOADS_AT_ONCE,
    MAX_FILES,
    BuiltEntries,
    RemoteDataset,
    RemoteFile,
    SpooledChunkSource,
    at_most,
    build_entries,
    file_mtime_ns,
    load_state,
    merged,
    save_state,
)
from netopt.cache.spool import LISTED_ONLY, content_range_start, open_spool, parts_worth
from netopt.cache.weblink import WebLink
from netopt.dataplane import trace
from netopt.dataplane.chunkio import RawChunk
from netopt.dataplane.httpsource import ClientOptions
from netopt.dataplane.limits import read_up_to
from netopt.dataplane.manifestpieces import PiecesBroken, content_range
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import NetworkError, PeerUnreachableError, ProtocolError, StorageError
from netopt.transfer.manifest import Manifest, validate_rel_path

__all__ = [
    "LINKS_HELD_MAX",
    "MAX_DEPTH",
    "MAX_FILES",
    "MAX_PAGES",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_LINKS",
    "PAGES_AT_ONCE",
    "HttpDirSource",
    "list_links",
    "open_http_dir",
]

MAX_DEPTH = 16
MAX_PAGE_BYTES = 64 << 20
"""The longest listing page read (nginx's autoindex of `MAX_FILES` files is ~15 MB): a
server that sends more is refused. A page is parsed as it arrives, never held whole."""
MAX_PAGES = 50_000
"""Listing pages (directories) crawled at most: a server that links more is refused."""
MAX_PAGE_LINKS = MAX_FILES + MAX_PAGES
"""Links one listing page may hold (its files and subdirectories): a page of more is
refused."""
LINKS_HELD_MAX = 2 * MAX_PAGE_LINKS
"""Links the listing pages being read may hold together (a page's parent link and links
found twice are counted too: twice the most a tree may list)."""
DESCRIBES_AT_ONCE = DOWNLOADS_AT_ONCE
"""Files listed at once (a HEAD, or the GET of a file not synced before, which is its
download): one at a time, listing 4,800 files over a 140 ms link took 4,800 round trips
(11 minutes)."""
PAGES_AT_ONCE = DESCRIBES_AT_ONCE
"""Listing pages read at once, as many as files are listed at once (the same origin,
the same connections). One at a time, a tree of 859 directories (a real tree of
installed packages behind nginx) took 859 round trips to list: 69 s on the lab's
80 ms link before the first file moved."""

BARE_PAGES_NAMED = 5
"""Directory pages that linked nothing below them named in the crawl's warning (the rest
counted)."""

_STATE_FILE = "httpdir.json"

log = logging.getLogger(__name__)


class _LinkBudget:
    """Links the listing pages being read may hold together: each page takes its links
    from it as it is parsed and gives them back once read, so the pages read at once
    hold at most `LINKS_HELD_MAX` links however many run."""

    def __init__(self, links: int) -> None:
        self.left = links


class _Links(HTMLParser):
    """The ``href`` of each ``<a>`` of a page fed to it: at most ``max_links`` of them,
    and no more than ``budget`` has left (ProtocolError past either, naming ``page``)."""

    def __init__(
        self, page: str = "", max_links: int | None = None, budget: _LinkBudget | None = None
    ) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self._page = page
        self._max_links = max_links
        self._budget = budget

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        found = [v for k, v in attrs if k == "href" and v]
        self.hrefs.extend(found)
        if self._max_links is not None and len(self.hrefs) > self._max_links:
            raise ProtocolError(f"{self._page}: a listing page of over {self._max_links} links")
        if self._budget is not None:
            self._budget.left -= len(found)
            if self._budget.left < 0:
                raise ProtocolError(
                    f"{self._page}: listing pages read at once hold over {LINKS_HELD_MAX} links"
                )


def list_links(html: str, page_url: str, base_url: str) -> tuple[list[str], list[str]]:
    """(files, subdirectories) linked from a listing page, as absolute URLs under ``base_url``."""
    parser = _Links()
    parser.feed(html)
    return _under(parser.hrefs, page_url, base_url)


def _under(hrefs: list[str], page_url: str, base_url: str) -> tuple[list[str], list[str]]:
    """`list_links` of a page's ``hrefs``: files and subdirectories below ``page_url``."""
    files: list[str] = []
    dirs: list[str] = []
    for href in hrefs:
        target = urljoin(page_url, href).split("#", 1)[0]
        if "?" in target or not target.startswith(base_url) or target == page_url:
            continue
        if len(target) <= len(page_url) or not target.startswith(page_url):
            continue
        (dirs if target.endswith("/") else files).append(target)
    return sorted(set(files)), sorted(set(dirs))


class HttpDirSource(SpooledChunkSource):
    """`ChunkSource` over files on a web server: spooled downloads first, else range requests."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        manifest: Manifest,
        built: BuiltEntries,
        release: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(manifest, built, self._read_range, release)
        self.session = session

    async def _read_range(self, remote: RemoteFile, offset: int, length: int) -> RawChunk:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        url = remote.key
        try:
            async with self.session.get(url, headers=headers) as resp:
                if resp.status == 206:
                    body = await read_up_to(resp.content.read, length + 1)
                    if len(body) > length:
                        raise ProtocolError(f"{url}: a range of {length} bytes answered longer")
                    data = body
                elif resp.status == 200:
                    # A server without range support sends the whole file: only what
                    # ends at the range is read (and counted), then the answer dropped.
                    body = await read_up_to(resp.content.read, offset + length)
                    data = body[offset:]
                else:
                    raise NetworkError(f"{url}: HTTP {resp.status}")
        except aiohttp.ClientError as exc:
            raise NetworkError(f"{url}: {type(exc).__name__}: {exc}") from exc
        return RawChunk(data, "identity", len(body))


async def _crawl(session: aiohttp.ClientSession, base: str, link: WebLink) -> tuple[list[str], int]:
    """Every file listed under ``base`` (sorted) and the listing's bytes on the wire:
    `PAGES_AT_ONCE` pages read at once, each subdirectory as soon as its parent page
    is read, a page cut off asked again (``link``). ProtocolError past `MAX_FILES`
    files or `MAX_PAGES` pages; NetworkError for a page not answered 200."""
    files: set[str] = set()
    wire_bytes = 0
    bare: list[str] = []  # the first few directory pages that linked nothing below them
    bare_count = 0
    budget = _LinkBudget(LINKS_HELD_MAX)
    queued = {base}
    pages: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    pages.put_nowait((base, 0))

    async def read_pages() -> None:
        nonlocal wire_bytes, bare_count
        while True:
            page, depth = await pages.get()
            try:
                read = functools.partial(_read_page, session, page, base, budget)
                found, subdirs, got = await link.again(read)
                wire_bytes += got
                if not found and not subdirs and page != base:
                    bare_count += 1
                    if len(bare) < BARE_PAGES_NAMED:
                        bare.append(page[len(base) :])
                files.update(found)
                if len(files) > MAX_FILES:
                    raise ProtocolError(f"{base}: more than {MAX_FILES} files")
                for sub in subdirs if depth < MAX_DEPTH else ():
                    if sub in queued:
                        continue
                    if len(queued) >= MAX_PAGES:
                        raise ProtocolError(f"{base}: more than {MAX_PAGES} directories")
                    queued.add(sub)
                    pages.put_nowait((sub, depth + 1))
            finally:
                pages.task_done()

    readers = [asyncio.ensure_future(read_pages()) for _ in range(PAGES_AT_ONCE)]
    listed = asyncio.ensure_future(pages.join())
    try:
        await asyncio.wait([listed, *readers], return_when=asyncio.FIRST_COMPLETED)
        for reader in readers:
            if reader.done():
                reader.result()  # the first failure, raised
    finally:
        for task in (listed, *readers):
            task.cancel()
        await asyncio.gather(listed, *readers, return_exceptions=True)
    if bare_count:
        # Nothing is lost silently: a directory whose page is not a listing (a web server
        # serves its index.html instead) hides its files from any crawler.
        log.warning(
            "%s: %d director%s linked nothing below %s (empty, or a page that is not a "
            "listing, such as an index.html the server sends instead): %s%s; files only "
            "such a page hides are not synced",
            base, bare_count, "y" if bare_count == 1 else "ies",
            "it" if bare_count == 1 else "them", ", ".join(sorted(bare)),
            ", ..." if bare_count > len(bare) else "",
        )  # fmt: skip
    return sorted(files), wire_bytes


async def _read_page(
    session: aiohttp.ClientSession, page: str, base: str, budget: _LinkBudget
) -> tuple[list[str], list[str], int]:
    """The files and subdirectories a listing page links below it, and its bytes:
    parsed as it arrives (never held whole), at most `MAX_PAGE_BYTES` and
    `MAX_PAGE_LINKS` links, its links taken from ``budget`` while it is read
    (ProtocolError past any of them)."""
    parser = _Links(page, MAX_PAGE_LINKS, budget)
    try:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        got = 0
        async with session.get(page) as resp:
            if resp.status != 200:
                raise NetworkError(f"{page}: HTTP {resp.status}")
            async for piece in resp.content.iter_any():
                got += len(piece)
                if got > MAX_PAGE_BYTES:
                    raise ProtocolError(f"{page}: a listing page over {MAX_PAGE_BYTES} bytes")
                parser.feed(decoder.decode(piece))
        parser.feed(decoder.decode(b"", final=True))
        parser.close()
        files, dirs = _under(parser.hrefs, page, base)
        return files, dirs, got
    finally:
        budget.left += len(parser.hrefs)


async def _describe(session: aiohttp.ClientSession, base: str, url: str) -> RemoteFile:
    async with session.head(url) as resp:
        if resp.status != 200:
            raise NetworkError(f"{url}: HTTP {resp.status}")
        return _listed(base, url, resp.headers, int(resp.headers.get("Content-Length", "-1")))


def _listed(base: str, url: str, headers: Mapping[str, str], size: int) -> RemoteFile:
    """``url`` as a HEAD's or a whole GET's headers list it (size, ETag, Last-Modified)."""
    modified = headers.get("Last-Modified", "")
    validator = f"{size}|{headers.get('ETag', '')}|{modified}"
    modified_s = None
    ranges = headers.get("Accept-Ranges", "").strip().lower() == "bytes"
    if modified:
        try:
            modified_s = int(email.utils.parsedate_to_datetime(modified).timestamp())
        except (TypeError, ValueError):
            modified_s = None
    rel = validate_rel_path(unquote(urlsplit(url).path[len(urlsplit(base).path) :]))
    mtime_ns = file_mtime_ns(modified_s, validator)
    # Parts need a validator to name in If-Range, or a changed file could mix versions.
    return RemoteFile(url, rel, size, validator, mtime_ns, ranges and bool(_if_range(validator)))


@asynccontextmanager
async def _get_unlisted(
    session: aiohttp.ClientSession, base: str, url: str, kept: tuple[RemoteFile, int] | None
) -> AsyncIterator[tuple[RemoteFile, int, AsyncIterable[bytes]]]:
    """`netopt.cache.spool.FetchUnlisted` for a web server: a GET that lists the file
    by its answer's headers, ranged from a kept partial download naming its validator.
    A kept complete download is asked for its last byte (a range from its end is one an
    origin cannot satisfy: nginx answers 416, which failed every try after a cut): the
    answer says whether it is still that file, and the byte is dropped. A range of
    another version (`_same_version`: the server ignored If-Range) is dropped and the
    file asked for whole, as is a 416 (such a server, the file now shorter than what
    was kept: it failed every try before)."""
    if_range = _if_range(kept[0].validator) if kept is not None and kept[1] else None
    if kept is not None and if_range is not None:
        complete = kept[1] == kept[0].size_bytes
        start = kept[1] - int(complete)
        headers = {"Range": f"bytes={start}-", "If-Range": if_range}
        async with session.get(url, headers=headers) as resp:
            if resp.status not in (206, 416):
                yield _whole(base, url, resp)
                return
            # 416: nothing at the kept start, so the file is not what was kept (a server
            # that ignores If-Range, the file now shorter): asked for whole below.
            if resp.status == 206 and _same_version(kept[0], resp.headers):
                answered = content_range_start(resp.headers.get("Content-Range"))
                if not complete:
                    yield kept[0], answered, _body(resp)
                elif answered != start or resp.content_length != 1:
                    raise ProtocolError(f"{url}: asked for byte {start}, answered otherwise")
                else:
                    await read_up_to(resp.content.read, 1)
                    yield kept[0], kept[1], _nothing()
                return
    async with session.get(url) as resp:
        yield _whole(base, url, resp)


def _whole(
    base: str, url: str, resp: aiohttp.ClientResponse
) -> tuple[RemoteFile, int, AsyncIterable[bytes]]:
    """A whole GET's answer as `_get_unlisted` gives it: the file as it lists it, 0 (or
    `LISTED_ONLY` for a file to download in parts) and its bytes; NetworkError unless
    it is a 200."""
    if resp.status != 200:
        raise NetworkError(f"{url}: HTTP {resp.status}")
    size = resp.content_length if resp.content_length is not None else -1
    listed = _listed(base, url, resp.headers, size)
    # A file large enough for parts has them on connections of their own.
    return listed, LISTED_ONLY if parts_worth(listed) else 0, _body(resp)


def _same_version(listed: RemoteFile, headers: Mapping[str, str]) -> bool:
    """Whether a ranged answer is of the version ``listed`` names: the total of its
    ``Content-Range``, its ETag and its Last-Modified as listed, each where both give
    it. A server that ignores If-Range answers a range of a changed file from its new
    version, and the bytes kept of the old one would be joined to it."""
    etag, modified = _etag_and_modified(listed.validator)
    try:
        _, _, total = content_range(headers.get("Content-Range"))
    except PiecesBroken:
        return False
    return (
        (listed.size_bytes < 0 or total == listed.size_bytes)
        and (not etag or headers.get("ETag", etag) == etag)
        and (not modified or headers.get("Last-Modified", modified) == modified)
    )


async def _nothing() -> AsyncIterator[bytes]:
    """No bytes: the answer for a kept complete download, whose last byte was dropped."""
    none: tuple[bytes, ...] = ()
    for piece in none:
        yield piece


def _body(resp: aiohttp.ClientResponse) -> AsyncIterable[bytes]:
    return resp.content.iter_chunked(1 << 20)


def _etag_and_modified(validator: str) -> tuple[str, str]:
    """The ETag and Last-Modified of a validator `_listed` made (``SIZE|ETAG|MODIFIED``;
    either may be empty)."""
    _, _, rest = validator.partition("|")
    etag, _, modified = rest.rpartition("|")
    return etag, modified


def _if_range(validator: str) -> str | None:
    """What a resumed download names in ``If-Range``: the listing's strong ETag, else its
    Last-Modified (a weak ETag may not be used there); None: neither, no resuming."""
    etag, modified = _etag_and_modified(validator)
    if etag.startswith('"'):
        return etag
    return modified or None


@asynccontextmanager
async def _get_from(
    session: aiohttp.ClientSession, remote: RemoteFile, offset: int, end: int | None
) -> AsyncIterator[tuple[int, AsyncIterable[bytes]]]:
    """`netopt.cache.spool.FetchFrom` for a web server: a ranged GET naming the listed
    validator when resuming or asking for a part; a 200 answer is the whole file again
    (NetworkError for a part: it changed)."""
    ranged = offset or end is not None
    if_range = _if_range(remote.validator) if ranged else None
    last = "" if end is None else str(end - 1)
    headers = {"Range": f"bytes={offset}-{last}", "If-Range": if_range} if if_range else {}
    async with session.get(remote.key, headers=headers) as resp:
        if resp.status == 206 and headers:
            if not _same_version(remote, resp.headers):
                # The server ignored If-Range: the open's next try lists it again.
                raise NetworkError(f"{remote.key}: changed since it was listed")
            start = content_range_start(resp.headers.get("Content-Range"))
        elif resp.status == 200 and end is not None:
            # A part answered whole: the file changed (If-Range), so its parts would mix
            # two versions. The open's next try lists it again.
            raise NetworkError(f"{remote.key}: changed since it was listed")
        elif resp.status == 200:
            start = 0
        else:
            raise NetworkError(f"{remote.key}: HTTP {resp.status}")
        yield start, _body(resp)


@asynccontextmanager
async def open_http_dir(
    url: str,
    name: str,
    client: ClientOptions,
    avg_chunk_bytes: int,
    state_dir: str | None,
    retry: SyncOptions,
) -> AsyncIterator[RemoteDataset]:
    """Open the files listed under ``url`` as dataset ``name``: crawled, downloaded where
    their chunking is not remembered in ``state_dir``, chunked (the ``http-dir`` kind of
    `netopt.cache.sources` wraps it). A request that fails to reach the server is asked
    again within ``retry``'s window (`netopt.cache.weblink`).

    Raises PeerUnreachableError / NetworkError / ProtocolError for the server,
    StorageError when downloads cannot be spooled.
    """
    base = url if url.endswith("/") else url + "/"
    state_path = Path(state_dir) / _STATE_FILE if state_dir else None
    headers = {"Authorization": f"Bearer {client.token}"} if client.token else {}
    timeout = aiohttp.ClientTimeout(
        sock_connect=client.connect_timeout_s, sock_read=client.read_timeout_s
    )
    where = urlsplit(base)
    port = where.port or (443 if where.scheme == "https" else 80)
    link = WebLink(where.hostname or "", port, retry)
    try:
        known = await load_state(state_path)
        async with (
            open_spool(state_dir, "httpdir", base) as spool,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=CONNECTIONS_AT_ONCE, socket_factory=link.socket_factory
                ),
                headers=headers,
                timeout=timeout,
                auto_decompress=False,
                trace_configs=[link.trace_config()],
            ) as session,
        ):
            try:
                urls, listing_bytes = await _crawl(session, base, link)
                trace.mark("web_crawled")
                fetched_bytes = 0

                async def listed(index: int) -> RemoteFile:
                    # A file chunked before: a HEAD says whether it changed. A new one:
                    # its GET lists it (one round trip, not two); `build_entries` then
                    # finds it complete in the spool.
                    nonlocal fetched_bytes
                    if urls[index] in known:
                        return await link.again(
                            functools.partial(_describe, session, base, urls[index])
                        )
                    get = functools.partial(_get_unlisted, session, base)
                    unlisted = functools.partial(spool.download_unlisted, urls[index], get)
                    remote, _, got = await link.again(unlisted)
                    fetched_bytes += got
                    return remote

                async def download(remote: RemoteFile) -> tuple[Path, int]:
                    get = functools.partial(_get_from, session)
                    return await link.again(functools.partial(spool.download, remote, get))

                async def listed_and_built(index: int) -> BuiltEntries:
                    # Each file downloaded (where it changed) and chunked as soon as it
                    # is listed: a large file's parts no longer wait for every other
                    # file of the tree to be listed (a tree of thousands of small files
                    # and a few large ones moved them one after the other).
                    remote = await listed(index)
                    trace.mark("web_first_listed")
                    return await build_entries([remote], known, avg_chunk_bytes, download)

                built = merged(await at_most(DESCRIBES_AT_ONCE, len(urls), listed_and_built))
            except aiohttp.ClientConnectorError as exc:
                raise PeerUnreachableError(f"{base} is unreachable: {exc}") from exc
            except aiohttp.ClientError as exc:
                raise NetworkError(f"{base}: {type(exc).__name__}: {exc}") from exc
            entries = tuple(sorted(built.entries, key=lambda e: e.path))
            manifest = Manifest(name, entries, avg_chunk_bytes)
            source = HttpDirSource(session, manifest, built, spool.release)
            await save_state(state_path, known)
            overhead_bytes = listing_bytes + fetched_bytes + built.wire_bytes
            yield RemoteDataset(manifest, source, overhead_bytes)
    except OSError as exc:
        raise StorageError(f"cannot spool downloads of {base}: {exc}") from exc
    finally:
        await link.close()

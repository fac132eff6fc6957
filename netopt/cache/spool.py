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

A download never grows past its listed size: an answer that goes on is cut there and
fails the try, as one that ends short does. The
spool is removed when the sync using it ends well, and kept when it fails, for the
next try. Without a state directory it is a temporary directory, removed either way.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from netopt.cache.remotefiles import RemoteFile
from netopt.errors import NetworkError, ProtocolError

__all__ = ["FetchFrom", "Spool", "content_range_start", "open_spool"]

FetchFrom = Callable[
    [RemoteFile, int], AbstractAsyncContextManager[tuple[int, AsyncIterable[bytes]]]
]
"""Ask for ``remote`` from byte ``offset`` (0: all of it): (the offset the answer starts
at, either ``offset`` or 0, and its bytes)."""


def content_range_start(content_range: str) -> int:
    """The first byte of a ``Content-Range: bytes FIRST-LAST/TOTAL`` answer; -1 when it
    is malformed (a resumed download then refuses the answer)."""
    unit, _, spec = content_range.strip().partition(" ")
    first, dash, _ = spec.partition("-")
    return int(first) if unit == "bytes" and dash and first.isdigit() and len(first) < 20 else -1


class Spool:
    """Downloads named by remote key in ``root`` (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _paths(self, remote: RemoteFile) -> tuple[Path, Path]:
        name = hashlib.sha256(remote.key.encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return self.root / f"{name}.part", self.root / f"{name}.meta"

    def _resume_offset(self, remote: RemoteFile) -> int:
        """Bytes already downloaded for ``remote``'s validator (blocking); 0 after a reset."""
        data, meta = self._paths(remote)
        stamp = {"key": remote.key, "validator": remote.validator}
        try:
            if json.loads(meta.read_text()) == stamp:
                have = data.stat().st_size
                if remote.size_bytes < 0 or have <= remote.size_bytes:
                    return have
        except (OSError, ValueError):
            pass
        data.unlink(missing_ok=True)
        meta.write_text(json.dumps(stamp))
        return 0

    async def download(self, remote: RemoteFile, fetch_from: FetchFrom) -> tuple[Path, int]:
        """``remote`` whole in the spool: (its path, bytes this call took on the wire).

        Raises what ``fetch_from`` raises; NetworkError for an answer that ends short of
        the listed size or goes past it (the file changed: the open's next try lists it
        again), ProtocolError for one from another offset than asked.
        """
        data, _ = self._paths(remote)
        have = await asyncio.to_thread(self._resume_offset, remote)
        # A file of unknown size is never taken as complete: it is asked for whole.
        if remote.size_bytes >= 0 and have == remote.size_bytes:
            return data, 0
        if remote.size_bytes < 0:
            have = 0
        got = 0
        async with fetch_from(remote, have) as (start, pieces):
            if start not in (0, have):
                raise ProtocolError(f"{remote.key}: answered from byte {start}, asked {have}")
            with data.open("r+b" if start and data.exists() else "wb") as f:
                f.truncate(start)
                f.seek(start)
                size = start
                async for piece in pieces:
                    size += len(piece)
                    got += len(piece)
                    if 0 <= remote.size_bytes < size:
                        # Changed since it was listed (or a hostile server): a new
                        # listing, on the open's next try, sees what it is now.
                        raise NetworkError(
                            f"{remote.key}: more than its listed {remote.size_bytes} bytes"
                        )
                    await asyncio.to_thread(f.write, piece)
        if 0 <= remote.size_bytes != size:
            raise NetworkError(f"{remote.key}: ended at byte {size} of {remote.size_bytes}")
        return data, got


@asynccontextmanager
async def open_spool(state_dir: str | None, kind: str, source: str) -> AsyncIterator[Spool]:
    """The spool of the downloads from ``source`` (its URL), a source of ``kind``:
    ``STATE_DIR/spool-KIND-HASH``, removed when the block ends well and kept when it
    raises. Without ``state_dir``, or while another sync holds that spool, a temporary
    one, removed either way. OSError when it cannot be made."""
    if state_dir is not None:
        digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        root = Path(state_dir) / f"spool-{kind}-{digest}"
        lock_fd = await asyncio.to_thread(_lock_spool, root)
        if lock_fd is not None:
            try:
                yield Spool(root)
                await asyncio.to_thread(shutil.rmtree, root, True)
            finally:
                os.close(lock_fd)
            return
    temporary = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=f"netopt-{kind}-"))
    try:
        yield Spool(temporary)
    finally:
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

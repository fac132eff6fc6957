"""Shared pieces of the cache service tests: a seeded dataset and a sync request."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from netopt.cache.packfmt import TOMBSTONE, PackReader, encode_entry, pack_name
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncReport, SyncRequest, run_sync
from netopt.dataplane.client import ClientOptions

CHUNK_BYTES = 64 * 1024
SMALL_FILES = 50
SMALL_BYTES = 40_000
BIG_BYTES = 6_000_000


def fake_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake S3 credentials from the env (the test servers accept any); no real AWS
    configuration or instance metadata is read."""
    for var in [v for v in os.environ if v.startswith("AWS_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-printed")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def make_dataset(root: Path, seed: int = 1, big_bytes: int = BIG_BYTES) -> int:
    """A big random file and 50 small ones of 40 kB (8 MB in all by default); the total bytes."""
    rng = random.Random(seed)
    (root / "shards").mkdir(parents=True, exist_ok=True)
    (root / "big.bin").write_bytes(rng.randbytes(big_bytes))
    for i in range(SMALL_FILES):
        (root / "shards" / f"s{i:03d}.bin").write_bytes(rng.randbytes(SMALL_BYTES))
    return big_bytes + SMALL_FILES * SMALL_BYTES


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".netopt" not in p.as_posix()
    }


def stored_chunks(cache: Path) -> set[str]:
    """The chunks a cache directory holds on disk: chunk files and indexed pack records
    (read as the agent reads them, without the cache lock)."""
    files = {p.name for p in (cache / "chunks").glob("*/*")}
    return files | PackReader(cache / "packs").chunk_ids()


def corrupt_stored_chunk(cache: Path, chunk_id: str, at: int = 100) -> None:
    """Flip one byte of a stored chunk, where it lies (its file or its pack record)."""
    where = PackReader(cache / "packs").locate(chunk_id)
    if where is None:
        path, offset = cache / "chunks" / chunk_id[:2] / chunk_id, at
    else:
        path, offset = cache / "packs" / pack_name(where.pack, "pack"), where.offset + at
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def drop_stored_chunk(cache: Path, chunk_id: str) -> None:
    """Make a stored chunk vanish behind the cache's back (its file, or its pack record)."""
    where = PackReader(cache / "packs").locate(chunk_id)
    if where is None:
        (cache / "chunks" / chunk_id[:2] / chunk_id).unlink()
        return
    with (cache / "packs" / pack_name(where.pack, "idx")).open("ab") as f:
        f.write(encode_entry(bytes.fromhex(chunk_id), where.offset, TOMBSTONE))


def request(source: str, dest: Path, cache: Path, **kw: object) -> SyncRequest:
    opts = kw.pop("source_options", None) or SourceOptions(avg_chunk_bytes=CHUNK_BYTES)
    return SyncRequest(source, str(dest), str(cache), source_options=opts, **kw)  # type: ignore[arg-type]


def served_options(token: str, cpu: object, link_rate_bps: float | None = None) -> SourceOptions:
    return SourceOptions(
        client=ClientOptions(token=token),
        client_cpu=cpu,  # type: ignore[arg-type]
        link_rate_bps=link_rate_bps,
    )


async def sync_served_tree(
    src: Path, dest: Path, cache: Path, cpu: object = None, link_rate_bps: float | None = None
) -> SyncReport:
    """``src`` served by a real netopt server on localhost (token), synced into ``dest``
    through ``cache`` with ``cpu`` (default: the test CPU profile), planned for a link of
    ``link_rate_bps`` when given (as ``--link-rate-mbps``); the server stopped after."""
    from tests.service.dataplane_helpers import CPU, TOKEN, start

    runner, port, _, _ = await start(src)
    try:
        req = SyncRequest(
            f"netopt://127.0.0.1:{port}/ds", str(dest), str(cache),
            source_options=served_options(TOKEN, CPU if cpu is None else cpu, link_rate_bps),
        )  # fmt: skip
        return await run_sync(req)
    finally:
        await runner.cleanup()


def mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def umount(where: Path) -> None:
    done = subprocess.run(["umount", str(where)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def listing_page(names: Iterable[str]) -> web.Response:
    """A web server's directory listing of ``names`` (links relative to the page), as a
    test origin of an ``http(s)://HOST/PATH/`` source answers it."""
    links = "".join(f'<a href="{name}">{name}</a>' for name in names)
    return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def static_origin(src: Path, middlewares: Sequence[Any] = ()) -> AsyncIterator[str]:
    """A real aiohttp static origin on loopback serving ``src`` at ``/ds/`` (a listing,
    ranges, ETag and Last-Modified), ``middlewares`` first; its base URL."""
    app = web.Application(middlewares=list(middlewares))
    app.add_routes([web.static("/ds/", src, show_index=True)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/ds/"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def web_origin(listing: Handler, file: Handler) -> AsyncIterator[str]:
    """A real aiohttp origin on loopback serving a directory at ``/ds/``: ``listing``
    answers the page, ``file`` each ``/ds/{name}`` (GET and HEAD); its base URL."""
    app = web.Application()
    app.add_routes([web.get("/ds/", listing), web.get("/ds/{name}", file)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/ds/"
    finally:
        await runner.cleanup()

"""A hostile server's manifest: names and paths that would leave DEST or the cache.

The server is a real aiohttp app on localhost that answers a real dataset's info
and manifest, tampered with; the client is a real ``netopt sync`` process (or
`run_sync` for the many entry-path cases). Nothing may be written outside DEST
and the cache, and a later ``netopt cache gc`` must not delete anything outside.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.errors import PathTraversalError, ProtocolError, ValidationError
from tests.service.cache_helpers import request, served_options, stored_chunks
from tests.service.dataplane_helpers import CPU, FAST, TOKEN, make_dataset, start

REPO = Path(__file__).resolve().parents[2]
Tamper = Callable[[dict[str, Any], dict[str, Any], Path], None]


async def _real_meta(src: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The info and manifest documents a real `netopt serve` of ``src`` answers."""
    runner, port, _, _ = await start(src, "ds")
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            base = f"http://127.0.0.1:{port}/v1/datasets/ds"
            async with session.get(base) as resp:
                info = await resp.json()
            async with session.get(base + "/manifest") as resp:
                manifest = await resp.json()
    finally:
        await runner.cleanup()
    return info, manifest


async def _hostile_server(info: dict[str, Any], manifest: dict[str, Any]) -> tuple[Any, int]:
    """Serves ``info`` and ``manifest`` for any dataset name; chunks are 404."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def send_info(_: web.Request) -> web.Response:
        return web.json_response(info)

    async def send_manifest(_: web.Request) -> web.Response:
        return web.json_response(manifest)

    async def no_chunk(_: web.Request) -> web.Response:
        return web.json_response({"error": "NotFound", "message": "no such chunk"}, status=404)

    app = web.Application()
    app.add_routes(
        [
            web.get("/v1/health", health),
            web.get("/v1/datasets/{name}", send_info),
            web.get("/v1/datasets/{name}/manifest", send_manifest),
            web.get("/v1/datasets/{name}/chunks/{chunk_id}", no_chunk),
            web.post("/v1/datasets/{name}/batch", no_chunk),
            web.post("/v1/datasets/{name}/stream", no_chunk),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def _outside(tmp_path: Path) -> Path:
    """A directory beside DEST and the cache, holding files a bad name could reach."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("a.json", "b.json", "keep.txt"):
        (outside / name).write_text(f"victim {name}\n")
    return outside


async def _netopt(*args: str) -> tuple[int, str]:
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "netopt", *args,
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def _rename(name_for: Callable[[Path], str]) -> Tamper:
    def tamper(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
        info["name"] = manifest["name"] = name_for(outside)

    return tamper


NAME_CASES = {
    "absolute-dir": _rename(str),
    "dot-dot": _rename(lambda outside: "../../outside"),
    "trailing-newline": _rename(lambda outside: "ds\n"),
    "other-dataset": _rename(lambda outside: "other"),
}


@pytest.mark.parametrize("case", sorted(NAME_CASES))
async def test_sync_refuses_a_manifest_name_it_did_not_ask_for(tmp_path: Path, case: str) -> None:
    make_dataset(tmp_path / "src")
    info, manifest = await _real_meta(tmp_path / "src")
    outside = _outside(tmp_path)
    before = _snapshot(outside)
    NAME_CASES[case](info, manifest, outside)
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    runner, port = await _hostile_server(info, manifest)
    try:
        url = f"netopt://127.0.0.1:{port}/ds"
        rc, out = await _netopt("sync", url, str(dest), "--cache-dir", str(cache))
        gc_rc, gc_out = await _netopt("cache", "gc", "--cache-dir", str(cache), "--json")
    finally:
        await runner.cleanup()
    # Nothing outside written by the sync, nothing deleted by the gc.
    assert _snapshot(outside) == before
    assert rc in (1, 2), out
    assert "not allowed" in out or "refusing" in out, out
    assert gc_rc == 0, gc_out
    assert not list((cache / "manifests").iterdir())
    assert not dest.exists() or _snapshot(dest) == {}


def _entry(path: str) -> Tamper:
    def tamper(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
        manifest["files"][0]["path"] = path

    return tamper


def _chunk_name(name: str) -> Tamper:
    def tamper(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
        entry = next(f for f in manifest["files"] if f["chunks"])
        entry["chunks"][0][0] = name

    return tamper


def _duplicate(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
    manifest["files"].append(copy.deepcopy(manifest["files"][0]))


def _file_and_dir(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
    twin = copy.deepcopy(manifest["files"][0])
    twin["path"] = "text"  # "text/data.jsonl" makes text a directory
    manifest["files"].append(twin)


def _huge_mtime(info: dict[str, Any], manifest: dict[str, Any], outside: Path) -> None:
    manifest["files"][0]["mtime_ns"] = 10**30


HEX = "ab" * 32
ENTRY_CASES: dict[str, tuple[Tamper, type[Exception]]] = {
    "absolute-path": (lambda i, m, o: _entry(str(o / "x"))(i, m, o), PathTraversalError),
    "dot-dot-path": (_entry("../outside/x"), PathTraversalError),
    "inner-dot-dot": (_entry("text/../../outside/x"), PathTraversalError),
    "nul-byte": (_entry("text/a\x00b"), PathTraversalError),
    "empty-component": (_entry("text//a"), PathTraversalError),
    "trailing-slash": (_entry("text/"), PathTraversalError),
    "backslash": (_entry("..\\outside\\x"), PathTraversalError),
    "state-dir": (_entry(".netopt-sync/chunks/x"), PathTraversalError),
    "newline": (_entry("a\nb"), PathTraversalError),
    "duplicate": (_duplicate, ValidationError),
    "file-and-dir": (_file_and_dir, ValidationError),
    "chunk-too-short": (_chunk_name("ab" * 31), PathTraversalError),
    "chunk-upper-case": (_chunk_name(HEX.upper()), PathTraversalError),
    "chunk-newline": (_chunk_name(HEX + "\n"), PathTraversalError),
    "chunk-path": (_chunk_name("../../../outside/" + HEX[:47]), PathTraversalError),
    "huge-mtime": (_huge_mtime, ProtocolError),
}


@pytest.mark.parametrize("case", sorted(ENTRY_CASES))
async def test_sync_refuses_unsafe_manifest_entries(tmp_path: Path, case: str) -> None:
    make_dataset(tmp_path / "src")
    info, manifest = await _real_meta(tmp_path / "src")
    outside = _outside(tmp_path)
    before = _snapshot(outside)
    tamper, error = ENTRY_CASES[case]
    tamper(info, manifest, outside)
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    runner, port = await _hostile_server(info, manifest)
    try:
        url = f"netopt://127.0.0.1:{port}/ds"
        req = request(
            url, dest, cache, source_options=served_options(TOKEN, CPU), sync_options=FAST
        )
        with pytest.raises(error):
            await run_sync(req)
    finally:
        await runner.cleanup()
    assert _snapshot(outside) == before
    assert not dest.exists()
    assert stored_chunks(cache) == set()


async def test_symlinks_in_dest_do_not_lead_outside(tmp_path: Path) -> None:
    """DEST holds a link to a directory outside and a link to a file outside: the manifest's
    path through the first is refused, nothing outside is written or deleted."""
    make_dataset(tmp_path / "src")
    info, manifest = await _real_meta(tmp_path / "src")
    outside = _outside(tmp_path)
    (outside / ".small.txt.0123abcd.netopt-tmp").write_text("looks like a leftover\n")
    before = _snapshot(outside)
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    (dest / "text").mkdir(parents=True)
    (dest / "text" / "nested").symlink_to(outside, target_is_directory=True)
    runner, port = await _hostile_server(info, manifest)
    try:
        url = f"netopt://127.0.0.1:{port}/ds"
        req = request(
            url, dest, cache, source_options=served_options(TOKEN, CPU), sync_options=FAST
        )
        with pytest.raises(PathTraversalError, match="symlink"):
            await run_sync(req)
    finally:
        await runner.cleanup()
    assert _snapshot(outside) == before


def test_a_poisoned_index_from_an_older_netopt_is_ignored(tmp_path: Path) -> None:
    """An index written before names were checked may name a directory outside: the cache
    forgets that entry on open, and gc deletes nothing there."""
    outside = _outside(tmp_path)
    before = _snapshot(outside)
    cache = tmp_path / "cache"
    Cache.open(cache).close()
    index = json.loads((cache / "index.json").read_text())
    index["datasets"] = {str(outside): HEX, "../../outside": HEX, "ds\n": HEX}
    (cache / "index.json").write_text(json.dumps(index))
    (cache / "manifests" / "ds\n").mkdir()
    (cache / "manifests" / "ds\n" / f"{HEX}.json").write_text("{}")
    with Cache.open(cache) as c:
        assert c.datasets == {}
        assert c.gc() == (0, 0)
        with pytest.raises(PathTraversalError):
            c.versions(str(outside))
    assert _snapshot(outside) == before

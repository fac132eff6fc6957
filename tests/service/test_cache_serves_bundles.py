"""A node's cache served to its peers (`CachedDatasets` behind the data plane) sends a tree's
small chunks in bundles and its large chunks alone, as a served directory does: a real
origin fills the cache, a real server of that cache answers a second sync's streams."""

from __future__ import annotations

import os
import random
from pathlib import Path

from dataplane_helpers import CPU, FAST, TOKEN, check_tree
from dataplane_helpers import start as start_origin

import netopt.dataplane.handlers as handlers_module
from netopt.cache.peerserve import CachedDatasets
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.server import ServeSettings, create_app, start_server

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=10)


def _mixed_tree(root: Path) -> dict[str, bytes]:
    """300 small text files and two large files (chunks of tens to hundreds of KiB)."""
    rng = random.Random(5)
    words = [f"w{rng.randrange(3000)}" for _ in range(1500)]
    files = {
        f"small/{i % 9}/f{i:03d}.txt": " ".join(rng.choices(words, k=rng.randint(40, 400))).encode()
        for i in range(300)
    }
    files["large/random.bin"] = os.urandom(3 << 20)
    files["large/text.txt"] = " ".join(rng.choices(words, k=600_000)).encode()
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


async def test_a_cache_serves_small_chunks_in_bundles_and_large_ones_alone(
    tmp_path: Path, monkeypatch
) -> None:
    files = _mixed_tree(tmp_path / "origin" / "ds")
    origin, origin_port, _, manifest = await start_origin(tmp_path / "origin" / "ds")
    cache = tmp_path / "hk-1" / "cache"
    cache.mkdir(parents=True)
    try:
        first = SyncRequest(
            source=f"netopt://127.0.0.1:{origin_port}/ds",
            dest=str(tmp_path / "hk-1" / "data"),
            cache_dir=str(cache),
            source_options=SourceOptions(client=ClientOptions(token=TOKEN), client_cpu=CPU),
            sync_options=FAST,
        )
        await run_sync(first)
    finally:
        await origin.cleanup()
    sizes = {ref.chunk_id: ref.length_bytes for f in manifest.files for ref in f.chunks}
    assert max(sizes.values()) > 64 * 1024  # chunks a bundle may not join another's
    bundled: list[list[int]] = []
    real_bundle = handlers_module.ContextEncoder.encode_bundle

    def recording(self: handlers_module.ContextEncoder, pieces: list[bytes], level: int):
        bundled.append([len(piece) for piece in pieces])
        return real_bundle(self, pieces, level)

    monkeypatch.setattr(handlers_module.ContextEncoder, "encode_bundle", recording)
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), CachedDatasets(cache), CPU)
    peer, port = await start_server(app, "127.0.0.1", 0)
    dest = tmp_path / "hk-2" / "data"
    try:
        summary, _ = await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, CLIENT, client_cpu=CPU, sync_options=FAST,
            zstd_level=3, streams=2,
        )  # fmt: skip
    finally:
        await peer.cleanup()
    check_tree(dest, files)
    assert summary.chunk_retries == 0  # no bundle was refused
    assert sum(len(b) for b in bundled) > 200  # the small files went in bundles
    for lengths in bundled:  # the rule a client checks: small chunks, 64 KiB at most
        assert max(lengths) < handlers_module.CONTEXT_MAX_CHUNK_BYTES
        assert sum(lengths) - lengths[-1] < 64 * 1024

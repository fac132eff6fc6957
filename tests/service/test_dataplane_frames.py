"""Precompressed frames (`netopt serve --precompress`): built once, checked when found
and when served, advertised to clients only when complete, and served in place of
on-the-fly compression; against real files and a real localhost server."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest
import zstandard
from aiohttp import ClientSession
from dataplane_helpers import CHUNK_BYTES, CPU, FAST, TOKEN, check_tree

from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.frames import FRAME_READ_BYTES_PER_S, FrameStore, frames_dir_for
from netopt.dataplane.served import ServedDataset, load_dataset
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, start_server

LEVEL = 9
CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)


def _text_dataset(root: Path) -> dict[str, bytes]:
    """~1 MB of JSON-lines over a large vocabulary (a higher zstd level helps, as on
    real text), plus incompressible bytes."""
    rng = random.Random(5)
    words = [f"{rng.choice('abcdefghij')}{rng.randrange(20000)}" for _ in range(5000)]
    lines = (
        json.dumps({"id": i, "text": " ".join(rng.choices(words, k=rng.randrange(10, 40)))})
        for i in range(5000)
    )
    files = {
        "data.jsonl": "\n".join(lines).encode(),
        "blob.bin": rng.randbytes(200_000),
    }
    root.mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


def _with_frames(src: Path, frames: Path) -> ServedDataset:
    ds = load_dataset(src, "ds", CHUNK_BYTES)
    store = FrameStore(
        frames_dir_for(frames, "ds", ds.manifest.manifest_id, LEVEL), LEVEL, len(ds.index)
    )
    return dataclasses.replace(ds, frames=store)


def _build(ds: ServedDataset) -> FrameStore:
    assert ds.frames is not None
    ds.frames.build(list(ds.index), ds.read_chunk, workers=2)
    ds.frames.sample([ds.root / f.path for f in ds.manifest.files if f.size_bytes > 0])
    return ds.frames


def test_build_stores_a_checked_frame_per_compressible_chunk(tmp_path: Path) -> None:
    _text_dataset(tmp_path / "src")
    ds = _with_frames(tmp_path / "src", tmp_path / "frames")
    store = _build(ds)
    assert store.complete
    assert store.offered
    assert store.ready == len(ds.index)
    raw = [cid for cid in ds.index if store.is_raw(cid)]
    framed = [cid for cid in ds.index if not store.is_raw(cid)]
    assert raw  # blob.bin does not shrink
    assert framed  # the JSON-lines do
    for cid in framed:
        frame = store.get(cid)
        assert frame is not None
        assert blake3.blake3(zstandard.ZstdDecompressor().decompress(frame)).hexdigest() == cid
    assert store.ratio() > 1.2
    # Incompressible chunks are remembered as such: a restart does not compress them again.
    assert {p.name for p in store.root.glob("*.raw")} == {f"{cid}.raw" for cid in raw}
    again = _with_frames(tmp_path / "src", tmp_path / "frames")
    assert again.frames is not None
    compressed: list[int] = []
    real = zstandard.ZstdCompressor.compress

    def counting(self: zstandard.ZstdCompressor, data: bytes) -> bytes:
        compressed.append(len(data))
        return real(self, data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zstandard.ZstdCompressor, "compress", counting)
        again.frames.build(list(again.index), again.read_chunk, workers=2)
    assert compressed == []
    assert again.frames.complete
    assert all(again.frames.is_raw(cid) for cid in raw)


def test_bad_frames_are_found_at_start_and_when_served(tmp_path: Path) -> None:
    _text_dataset(tmp_path / "src")
    ds = _with_frames(tmp_path / "src", tmp_path / "frames")
    store = _build(ds)
    framed = sorted(cid for cid in ds.index if not store.is_raw(cid))
    truncated, flipped = framed[0], framed[1]
    (store.root / truncated).write_bytes((store.root / truncated).read_bytes()[:20])
    data = bytearray((store.root / flipped).read_bytes())
    data[-8] ^= 0xFF
    (store.root / flipped).write_bytes(bytes(data))
    # Served: a bad frame is dropped (the route then compresses on the fly).
    assert store.get(truncated) is None
    assert not store.complete
    # A new store over the same directory finds the bad ones and compresses them again.
    again = _build(_with_frames(tmp_path / "src", tmp_path / "frames"))
    assert again.complete
    for cid in (truncated, flipped):
        frame = again.get(cid)
        assert frame is not None
        assert blake3.blake3(zstandard.ZstdDecompressor().decompress(frame)).hexdigest() == cid


async def test_clients_plan_with_the_precompressed_level_once_complete(tmp_path: Path) -> None:
    files = _text_dataset(tmp_path / "src")
    ds = _with_frames(tmp_path / "src", tmp_path / "frames")
    stats = ServeStats()
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": ds}, CPU, stats)
    runner, port = await start_server(app, "127.0.0.1", 0)
    url = f"netopt://127.0.0.1:{port}/ds"
    try:
        async with ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async with http.get(f"http://127.0.0.1:{port}/v1/datasets/ds") as resp:
                before = await resp.json()
            assert before["precompressed"] == {
                "level": LEVEL,
                "ready_chunks": 0,
                "chunks": len(ds.index),
            }
            assert str(LEVEL) not in before["cpu"]["compress_bytes_per_s"]
            _, plan = await sync_url(url, tmp_path / "a", CLIENT, client_cpu=CPU, sync_options=FAST)
            assert plan.zstd_level != LEVEL  # not complete: planned on the fly as before
            store = _build(ds)
            async with http.get(f"http://127.0.0.1:{port}/v1/datasets/ds") as resp:
                after = await resp.json()
        assert after["precompressed"]["ready_chunks"] == len(ds.index)
        assert after["cpu"]["compress_bytes_per_s"][str(LEVEL)] == FRAME_READ_BYTES_PER_S
        assert store.sampled_ratio is not None
        assert after["sample"][str(LEVEL)] == pytest.approx(store.sampled_ratio)
        assert store.sampled_ratio > before["sample"]["1"]
        sent_before = stats.payload_bytes_sent
        asked_before = dict(stats.chunk_requests)
        summary, plan = await sync_url(
            url, tmp_path / "b", CLIENT, client_cpu=CPU, sync_options=FAST, link_rate_bps=100e6
        )
        check_tree(tmp_path / "b", files)
        assert plan.zstd_level == LEVEL

        # What was sent is exactly the stored frames (chunks zstd does not shrink: raw).
        def served_bytes(cid: str) -> int:
            return ds.index[cid][2] if store.is_raw(cid) else (store.root / cid).stat().st_size

        asked = {c: n - asked_before.get(c, 0) for c, n in stats.chunk_requests.items()}
        expected = sum(n * served_bytes(c) for c, n in asked.items())
        assert stats.payload_bytes_sent - sent_before == expected
        assert set(asked) == set(ds.index)
        assert summary.wire_bytes < sum(len(d) for d in files.values())
    finally:
        await runner.cleanup()


def test_serve_precompress_reuses_checked_frames(tmp_path: Path) -> None:
    # The CLI end to end: `netopt serve --precompress` builds the frames, says so, and
    # a second start over the same frames directory reuses them.
    _text_dataset(tmp_path / "src")
    frames = tmp_path / "frames"
    for _ in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-m", "netopt", "serve", str(tmp_path / "src"), "--name", "ds",
             "--bind", "127.0.0.1:0", "--no-auth", "--chunk-size", str(CHUNK_BYTES),
             "--precompress", str(LEVEL), "--frames-dir", str(frames)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = ""
            deadline = time.monotonic() + 60
            while "precompressed" not in line and time.monotonic() < deadline:
                line = proc.stderr.readline() if proc.stderr else ""
                assert line or proc.poll() is None, "serve exited"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            for pipe in (proc.stdout, proc.stderr):
                if pipe:
                    pipe.close()
        assert "precompressed" in line
        assert f"zstd {LEVEL}" in line
    (stored,) = frames.iterdir()
    assert stored.name.startswith("ds-")
    assert stored.name.endswith(f"-zstd{LEVEL}")
    assert len(list(stored.iterdir())) >= 1

"""The small frames that arrive together are read in one go (`HttpChunkStream.next_buffered`)
and stored as one group (`SyncRun.process_group`): a real localhost server, a tree of
small files, and a bad copy in the middle of what arrived, compressed chunk by chunk or
through the stream's zstd context (in bundles)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import blake3
import pytest
from dataplane_helpers import CPU, FAST, TOKEN, check_tree, start

import netopt.dataplane.handlers as handlers_module
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.streaming import HttpChunkStream
from netopt.errors import IntegrityError
from netopt.transfer.manifest import STATE_DIR_NAME

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)
NO_STEALS = dataclasses.replace(FAST, steal_after_s=10.0)
"""No stream takes over another's chunk at the tail: a chunk asked twice is a refetch."""


def _small_tree(root: Path, n_files: int) -> dict[str, bytes]:
    """``n_files`` files of 300 B-3 KB of compressible text, in nested directories."""
    rng = random.Random(31)
    words = [f"w{rng.randrange(5000)}" for _ in range(2000)]
    files: dict[str, bytes] = {}
    for i in range(n_files):
        rel = f"d{i % 7}/e{i % 13}/f{i:04d}.txt"
        files[rel] = " ".join(rng.choices(words, k=rng.randint(50, 500))).encode()[:3000]
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel])
    return files


@pytest.mark.parametrize("stream_context", [True, False], ids=["context", "per-chunk"])
async def test_a_bad_copy_among_frames_read_together_is_fetched_again_alone(
    tmp_path: Path, monkeypatch, stream_context: bool
) -> None:
    files = _small_tree(tmp_path / "src", 600)
    runner, port, stats, manifest = await start(tmp_path / "src")
    ids = [f.chunks[0].chunk_id for f in manifest.files]
    victims = {ids[200], ids[401]}
    real = handlers_module.encode_chunk
    real_context = handlers_module.ContextEncoder.encode
    spoiled: list[str] = []

    def spoil(data: bytes) -> bytes:
        name = blake3.blake3(data).hexdigest()
        if name in victims and name not in spoiled:
            spoiled.append(name)
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    monkeypatch.setattr(handlers_module, "encode_chunk", lambda d, lv: real(spoil(d), lv))

    def spoiling_context(self: handlers_module.ContextEncoder, data: bytes, level: int):
        return real_context(self, spoil(data), level)

    monkeypatch.setattr(handlers_module.ContextEncoder, "encode", spoiling_context)
    real_bundle = handlers_module.ContextEncoder.encode_bundle

    def spoiling_bundle(self: handlers_module.ContextEncoder, pieces: list[bytes], level: int):
        bundled.append(len(pieces))
        return real_bundle(self, [spoil(piece) for piece in pieces], level)

    bundled: list[int] = []
    monkeypatch.setattr(handlers_module.ContextEncoder, "encode_bundle", spoiling_bundle)
    monkeypatch.setattr(handlers_module, "_stream_context", lambda request: stream_context)
    buffered: list[str] = []
    real_buffered = HttpChunkStream.next_buffered

    def counting(self: HttpChunkStream, chunk_id: str, length_bytes: int):
        raw = real_buffered(self, chunk_id, length_bytes)
        if raw is not None:
            buffered.append(chunk_id)
        return raw

    monkeypatch.setattr(HttpChunkStream, "next_buffered", counting)
    dest = tmp_path / "dst"
    try:
        summary, _ = await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, CLIENT, client_cpu=CPU,
            sync_options=NO_STEALS, zstd_level=3, streams=2,
        )  # fmt: skip
        check_tree(dest, files)
        assert sorted(spoiled) == sorted(victims)
        assert len(buffered) > len(files) // 2  # most frames were read in groups
        again = {name for name in ids if stats.chunk_requests[name] > 1}
        assert max(stats.chunk_requests[name] for name in ids) == 2
        if stream_context:
            assert sum(bundled) > len(files) // 2  # most chunks left in bundles
            # A bad copy cuts a context stream (what followed it cannot be decoded): the
            # frames sent behind it on that stream are asked for again, nothing else.
            assert victims <= again
            assert summary.chunk_retries >= 2
        else:
            # The good frames of the bad copy's group were stored from it.
            assert again == victims
            assert summary.chunk_retries == 2
            assert not bundled
        assert summary.files_written == len(files)
        assert not (dest / STATE_DIR_NAME).exists()
    finally:
        await runner.cleanup()


async def test_an_always_bad_chunk_inside_a_bundle_is_charged_to_itself(
    tmp_path: Path, monkeypatch
) -> None:
    files = _small_tree(tmp_path / "src", 600)
    runner, port, _, manifest = await start(tmp_path / "src")
    ids = [f.chunks[0].chunk_id for f in manifest.files]
    victim = ids[300]
    real_bundle = handlers_module.ContextEncoder.encode_bundle
    inside: list[int] = []

    def spoiling_bundle(self: handlers_module.ContextEncoder, pieces: list[bytes], level: int):
        names = [blake3.blake3(piece).hexdigest() for piece in pieces]
        if victim in names:
            inside.append(names.index(victim))
            at = names.index(victim)
            bad = pieces[at][:-1] + bytes([pieces[at][-1] ^ 1])
            pieces = [*pieces[:at], bad, *pieces[at + 1 :]]
        return real_bundle(self, pieces, level)

    monkeypatch.setattr(handlers_module.ContextEncoder, "encode_bundle", spoiling_bundle)
    real_context = handlers_module.ContextEncoder.encode

    def spoiling_alone(self: handlers_module.ContextEncoder, data: bytes, level: int):
        if blake3.blake3(data).hexdigest() == victim:
            data = data[:-1] + bytes([data[-1] ^ 1])
        return real_context(self, data, level)

    monkeypatch.setattr(handlers_module.ContextEncoder, "encode", spoiling_alone)
    dest = tmp_path / "dst"
    try:
        with pytest.raises(IntegrityError, match=victim[:16]):
            await sync_url(
                f"netopt://127.0.0.1:{port}/ds", dest, CLIENT, client_cpu=CPU,
                sync_options=NO_STEALS, zstd_level=3, streams=2,
            )  # fmt: skip
        assert any(at > 0 for at in inside)  # it was not its bundle's first chunk
        assert len(files) == len(ids)
    finally:
        await runner.cleanup()

"""Real localhost server and client: corruption, killed connections, resume, concurrency."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import blake3
import pytest
from dataplane_helpers import (
    CPU,
    FAST,
    TOKEN,
    Proxy,
    check_tree,
    make_dataset,
    start,
)

import netopt.dataplane.handlers as handlers_module
from netopt.dataplane.client import ClientOptions, _hedged, sync_url
from netopt.errors import AuthenticationError, IntegrityError, NetworkError, PeerUnreachableError
from netopt.transfer.manifest import STATE_DIR_NAME

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)


async def _sync(port: int, dest: Path, **kw: object):
    return await sync_url(
        f"netopt://127.0.0.1:{port}/ds",
        dest,
        kw.pop("client", CLIENT),  # type: ignore[arg-type]
        client_cpu=CPU,
        sync_options=FAST,
        **kw,  # type: ignore[arg-type]
    )


async def test_sync_round_trip_compresses_and_cleans_up(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    try:
        summary, plan = await _sync(port, tmp_path / "dst", streams=4)
        check_tree(tmp_path / "dst", files)
        assert not (tmp_path / "dst" / STATE_DIR_NAME).exists()
        assert summary.files_written == len(files)
        assert summary.logical_bytes == manifest.total_bytes
        assert plan.codec == "zstd"  # the JSON-lines file samples as compressible
        assert summary.wire_bytes < summary.logical_bytes  # JSON-lines compressed on the wire
        assert sum(stats.chunk_requests.values()) == len(manifest.unique_chunks())
        again, _ = await _sync(port, tmp_path / "dst")
        assert again.files_skipped == len(files)
        assert again.chunks_fetched == 0
    finally:
        await runner.cleanup()


async def test_corrupted_chunk_is_fetched_again(tmp_path: Path, monkeypatch) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    victim = next(f for f in manifest.files if f.path == "random.bin").chunks[1].chunk_id
    real = handlers_module.encode_chunk
    corrupted: list[str] = []

    def corrupting(data: bytes, level: int | None):
        if blake3.blake3(data).hexdigest() == victim and not corrupted:
            corrupted.append(victim)
            data = bytes([data[0] ^ 1]) + data[1:]
        return real(data, level)

    monkeypatch.setattr(handlers_module, "encode_chunk", corrupting)
    try:
        summary, _ = await _sync(port, tmp_path / "dst", zstd_level=0)
        check_tree(tmp_path / "dst", files)
        assert corrupted == [victim]
        assert stats.chunk_requests[victim] == 2
        assert summary.chunk_retries >= 1
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream_context", [True, False], ids=["context", "per-chunk"])
async def test_always_corrupt_chunk_is_never_stored(
    tmp_path: Path, monkeypatch, stream_context: bool
) -> None:
    """A server that always sends a bad copy of one chunk, compressed chunk by chunk or
    through the stream's zstd context (alone or in a bundle): the sync fails once the
    chunk's copies ran out, and nothing unverified is stored."""
    make_dataset(tmp_path / "src")
    runner, port, _, manifest = await start(tmp_path / "src")
    victim = manifest.files[-1].chunks[-1].chunk_id
    real = handlers_module.encode_chunk
    real_context = handlers_module.ContextEncoder.encode
    calls: list[str] = []

    def flipped(data: bytes) -> bytes:
        if blake3.blake3(data).hexdigest() == victim:
            calls.append(victim)
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    def corrupting(data: bytes, level: int | None):
        return real(flipped(data), level)

    def corrupting_context(self, data: bytes, level: int):
        return real_context(self, flipped(data), level)

    monkeypatch.setattr(handlers_module, "encode_chunk", corrupting)
    monkeypatch.setattr(handlers_module.ContextEncoder, "encode", corrupting_context)
    real_bundle = handlers_module.ContextEncoder.encode_bundle

    def corrupting_bundle(self, pieces: list[bytes], level: int):
        return real_bundle(self, [flipped(piece) for piece in pieces], level)

    monkeypatch.setattr(handlers_module.ContextEncoder, "encode_bundle", corrupting_bundle)
    monkeypatch.setattr(
        handlers_module, "_stream_context", lambda request: stream_context, raising=True
    )
    dest = tmp_path / "dst"
    try:
        # The bad copies are charged to the chunk that was wrong, also inside a bundle.
        with pytest.raises(IntegrityError, match=victim[:16]):
            await _sync(port, dest, zstd_level=3)
        assert len(calls) >= 2  # each copy was corrupted where it was encoded
        stored = list((dest / STATE_DIR_NAME / "chunks").iterdir())
        assert victim not in {p.name for p in stored}
        for path in stored:
            assert blake3.blake3(path.read_bytes()).hexdigest() == path.name
    finally:
        await runner.cleanup()


async def test_connection_killed_mid_chunk_recovers(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    # Connections 1 and 2 carry info and manifest; connection 3 is the first chunk stream.
    proxy = Proxy(port, kill_connection=3, kill_after_bytes=100_000)
    proxy_port = await proxy.start()
    try:
        summary, _ = await _sync(proxy_port, tmp_path / "dst", zstd_level=0, streams=2)
        check_tree(tmp_path / "dst", files)
        assert proxy.killed == 1
        assert summary.chunk_retries >= 1
    finally:
        await proxy.close()
        await runner.cleanup()


async def test_server_gone_then_resume_without_refetch(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    # The server vanishes once 300 kB reached the client: mid-transfer whatever the
    # batching (the 600 kB random file alone is more on the wire). A cut at the 5th
    # verified chunk came after the last byte had been read once the server sent small
    # chunks ahead in batches.
    proxy = Proxy(port, vanish_after_bytes=300_000)
    proxy_port = await proxy.start()
    dest = tmp_path / "dst"
    try:
        with pytest.raises(NetworkError) as caught:
            await _sync(proxy_port, dest, streams=2, zstd_level=0)
        assert proxy.vanished
        assert isinstance(caught.value, PeerUnreachableError)
        assert "unreachable" in str(caught.value)
        kept = {p.name for p in (dest / STATE_DIR_NAME / "chunks").iterdir()}
        assert 1 <= len(kept) < len(set(manifest.unique_chunks()))  # a partial sync kept
        first_run = dict(stats.chunk_requests)
        stats.chunk_requests.clear()
        summary, _ = await _sync(port, dest, streams=2, zstd_level=0)
        check_tree(dest, files)
        second_run = dict(stats.chunk_requests)
        assert not kept & set(second_run)  # verified chunks were not fetched again
        assert set(second_run) | kept == set(manifest.unique_chunks())
        assert all(n == 1 for n in second_run.values())
        assert summary.chunks_fetched == len(second_run)
        # Kept chunks are either reused directly or belong to files already written.
        assert summary.chunks_reused + summary.files_skipped >= 1
        assert summary.chunks_reused <= len(kept)
        assert len(first_run) >= len(kept)
    finally:
        await proxy.close()
        await runner.cleanup()


async def test_concurrent_clients(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    try:
        results = await asyncio.gather(
            *(_sync(port, tmp_path / f"dst{i}", streams=3) for i in range(4))
        )
        for i in range(4):
            check_tree(tmp_path / f"dst{i}", files)
        assert all(r[0].files_written == len(files) for r in results)
        assert sum(stats.chunk_requests.values()) == 4 * len(manifest.unique_chunks())
    finally:
        await runner.cleanup()


async def test_token_is_required(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    try:
        with pytest.raises(AuthenticationError):
            await _sync(port, tmp_path / "a", client=ClientOptions(token=None))
        with pytest.raises(AuthenticationError):
            await _sync(port, tmp_path / "b", client=ClientOptions(token="wrong-token-0123456789"))
    finally:
        await runner.cleanup()


async def test_cancelled_hedged_request_leaves_no_unretrieved_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # info and manifest are asked in parallel: when one is refused, the task group cancels
    # the other, whose own refusal must still be collected, not left to asyncio's
    # "Task exception was never retrieved" log.
    async def refused() -> None:
        await asyncio.sleep(0.05)
        raise AuthenticationError("refused")

    waiting = asyncio.create_task(_hedged(refused, delay_s=10))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    del waiting
    await asyncio.sleep(0.1)
    gc.collect()
    assert "never retrieved" not in caplog.text


async def test_server_not_there(tmp_path: Path) -> None:
    runner, port, _, _ = await start(make_dataset(tmp_path / "src") and tmp_path / "src")
    await runner.cleanup()
    with pytest.raises(PeerUnreachableError, match="unreachable"):
        await _sync(port, tmp_path / "dst")


async def test_a_tree_of_real_files_crosses_in_one_context_per_stream(
    tmp_path: Path, monkeypatch
) -> None:
    """netopt's own sources (~200 small files): synced byte for byte with one zstd context
    per stream, in fewer wire bytes than the same sync compressed chunk by chunk."""
    src = tmp_path / "src"
    files = _copy_sources(src)
    runner, port, _, _ = await start(src)
    contexts: list[bool] = []
    real = handlers_module._stream_context

    def watched(request) -> bool:
        contexts.append(real(request))
        return contexts[-1]

    monkeypatch.setattr(handlers_module, "_stream_context", watched)
    try:
        with_context, _ = await _sync(port, tmp_path / "a", zstd_level=3, streams=2)
        check_tree(tmp_path / "a", files)
        assert contexts
        assert all(contexts)
        monkeypatch.setattr(handlers_module, "_stream_context", lambda request: False)
        per_chunk, _ = await _sync(port, tmp_path / "b", zstd_level=3, streams=2)
        check_tree(tmp_path / "b", files)
    finally:
        await runner.cleanup()
    assert with_context.logical_bytes == per_chunk.logical_bytes
    assert with_context.wire_bytes < 0.9 * per_chunk.wire_bytes


def _copy_sources(dest: Path) -> dict[str, bytes]:
    """netopt's own ``.py`` files copied under ``dest``: relative path -> bytes."""
    package = Path(handlers_module.__file__).resolve().parents[1]
    files: dict[str, bytes] = {}
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        files[rel] = path.read_bytes()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(files[rel])
    return files

"""`netopt.dataplane.prefetch`: a sync's first round trips begun before its imports,
against a real localhost server: answers and sockets are used, anything wrong falls
back to the normal path (which reports errors), nothing leaks."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from aiohttp import web
from dataplane_helpers import (
    CHUNK_BYTES,
    CPU,
    FAST,
    TOKEN,
    check_tree,
    make_dataset,
    serve_with_middleware,
    start,
)
from test_dataplane_server import _evil_app
from tls_helpers import make_pki

from netopt.dataplane import prefetch
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.served import load_dataset
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, start_server
from netopt.errors import AuthenticationError, PathTraversalError, TlsError
from netopt.tlsconf import ClientTls, ServerTls, server_context, use_client_tls
from netopt.transfer.manifest import Manifest

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)


async def _sync(port: int, dest: Path, client: ClientOptions = CLIENT, streams: int = 4):
    return await sync_url(
        f"netopt://127.0.0.1:{port}/ds",
        dest,
        client,
        client_cpu=CPU,
        sync_options=FAST,
        streams=streams,
    )


@pytest.fixture(autouse=True)
def _fresh_stats():
    prefetch.discard()
    prefetch.STATS.clear()
    yield
    prefetch.discard()


async def _settle() -> None:
    """Let the prefetch threads finish connecting (they are not awaited by `start`)."""
    for _ in range(100):
        pending = prefetch._pending
        if pending is None or not any(t.is_alive() for t in pending.threads):
            return
        await asyncio.sleep(0.02)


async def _prefetched_sync(
    port: int, dest: Path, files: dict[str, bytes], stats: ServeStats, manifest: Manifest
) -> None:
    """Prefetch 4 sockets and the answers, then sync: the tree is whole, each chunk was
    asked once, the answers and sockets were used, every socket taken or closed."""
    assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 4)
    await _settle()
    summary, _ = await _sync(port, dest)
    check_tree(dest, files)
    assert summary.logical_bytes == manifest.total_bytes
    assert sum(stats.chunk_requests.values()) == len(manifest.unique_chunks())
    assert prefetch.STATS["meta_used"] == 1
    assert prefetch.STATS["sockets_used"] >= 1
    # Every connected socket was either taken by a stream or closed at the end.
    assert prefetch.STATS["sockets_used"] + prefetch.STATS["sockets_discarded"] == 4


async def test_prefetched_answers_and_sockets_are_used(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    try:
        await _prefetched_sync(port, tmp_path / "dst", files, stats, manifest)
        assert prefetch._pending is None
    finally:
        await runner.cleanup()


async def test_a_prefetch_with_another_token_or_dataset_is_not_used(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", "another-token-0123456789", 0)
        await _settle()
        await _sync(port, tmp_path / "a")
        check_tree(tmp_path / "a", files)
        prefetch.start(f"netopt://127.0.0.1:{port}/other", TOKEN, 0)
        await _settle()
        await _sync(port, tmp_path / "b")
        check_tree(tmp_path / "b", files)
        assert prefetch.STATS["meta_used"] == 0
    finally:
        await runner.cleanup()


async def test_a_refused_prefetch_leaves_the_error_to_the_normal_path(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", None, 2)
        await _settle()
        with pytest.raises(AuthenticationError):
            await _sync(port, tmp_path / "dst", ClientOptions(token=None))
        assert prefetch.STATS["meta_used"] == 0
    finally:
        await runner.cleanup()


async def test_prefetched_manifest_is_validated_like_any_other(tmp_path: Path) -> None:
    doc = {
        "name": "ds",
        "files": [
            {"path": "../evil", "size_bytes": 3, "mode": 420, "mtime_ns": 0,
             "chunks": [["a" * 64, 3]]}
        ],
    }  # fmt: skip
    runner = web.AppRunner(_evil_app(doc))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", None, 2)
        await _settle()
        with pytest.raises(PathTraversalError):
            await _sync(port, tmp_path / "box" / "dst", ClientOptions())
        assert prefetch.STATS["meta_used"] == 1
        assert not (tmp_path / "box" / "evil").exists()
    finally:
        await runner.cleanup()


def test_start_ignores_what_is_not_a_dataset_url() -> None:
    for url in ("http://127.0.0.1:1/ds", "netopt://127.0.0.1/ds", "netopt://h:99999/ds",
                "netopt://h:80/", "netopt://h:80/a/b", "/some/dir"):  # fmt: skip
        assert not prefetch.start(url, None, 1), url
    assert prefetch._pending is None


async def _tls_server(
    root: Path, pki_root: Path
) -> tuple[web.AppRunner, int, ServeStats, Manifest, Path]:
    """A real data-plane server over TLS (a certificate for 127.0.0.1): runner, port,
    stats, manifest and the CA file that verifies it."""
    pki = make_pki(pki_root)
    node = pki.issue("srv")
    dataset = load_dataset(root, "ds", CHUNK_BYTES)
    stats = ServeStats()
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU, stats)
    ctx = server_context(ServerTls(str(node.cert), str(node.key), None, False, "test"))
    runner, port = await start_server(app, "127.0.0.1", 0, ssl_context=ctx)
    return runner, port, stats, dataset.manifest, pki.ca


async def test_under_tls_the_answers_come_over_tls_and_the_sockets_are_used(
    tmp_path: Path,
) -> None:
    """With the cluster CA set, the info and manifest are fetched over verified TLS during
    start-up and the data sockets are connected (the engine's TLS runs over them)."""
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest, ca = await _tls_server(tmp_path / "src", tmp_path / "pki")
    use_client_tls(ClientTls(ca_file=str(ca)))
    try:
        await _prefetched_sync(port, tmp_path / "dst", files, stats, manifest)
    finally:
        use_client_tls(ClientTls())
        await runner.cleanup()


async def test_under_tls_a_server_the_ca_did_not_sign_gets_nothing_from_the_prefetch(
    tmp_path: Path,
) -> None:
    """The prefetch verifies as the normal path does: against another CA its requests fail
    (the token is never sent), nothing is used, and the normal path names the cause."""
    make_dataset(tmp_path / "src")
    runner, port, _, _, _ = await _tls_server(tmp_path / "src", tmp_path / "pki")
    other = make_pki(tmp_path / "other", "another CA")
    use_client_tls(ClientTls(ca_file=str(other.ca)))
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 2)
        await _settle()
        with pytest.raises(TlsError, match="certificate"):
            await _sync(port, tmp_path / "dst")
        assert prefetch.STATS["meta_used"] == 0
    finally:
        use_client_tls(ClientTls())
        await runner.cleanup()


def test_under_tls_a_ca_file_that_does_not_load_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    use_client_tls(ClientTls(ca_file=str(bad)))
    try:
        assert not prefetch.start("netopt://127.0.0.1:9/ds", TOKEN, 2)
        assert prefetch._pending is None
    finally:
        use_client_tls(ClientTls())


async def _slow_manifest_server(
    root: Path, ranged_delays_s: list[float], whole_delay_s: float, ranged_fail: bool = False
) -> tuple[web.AppRunner, int, list[tuple[float, bool]]]:
    """The data plane on loopback whose manifest requests for a byte range (the
    prefetch's pieces) are answered after ``ranged_delays_s`` in the order they come
    (the last for every later one), with a 503 when ``ranged_fail``, and those for the
    whole manifest (the normal path's) after ``whole_delay_s``. The list gets each
    manifest request's arrival (monotonic s) and whether it asked for a range."""
    asked: list[tuple[float, bool]] = []

    @web.middleware
    async def slow(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        if request.path.endswith("/manifest"):
            ranged = "Range" in request.headers
            n = sum(1 for _, r in asked if r)
            asked.append((asyncio.get_running_loop().time(), ranged))
            if not ranged:
                await asyncio.sleep(whole_delay_s)
            else:
                await asyncio.sleep(ranged_delays_s[min(n, len(ranged_delays_s) - 1)])
                if ranged_fail:
                    return web.json_response({"error": "busy"}, status=503)
        return await handler(request)

    runner, port, _ = await serve_with_middleware(root, slow)
    return runner, port, asked


async def _sync_past_slow_manifests(
    tmp_path: Path,
    ranged_delays_s: list[float],
    whole_delay_s: float,
    timeout_s: float,
    ranged_fail: bool = False,
) -> list[tuple[float, bool]]:
    """Prefetch, then sync (within ``timeout_s``) from `_slow_manifest_server`; the
    tree must be whole. The manifest requests' arrivals, and whether each was ranged."""
    files = make_dataset(tmp_path / "src")
    runner, port, asked = await _slow_manifest_server(
        tmp_path / "src", ranged_delays_s, whole_delay_s, ranged_fail
    )
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 2)
        await asyncio.wait_for(_sync(port, tmp_path / "dst"), timeout=timeout_s)
        check_tree(tmp_path / "dst", files)
    finally:
        await runner.cleanup()
    return asked


async def test_a_stalled_piece_of_a_prefetched_manifest_is_taken_over(tmp_path: Path) -> None:
    # The manifest is small: its first piece, which the prefetch asks for twice. Both
    # asks stall 5 s (as requests whose packets were lost wait out retransmission
    # timeouts); an idle connection asks for a third copy (`manifestpieces.STALL_MIN_S` on
    # loopback), answered at once, and the prefetch's manifest is used: the sync does
    # not wait for the stalls.
    files = make_dataset(tmp_path / "src")
    first_piece: list[float] = []
    release = asyncio.Event()

    @web.middleware
    async def stall(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        if request.headers.get("Range", "").startswith("bytes=0-"):
            first_piece.append(asyncio.get_running_loop().time())
            if len(first_piece) <= 2:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(release.wait(), 5)
        return await handler(request)

    runner, port, _ = await serve_with_middleware(tmp_path / "src", stall)
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 2)
        await asyncio.wait_for(_sync(port, tmp_path / "dst"), timeout=3.0)
        check_tree(tmp_path / "dst", files)
    finally:
        release.set()
        await runner.cleanup()
    assert len(first_piece) == 3
    assert prefetch.STATS["meta_used"] == 1
    assert prefetch.STATS["manifest_takeovers"] == 1


async def test_a_late_prefetched_answer_is_used_when_it_beats_asking_again(
    tmp_path: Path,
) -> None:
    # The prefetch's pieces come 0.8 s late (they lost packets on a lossy link), past
    # `take_meta`'s wait: the normal path asks again, and its answer would take 5 s.
    # The prefetch's late answer wins the race; the sync is whole.
    asked = await _sync_past_slow_manifests(tmp_path, [0.8], 5.0, 4.0)
    whole = [at for at, ranged in asked if not ranged]
    assert whole  # the normal path had asked again
    assert whole[0] - asked[0][0] < 0.8  # before the prefetch's answer came
    assert prefetch.STATS["meta_used"] == 1


async def test_a_prefetch_that_fails_late_leaves_the_answer_to_the_normal_path(
    tmp_path: Path,
) -> None:
    # Every piece the prefetch asks for fails (503) after 0.8 s, past `take_meta`'s
    # wait; the normal path's answer (1.2 s) is used.
    asked = await _sync_past_slow_manifests(tmp_path, [0.8], 1.2, 6.0, ranged_fail=True)
    assert any(not ranged for _, ranged in asked)
    assert prefetch.STATS["meta_used"] == 0

"""A ``netopt serve`` server's life: load and watch the dataset, start, precompress, stop.

`run_serve` loads the directory as a live dataset, starts the data-plane app
(`netopt.dataplane.server`), optionally builds the precompressed frames meanwhile,
and serves until SIGINT or SIGTERM; then it stops the server and the watcher. The
command line (`netopt.cli.serve_cmd`) only parses options and calls it; what the
server has to say goes through the ``say`` (the serving line) and ``note``
(progress of the precompression) callbacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from netopt.config import TlsSettings
from netopt.dataplane.frames import FrameStore, frames_dir_for
from netopt.dataplane.handlers import ServeSettings, ServeStats
from netopt.dataplane.origin import LiveDataset
from netopt.dataplane.served import ServedDataset
from netopt.dataplane.servemetrics import ServeMetrics, add_metrics_route
from netopt.dataplane.server import create_app, start_server
from netopt.errors import NetoptError
from netopt.tlsconf import certificate_watch
from netopt.transfer.profile import load_cpu_profile

__all__ = ["default_frames_dir", "run_serve"]

log = logging.getLogger(__name__)


def default_frames_dir() -> Path:
    """``$XDG_CACHE_HOME/netopt/frames`` (default ``~/.cache``)."""
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache) / "netopt" / "frames"


async def run_serve(
    directory: str,
    name: str,
    host: str,
    port: int,
    settings: ServeSettings,
    avg_chunk_bytes: int,
    codec_cache: str | None,
    precompress_level: int | None = None,
    frames_dir: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    tls: TlsSettings | None = None,
    *,
    say: Callable[[str], None] = print,
    note: Callable[[str], None] = print,
) -> int:
    """Serve ``directory`` as dataset ``name`` on ``host:port`` until SIGINT or SIGTERM
    (over TLS with ``ssl_context``, which follows renewals of ``tls``'s files); with
    ``precompress_level``, compress every chunk once at that level meanwhile.

    Returns 0 once stopped. Raises ValidationError when the address cannot be bound,
    StorageError / ValidationError when the directory cannot be served.
    """
    live = await asyncio.to_thread(LiveDataset.load, directory, name, avg_chunk_bytes)
    store: FrameStore | None = None
    if precompress_level is not None:
        base = Path(frames_dir) if frames_dir else default_frames_dir()
        where = frames_dir_for(base, name, live.manifest.manifest_id, precompress_level)
        store = FrameStore(where, precompress_level, len(live.index))
        live.with_frames(store)
    dataset = live.current
    cpu = await asyncio.to_thread(load_cpu_profile, codec_cache)
    # Clients plan with the cores this server will actually compress on.
    cpu = dataclasses.replace(cpu, cores=settings.worker_threads)
    stats = ServeStats()
    metrics = ServeMetrics(stats, {name: live})
    app = create_app(settings, {name: live}, cpu, stats, observer=metrics.http)
    add_metrics_route(app, metrics)
    runner, bound = await start_server(app, host, port, ssl_context=ssl_context)
    shown = f"[{host}]" if ":" in host else host
    serving = (
        f"serving netopt://{shown}:{bound}/{name} ({len(dataset.manifest.files)} files, "
        f"{dataset.manifest.total_bytes} bytes, {len(dataset.index)} chunks; "
        f"changes noticed by {live.watching})"
    )
    say(serving)
    log.info("%s", serving)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    building = None
    watch = loop.create_task(certificate_watch(ssl_context, tls or TlsSettings(), "netopt serve"))
    if store is not None:
        # A one-off publishing step: it may use every core, unlike serving.
        building = loop.create_task(_precompress(store, dataset, os.cpu_count() or 1, note))
    try:
        await stop.wait()
    finally:
        watch.cancel()
        if building is not None:
            building.cancel()
        await runner.cleanup()
        live.close()
    return 0


async def _precompress(
    store: FrameStore, dataset: ServedDataset, workers: int, note: Callable[[str], None]
) -> None:
    """Build ``store`` in threads and say how it went (a failure leaves serving as it was:
    chunks without a frame are compressed on the fly)."""
    started = time.monotonic()
    note(f"precompressing {store.chunks} chunks at zstd {store.level} into {store.root}")
    ids = list(dataset.index)
    files = [dataset.root / f.path for f in dataset.manifest.files if f.size_bytes > 0]
    try:
        await asyncio.to_thread(store.build, ids, dataset.read_chunk, workers)
        await asyncio.to_thread(store.sample, files)
    except NetoptError as exc:
        note(f"precompression stopped: {exc}; serving on-the-fly compression")
        return
    note(
        f"precompressed {store.ready} chunks at zstd {store.level} in "
        f"{time.monotonic() - started:.1f} s (ratio {store.ratio():.2f}, "
        f"{store.sampled_ratio:.2f} on the sample)"
    )

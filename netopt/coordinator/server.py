"""Run the coordinator until SIGTERM or SIGINT: ``netopt coordinator --config FILE``."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from netopt.config import CoordinatorSettings
from netopt.coordinator.app import CoordinatorDeps, create_app
from netopt.errors import NetworkError
from netopt.tlsconf import certificate_watch, listener_context
from netopt.webshell import start_site

__all__ = ["run_coordinator", "serve"]

log = logging.getLogger(__name__)

# Allocations between young-generation collections (CPython's default is 700). A request
# frees almost all it allocates by reference counting, so a collection finds about the
# same few live young objects whatever the threshold: rarer collections mean fewer
# pauses (and fewer promotions into the older generations, whose collections are the
# long ones) for at most this many objects of cyclic garbage held a little longer.
GC_GEN0_THRESHOLD = 20_000


async def serve(
    settings: CoordinatorSettings,
    stop: asyncio.Event,
    deps: CoordinatorDeps | None = None,
    on_ready: Callable[[str, int], None] | None = None,
) -> None:
    """Serve until ``stop`` is set, then close connections and the database cleanly.

    ``on_ready(host, port)`` is called once listening (the port is the bound one
    when the configured port is 0). Raises NetworkError when the address is taken.
    """
    tls = listener_context(settings.tls, settings.listen.host, "coordinator tls")
    app = create_app(settings, deps)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    try:
        try:
            await start_site(
                runner, host=settings.listen.host, port=settings.listen.port, ssl_context=tls
            )
        except OSError as exc:
            raise NetworkError(
                f"cannot listen on {settings.listen.url_host}:{settings.listen.port}: "
                f"{exc.strerror}"
            ) from exc
        # The bound address tells the real port when port 0 was asked for.
        addresses = runner.addresses
        port = int(addresses[0][1]) if addresses else settings.listen.port
        scheme = "https" if tls is not None else "http"
        log.warning("coordinator listening on %s://%s:%d", scheme, settings.listen.url_host, port)
        if on_ready is not None:
            on_ready(settings.listen.host, port)
        watch = asyncio.create_task(certificate_watch(tls, settings.tls, "coordinator"))
        try:
            await stop.wait()
        finally:
            watch.cancel()
        log.warning("coordinator shutting down")
    finally:
        await runner.cleanup()


def _freeze_startup_heap(host: str, port: int) -> None:
    """Move what start-up left (modules, settings, the loaded registry) out of the collector's
    reach: a full collection then walks only objects made since, so its pause is shorter.
    Collected first, so no garbage is frozen. Young collections are made rarer too
    (:data:`GC_GEN0_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, older, oldest)


def run_coordinator(settings: CoordinatorSettings) -> int:
    """Blocking entry point: serve until SIGTERM/SIGINT; returns the exit code (0)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop, on_ready=_freeze_startup_heap)

    asyncio.run(main())
    return 0

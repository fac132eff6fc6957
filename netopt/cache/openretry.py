"""Open a sync's source through an outage: the same retry window its chunks have.

A sync rides out a server restart or a link cut once its chunks are moving (each chunk
is retried for `SyncOptions.retry_window_s`). Before that, opening the source (its
info and manifest, or an S3 listing) failed at the first network error: a job whose
start met a restarting server or a flapping link failed at once (0.3 s against a
refused port), where rclone and aria2c retry. `open_riding_out` tries the open again,
with the sync's backoff (`netopt.dataplane.syncrun.backoff_delay_s`), until it has
been failing for the window; then the last error is raised, naming the window.

Only failures to reach the source are retried (`NetworkError`, a refused or reset
connection, a timeout, an HTTP 5xx). What the source answered is final: a bad token,
a missing dataset, TLS refused, a malformed or hostile answer (`ProtocolError`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from netopt.cache.sources import OpenedSource, Source, SourceOptions
from netopt.dataplane.syncrun import backoff_delay_s
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import NetworkError, PeerUnreachableError, ProtocolError

__all__ = ["open_riding_out"]

log = logging.getLogger(__name__)


def _gave_up(exc: NetworkError, failing_s: float, window_s: float) -> NetworkError:
    """The error opening ends with once it failed for the whole window: of ``exc``'s
    kind (PeerUnreachableError for a server that cannot be reached)."""
    kind = PeerUnreachableError if isinstance(exc, PeerUnreachableError) else NetworkError
    return kind(
        f"{exc} (gave up opening the source after {failing_s:.1f} s of failures; retry "
        f"window {window_s:g} s, --retry-window-s)"
    )


@asynccontextmanager
async def open_riding_out(
    source: Source, opts: SourceOptions, sync_options: SyncOptions
) -> AsyncIterator[OpenedSource]:
    """``source.open(opts)``, tried again while it fails to reach the source, until it
    has been failing for ``sync_options.retry_window_s`` (see the module doc)."""
    first_failure_s: float | None = None
    failures = 0
    while True:
        opening = source.open(opts)
        try:
            opened = await opening.__aenter__()
        except ProtocolError:
            raise
        except NetworkError as exc:
            now_s = time.monotonic()
            first_failure_s = now_s if first_failure_s is None else first_failure_s
            failing_s = now_s - first_failure_s
            window_s = sync_options.retry_window_s
            if failing_s >= window_s:
                raise _gave_up(exc, failing_s, window_s) from exc
            failures += 1
            delay_s = min(backoff_delay_s(sync_options, failures), window_s - failing_s)
            log.warning("%s; trying again in %.1f s", exc, delay_s)
            await asyncio.sleep(delay_s)
            continue
        break
    try:
        yield opened
    except BaseException:
        if not await opening.__aexit__(*sys.exc_info()):
            raise
    else:
        await opening.__aexit__(None, None, None)

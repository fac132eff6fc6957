"""Open a sync's source through an outage: the same retry window its chunks have.

A sync rides out a server restart or a link cut once its chunks are moving (each chunk
is retried for `SyncOptions.retry_window_s`). Before that, opening the source (its
info and manifest, or an S3 listing) failed at the first network error: a job whose
start met a restarting server or a flapping link failed at once (0.3 s against a
refused port), where rclone and aria2c retry. `open_riding_out` tries the open again,
with the sync's backoff (`netopt.dataplane.syncrun.backoff_delay_s`), until the window
has passed since its first try began (not its first failure: a server that accepts and
never answers fails the first try only after the 60 s read timeout, and would
otherwise be waited on twice that); then the last error is raised, naming the window.
Between tries what the failed one read is collected at once.

Only failures to reach the source are retried (`NetworkError`, a refused or reset
connection, a timeout, an HTTP 5xx). What the source answered is final: a bad token,
a missing dataset, TLS refused, a malformed or hostile answer (`ProtocolError`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from netopt.cache.sources import OpenedSource, Source, SourceOptions
from netopt.dataplane.syncrun import backoff_delay_s
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import NetworkError, PeerUnreachableError, ProtocolError

__all__ = ["check_riding_out", "open_riding_out"]

log = logging.getLogger(__name__)


def _gave_up(
    exc: NetworkError, trying_s: float, window_s: float, what: str = "opening the source"
) -> NetworkError:
    """The error ``what`` ends with once it tried for the whole window: of ``exc``'s
    kind (PeerUnreachableError for a server that cannot be reached)."""
    kind = PeerUnreachableError if isinstance(exc, PeerUnreachableError) else NetworkError
    return kind(
        f"{exc} (gave up {what} after trying for {trying_s:.1f} s; retry "
        f"window {window_s:g} s, --retry-window-s)"
    )


def _delay_or_give_up(
    exc: NetworkError,
    first_try_s: float,
    failures: int,
    sync_options: SyncOptions,
    what: str = "opening the source",
) -> float:
    """The wait before the next try of ``what`` after its ``failures``-th failure
    (``exc``), logged; the error it ends with (`_gave_up`) once the retry window has
    passed since ``first_try_s``."""
    trying_s = time.monotonic() - first_try_s
    window_s = sync_options.retry_window_s
    if trying_s >= window_s:
        raise _gave_up(exc, trying_s, window_s, what) from exc
    delay_s = min(backoff_delay_s(sync_options, failures), window_s - trying_s)
    log.warning("%s; trying again in %.1f s", exc, delay_s)
    return delay_s


@asynccontextmanager
async def open_riding_out(
    source: Source, opts: SourceOptions, sync_options: SyncOptions
) -> AsyncIterator[OpenedSource]:
    """``source.open(opts)``, tried again while it fails to reach the source, until
    ``sync_options.retry_window_s`` has passed since the first try began (see the
    module doc)."""
    first_try_s = time.monotonic()
    failures = 0
    while True:
        opening = source.open(opts)
        try:
            opened = await opening.__aenter__()
        except ProtocolError:
            raise
        except NetworkError as exc:
            failures += 1
            delay_s = _delay_or_give_up(exc, first_try_s, failures, sync_options)
            del exc
            # What the failed try read (a partial manifest, in cycles with its error's
            # frames) goes now, not when the collector next runs: else each try of a
            # slow server's large manifest kept one more (85 -> 411 MB over 5 tries).
            gc.collect()
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


async def check_riding_out(opened: OpenedSource, shared: bool, sync_options: SyncOptions) -> None:
    """``opened.check_still_current(shared)``, asked again while it fails to reach the
    source, until ``sync_options.retry_window_s`` has passed since the first try began:
    a server restarting as a sync ends (its last chunks in, the streams that would have
    named its version cut) failed the sync at once, where a restart a moment earlier was
    ridden out. What the source answers (another version, a malformed answer) is final."""
    first_try_s = time.monotonic()
    failures = 0
    while True:
        try:
            await opened.check_still_current(shared)
            return
        except ProtocolError:
            raise
        except NetworkError as exc:
            failures += 1
            delay_s = _delay_or_give_up(
                exc, first_try_s, failures, sync_options, "checking the source's version"
            )
            await asyncio.sleep(delay_s)

"""Which client failures read as "the server closed the connection unanswered" (a TLS 1.3
refusal of a missing client certificate, when no client certificate is set)."""

from __future__ import annotations

import errno

import aiohttp

from netopt.dataplane.httpsource import _closed_unanswered


def test_a_disconnect_always_and_a_reset_only_before_the_first_answer() -> None:
    reset = aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer")
    assert _closed_unanswered(aiohttp.ServerDisconnectedError(), first=False)
    assert _closed_unanswered(reset, first=True)
    assert not _closed_unanswered(reset, first=False)  # mid-sync: a restart, retried
    refused = aiohttp.ClientOSError(errno.ECONNREFUSED, "refused")
    assert not _closed_unanswered(refused, first=True)
    # A connect that failed (its constructor's arguments vary between aiohttp versions).
    connect = aiohttp.ClientConnectorError.__new__(aiohttp.ClientConnectorError)
    assert not _closed_unanswered(connect, first=True)  # never connected: unreachable
    assert not _closed_unanswered(TimeoutError(), first=True)

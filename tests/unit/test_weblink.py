"""Which failures a web origin's request is asked again for (`netopt.cache.weblink`):
those to reach the origin, not what the origin answered."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from netopt.cache.weblink import failed_to_reach
from netopt.errors import NetworkError, ProtocolError

_KEY = ConnectionKey("example.test", 443, True, True, None, None, None)


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(111, "refused")),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ClientOSError(104, "reset"),
        aiohttp.ServerTimeoutError("stalled"),
        TimeoutError(),
    ],
)
def test_failures_to_reach_the_origin_are_asked_again(exc: BaseException) -> None:
    assert failed_to_reach(exc)


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ClientConnectorCertificateError(_KEY, ValueError("bad certificate")),
        aiohttp.ClientConnectorSSLError(_KEY, OSError("handshake refused")),
        NetworkError("big.bin: HTTP 503"),
        NetworkError("big.bin: changed since it was listed"),
        ProtocolError("a listing page over 67108864 bytes"),
        ValueError("not a network failure"),
    ],
)
def test_what_the_origin_answered_is_not_asked_again(exc: BaseException) -> None:
    assert not failed_to_reach(exc)

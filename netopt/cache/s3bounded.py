"""A bucket's listing pages read within a bound.

botocore reads every answer that is not an object's body into memory whole before it
parses it: a ListObjectsV2 page from a service that lies (or a proxy that loops) could
be any length. `BoundedListing` sends the client's ListObjectsV2 requests itself
(botocore's ``before-send`` hook: a handler's answer replaces the client's own send),
reads at most `MAX_LISTING_PAGE_BYTES` of each answer and refuses a longer one. Signing,
retries and parsing stay botocore's: a failure to connect, a timeout or a connection
closed early is raised as botocore's own error, which its retry mode knows.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp
from yarl import URL

from netopt.dataplane.httpsource import ClientOptions
from netopt.dataplane.limits import read_up_to
from netopt.errors import ProtocolError

__all__ = ["LISTING_EVENT", "MAX_LISTING_PAGE_BYTES", "BoundedListing"]

MAX_LISTING_PAGE_BYTES = 8 * 1024 * 1024
"""The most bytes of one ListObjectsV2 page: a page holds at most 1,000 objects, each a
key of up to 1,024 bytes with its size, ETag, date and storage class (~1.5 MB in all)."""

LISTING_EVENT = "before-send.s3.ListObjectsV2"


class _Body:
    """An answer's body, already read, and its headers as sent: what botocore's response
    reads from (aiobotocore before 3 takes the headers from ``raw.raw_headers`` too)."""

    def __init__(self, data: bytes, raw_headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self._data = data
        self.raw_headers = raw_headers

    async def read(self, *_: Any) -> bytes:
        data, self._data = self._data, b""
        return data


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class BoundedListing:
    """The listing requests of one S3 client, over a session of its own: within
    ``options``' connect and read timeouts, through the proxy the environment names
    (as botocore's), trusting ``ca_bundle`` when botocore's configuration names one."""

    def __init__(self, options: ClientOptions, ca_bundle: str | None) -> None:
        self._options = options
        self._ca_bundle = ca_bundle
        self._session: aiohttp.ClientSession | None = None
        self._clients: list[Any] = []

    async def __aenter__(self) -> BoundedListing:
        ssl_context: ssl.SSLContext | bool = True
        if self._ca_bundle:
            cafile = self._ca_bundle
            ssl_context = await asyncio.to_thread(ssl.create_default_context, cafile=cafile)
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._options.connect_timeout_s,
            sock_read=self._options.read_timeout_s,
        )
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            trust_env=True,
            connector=aiohttp.TCPConnector(ssl=ssl_context),
            auto_decompress=False,  # the body is parsed as sent (``Accept-Encoding: identity``)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:  # the client's later listings are its own again
            client.meta.events.unregister(LISTING_EVENT, self.send)
        self._clients.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def attach(self, client: Any) -> None:
        """Send ``client``'s ListObjectsV2 requests through this listing, until it closes."""
        client.meta.events.register(LISTING_EVENT, self.send)
        self._clients.append(client)

    async def send(self, request: Any, **_: Any) -> Any:
        """``request`` (botocore's prepared and signed request) sent; botocore's response
        with at most `MAX_LISTING_PAGE_BYTES` of body. ProtocolError past that."""
        from aiobotocore.awsrequest import AioAWSResponse
        from botocore import exceptions as bx

        assert self._session is not None, "used outside its context"
        headers = {_text(k): _text(v) for k, v in request.headers.items()}
        headers["Accept-Encoding"] = "identity"
        try:
            async with self._session.request(
                # As signed: the query is sent exactly as botocore encoded it.
                request.method,
                URL(request.url, encoded=True),
                headers=headers,
                data=request.body or None,
            ) as resp:
                body = await read_up_to(resp.content.read, MAX_LISTING_PAGE_BYTES + 1)
                raw_headers = resp.raw_headers
                status = resp.status
        except aiohttp.ClientSSLError as exc:  # a certificate refused, as botocore names it
            raise bx.SSLError(endpoint_url=request.url, error=exc) from exc
        except aiohttp.ClientConnectorError as exc:
            raise bx.EndpointConnectionError(endpoint_url=request.url, error=exc) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise bx.ReadTimeoutError(endpoint_url=request.url, error=exc) from exc
        except aiohttp.ClientError as exc:
            raise bx.ConnectionClosedError(endpoint_url=request.url) from exc
        if len(body) > MAX_LISTING_PAGE_BYTES:
            raise ProtocolError(
                f"a listing page of more than {MAX_LISTING_PAGE_BYTES} bytes from "
                f"{request.url.split('?', 1)[0]}: refused"
            )
        answered = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
        return AioAWSResponse(request.url, status, answered, _Body(body, raw_headers))

"""What every netopt HTTP service shares at its edge: listener limits and JSON errors.

`start_site` listens for an aiohttp runner with `ListenerLimits`: a connection must send
its first request's header within ``header_timeout_s``, an idle keep-alive connection is
closed after ``idle_timeout_s``, and one address may hold ``max_connections_per_address``
connections (all addresses together: fewer than the process may open files, so accepting
never fails for want of a descriptor). A connection over a cap is closed at once; a
flood of them is logged once, when it starts, not per connection. With an ``ssl_context``
(`netopt.tlsconf.server_context`: TLS 1.2+, optionally client certificates) the listener
speaks TLS only; a plain-HTTP client's bytes fail the handshake and the connection closes.

`check_bearer` is the one token check (``Authorization: Bearer TOKEN``, constant-time
compare) and `bearer_refusal` its answer, the one 401 body
``{"error": "AuthenticationError", "message": TEXT}`` with ``WWW-Authenticate``; the
coordinator, the data plane and the agent's doctor routes all use them.

`service_shell` is the one middleware every service puts first: it turns every
4xx/5xx that aiohttp or a handler raises (a netopt error by its kind, an aiohttp
HTTP error, anything else as a logged 500) into the one JSON error body
``{"error": NAME, "message": TEXT}``, logs each request (``netopt.http``, debug) and
hands route, method, status and duration to the service's `RequestObserver` (its
metrics). `parse_json_document` reads an untrusted JSON body (refusing what would make
``json`` raise something other than a clean refusal: deep nesting, integers over
Python's digit limit, NaN).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import resource
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import prometheus_client
from aiohttp import web

from netopt.errors import (
    AuthenticationError,
    NetoptError,
    NotFoundError,
    ResidencyError,
    StorageError,
    ValidationError,
)

__all__ = [
    "FD_RESERVE",
    "MAX_CONNECTIONS",
    "ConnectionGuard",
    "LimitedSite",
    "ListenerLimits",
    "RequestMetrics",
    "RequestObserver",
    "bearer_refusal",
    "check_bearer",
    "error_response",
    "parse_json_document",
    "route_name",
    "service_shell",
    "start_site",
    "status_of",
    "unauthorized",
]

log = logging.getLogger(__name__)
request_log = logging.getLogger("netopt.http")

MAX_CONNECTIONS = 4096
"""Connections one listener holds at most, whatever the descriptor limit."""
FD_RESERVE = 128
"""Descriptors kept for files, the database and outgoing connections."""


@dataclass(frozen=True)
class ListenerLimits:
    """How long a client may take and how many connections it may hold."""

    header_timeout_s: float = 15.0
    """A new connection's first request header must have arrived by then."""
    idle_timeout_s: float = 60.0
    """A keep-alive connection with no request (a later header included) is closed then."""
    max_connections_per_address: int = 128
    """Above a sync's 64 data connections plus its info and manifest requests."""
    max_connections: int | None = None
    """None: `MAX_CONNECTIONS`, or the descriptor limit less `FD_RESERVE` if lower."""

    def connection_cap(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return MAX_CONNECTIONS
        return max(16, min(MAX_CONNECTIONS, soft - FD_RESERVE))


class ConnectionGuard:
    """Open connections per address and in all; logs each flood once."""

    def __init__(self, limits: ListenerLimits, where: str) -> None:
        self.limits = limits
        self.where = where
        self.cap = limits.connection_cap()
        self.open_by_address: Counter[str] = Counter()
        self.open_total = 0
        self.refused = 0
        self._flooding: set[str] = set()

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address``; False (refuse it) when over a cap."""
        per_address = self.limits.max_connections_per_address
        if self.open_by_address[address] >= per_address:
            self._refuse(address, f"{address} holds {per_address} connections")
            return False
        if self.open_total >= self.cap:
            self._refuse("*", f"{self.cap} connections are open")
            return False
        self.open_by_address[address] += 1
        self.open_total += 1
        return True

    def _refuse(self, key: str, why: str) -> None:
        self.refused += 1
        if key not in self._flooding:
            self._flooding.add(key)
            log.warning("%s: %s; closing new ones until that drops (logged once)", self.where, why)

    def release(self, address: str) -> None:
        """Forget a connection `admit` counted."""
        self.open_total -= 1
        self.open_by_address[address] -= 1
        left = self.open_by_address[address]
        if left <= 0:
            del self.open_by_address[address]
        # A flood is over when half the room is free again (no log line per connection).
        if address in self._flooding and left <= self.limits.max_connections_per_address // 2:
            self._flooding.discard(address)
            log.info("%s: connections from %s back under the limit", self.where, address)
        if "*" in self._flooding and self.open_total <= self.cap // 2:
            self._flooding.discard("*")
            log.info("%s: connections back under the limit", self.where)


class _LimitedHandler(web.RequestHandler):
    """aiohttp's connection handler, counted by a `ConnectionGuard`, with a header deadline."""

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._address: str | None = None
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        if not self._guard.admit(address):
            self.force_close()
            return
        self._address = address
        timeout_s = self._guard.limits.header_timeout_s
        self._header_timer = self._loop.call_later(timeout_s, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        # aiohttp counts a request once its header is parsed; none yet: a slow client.
        if self._request_count == 0:
            log.debug("%s: no request header within the deadline", self._guard.where)
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._address is not None:
            self._guard.release(self._address)
            self._address = None
        super().connection_lost(exc)


class LimitedSite(web.BaseSite):
    """A listening socket (``sock``, or ``host``/``port``) for ``runner`` under ``limits``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        limits: ListenerLimits,
        *,
        sock: socket.socket | None = None,
        host: str | None = None,
        port: int = 0,
        access_log: logging.Logger | None = None,
        backlog: int = 256,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog, ssl_context=ssl_context)
        self._limits = limits
        self._sock = sock
        self._host = host
        self._port = port
        self._access_log = access_log
        self.guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        if self._sock is not None:
            host, port = self._sock.getsockname()[:2]
            return f"{scheme}://{host}:{port}"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        guard = self.guard = ConnectionGuard(self._limits, self.name)
        idle_s = self._limits.idle_timeout_s
        access_log = self._access_log

        def factory() -> web.RequestHandler:
            return _LimitedHandler(
                server, guard, loop=loop, keepalive_timeout=idle_s, access_log=access_log
            )

        tls = self._ssl_context
        # A handshake is not yet a connection the guard counts: it gets the header's
        # deadline, so a client cannot hold sockets open by never finishing one.
        handshake_s = self._limits.header_timeout_s if tls is not None else None
        if self._sock is not None:
            self._server = await loop.create_server(
                factory,
                sock=self._sock,
                backlog=self._backlog,
                ssl=tls,
                ssl_handshake_timeout=handshake_s,
            )
        else:
            self._server = await loop.create_server(
                factory,
                self._host,
                self._port,
                backlog=self._backlog,
                reuse_address=True,
                ssl=tls,
                ssl_handshake_timeout=handshake_s,
            )


async def start_site(
    runner: web.BaseRunner,
    limits: ListenerLimits | None = None,
    *,
    sock: socket.socket | None = None,
    host: str | None = None,
    port: int = 0,
    access_log: logging.Logger | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> LimitedSite:
    """Listen for ``runner`` (set up) under ``limits``, over TLS with ``ssl_context``;
    OSError when the address is taken."""
    site = LimitedSite(
        runner,
        limits or ListenerLimits(),
        sock=sock,
        host=host,
        port=port,
        access_log=access_log,
        ssl_context=ssl_context,
    )
    await site.start()
    return site


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not allowed (numbers must be finite)")


def parse_json_document(raw: bytes) -> Any:
    """Decode an untrusted UTF-8 JSON body; ValidationError for anything malformed."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("body is not UTF-8") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"body is not JSON: {exc.msg} at offset {exc.pos}") from None
    except RecursionError:
        raise ValidationError("body nests too deeply") from None
    except ValueError as exc:  # an integer over the digit limit, a refused constant
        raise ValidationError(f"body is not acceptable JSON: {str(exc)[:120]}") from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def check_bearer(header: str | None, token: bytes) -> None:
    """Raise AuthenticationError unless ``header`` is ``Bearer <token>`` (constant time)."""
    if not header:
        raise AuthenticationError("missing Authorization: Bearer token")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise AuthenticationError("Authorization must use the Bearer scheme")
    if not hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token):
        raise AuthenticationError("token refused")


def unauthorized(exc: AuthenticationError) -> web.Response:
    """The one 401 answer: the error's JSON body and a ``WWW-Authenticate`` challenge."""
    response = web.json_response(exc.to_dict(), status=401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="netopt"'
    return response


def bearer_refusal(request: web.Request, token: str) -> web.Response | None:
    """None when ``request`` carries the shared ``token``; the 401 answer otherwise."""
    try:
        check_bearer(request.headers.get("Authorization"), token.encode())
    except AuthenticationError as exc:
        return unauthorized(exc)
    return None


def status_of(exc: NetoptError) -> int:
    """The HTTP status of a netopt error raised while handling a request."""
    if isinstance(exc, AuthenticationError):
        return 401
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ResidencyError):
        return 403
    if isinstance(exc, ValidationError):
        return 400
    if isinstance(exc, StorageError):
        return 503
    return 500


def error_response(status: int, name: str, message: str, **extra: object) -> web.Response:
    """The one error body ``{"error": NAME, "message": TEXT[, ...]}`` with ``status``."""
    return web.json_response({"error": name, "message": message[:500], **extra}, status=status)


def route_name(request: web.Request) -> str:
    """The route's pattern (``/v1/datasets/{name}``), ``unmatched`` for an unknown path:
    a label that a peer cannot grow without bound."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


class RequestObserver(Protocol):
    """Where a service's request metrics go (e.g. a Prometheus counter and histogram)."""

    def observe(self, route: str, method: str, status: int, seconds: float) -> None: ...


REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.5,
                     1.0, 2.5)  # fmt: skip


class RequestMetrics:
    """A service's request metrics in ``registry``: ``PREFIX_requests_total`` by route,
    method and status, ``PREFIX_request_duration_seconds`` by route; a `RequestObserver`."""

    def __init__(self, prefix: str, registry: prometheus_client.CollectorRegistry) -> None:
        self.requests = prometheus_client.Counter(
            f"{prefix}_requests",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = prometheus_client.Histogram(
            f"{prefix}_request_duration_seconds",
            "Time to handle a request, by route.",
            ["route"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one handled request."""
        self.latency.labels(route).observe(seconds)
        self.requests.labels(route, method, str(status)).inc()


def service_shell(
    service: str,
    *,
    max_request_bytes: int,
    limit_key: str | None = None,
    observer: RequestObserver | None = None,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware a ``service`` app puts first: JSON errors, request log, metrics.

    ``max_request_bytes`` is the app's body limit (its ``client_max_size``), named in a
    413 answer by ``limit_key`` (the config key that sets it) when given.
    """

    @web.middleware
    async def shell(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await _answer(request, handler, service, max_request_bytes, limit_key)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status  # a redirect, or an error with its JSON body: aiohttp sends it
            raise
        finally:
            seconds = time.perf_counter() - started
            route = route_name(request)
            if observer is not None:
                observer.observe(route, request.method, status, seconds)
            request_log.debug(
                "%s %s %s %d %.1f ms", service, request.method, route, status, seconds * 1e3
            )

    return shell


async def _answer(
    request: web.Request,
    handler: Handler,
    service: str,
    max_bytes: int,
    limit_key: str | None,
) -> web.StreamResponse:
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        if request.writer.output_size > 0:
            raise  # the answer has begun: only closing the connection is left (aiohttp)
        if isinstance(exc, web.HTTPException) and (
            exc.status < 400 or exc.content_type == "application/json"
        ):
            raise  # a redirect, or an error that already has its JSON body
        return _error_of(request, exc, service, max_bytes, limit_key)


def _error_of(
    request: web.Request, exc: Exception, service: str, max_bytes: int, limit_key: str | None
) -> web.StreamResponse:
    if isinstance(exc, NetoptError):
        status = status_of(exc)
        if status == 500:
            log.error("%s: request %s %s failed", service, request.method, request.path,
                      exc_info=exc)  # fmt: skip
        response = web.json_response(exc.to_dict(), status=status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="netopt"'
        return response
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = f"{limit_key} ({max_bytes})" if limit_key else f"the limit of {max_bytes} bytes"
        return error_response(413, "RequestTooLarge", f"body exceeds {limit}")
    if isinstance(exc, web.HTTPException):
        # aiohttp's own text is "404: Not Found"; a handler's text says more.
        given = exc.text if exc.content_type == "text/plain" else None
        default = f"{exc.status}: {exc.reason}"
        message = given if given and given != default else exc.reason
        response = error_response(exc.status, type(exc).__name__.removeprefix("HTTP"), message)
        if "Allow" in exc.headers:  # a 405 says which methods the path has (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    log.error("%s: request %s %s failed", service, request.method, request.path, exc_info=exc)
    return error_response(500, "InternalError", f"the {service} failed to handle this request")

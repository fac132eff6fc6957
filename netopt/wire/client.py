"""An async client of the coordinator's API, for the agent and ``netopt status``.

Errors, by what the caller should do:

- :class:`~netopt.errors.PeerUnreachableError`: connection refused or timed out,
  or a 5xx answer, from every address the client knows. Retry later (the agent
  spools and replays).
- :class:`~netopt.errors.TlsError`: the TLS handshake was refused (wrong CA, expired
  certificate, wrong host name, no client certificate), or http:// while TLS is on.
- :class:`~netopt.errors.UsageError`: the token would go in plaintext to a non-loopback
  host (`netopt.tlsconf.client_ssl`); refused before any byte is sent.
- :class:`~netopt.errors.AuthenticationError`: 401, the token is wrong. Fix config.
- :class:`CoordinatorRejected` (a ValidationError): any other 4xx, with ``status``
  and the JSON ``body``. Resending the same request will not help; a 404 on an
  agent route means "register first".

Several addresses (replicas sharing one database): ``base_url`` may be a list, or
one string of comma-separated URLs. A request goes to the address that answered
last; on no answer or a 5xx it moves on to the next one, after a short backoff
with jitter, until each was tried once. Every agent request is safe to resend to
another replica (registration and heartbeats are idempotent, a batch id is stored
once whichever replica gets it).
"""

from __future__ import annotations

import asyncio
import errno
import json
import random
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import aiohttp

from netopt.errors import (
    AuthenticationError,
    PeerUnreachableError,
    ProtocolError,
    ResidencyError,
    TlsError,
    ValidationError,
)
from netopt.tlsconf import client_ssl, disconnect_hint, explain_tls_failure
from netopt.wire.answers import LinksAnswer, NodePlanAnswer, NodesAnswer
from netopt.wire.fields import RequestInvalid
from netopt.wire.schema import Heartbeat, Registration, SummaryBatch

__all__ = [
    "CoordinatorClient",
    "CoordinatorRejected",
    "failover_delay_s",
    "read_answer",
    "split_urls",
]

_T = TypeVar("_T")


def read_answer(read: Callable[[object], _T], answer: object, what: str, source: str) -> _T:
    """``read(answer)`` (a typed answer's ``from_dict``); a malformed answer is a
    ProtocolError naming ``source`` (the coordinator), ``what`` and the field."""
    try:
        return read(answer)
    except RequestInvalid as exc:
        raise ProtocolError(f"coordinator {source}: a malformed {what}: {exc}") from None


FAILOVER_BASE_S = 0.05
FAILOVER_CAP_S = 1.0


def split_urls(base_url: str | Sequence[str]) -> tuple[str, ...]:
    """The coordinator addresses in ``base_url`` (a list, or comma-separated), in order."""
    parts = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = tuple(u.strip().rstrip("/") for u in parts if u.strip())
    if not urls:
        raise ValueError("no coordinator URL given")
    return urls


def failover_delay_s(attempt: int, draw: float) -> float:
    """Wait before the ``attempt``-th (1-based) other address: exponential, capped, with
    ``draw`` in [0, 1) spreading it over 50-150% so that agents do not move in step."""
    backoff_s: float = min(FAILOVER_CAP_S, FAILOVER_BASE_S * 2.0 ** (attempt - 1))
    return backoff_s * (0.5 + draw)


class CoordinatorRejected(ValidationError):
    """The coordinator refused a request (4xx other than 401)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        super().__init__(f"coordinator answered {status}: {body.get('message', body)}")


class CoordinatorClient:
    """``async with CoordinatorClient(url, token) as client: await client.register(...)``.

    ``base_url``: one URL, a list, or comma-separated URLs (see the module docstring).
    """

    def __init__(
        self, base_url: str | Sequence[str], token: str, *, timeout_s: float = 10.0
    ) -> None:
        self.urls = split_urls(base_url)
        self._current = 0
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._ssl = client_ssl(self.base_url, sends_token=True)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False)
        return aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )

    async def __aenter__(self) -> CoordinatorClient:
        self._session = self._open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def base_url(self) -> str:
        """The address requests go to now (the one that answered last)."""
        return self.urls[self._current]

    async def request(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        """Send one request; the decoded JSON answer, or one of the module's errors.

        Tries each address at most once, starting with the current one; raises the
        last PeerUnreachableError when none answered.
        """
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        for attempt in range(len(self.urls)):
            if attempt:
                await asyncio.sleep(failover_delay_s(attempt, random.random()))
            try:
                return await self._request_once(method, path, data, params)
            except PeerUnreachableError:
                if attempt == len(self.urls) - 1:
                    raise
                self._current = (self._current + 1) % len(self.urls)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _request_once(
        self, method: str, path: str, data: bytes | None, params: dict[str, str] | None
    ) -> Any:
        tls_now = client_ssl(self.base_url, sends_token=True)
        if tls_now is not self._ssl:  # renewed files, or another address's scheme
            self._ssl = tls_now
            await self.close()
        if self._session is None:
            self._session = self._open()
        url = self.base_url + path
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._session.request(
                method, url, data=data, params=params, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            tls_cause = explain_tls_failure(exc)
            if tls_cause is not None:
                raise TlsError(f"coordinator {self.base_url}: {tls_cause}") from None
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, aiohttp.ServerDisconnectedError):
                hint, refused = disconnect_hint(self.base_url)
                if refused:
                    raise TlsError(f"coordinator {self.base_url}: {hint}") from None
                reason += f" ({hint})"
            elif getattr(exc, "errno", None) == errno.ECONNRESET:
                # A TLS 1.3 server refusing a missing client certificate closes after the
                # handshake: a clean close or, by timing, a reset. A reset is also what a
                # flapping link gives, so it stays retryable; it only carries the hint.
                reason += f" ({disconnect_hint(self.base_url)[0]})"
            raise PeerUnreachableError(
                f"coordinator {self.base_url} unreachable: {reason}"
            ) from exc
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"message": raw[:200].decode("utf-8", "replace")}
        if status == 401:
            raise AuthenticationError(f"coordinator refused the token: {answer.get('message')}")
        if status >= 500:
            raise PeerUnreachableError(
                f"coordinator {self.base_url} answered {status}: {answer.get('message')}"
            )
        if status >= 400:
            raise CoordinatorRejected(status, answer if isinstance(answer, dict) else {})
        return answer

    async def register(self, registration: Registration) -> dict[str, Any]:
        """Register; the answer has plan_version, heartbeat_interval_s, max_request_bytes."""
        result: dict[str, Any] = await self.request(
            "POST", "/api/v1/agents/register", registration.to_dict()
        )
        return result

    async def heartbeat(self, node: str, beat: Heartbeat | None = None) -> dict[str, Any]:
        """Heartbeat; refetch the plan when the answer's plan_version changed."""
        body = (beat or Heartbeat()).to_dict()
        result: dict[str, Any] = await self.request(
            "POST", f"/api/v1/agents/{node}/heartbeat", body
        )
        return result

    async def leave(self, node: str) -> dict[str, Any]:
        """Deregister on graceful shutdown."""
        result: dict[str, Any] = await self.request("DELETE", f"/api/v1/agents/{node}")
        return result

    async def plan(self, node: str) -> NodePlanAnswer:
        """This node's probe peers and bandwidth slots, checked (`NodePlanAnswer`).

        Raises ProtocolError naming the field when the answer is malformed.
        """
        answer = await self.request("GET", f"/api/v1/agents/{node}/plan")
        return read_answer(NodePlanAnswer.from_dict, answer, "plan", self.base_url)

    async def nodes(self) -> NodesAnswer:
        """``GET /api/v1/nodes``, checked (`NodesAnswer`).

        Raises ProtocolError naming the field when the answer is malformed.
        """
        answer = await self.request("GET", "/api/v1/nodes")
        return read_answer(NodesAnswer.from_dict, answer, "nodes answer", self.base_url)

    async def links(self, window_s: float | None = None) -> LinksAnswer:
        """``GET /api/v1/links`` over the last ``window_s`` seconds (the coordinator's
        default when None), checked (`LinksAnswer`).

        Raises ProtocolError naming the field when the answer is malformed.
        """
        query = None if window_s is None else {"window_s": str(window_s)}
        answer = await self.request("GET", "/api/v1/links", params=query)
        return read_answer(LinksAnswer.from_dict, answer, "links answer", self.base_url)

    async def submit(self, node: str, batch: SummaryBatch) -> dict[str, Any]:
        """Send a batch; ``{"duplicate": true}`` means it was stored before (safe to drop)."""
        result: dict[str, Any] = await self.request(
            "POST", f"/api/v1/agents/{node}/summaries", batch.to_dict()
        )
        return result

    async def check_placement(self, dataset: str, node: str) -> dict[str, Any]:
        """Ask whether ``dataset`` may be placed on ``node``; the 200 answer when it may.

        Raises ResidencyError (the coordinator's message, naming the rule) on a 403,
        CoordinatorRejected for an unknown node (404) or a bad name (400).
        """
        try:
            result: dict[str, Any] = await self.request(
                "POST", "/api/v1/placements", {"dataset": dataset, "node": node}
            )
        except CoordinatorRejected as exc:
            if exc.status == 403:
                raise ResidencyError(str(exc.body.get("message", exc))) from None
            raise
        return result

    async def get(self, path: str, **params: float | str) -> dict[str, Any]:
        """GET an API path (``/api/v1/nodes``, ``/api/v1/links`` ...) with query parameters."""
        query = {k: str(v) for k, v in params.items()}
        result: dict[str, Any] = await self.request("GET", path, params=query or None)
        return result

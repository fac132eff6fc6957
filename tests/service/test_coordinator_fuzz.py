"""A property-based client (hypothesis): whatever it sends, the coordinator never answers 5xx.

The coordinator runs in a background thread on a real localhost port; requests
go through http.client, so the bytes on the wire are exactly what was generated.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from coordinator_helpers import AUTH, TOKEN, batch, make_settings, registration, summary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netopt.coordinator.server import serve

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)  # fmt: skip
SEGMENT = st.one_of(
    st.sampled_from(["hk-1", "us-1", "zz-9", "HK", "-", "a" * 40]),
    st.text(min_size=1, max_size=12),
).map(lambda s: quote(s, safe=""))
TEMPLATES = [
    ("POST", "/api/v1/agents/register"),
    ("POST", "/api/v1/agents/{a}/heartbeat"),
    ("DELETE", "/api/v1/agents/{a}"),
    ("GET", "/api/v1/agents/{a}/plan"),
    ("POST", "/api/v1/agents/{a}/summaries"),
    ("GET", "/api/v1/nodes"),
    ("GET", "/api/v1/links"),
    ("GET", "/api/v1/links/{a}/{b}/history"),
    ("GET", "/api/v1/regions"),
    ("GET", "/api/v1/plan"),
    ("PATCH", "/api/v1/{a}"),
]


class Server:
    def __init__(self, tmp_path: Path) -> None:
        self.settings = make_settings(tmp_path, max_request_bytes=16 * 1024)
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__/__exit__
            self.failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def ready(host: str, port: int) -> None:
            self.port = port
            self._ready.set()

        await serve(self.settings, self._stop, on_ready=ready)

    def __enter__(self) -> Server:
        self._thread.start()
        assert self._ready.wait(20), "coordinator did not start"
        if self.failure is not None:
            raise self.failure
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
        if self.failure is not None:
            raise self.failure

    def request(
        self, method: str, path: str, body: bytes | None, auth: bool = True
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            headers = {**(AUTH if auth else {}), "Content-Type": "application/json"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(tmp_path_factory.mktemp("fuzz")) as srv:
        for name, region in (("hk-1", "hk"), ("us-1", "us")):
            status, _ = srv.request("POST", "/api/v1/agents/register",
                                    json.dumps(registration(name, region)).encode())  # fmt: skip
            assert status == 200
        yield srv


def check(status: int, body: Any) -> None:
    assert status < 500, body
    if status >= 400:
        assert isinstance(body, dict), body
        assert body["error"], body
        assert body["message"], body


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    template=st.sampled_from(TEMPLATES),
    a=SEGMENT,
    b=SEGMENT,
    query=st.dictionaries(
        st.sampled_from(["window_s", "limit", "x"]), st.text(max_size=8), max_size=2
    ),
    body=st.none() | JSON.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64),
)
def test_random_requests_never_get_5xx(
    server: Server,
    template: tuple[str, str],
    a: str,
    b: str,
    query: dict[str, str],
    body: bytes | None,
) -> None:
    method, path = template
    path = path.format(a=a, b=b)
    if query:
        path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    check(*server.request(method, path, body))


def _mutate(data: dict[str, Any], key: str, value: Any, drop: bool) -> dict[str, Any]:
    out = dict(data)
    if drop:
        out.pop(key, None)
    else:
        out[key] = value
    return out


@FUZZ
@given(
    key=st.sampled_from([*summary("hk-1", "us-1", 1.0), "extra", "outages", "streams"]),
    value=JSON,
    drop=st.booleans(),
    count=st.integers(0, 3),
    batch_id=st.text(max_size=70),
)
def test_mutated_batches_are_stored_or_refused_never_5xx(
    server: Server, key: str, value: Any, drop: bool, count: int, batch_id: str
) -> None:
    now = time.time()
    good = summary("hk-1", "us-1", now)
    items = [_mutate(good, key, value, drop) for _ in range(count)]
    body = json.dumps(batch(batch_id, items)).encode()
    status, answer = server.request("POST", "/api/v1/agents/hk-1/summaries", body)
    check(status, answer)
    if status == 200:
        assert answer["accepted"] + answer["expired"] in (0, count)


@FUZZ
@given(key=st.sampled_from(list(registration("x", "y"))), value=JSON, drop=st.booleans())
def test_mutated_registrations_never_5xx(server: Server, key: str, value: Any, drop: bool) -> None:
    body = json.dumps(_mutate(registration("fz-1", "fz"), key, value, drop)).encode()
    check(*server.request("POST", "/api/v1/agents/register", body))


def test_no_token_never_reaches_a_handler(server: Server) -> None:
    status, body = server.request("POST", "/api/v1/agents/register", b"{}", auth=False)
    assert status == 401
    assert body["error"] == "AuthenticationError"
    assert TOKEN not in json.dumps(body)

"""The coordinator's aiohttp application: routes, middlewares, background loops.

``create_app(settings, deps) -> web.Application``. Handlers parse and validate,
call :class:`~netopt.coordinator.service.Coordinator`, and serialise. Every
error is, through the shared `netopt.webshell.service_shell`, a JSON body
``{"error": NAME, "message": TEXT[, "field": PATH]}``: 400 invalid request, 401
missing/wrong token, 403 residency refusal, 404 unknown node or route, 405 wrong method,
413 body over ``max_request_bytes``, 503 storage failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from netopt.config import CoordinatorSettings, resolve_token
from netopt.coordinator import dashboard, linkmetrics
from netopt.coordinator.auth import token_middleware
from netopt.coordinator.catalogue import Catalogue
from netopt.coordinator.catalogue_api import CATALOGUE, CATALOGUE_ROUTES, ChunkCatalogue
from netopt.coordinator.database import StoreRunner, open_database
from netopt.coordinator.metrics import CONTENT_TYPE, CoordinatorMetrics
from netopt.coordinator.openapi import openapi_document, query_names
from netopt.coordinator.service import Coordinator, PlacementRequest
from netopt.errors import ConfigError, StorageError
from netopt.webshell import error_response, service_shell
from netopt.wire.fields import RequestInvalid, parse_json_body
from netopt.wire.schema import (
    Heartbeat,
    Registration,
    SummaryBatch,
    check_node_name,
)

__all__ = ["COORDINATOR", "METRICS", "CoordinatorDeps", "create_app"]

log = logging.getLogger(__name__)

COORDINATOR = web.AppKey("coordinator", Coordinator)
METRICS = web.AppKey("metrics", CoordinatorMetrics)
DEFAULT_WINDOW_S = 300.0
MAX_HISTORY = 5000
HEARTBEAT_FLUSH_S = 2.0
READY_TIMEOUT_S = 2.0
PASSWORD_FILE_MAX_BYTES = 4096


@dataclass(frozen=True)
class CoordinatorDeps:
    """What the app takes from outside: the clock (unix seconds) and background loop periods."""

    clock: Callable[[], float] = field(default=time.time)
    sweep_interval_s: float = 300.0
    heartbeat_flush_s: float = HEARTBEAT_FLUSH_S
    checkpoint_s: float = 2.0
    durable_commits: bool = False  # fsync every commit; also `durability: full` in the config


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, allow_nan=False))


async def _body(request: web.Request) -> object:
    max_bytes = request.app[COORDINATOR].settings.max_request_bytes
    length = request.content_length
    if length is not None and length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=length)
    return parse_json_body(await request.read())


def _node(request: web.Request, key: str = "node") -> str:
    return check_node_name(request.match_info[key], key)


def _query_number(request: web.Request, key: str, default: float, low: float, high: float) -> float:
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RequestInvalid(key, "expected a number") from None
    if not low <= value <= high:
        raise RequestInvalid(key, f"must be within {low:g}..{high:g}")
    return value


def _window_s(request: web.Request) -> float:
    retention_s = request.app[COORDINATOR].settings.retention_s
    return _query_number(request, "window_s", min(DEFAULT_WINDOW_S, retention_s), 1, retention_s)


async def register(request: web.Request) -> web.Response:
    reg = Registration.from_dict(await _body(request))
    return _json(await request.app[COORDINATOR].register(reg, request.remote or "127.0.0.1"))


async def heartbeat(request: web.Request) -> web.Response:
    node = _node(request)
    data = await _body(request) if request.can_read_body else None
    return _json(await request.app[COORDINATOR].heartbeat(node, Heartbeat.from_dict(data)))


async def leave(request: web.Request) -> web.Response:
    return _json(await request.app[COORDINATOR].leave(_node(request)))


async def agent_plan(request: web.Request) -> web.Response:
    return _json(await request.app[COORDINATOR].node_plan(_node(request)))


async def summaries(request: web.Request) -> web.Response:
    node = _node(request)
    batch = SummaryBatch.from_dict(await _body(request))
    result = await request.app[COORDINATOR].ingest(node, batch)
    metrics = request.app[METRICS]
    metrics.batches.labels("duplicate" if result.duplicate else "stored").inc()
    metrics.summaries.labels("stored").inc(result.accepted)
    metrics.summaries.labels("expired").inc(result.expired)
    return _json(
        {
            "batch_id": result.batch_id,
            "duplicate": result.duplicate,
            "accepted": result.accepted,
            "expired": result.expired,
        }
    )


async def nodes(request: web.Request) -> web.Response:
    coordinator = request.app[COORDINATOR]
    return _json(
        {
            "now_s": coordinator.clock(),
            "stale_after_s": coordinator.settings.stale_after_s,
            "nodes": coordinator.node_views(),
        }
    )


async def links(request: web.Request) -> web.Response:
    return _json(await request.app[COORDINATOR].links(_window_s(request)))


async def regions(request: web.Request) -> web.Response:
    return _json(await request.app[COORDINATOR].region_matrix(_window_s(request)))


async def history(request: web.Request) -> web.Response:
    src, dst = _node(request, "src"), _node(request, "dst")
    limit = int(_query_number(request, "limit", 500, 1, MAX_HISTORY))
    result = await request.app[COORDINATOR].history(src, dst, _window_s(request), limit)
    return _json(result)


async def fleet_plan(request: web.Request) -> web.Response:
    plan = request.app[COORDINATOR].plan()
    return _json(
        {
            "plan_version": plan.version,
            "bandwidth_cycle_s": plan.cycle_s,
            "bandwidth_slot_s": plan.slot_s,
            "probes": [{"src": p.src, "dst": p.dst, "kind": p.kind} for p in plan.probes],
            "bandwidth_tests": [
                {"src": t.src, "dst": t.dst, "slot": t.slot, "offset_s": t.offset_s}
                for t in plan.bandwidth
            ],
        }
    )


async def placements(request: web.Request) -> web.Response:
    req = PlacementRequest.from_dict(await _body(request))
    return _json(await request.app[COORDINATOR].placement(req))


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document())


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """200 while the database answers within READY_TIMEOUT_S, else 503 (take traffic elsewhere)."""
    coordinator = request.app[COORDINATOR]
    try:
        await asyncio.wait_for(coordinator.db.ping(), READY_TIMEOUT_S)
    except (StorageError, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {READY_TIMEOUT_S:g} s"
        return error_response(503, "NotReady", f"database {coordinator.db.description}: {reason}")
    return _json({"ok": True, "leader": coordinator.leader})


async def metrics_endpoint(request: web.Request) -> web.Response:
    matrix = await request.app[COORDINATOR].links(linkmetrics.WINDOW_S)
    metrics = request.app[METRICS]

    def render() -> bytes:
        return metrics.render(linkmetrics.link_families(matrix["links"]))

    # A family per link pair: at a thousand nodes that is seconds of text building, which
    # must not stall the heartbeats and ingest this loop also serves.
    body = await asyncio.to_thread(render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _strict_query(handler: RouteHandler, allowed: frozenset[str]) -> RouteHandler:
    """``handler`` behind a check that the query holds only the documented parameters,
    each at most once (a typo'd ``windw_s`` must not silently fall back to the default,
    nor ``window_s=1&window_s=x`` be read as its first value: every one is a scalar)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        unknown = set(request.query) - allowed
        if unknown:
            names = ", ".join(repr(k[:40]) for k in sorted(unknown)[:5])
            raise RequestInvalid("query", f"unknown parameter(s) {names}")
        if len(request.query) > len(set(request.query)):
            repeated = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
            names = ", ".join(repr(k[:40]) for k in repeated[:5])
            raise RequestInvalid("query", f"parameter(s) {names} given more than once")
        return await handler(request)

    return checked


ROUTES: tuple[tuple[str, str, RouteHandler], ...] = (
    ("POST", "/api/v1/agents/register", register),
    ("POST", "/api/v1/agents/{node}/heartbeat", heartbeat),
    ("DELETE", "/api/v1/agents/{node}", leave),
    ("GET", "/api/v1/agents/{node}/plan", agent_plan),
    ("POST", "/api/v1/agents/{node}/summaries", summaries),
    ("GET", "/api/v1/nodes", nodes),
    ("GET", "/api/v1/links", links),
    ("GET", "/api/v1/links/{src}/{dst}/history", history),
    ("GET", "/api/v1/regions", regions),
    ("GET", "/api/v1/plan", fleet_plan),
    ("POST", "/api/v1/placements", placements),
    *CATALOGUE_ROUTES,
    ("GET", "/openapi.json", openapi),
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
    ("GET", "/metrics", metrics_endpoint),
    ("GET", "/", dashboard.page),
    ("GET", "/dashboard.js", dashboard.script),
    ("GET", "/dashboard.css", dashboard.stylesheet),
)


async def _every(period_s: float, name: str, step: Callable[[], Awaitable[object]]) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await step()
        except StorageError:
            log.exception("%s failed; retrying in %.0f s", name, period_s)


async def _flush_and_follow(coordinator: Coordinator) -> None:
    """Heartbeats out, the other replicas' registry changes in, the election renewed,
    the stored probe plan followed (or, leading, a new one stored)."""
    await coordinator.flush_heartbeats()
    await coordinator.refresh_registry()
    if coordinator.db.shared:
        await coordinator.elect()
        await coordinator.follow_plan()


def _lifecycle(
    db: StoreRunner, deps: CoordinatorDeps
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        coordinator = app[COORDINATOR]
        await db.open()
        log.warning("coordinator database: %s", db.description)
        await coordinator.load()
        await coordinator.elect()
        await coordinator.sweep()
        await coordinator.start_plan()

        async def follow() -> None:
            await _flush_and_follow(coordinator)

        tasks = [
            asyncio.create_task(
                _every(deps.sweep_interval_s, "retention sweep", coordinator.sweep)
            ),
            asyncio.create_task(_every(deps.heartbeat_flush_s, "heartbeat flush", follow)),
            asyncio.create_task(_every(deps.checkpoint_s, "WAL checkpoint", db.checkpoint)),
        ]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await coordinator.close()
        with contextlib.suppress(StorageError):
            await coordinator.flush_heartbeats()
        await db.close()

    return lifecycle


def _database_password(path: str | None) -> str | None:
    """The first line of ``database_password_file``; ConfigError naming the key if unreadable."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(PASSWORD_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot be read: {exc.strerror}", key_path="database_password_file", file=path
        ) from None
    password = raw.decode("utf-8", "replace").splitlines()[0] if raw.strip() else ""
    if not password or len(raw) > PASSWORD_FILE_MAX_BYTES:
        raise ConfigError(
            "is empty or too long", key_path="database_password_file", file=path,
            expected=f"the password on its first line (at most {PASSWORD_FILE_MAX_BYTES} bytes)",
        )  # fmt: skip
    return password


def create_app(
    settings: CoordinatorSettings, deps: CoordinatorDeps | None = None
) -> web.Application:
    """Build the coordinator app; the database opens when the app starts.

    Raises ConfigError when no token is configured (the API is never open).
    """
    deps = deps or CoordinatorDeps()
    token = resolve_token(settings.token, settings.token_file)
    durable = deps.durable_commits or settings.durability == "full"
    db = open_database(
        settings.database,
        durable_commits=durable,
        password=_database_password(settings.database_password_file),
        ingest_linger_s=settings.ingest_linger_s,
    )
    coordinator = Coordinator(settings, db, deps.clock, deps.heartbeat_flush_s)
    metrics = CoordinatorMetrics(coordinator.state_counts, lambda: coordinator.leader)
    db.observe = metrics.observe_store
    app = web.Application(
        client_max_size=settings.max_request_bytes,
        middlewares=[
            dashboard.security_headers,
            service_shell(
                "coordinator",
                max_request_bytes=settings.max_request_bytes,
                limit_key="max_request_bytes",
                observer=metrics.http,
            ),
            token_middleware(token),
        ],
    )
    app[COORDINATOR] = coordinator
    app[METRICS] = metrics
    app[CATALOGUE] = ChunkCatalogue(Catalogue(), coordinator)
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, _strict_query(handler, query_names(path, method)))
    app.cleanup_ctx.append(_lifecycle(db, deps))
    return app

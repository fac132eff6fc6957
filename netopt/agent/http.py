"""The agent's own HTTP endpoints: ``/healthz``, Prometheus ``/metrics``, the doctor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from netopt.agent.doctor_api import doctor_routes

if TYPE_CHECKING:
    from netopt.agent.daemon import Agent

__all__ = ["AGENT", "create_app"]

AGENT: web.AppKey[Agent] = web.AppKey("agent")


async def healthz(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    return web.json_response(
        {
            "ok": True,
            "node": agent.settings.node,
            "region": agent.settings.region,
            "registered": agent.registered.is_set(),
            "plan_version": agent.plan_version,
            "spool_bytes": agent.spool.size_bytes,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    if agent.probe_server is not None:
        for outcome, count in agent.probe_server.reflector.counters.to_dict().items():
            agent.metrics.reflected.labels(outcome).set(count)
    body = generate_latest(agent.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(agent: Agent) -> web.Application:
    """The agent's web app. Health and metrics carry no secrets, so need no token; the
    doctor routes do (see ``doctor_api``)."""
    app = web.Application(client_max_size=64 * 1024)
    app[AGENT] = agent
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    app.add_routes(doctor_routes(agent))
    return app

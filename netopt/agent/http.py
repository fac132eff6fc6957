"""The agent's HTTP endpoints: ``/healthz``, Prometheus ``/metrics``, ``/v1/train`` (the
node's training jobs, see ``trainjobs``), the doctor, and its
cache served to peers (the data plane's ``/v1/datasets/...`` routes, token required)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from netopt.agent.doctor_api import doctor_routes
from netopt.agent.trainjobs import PARTS, read_train_jobs
from netopt.cache.peerserve import CachedDatasets, agent_cpu_profile
from netopt.dataplane.handlers import STATS, ServeSettings, auth_middleware
from netopt.dataplane.server import add_dataplane
from netopt.webshell import service_shell

if TYPE_CHECKING:
    from netopt.agent.daemon import Agent

__all__ = ["AGENT", "create_app"]

AGENT: web.AppKey[Agent] = web.AppKey("agent")
MAX_REQUEST_BYTES = 64 * 1024


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
            agent.metrics.reflected.set(count, outcome)
    served = request.app[STATS]
    agent.metrics.served_chunks.set(served.chunk_requests_total)
    agent.metrics.served_bytes.set(served.payload_bytes_sent)
    # off the loop: the train directory's files are read at collection
    body = await asyncio.to_thread(generate_latest, agent.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def train_jobs(request: web.Request) -> web.Response:
    """Each training job's rank: steps, seconds and share of step time per part."""
    directory = Path(request.app[AGENT].settings.train_dir)
    jobs, rejected = await asyncio.to_thread(read_train_jobs, directory)
    return web.json_response(
        {
            "jobs": [
                {
                    "job": job.job,
                    "rank": job.rank,
                    "steps": job.steps,
                    "seconds": job.seconds,
                    "shares": {part: job.share(part) for part in PARTS if part != "step"},
                }
                for job in jobs
            ],
            "rejected_files": rejected,
        }
    )


def create_app(agent: Agent) -> web.Application:
    """The agent's web app. Health, metrics and the training jobs' totals carry no
    secrets, so need no token; the doctor routes do (see ``doctor_api``)."""
    shell = service_shell("agent", max_request_bytes=MAX_REQUEST_BYTES, observer=agent.metrics.http)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[shell, auth_middleware])
    app[AGENT] = agent
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/metrics", metrics),
            web.get("/v1/train", train_jobs),
        ]
    )
    app.add_routes(doctor_routes(agent))
    cache = agent.settings.cache
    cc = None if cache.congestion_control == "default" else cache.congestion_control
    # In-region peers fetch uncompressed; a node across the border (this agent as the
    # gateway near an origin) plans compression from the sample and these speeds.
    cpu = agent_cpu_profile()
    add_dataplane(
        app,
        ServeSettings(token=agent.token, congestion_control=cc, worker_threads=2),
        CachedDatasets(cache.dir),
        cpu,
    )
    return app

"""The agent's doctor endpoints: let ``netopt doctor --via-agents`` run the checks on
every node of a cluster from one place.

    POST /v1/doctor/listen  {"master_port": 29500, "duration_s": 120}
        serve the ports training needs on this node's listen address for a while,
        so peers can test reaching them; answers {"listening": [...], "busy": [...]}
    POST /v1/doctor/run     {"peers": ["198.18.1.10", ...], "master_port": 29500,
                             "check_mtu": true, "links": {links document} | null}
        run the doctor on this node against those peers; answers the report

Both need ``Authorization: Bearer TOKEN`` (the cluster token).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from netopt.config import LinksSettings, settings_from_data
from netopt.config.loader import SourceMap
from netopt.doctor import ports
from netopt.doctor.run import DoctorOptions, run_doctor
from netopt.errors import NetoptError, ValidationError
from netopt.webshell import bearer_refusal, parse_json_document

if TYPE_CHECKING:
    from netopt.agent.daemon import Agent

__all__ = ["doctor_routes"]

MAX_LISTEN_S = 600.0
MAX_PEERS = 256


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": "DoctorRequestError", "message": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = parse_json_document(await request.read())
    except ValidationError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "DoctorRequestError", "message": str(exc)}),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "DoctorRequestError", "message": "expected an object"}),
            content_type="application/json",
        )
    return body


def _port(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ValueError("master_port must be an integer 1..65535")
    return value


def doctor_routes(agent: Agent) -> list[web.RouteDef]:
    """The routes, bound to ``agent`` (its token, node name and listen address)."""

    async def listen(request: web.Request) -> web.Response:
        if (refusal := bearer_refusal(request, agent.token)) is not None:
            return refusal
        body = await _body(request)
        try:
            master_port = _port(body.get("master_port", ports.DEFAULT_MASTER_PORT))
            duration_s = float(body.get("duration_s", 120.0))
        except (TypeError, ValueError) as exc:
            return _refuse(400, str(exc))
        if not 0 < duration_s <= MAX_LISTEN_S:
            return _refuse(400, f"duration_s must be in (0, {MAX_LISTEN_S:g}]")
        specs = ports.required_ports(master_port, ports.ephemeral_range())
        ready = asyncio.Event()
        task = asyncio.create_task(
            ports.serve_ports(agent.settings.listen.host, specs, duration_s, ready)
        )
        agent.background.add(task)
        task.add_done_callback(agent.background.discard)
        await ready.wait()
        return web.json_response({"ports": [s.port for s in specs], "duration_s": duration_s})

    async def run(request: web.Request) -> web.Response:
        if (refusal := bearer_refusal(request, agent.token)) is not None:
            return refusal
        body = await _body(request)
        peers = body.get("peers", [])
        if not isinstance(peers, list) or len(peers) > MAX_PEERS:
            return _refuse(400, f"peers must be a list of at most {MAX_PEERS} addresses")
        try:
            addresses = tuple(str(ipaddress.ip_address(p)) for p in peers)
            master_port = _port(body.get("master_port", ports.DEFAULT_MASTER_PORT))
        except (TypeError, ValueError) as exc:
            return _refuse(400, f"bad request: {exc}")
        links = None
        if body.get("links") is not None:
            try:
                parsed = settings_from_data(body["links"], SourceMap("request links", {}), "links")
            except NetoptError as exc:
                return _refuse(400, str(exc))
            assert isinstance(parsed, LinksSettings)
            links = parsed
        options = DoctorOptions(
            node=agent.settings.node,
            peers=addresses,
            links=links,
            master_port=master_port,
            token=agent.token,
            probe_port=agent.settings.probe.port,
            check_mtu=bool(body.get("check_mtu", True)),
        )
        report = await asyncio.to_thread(run_doctor, options)
        return web.json_response({"node": agent.settings.node, **report.to_dict()})

    return [web.post("/v1/doctor/listen", listen), web.post("/v1/doctor/run", run)]

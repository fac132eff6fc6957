"""``netopt doctor --coordinator URL --via-agents``: the doctor on every node at once.

The coordinator lists the nodes (and their agents' HTTP ports) and the measured
links; every agent first serves the ports training needs, then runs the doctor
against all the others, so each direction of each pair is tested from its
source. The findings of all nodes are ranked together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from netopt.errors import NetoptError, PeerUnreachableError, ValidationError
from netopt.nccl.from_coordinator import links_from_coordinator
from netopt.tlsconf import client_ssl, data_scheme
from netopt.wire.answers import NodesAnswer
from netopt.wire.client import CoordinatorClient

__all__ = ["AgentEndpoint", "merge_reports", "run_cluster_doctor"]

LISTEN_S = 300.0
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class AgentEndpoint:
    """A node's agent, as the coordinator knows it."""

    node: str
    host: str
    data_port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{data_scheme()}://{host}:{self.data_port}"


def agents_from_nodes(nodes_answer: NodesAnswer, wanted: Sequence[str]) -> list[AgentEndpoint]:
    """Live nodes with an agent HTTP port, optionally only those in ``wanted`` (pure)."""
    found = []
    for n in nodes_answer.nodes:
        if n.state == "live" and n.data_port and n.host and (not wanted or n.node in wanted):
            found.append(AgentEndpoint(n.node, n.host, n.data_port))
    missing = sorted(set(wanted) - {a.node for a in found})
    if missing:
        raise ValidationError(f"no live agent for node(s) {', '.join(missing)}")
    return found


def merge_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One cluster report: every node's findings tagged with the node, ranked by impact."""
    findings = [{"node": r["node"], **f} for r in reports for f in r.get("findings", [])]
    findings.sort(key=lambda f: -float(f["impact"]))
    not_checked = [{"node": r["node"], **s} for r in reports for s in r.get("not_checked", [])]
    return {
        "nodes": [r["node"] for r in reports],
        "findings": findings,
        "not_checked": not_checked,
        "reports": list(reports),
    }


async def _post(
    session: aiohttp.ClientSession, agent: AgentEndpoint, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    try:
        async with session.post(agent.url + path, json=body) as response:
            answer: dict[str, Any] = await response.json(content_type=None)
            if response.status != 200:
                raise NetoptError(f"agent {agent.node} answered {response.status}: {answer}")
            return answer
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise PeerUnreachableError(f"agent {agent.node} at {agent.url}: {exc!r}") from exc


async def run_cluster_doctor(
    coordinator_url: str,
    token: str,
    wanted: Sequence[str] = (),
    master_port: int = 29500,
    check_mtu: bool = True,
) -> dict[str, Any]:
    """Ask every live agent to listen, then to run the doctor against the others."""
    async with CoordinatorClient(coordinator_url, token) as client:
        nodes = await client.nodes()
        links = await client.links(window_s=3600)
    agents = agents_from_nodes(nodes, wanted)
    if len(agents) < 2:
        raise ValidationError("the cluster doctor needs at least two live agents")
    document, notes = links_from_coordinator(
        nodes, links, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    )
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=RUN_TIMEOUT_S)
    tls = client_ssl(agents[0].url, sends_token=True)
    for agent in agents[1:]:
        client_ssl(agent.url, sends_token=True)  # each agent's address passes the rule
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else False)
    async with aiohttp.ClientSession(
        headers=headers, timeout=timeout, connector=connector
    ) as session:
        await asyncio.gather(*(
            _post(session, a, "/v1/doctor/listen",
                  {"master_port": master_port, "duration_s": LISTEN_S})
            for a in agents
        ))  # fmt: skip
        reports = await asyncio.gather(*(
            _post(session, a, "/v1/doctor/run", {
                "peers": [b.host for b in agents if b is not a],
                "master_port": master_port,
                "check_mtu": check_mtu,
                "links": document if document["links"] else None,
            })
            for a in agents
        ))  # fmt: skip
    merged = merge_reports(reports)
    merged["hosts"] = {a.node: a.host for a in agents}  # peers appear by address in findings
    merged["notes"] = notes
    return merged

"""The pure parts of ``scripts/gpu_check.sh``: step results, the verdict, the JSON report,
and the links document that describes this machine to ``netopt nccl-env``.

``netopt nccl-env`` has no local-only mode: it tunes for two or more nodes of a links
file (or a coordinator). :func:`local_links_document` therefore writes a links file
whose two nodes are this machine and a twin with the same NICs, joined by one pair
with the given figures, so the env file names this machine's own interfaces and
carries the socket/buffer variables a WAN pair makes netopt set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from netopt.fsutil import atomic_write_bytes
from netopt.nccl.linksdoc import PairFigures, links_document
from netopt.torch.nccllog import EnvCheck
from netopt.wire.schema import Nic

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNCONFIRMED",
    "TWIN_NODE",
    "StepResult",
    "Verdict",
    "WanFigures",
    "exit_code",
    "local_links_document",
    "node_name",
    "report_document",
    "verdict",
    "write_report",
]

StepStatus = Literal["pass", "fail", "skipped"]
Verdict = Literal["pass", "unconfirmed", "fail"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNCONFIRMED = 3
"""Every check passed, but some variables could not be confirmed from NCCL's log."""

TWIN_NODE = "netopt-twin"
_NODE_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


@dataclass(frozen=True)
class StepResult:
    """One step: ``pass``, ``fail`` (with the reason) or ``skipped`` (with the reason)."""

    name: str
    status: StepStatus
    reason: str = ""
    elapsed_s: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WanFigures:
    """The pair netopt tunes for: a cross-region path, so every socket variable is set."""

    rtt_ms: float = 100.0
    loss_ratio: float = 0.0001
    single_stream_mbps: float = 500.0
    link_mbps: float = 10000.0


def node_name(hostname: str) -> str:
    """``hostname -s`` where it is a valid node name, else ``gpu-check-host``."""
    short = hostname.split(".")[0]
    return short if _NODE_RE.match(short) and short != TWIN_NODE else "gpu-check-host"


def local_links_document(
    node: str, nics: Sequence[Nic], figures: WanFigures, measured_at: str
) -> dict[str, Any]:
    """A links file: ``node`` (this machine) and its twin, both with ``nics``, one pair."""
    pair = PairFigures(
        node,
        TWIN_NODE,
        figures.rtt_ms,
        figures.loss_ratio,
        figures.single_stream_mbps,
        figures.link_mbps,
        "cubic",
    )
    regions = {node: "local", TWIN_NODE: "twin"}
    return links_document(regions, {node: nics, TWIN_NODE: nics}, [pair], measured_at)


def verdict(steps: Sequence[StepResult], env_check: EnvCheck | None) -> Verdict:
    """``fail`` on any failed step or rejected variable; ``unconfirmed`` when some variable
    was not echoed; else ``pass``. A run without an env check (it failed earlier) fails."""
    if any(s.status == "fail" for s in steps) or env_check is None:
        return "fail"
    if env_check.named("rejected"):
        return "fail"
    return "unconfirmed" if env_check.named("not_echoed") else "pass"


def exit_code(result: Verdict) -> int:
    """0 pass, 1 fail, 3 unconfirmed."""
    return {"pass": EXIT_OK, "fail": EXIT_FAILED, "unconfirmed": EXIT_UNCONFIRMED}[result]


def report_document(
    meta: Mapping[str, Any], steps: Sequence[StepResult], env_check: EnvCheck | None
) -> dict[str, Any]:
    """The JSON report: ``meta`` (mode, host, versions, times), the verdict, every step,
    and every variable's verdict with its evidence."""
    variables = [asdict(v) for v in env_check.verdicts] if env_check else []
    return {
        **meta,
        "verdict": verdict(steps, env_check),
        "steps": [asdict(s) | {"details": dict(s.details)} for s in steps],
        "variables": variables,
        "accepted": list(env_check.named("accepted")) if env_check else [],
        "rejected": list(env_check.named("rejected")) if env_check else [],
        "not_echoed": list(env_check.named("not_echoed")) if env_check else [],
    }


def write_report(path: str, document: Mapping[str, Any]) -> None:
    """Write the report atomically (never half-written)."""
    atomic_write_bytes(path, (json.dumps(document, indent=2, default=str) + "\n").encode())

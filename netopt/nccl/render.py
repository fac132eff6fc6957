"""Write ``NcclSettings`` as text: env, json, slurm, k8s, and the tuner-plugin CSV.

Pure functions from settings to strings; the CLI writes the files. The env format
is a plain ``KEY=VALUE`` file (comments on their own lines), usable as
``docker --env-file``, systemd ``EnvironmentFile=`` and ``/etc/nccl.conf``. Values that
differ per node (interface names) go into one node's file (:func:`render_node`), one
self-contained file per node (:func:`render_per_node_files`), or, asked for
explicitly, a hostname ``case`` switch inside one shell file (``switch=True``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Literal

from netopt.nccl.model import EnvValue, NcclSettings

__all__ = [
    "FORMATS",
    "Format",
    "differing_keys",
    "render",
    "render_node",
    "render_per_node_files",
    "render_tuner_csv",
    "settings_as_data",
]

Format = Literal["env", "json", "slurm", "k8s"]
FORMATS: tuple[Format, ...] = ("env", "json", "slurm", "k8s")

_SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_=:;,./^+@%-]*$")


def _version(settings: NcclSettings) -> str:
    return ".".join(map(str, settings.nccl_version))


def _value(value: str) -> str:
    """The value as a shell word; plain when it needs no quoting (env files, nccl.conf)."""
    if _SAFE_VALUE_RE.match(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def _header(settings: NcclSettings, node: str | None = None) -> list[str]:
    lines = [
        f"# netopt nccl-env: NCCL {_version(settings)}, nodes {', '.join(settings.nodes)}"
        + (f" (this file: {node})" if node else ""),
    ]
    lines += [f"# warning: {w}" for w in settings.warnings]
    advice = settings.advice
    lines.append(f"# advice: init_process_group(timeout=timedelta(seconds={advice.timeout_s}))")
    lines.append(f"#   {advice.timeout_reason}")
    hook = advice.hook + (f"(rank {advice.powersgd_rank})" if advice.powersgd_rank else "")
    hook += ", powersgd_alternate=True" if advice.powersgd_alternate else ""
    lines.append(f"# advice: DDP comm hook {hook}: {advice.hook_reason}")
    if advice.bucket_cap_mb is not None:
        lines.append(f"# advice: DDP buckets: {advice.bucket_reason}")
    if advice.accumulation is not None:
        lines.append(f"# advice: gradient accumulation: {advice.accumulation.reason}")
    if advice.averaging is not None:
        lines.append(f"# advice: local SGD: {advice.averaging.reason}")
        lines.append(f"#   caveat: {advice.averaging.caveat}")
    lines += [f"# note: {n}" for n in advice.notes]
    return lines


def _assignments(values: tuple[EnvValue, ...], prefix: str = "", indent: str = "") -> list[str]:
    lines: list[str] = []
    for item in values:
        lines.append(f"{indent}# {item.reason}")
        lines.append(f"{indent}{prefix}{item.key}={_value(item.value)}")
    return lines


def _switch(settings: NcclSettings, prefix: str, host_expr: str) -> list[str]:
    if not any(settings.per_node.values()):
        return []
    lines = [f'case "{host_expr}" in']
    for node in settings.nodes:
        lines.append(f"  {node})")
        lines += _assignments(settings.per_node.get(node, ()), prefix, indent="    ")
        lines.append("    ;;")
    known = " ".join(settings.nodes)
    lines.append("  *)")
    lines.append(
        f'    echo "netopt nccl-env: unknown host {host_expr}; expected one of {known}" >&2'
    )
    lines.append("    ;;")
    lines.append("esac")
    return lines


def differing_keys(settings: NcclSettings) -> tuple[str, ...]:
    """Keys whose value is not the same on every node (what one plain file cannot hold)."""
    keys = sorted({item.key for values in settings.per_node.values() for item in values})
    return tuple(keys)


def render(settings: NcclSettings, fmt: Format, *, switch: bool = False) -> str:
    """All nodes in one text.

    env and slurm hold per-node values only with ``switch`` (a shell ``case`` on the host
    name: then the file must be sourced by a shell); without it, a plain file of the
    common values, and the caller makes sure no value differs per node.
    """
    if fmt == "json":
        return json.dumps(settings_as_data(settings), indent=2) + "\n"
    if fmt == "k8s":
        return _render_k8s(settings)
    if fmt == "slurm":
        lines = ["#!/bin/bash", *_header(settings), "# source from the batch script or a prolog"]
        lines += _assignments(settings.common, prefix="export ")
        if switch:
            lines += _switch(settings, "export ", "${SLURMD_NODENAME:-$(hostname -s)}")
        return "\n".join(lines) + "\n"
    if switch:
        use = "# use: set -a; . ./this-file; set +a   (a shell file: it switches on the host name)"
    else:
        use = "# use: docker --env-file, systemd EnvironmentFile=, /etc/nccl.conf, set -a; . FILE"
    lines = [*_header(settings), use]
    lines += _assignments(settings.common)
    if switch:
        lines += _switch(settings, "", "$(hostname -s)")
    return "\n".join(lines) + "\n"


def render_node(settings: NcclSettings, node: str, fmt: Format) -> str:
    """One node's values (common, then its own) as a plain env file or Slurm ``export`` lines.

    The slurm form is what a Slurm TaskProlog prints: ``export NAME=value`` lines (Slurm
    takes the value literally) and ``#`` comments, which it ignores.
    """
    own = settings.per_node.get(node, ())
    if fmt == "slurm":
        lines = _header(settings, node)
        lines += _assignments(settings.common, prefix="export ")
        lines += _assignments(own, prefix="export ")
        return "\n".join(lines) + "\n"
    if fmt != "env":
        raise ValueError(f"one node's file is env or slurm, not {fmt}")
    return render_per_node_files(settings)[node]


def render_per_node_files(settings: NcclSettings) -> dict[str, str]:
    """One self-contained ``KEY=VALUE`` env file per node (common values, then its own)."""
    out: dict[str, str] = {}
    for node in settings.nodes:
        lines = _header(settings, node)
        lines += _assignments(settings.common)
        lines += _assignments(settings.per_node.get(node, ()))
        out[node] = "\n".join(lines) + "\n"
    return out


def _render_k8s(settings: NcclSettings) -> str:
    docs: list[str] = []

    def config_map(name: str, values: tuple[EnvValue, ...], node: str | None) -> str:
        lines = [*_header(settings, node), "apiVersion: v1", "kind: ConfigMap", "metadata:"]
        lines += [f"  name: {name}", "  labels:", "    app.kubernetes.io/managed-by: netopt"]
        lines.append("data:")
        for item in values:
            lines.append(f"  # {item.reason}")
            lines.append(f"  {item.key}: {json.dumps(item.value)}")
        return "\n".join(lines)

    docs.append(config_map("netopt-nccl-env", settings.common, None))
    for node in settings.nodes:
        own = settings.per_node.get(node, ())
        if own:
            docs.append(config_map(f"netopt-nccl-env-{node}", own, node))
    usage = (
        "# use: envFrom: [{configMapRef: {name: netopt-nccl-env}}, "
        "{configMapRef: {name: netopt-nccl-env-<node>}}] on pods pinned to <node>"
    )
    return usage + "\n" + "\n---\n".join(docs) + "\n"


def settings_as_data(settings: NcclSettings) -> dict[str, Any]:
    """Everything as JSON-able data (the ``--format json`` document)."""

    def values(items: tuple[EnvValue, ...]) -> list[dict[str, str]]:
        return [{"key": v.key, "value": v.value, "reason": v.reason} for v in items]

    per_node: Mapping[str, tuple[EnvValue, ...]] = settings.per_node
    advice = settings.advice
    return {
        "nccl_version": _version(settings),
        "nodes": list(settings.nodes),
        "common": values(settings.common),
        "per_node": {node: values(per_node.get(node, ())) for node in settings.nodes},
        "advice": {
            "timeout_s": advice.timeout_s,
            "timeout_reason": advice.timeout_reason,
            "hook": advice.hook,
            "hook_reason": advice.hook_reason,
            "powersgd_rank": advice.powersgd_rank,
            "powersgd_alternate": advice.powersgd_alternate,
            "comm_share": advice.comm_share,
            "bucket_cap_mb": advice.bucket_cap_mb,
            "bucket_reason": advice.bucket_reason,
            "notes": list(advice.notes),
            "accumulation": None if advice.accumulation is None else asdict(advice.accumulation),
            "averaging": None if advice.averaging is None else asdict(advice.averaging),
        },
        "warnings": list(settings.warnings),
        "rank_order": None
        if settings.rank_order is None
        else {
            "given": list(settings.rank_order.given),
            "advised": list(settings.rank_order.advised),
            "border_hops_given": settings.rank_order.border_hops_given,
            "border_hops_advised": settings.rank_order.border_hops_advised,
            "node_rank": settings.rank_order.node_rank(),
        },
        "predictions": [
            {"algorithm": p.algorithm, "size_bytes": p.size_bytes, "time_s": p.time_s}
            for p in settings.predictions
        ],
        "tuner_rows": [
            {
                "collective": r.collective,
                "min_bytes": r.min_bytes,
                "max_bytes": r.max_bytes,
                "algorithm": r.algorithm,
                "protocol": r.protocol,
                "channels": r.channels,
                "n_nodes": r.n_nodes,
                "n_ranks": r.n_ranks,
            }
            for r in settings.tuner_rows
        ],
    }


def render_tuner_csv(settings: NcclSettings) -> str:
    """The example tuner plugin's CSV (NVIDIA/nccl ext-tuner/example, nccl_tuner.conf).

    8 fields per line (the plugin's required ones; numPipeOps/regBuff left to
    match anything): collective_type,min_bytes,max_bytes,algorithm,protocol,
    channels,nNodes,nRanks. Lines starting with '#' are comments.
    """
    lines = [
        f"# netopt nccl-env tuner CSV: NCCL {_version(settings)}, "
        f"nodes {', '.join(settings.nodes)}",
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
    ]
    for r in settings.tuner_rows:
        lines.append(
            f"{r.collective},{r.min_bytes},{r.max_bytes},{r.algorithm},{r.protocol},"
            f"{r.channels},{r.n_nodes},{r.n_ranks}"
        )
    return "\n".join(lines) + "\n"

"""``GET /openapi.json``: the coordinator's API as an OpenAPI 3.1 document."""

from __future__ import annotations

from typing import Any

from netopt import __version__
from netopt.names import DATASET_NAME_RE, HASH_ID_RE, IFNAME_RE, NODE_NAME_RE
from netopt.wire.fields import string_schema
from netopt.wire.schema import (
    BATCH_ID_RE,
    CC_RE,
    MAX_ADDRESSES_PER_NIC,
    MAX_NIC_MBPS,
    MAX_NICS,
    MAX_OUTAGES,
    MAX_PROBES,
    MAX_RATE_BPS,
    MAX_RTT_MS,
    MAX_SUMMARIES_PER_BATCH,
    MAX_TIME_S,
    MAX_WINDOW_S,
    METHODS,
    NAME_MAX_LEN,
    TARGET_MAX_LEN,
    VERSION_RE,
)

__all__ = ["openapi_document", "query_names"]

# Every bound and pattern below is the constant the validators in schema.py use.
NAME = string_schema(NAME_MAX_LEN, NODE_NAME_RE)
MS = {"type": "number", "minimum": 0, "maximum": MAX_RTT_MS}
BPS = {"type": ["number", "null"], "minimum": 0, "maximum": MAX_RATE_BPS}
COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_PROBES}
_INTERFACE = "^[0-9A-Fa-f:.]{2,45}/[0-9]{1,3}$"  # ip/prefix; ipaddress.ip_interface decides


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": props}  # fmt: skip


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema]}


def _schemas() -> dict[str, Any]:
    indexes = {"type": "array", "maxItems": 65536, "items": {"type": "integer", "minimum": 0}}
    rtt = _obj(["min", "mean", "p50", "p90", "p99", "max"],
               **{k: MS for k in ("min", "mean", "p50", "p90", "p99", "max")})  # fmt: skip
    summary = _obj(
        ["src", "dst", "taken_at_s", "window_s", "method"],
        src=NAME,
        dst={**NAME, "description": "must differ from src"},
        taken_at_s={"type": "number", "minimum": 0, "maximum": MAX_TIME_S,
                    "description": "unix time at the end of the window"},
        window_s={"type": "number", "minimum": 0.001, "maximum": MAX_WINDOW_S},
        method={"enum": list(METHODS)},
        probes_sent=COUNT,
        probes_received={**COUNT, "description": "<= probes_sent"},
        rtt_ms=_nullable(rtt),
        jitter_ms={"type": ["number", "null"], "minimum": 0, "maximum": MAX_RTT_MS},
        delay_variation_ms=_nullable(_obj(["p50", "p90", "p99"], p50=MS, p90=MS, p99=MS)),
        loss_ratio={"type": ["number", "null"], "minimum": 0, "maximum": 1,
                    "description": "required for udp and tcp-connect"},
        loss_ratio_ci95={"type": ["array", "null"], "minItems": 2, "maxItems": 2,
                         "items": {"type": "number", "minimum": 0, "maximum": 1}},
        reordered_count=COUNT,
        duplicate_count=COUNT,
        late_count=COUNT,
        outages={"type": "array", "maxItems": MAX_OUTAGES, "items": _obj(
            ["start_s", "duration_s"],
            start_s={"type": "number", "minimum": 0, "maximum": MAX_WINDOW_S},
            duration_s={"type": "number", "minimum": 0, "maximum": MAX_WINDOW_S},
            lost_count=COUNT, ongoing={"type": "boolean"})},
        single_stream_bps=BPS,
        aggregate_bps={**BPS, "description": "bulk-tcp/iperf3 need this or single_stream_bps"},
        streams={"type": ["integer", "null"], "minimum": 1, "maximum": 1024},
        congestion_control=_nullable(string_schema(16, CC_RE)),
        target=_nullable(string_schema(TARGET_MAX_LEN)),
        duration_s={"type": ["number", "null"], "minimum": 0, "maximum": MAX_WINDOW_S},
    )  # fmt: skip
    nic = _obj(
        ["name"],
        name=string_schema(15, IFNAME_RE),
        addresses={"type": "array", "maxItems": MAX_ADDRESSES_PER_NIC,
                   "items": {"anyOf": [{"format": "ipv4"}, {"format": "ipv6"},
                                       {"type": "string", "pattern": _INTERFACE}],
                             "type": "string", "description": "IP or IP/prefix"}},
        speed_mbps={"type": ["number", "null"], "minimum": 0, "maximum": MAX_NIC_MBPS},
        mtu={"type": "integer", "minimum": 68, "maximum": 65536},
    )  # fmt: skip
    peer: dict[str, Any] = {"type": "object", "properties": {
        "node": NAME, "region": NAME, "host": {"type": "string"},
        "probe_port": {"type": "integer"}, "data_port": {"type": ["integer", "null"]}}}  # fmt: skip
    return {
        "Error": {"type": "object", "required": ["error", "message"], "properties": {
            "error": {"type": "string"}, "message": {"type": "string"},
            "field": {"type": "string", "description": "path of the refused value"}}},
        "Registration": _obj(
            ["node", "region", "netopt_version", "cpu_count", "nics"],
            node=NAME, region=NAME,
            netopt_version=string_schema(32, VERSION_RE),
            cpu_count={"type": "integer", "minimum": 1, "maximum": 65536},
            nics={"type": "array", "maxItems": MAX_NICS, "items": nic},
            advertise_host={"oneOf": [{"type": "null"}, {"type": "string", "format": "ipv4"},
                                      {"type": "string", "format": "ipv6"}],
                            "description": "address peers probe; default: the request's source"},
            probe_port={"type": ["integer", "null"], "minimum": 1, "maximum": 65535},
            data_port={"type": ["integer", "null"], "minimum": 1, "maximum": 65535}),
        "AgentAck": {"type": "object", "properties": {
            "node": NAME, "plan_version": {"type": "string"},
            "heartbeat_interval_s": {"type": "number"}, "stale_after_s": {"type": "number"},
            "max_request_bytes": {"type": "integer"}, "server_time_s": {"type": "number"}}},
        "Heartbeat": _obj([], uptime_s={"type": ["number", "null"], "minimum": 0},
                          spool_bytes={"type": ["integer", "null"], "minimum": 0},
                          spool_dropped_count={"type": ["integer", "null"], "minimum": 0}),
        "LinkSummary": summary,
        "SummaryBatch": _obj(
            ["batch_id", "summaries"],
            batch_id={**string_schema(64, BATCH_ID_RE),
                      "description": "unique per agent; a replay is acknowledged, not stored"},
            summaries={"type": "array", "maxItems": MAX_SUMMARIES_PER_BATCH,
                       "items": _ref("LinkSummary")}),
        "IngestResult": {"type": "object", "properties": {
            "batch_id": {"type": "string"}, "duplicate": {"type": "boolean"},
            "accepted": COUNT, "expired": {**COUNT, "description": "older than retention"}}},
        "NodePlan": {"type": "object", "properties": {
            "node": NAME, "plan_version": {"type": "string"},
            "probes": {"type": "array", "items": {**peer, "properties": {
                **peer["properties"], "kind": {"enum": ["in-region", "cross-border"]}}}},
            "bandwidth_cycle_s": {"type": "number"}, "bandwidth_slot_s": {"type": "number"},
            "bandwidth_tests": {"type": "array", "items": {**peer, "properties": {
                **peer["properties"], "offset_s": {"type": "number", "description":
                    "run at every k * bandwidth_cycle_s + offset_s (unix time)"}}}}}},
        "Nodes": {"type": "object", "properties": {"nodes": {"type": "array", "items": {
            "type": "object", "properties": {"node": NAME, "region": NAME,
                                             "state": {"enum": ["live", "stale", "left"]}}}}}},
        "Links": {"type": "object", "description": "per (src, dst): latest figures, RTT "
                  "percentiles over the window's summary medians, pooled loss, latest bandwidth"},
        "Regions": {"type": "object", "description": "per unordered region pair"},
        "Placement": {"type": "object", "additionalProperties": False, "required": ["dataset"],
            "description": "exactly one of node (registered) or region", "properties": {
            "dataset": string_schema(128, DATASET_NAME_RE),
            "node": NAME, "region": NAME}},
        "PlacementAnswer": {"type": "object", "properties": {
            "allowed": {"const": True}, "dataset": {"type": "string"}, "node": NAME,
            "region": NAME, "residency": {"type": ["array", "null"], "items": NAME},
            "note": {"type": "string", "description": "set when the dataset is not in the "
                     "catalogue (datasets_file): no rule applies"}}},
        "History": {"type": "object", "properties": {
            "summaries": {"type": "array", "items": _ref("LinkSummary")}}},
        "RouteRequest": _obj(
            ["node", "chunk_count"], node=NAME,
            chunk_count={"type": "integer", "minimum": 1, "maximum": 1 << 24},
            want={**indexes, "description": "chunks to find sources for (indexes into the "
                  "manifest's unique-chunk order)"},
            have={**indexes, "description": "chunks stored since the last call"},
            exclude={"type": "array", "maxItems": 256, "items": NAME,
                     "description": "peers this node failed to reach"},
            steal={**indexes, "description": "wanted chunks the caller waited too long "
                   "for: lease them to it (their lessee is stuck)"},
            done={"type": "boolean", "description": "the sync ended: free its leases"}),
        "RouteAnswer": {"type": "object", "properties": {
            "peers": {"type": "object", "additionalProperties": indexes,
                      "description": "node -> chunks to fetch from it (same region)"},
            "origin": {**indexes, "description": "leased to the caller: fetch from SOURCE"},
            "wait": {**indexes, "description": "in flight across the border for a peer: "
                     "ask again after retry_after_s"},
            "endpoints": {"type": "object", "additionalProperties": {"type": "string"},
                          "description": "node -> HOST:PORT of its agent's data plane"},
            "retry_after_s": {"type": "number"},
            "start_fraction": {"type": "number", "description": "first call only: where in "
                               "the chunk order this syncer should start"}}},
        "Datasets": {"type": "object", "description": "every dataset version: holders "
                     "(chunks held, live) and sync sessions (leases)"},
    }  # fmt: skip


def _op(summary: str, ok: str | None, body: str | None = None, **params: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {}}
    op["responses"]["200"] = {"description": "OK", "content": {
        "application/json": {"schema": _ref(ok) if ok else {"type": "object"}}}}  # fmt: skip
    for code, text in (
        ("400", "invalid request"),
        ("401", "missing or wrong token"),
        ("404", "unknown node"),
        ("413", "body over max_request_bytes"),
    ):
        op["responses"][code] = {"description": text, "content": {
            "application/json": {"schema": _ref("Error")}}}  # fmt: skip
    if body:
        op["requestBody"] = {"required": body != "Heartbeat", "content": {
            "application/json": {"schema": _ref(body)}}}  # fmt: skip
    op["parameters"] = [
        {"name": name, "in": where, "required": where == "path", "schema": schema}
        for name, (where, schema) in params.items()
    ]
    return op


def _placement_op() -> dict[str, Any]:
    op = _op("May a dataset's chunks be placed on this node (residency rules of the "
             "catalogue in datasets_file)?", "PlacementAnswer", "Placement")  # fmt: skip
    op["responses"]["403"] = {"description": "refused: the dataset's residency excludes the "
                              "node's region (the message names the rule)", "content": {
                              "application/json": {"schema": _ref("Error")}}}  # fmt: skip
    return op


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of every route (JSON-able)."""
    node = ("path", NAME)
    window = ("query", {"type": "number", "minimum": 1, "default": 300,
                        "description": "seconds back from now (at most retention_s)"})  # fmt: skip
    limit = ("query", {"type": "integer", "minimum": 1, "maximum": 5000, "default": 500})
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "netopt coordinator",
            "version": __version__,
            "description": "Agent registry, link-summary ingest, probe plans and the link "
            "matrix. Every route except /, /dashboard.*, /openapi.json, /healthz and /readyz needs "
            "'Authorization: Bearer <token>' (the shared token); /metrics too.",
        },
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/agents/register": {"post": _op(
                "Register or re-register an agent", "AgentAck", "Registration")},
            "/api/v1/agents/{node}/heartbeat": {"post": _op(
                "Heartbeat; the reply carries plan_version (refetch the plan when it changes)",
                "AgentAck", "Heartbeat", node=node)},
            "/api/v1/agents/{node}": {"delete": _op(
                "Deregister on graceful shutdown (node shows as 'left')", None, node=node)},
            "/api/v1/agents/{node}/plan": {"get": _op(
                "This agent's probe peers and bandwidth test slots", "NodePlan", node=node)},
            "/api/v1/agents/{node}/summaries": {"post": _op(
                "Ingest a batch of link summaries, idempotent by (node, batch_id)",
                "IngestResult", "SummaryBatch", node=node)},
            "/api/v1/nodes": {"get": _op("Nodes with liveness state", "Nodes")},
            "/api/v1/links": {"get": _op("Node-pair matrix", "Links", window_s=window)},
            "/api/v1/links/{src}/{dst}/history": {"get": _op(
                "Recent summaries of one link, oldest first", "History",
                src=node, dst=node, window_s=window, limit=limit)},
            "/api/v1/regions": {"get": _op("Region-pair aggregates", "Regions", window_s=window)},
            "/api/v1/plan": {"get": _op("The whole fleet's plan", None)},
            "/api/v1/placements": {"post": _placement_op()},
            "/api/v1/datasets": {"get": _op("The chunk catalogue: dataset versions, holders "
                                            "and sync sessions", "Datasets")},
            "/api/v1/datasets/{dataset}/versions/{manifest_id}/route": {"post": _op(
                "Sources for the chunks a sync wants (in-region peers first, the border "
                "once); reports the chunks it stored", "RouteAnswer", "RouteRequest",
                dataset=("path", string_schema(128, DATASET_NAME_RE)),
                manifest_id=("path", string_schema(64, HASH_ID_RE)))},
            "/metrics": {"get": {"summary": "Prometheus metrics (token required)",
                                 "responses": {"200": {"description": "text format 0.0.4"},
                                               "401": {"description": "missing or wrong token",
                                                       "content": {"application/json": {
                                                           "schema": _ref("Error")}}}}}},
            "/healthz": {"get": {"summary": "Liveness, no token", "security": [],
                                 "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Readiness, no token: 503 while the database cannot "
                                "be reached (leader: whether this replica does the sweeps)",
                                "security": [],
                                "responses": {"200": {"description": "ready"},
                                              "503": {"description": "database unreachable",
                                                      "content": {"application/json": {
                                                          "schema": _ref("Error")}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3.1"}}}},
            "/": {"get": {"summary": "Dashboard page (static; the token is typed in or passed "
                          "as #token=... and sent only as a header)", "security": [],
                          "responses": {"200": {"description": "HTML"}}}},
        },
    }  # fmt: skip


def query_names(path: str, method: str) -> frozenset[str]:
    """The query parameters the document lists for ``method path``: the server refuses others."""
    operation = openapi_document()["paths"].get(path, {}).get(method.lower(), {})
    return frozenset(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")

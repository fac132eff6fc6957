"""HTTP routes of the chunk catalogue (see :mod:`netopt.coordinator.catalogue`).

    POST /api/v1/datasets/{dataset}/versions/{manifest_id}/route
        body {"node", "chunk_count", "want": [i...], "have": [i...], "exclude": [node...],
              "steal": [i...], "done": bool}
        200 {"peers": {node: [i...]}, "origin": [i...], "wait": [i...],
             "endpoints": {node: "HOST:PORT"}, "retry_after_s", ["start_fraction"]}
    GET  /api/v1/datasets                       every version, its holders and sessions

The asking node must be registered (its region decides who its peers are); a
peer is offered only while its agent is live and advertises a data port.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from netopt.coordinator.catalogue import Catalogue, CatalogueError, RouteRequest
from netopt.coordinator.service import Coordinator, node_state
from netopt.names import NODE_NAME_RE, is_dataset_name, is_hash_id, is_node_name
from netopt.wire.fields import Reader, RequestInvalid, parse_json_body

__all__ = ["CATALOGUE", "CATALOGUE_ROUTES", "ChunkCatalogue", "parse_route_request"]

MAX_INDEXES = 65536
"""Indexes per list in one call (a sync asks batch by batch and reports as it stores)."""
MAX_EXCLUDE = 256


def _indexes(r: Reader, key: str, chunk_count: int) -> tuple[int, ...]:
    out = []
    for where, value in r.items(key, max_items=MAX_INDEXES, required=False):
        if type(value) is not int or not 0 <= value < chunk_count:
            raise RequestInvalid(where, f"expected a chunk index within 0..{chunk_count - 1}")
        out.append(value)
    return tuple(out)


def parse_route_request(data: object, dataset: str, manifest_id: str) -> RouteRequest:
    """The route call's body; RequestInvalid naming the field for anything malformed."""
    if not is_dataset_name(dataset):
        raise RequestInvalid("dataset", f"{dataset[:64]!r} is not a dataset name")
    if not is_hash_id(manifest_id):
        raise RequestInvalid("manifest_id", "expected 64 lowercase hex digits")
    r = Reader(
        data,
        keys=frozenset(("node", "chunk_count", "want", "have", "exclude", "steal", "done")),
    )
    node = r.string("node", max_len=63, pattern=NODE_NAME_RE)
    chunk_count = r.integer("chunk_count", ge=1, le=1 << 24)
    exclude = []
    for where, value in r.items("exclude", max_items=MAX_EXCLUDE, required=False):
        if not is_node_name(value):
            raise RequestInvalid(where, "expected a node name")
        exclude.append(value)
    return RouteRequest(
        node=node,
        dataset=dataset,
        manifest_id=manifest_id,
        chunk_count=chunk_count,
        want=_indexes(r, "want", chunk_count),
        have=_indexes(r, "have", chunk_count),
        exclude=tuple(exclude),
        steal=_indexes(r, "steal", chunk_count),
        done=r.boolean("done", default=False),
    )


@dataclass
class ChunkCatalogue:
    """The catalogue joined with the registry (regions, liveness, data endpoints)."""

    catalogue: Catalogue
    coordinator: Coordinator

    def _live(self, now_s: float) -> set[str]:
        stale_after_s = self.coordinator.settings.stale_after_s
        return {
            name
            for name, node in self.coordinator.nodes.items()
            if node_state(node, now_s, stale_after_s) == "live"
        }

    async def route(self, req: RouteRequest) -> dict[str, object]:
        """Route one call; NotFoundError for an unregistered node, RequestInvalid for a
        request that contradicts the version. The state is the store's when replicas
        share it (:meth:`StoreRunner.route_chunks`)."""
        await self.coordinator.known(req.node)  # NotFoundError: start its agent first
        nodes = self.coordinator.nodes
        now_s = self.coordinator.clock()
        regions = {name: node.region for name, node in nodes.items()}
        live = {n for n in self._live(now_s) if nodes[n].registration.get("data_port")}
        try:
            answer = await self.coordinator.db.route_chunks(
                self.catalogue, req, regions, live, now_s
            )
        except CatalogueError as exc:
            raise RequestInvalid("chunk_count", str(exc)) from None
        endpoints = {}
        for name in answer.peers:
            node = nodes[name]
            host = f"[{node.host}]" if ":" in node.host else node.host
            endpoints[name] = f"{host}:{node.registration['data_port']}"
        return {**answer.to_dict(), "endpoints": endpoints}

    async def describe(self) -> dict[str, object]:
        """Every dataset version the catalogue knows."""
        now_s = self.coordinator.clock()
        live = self._live(now_s)
        versions = await self.coordinator.db.describe_catalogue(self.catalogue, live, now_s)
        return {"now_s": now_s, "versions": versions}


CATALOGUE = web.AppKey("catalogue", ChunkCatalogue)


def _json(data: object) -> web.Response:
    return web.json_response(data, dumps=lambda d: json.dumps(d, allow_nan=False))


async def route_chunks(request: web.Request) -> web.Response:
    catalogue = request.app[CATALOGUE]
    max_bytes = catalogue.coordinator.settings.max_request_bytes
    length = request.content_length
    if length is not None and length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=length)
    data = parse_json_body(await request.read())
    req = parse_route_request(
        data, request.match_info["dataset"], request.match_info["manifest_id"]
    )
    return _json(await catalogue.route(req))


async def list_datasets(request: web.Request) -> web.Response:
    return _json(await request.app[CATALOGUE].describe())


CATALOGUE_ROUTES = (
    ("POST", "/api/v1/datasets/{dataset}/versions/{manifest_id}/route", route_chunks),
    ("GET", "/api/v1/datasets", list_datasets),
)

"""The chunk catalogue: which node holds which chunks of which dataset version, and
who fetches what across a border.

Pure state and decisions (no I/O, the clock is passed in), kept in the
coordinator's memory. A dataset version is named by its manifest id; its chunks
are numbered in the order of ``Manifest.unique_chunks()`` (first appearance in
file order), which every node holding the same manifest computes alike, so
requests carry small integers instead of 64-digit hashes.

A syncing node asks :meth:`Catalogue.route` for sources of the chunks it wants
next and reports the chunks it stored since its last call. Each wanted chunk gets
one answer:

- ``peer``: a node of the asker's region holds it: fetch it from that node (the
  least-loaded holder of this answer, so load spreads across holders);
- ``origin``: no live node of the region holds it and none is fetching it: the
  asker now holds the *lease* for it and fetches it across the border;
- ``wait``: another node of the region holds a live lease (the chunk is in flight
  across the border): ask again shortly, a peer will hold it. A caller that waited
  too long for a chunk may *steal* its lease (the lessee is stuck, not dead).

Leases belong to a sync *session* (node, dataset version). A session is renewed
by every call and ends with ``done`` or when it goes ``session_ttl_s`` without a
call (its node was killed): then its leases are free again and the next asker
fetches those chunks itself. Holdings count only while their node is live in the
registry, and an asker can exclude peers it failed to reach.

Where the state lives: with a SQLite store (one coordinator) in this object's
memory, so after a restart syncs fetch from their SOURCE until nodes report
holdings again (more border bytes, never wrong data); with PostgreSQL (several
replicas) in the database: each call loads its version (:meth:`Catalogue.load`,
a :class:`VersionState`), is routed here, and is written back
(:meth:`Catalogue.export`) in one transaction holding the version's row lock
(:meth:`netopt.coordinator.pgstore.PgStore.catalogue_route`), so a sync that
started its sharing through one replica finishes through another.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from netopt.errors import ValidationError

__all__ = [
    "Catalogue",
    "CatalogueError",
    "RouteAnswer",
    "RouteRequest",
    "VersionState",
    "start_fraction",
]

DEFAULT_SESSION_TTL_S = 10.0
DEFAULT_RETRY_AFTER_S = 0.25
MAX_CHUNKS = 1 << 24
"""Chunks per dataset version the catalogue accepts (16 Mi: 64 TiB at 4 MiB chunks)."""


class CatalogueError(ValidationError):
    """A request that contradicts the catalogue (bad chunk index, wrong chunk count)."""


class _Bits:
    """A fixed-size bitset over chunk indexes."""

    __slots__ = ("count", "data")

    def __init__(self, size: int) -> None:
        self.data = bytearray((size + 7) // 8)
        self.count = 0

    @classmethod
    def restored(cls, size: int, data: bytes, count: int) -> _Bits:
        """A bitset as :meth:`Catalogue.export` gave it (padded or cut to ``size``)."""
        bits = cls(size)
        bits.data[: len(data)] = data[: len(bits.data)]
        bits.count = count
        return bits

    def add(self, index: int) -> None:
        byte, bit = divmod(index, 8)
        if not self.data[byte] >> bit & 1:
            self.data[byte] |= 1 << bit
            self.count += 1

    def __contains__(self, index: int) -> bool:
        byte, bit = divmod(index, 8)
        return bool(self.data[byte] >> bit & 1)


def start_fraction(rank: int) -> float:
    """Where in the chunk order the ``rank``-th concurrent syncer of a region starts.

    The van der Corput sequence (0, 1/2, 1/4, 3/4, 1/8 ...): however many nodes
    join, their starting points stay spread, so they lease different chunks.
    """
    fraction, denominator = 0.0, 1.0
    while rank:
        denominator *= 2
        rank, bit = divmod(rank, 2)
        fraction += bit / denominator
    return fraction


@dataclass(frozen=True)
class RouteRequest:
    """One call of a syncing node (indexes into the version's chunk order)."""

    node: str
    dataset: str
    manifest_id: str
    chunk_count: int
    want: tuple[int, ...] = ()
    have: tuple[int, ...] = ()
    exclude: tuple[str, ...] = ()
    steal: tuple[int, ...] = ()
    """Wanted chunks the caller waited too long for: lease them to it even if another
    live session holds their lease (that node is stuck, not dead)."""
    done: bool = False


@dataclass(frozen=True)
class RouteAnswer:
    """Sources for the wanted chunks; ``start_fraction`` is set on a session's first call."""

    peers: dict[str, list[int]]
    origin: list[int]
    wait: list[int]
    retry_after_s: float
    start_fraction: float | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON answer (peer endpoints are added by the caller)."""
        out: dict[str, object] = {
            "peers": self.peers,
            "origin": self.origin,
            "wait": self.wait,
            "retry_after_s": self.retry_after_s,
        }
        if self.start_fraction is not None:
            out["start_fraction"] = self.start_fraction
        return out


@dataclass
class _Session:
    node: str
    region: str
    rank: int
    last_seen_s: float
    leases: set[int] = field(default_factory=set)


@dataclass
class _Version:
    dataset: str
    chunk_count: int
    holders: dict[str, _Bits] = field(default_factory=dict)
    leases: dict[int, str] = field(default_factory=dict)
    """chunk index -> node whose session fetches it across the border."""
    sessions: dict[str, _Session] = field(default_factory=dict)


@dataclass(frozen=True)
class VersionState:
    """One dataset version's catalogue state as a store keeps it.

    ``sessions_json`` holds the sessions and leases; ``holders`` maps a node to
    (chunks held, its bitset's bytes).
    """

    chunk_count: int
    sessions_json: str
    holders: Mapping[str, tuple[int, bytes]]


class Catalogue:
    """Holdings, leases and sessions of every dataset version the coordinator has seen."""

    def __init__(
        self,
        session_ttl_s: float = DEFAULT_SESSION_TTL_S,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    ) -> None:
        self.session_ttl_s = session_ttl_s
        self.retry_after_s = retry_after_s
        self._versions: dict[tuple[str, str], _Version] = {}
        """(dataset, manifest id) -> its state."""

    def _version(self, req: RouteRequest) -> _Version:
        if not 1 <= req.chunk_count <= MAX_CHUNKS:
            raise CatalogueError(f"chunk_count must be within 1..{MAX_CHUNKS}")
        key = (req.dataset, req.manifest_id)
        version = self._versions.get(key)
        if version is None:
            version = _Version(req.dataset, req.chunk_count)
            self._versions[key] = version
        elif version.chunk_count != req.chunk_count:
            raise CatalogueError(
                f"{req.dataset} version {req.manifest_id[:16]} has {version.chunk_count} "
                f"chunks, not {req.chunk_count}"
            )
        for index in (*req.want, *req.have, *req.steal):
            if not 0 <= index < version.chunk_count:
                raise CatalogueError(f"chunk index {index} is outside 0..{version.chunk_count - 1}")
        return version

    def load(self, dataset: str, manifest_id: str, state: VersionState) -> None:
        """Put a stored version's state in place of whatever is held for it."""
        version = _Version(dataset, state.chunk_count)
        for node, (count, data) in state.holders.items():
            version.holders[node] = _Bits.restored(state.chunk_count, data, count)
        doc = json.loads(state.sessions_json) if state.sessions_json else {}
        for node, region, rank, last_seen_s, leases in doc.get("sessions", []):
            version.sessions[node] = _Session(node, region, rank, last_seen_s, set(leases))
        version.leases = {int(index): node for index, node in doc.get("leases", [])}
        self._versions[(dataset, manifest_id)] = version

    def export(self, dataset: str, manifest_id: str, holders: Iterable[str]) -> VersionState:
        """The state of one version, with the bitsets of ``holders`` only (those a call
        changed). Raises KeyError for a version this catalogue does not hold."""
        version = self._versions[(dataset, manifest_id)]
        sessions = [
            [s.node, s.region, s.rank, s.last_seen_s, sorted(s.leases)]
            for s in version.sessions.values()
        ]
        doc = {"sessions": sessions, "leases": sorted(version.leases.items())}
        changed = {
            node: (bits.count, bytes(bits.data))
            for node in holders
            if (bits := version.holders.get(node)) is not None
        }
        return VersionState(version.chunk_count, json.dumps(doc, separators=(",", ":")), changed)

    def _expire(self, version: _Version, now_s: float) -> None:
        for node, session in list(version.sessions.items()):
            if now_s - session.last_seen_s > self.session_ttl_s:
                self._end(version, node)

    @staticmethod
    def _end(version: _Version, node: str) -> None:
        session = version.sessions.pop(node, None)
        if session is not None:
            for index in session.leases:
                if version.leases.get(index) == node:
                    del version.leases[index]

    def route(
        self,
        req: RouteRequest,
        regions: Mapping[str, str],
        live: Collection[str],
        now_s: float,
    ) -> RouteAnswer:
        """Record ``req.have``, then route ``req.want`` (see the module docstring).

        ``regions`` maps node -> region (the registry), ``live`` holds the nodes whose
        agents are live. Raises CatalogueError for indexes or counts that do not
        fit the version, KeyError when ``req.node`` has no region.
        """
        region = regions[req.node]
        version = self._version(req)
        self._expire(version, now_s)
        held = version.holders.get(req.node)
        if held is None and req.have:
            held = version.holders[req.node] = _Bits(version.chunk_count)
        session = version.sessions.get(req.node)
        first_call = session is None and not req.done
        if session is None and not req.done:
            ranks = {s.rank for s in version.sessions.values() if s.region == region}
            rank = next(r for r in range(len(ranks) + 1) if r not in ranks)
            session = version.sessions[req.node] = _Session(req.node, region, rank, now_s)
        for index in req.have:
            assert held is not None
            held.add(index)
            if version.leases.get(index) == req.node:
                del version.leases[index]
            if session is not None:
                session.leases.discard(index)
        if req.done:
            self._end(version, req.node)
            return RouteAnswer({}, [], [], self.retry_after_s)
        assert session is not None
        session.last_seen_s = now_s
        answer = self._assign(version, req, region, regions, live, session)
        if first_call:
            answer = RouteAnswer(
                answer.peers, answer.origin, answer.wait, answer.retry_after_s,
                start_fraction(session.rank),
            )  # fmt: skip
        return answer

    def _assign(
        self,
        version: _Version,
        req: RouteRequest,
        region: str,
        regions: Mapping[str, str],
        live: Collection[str],
        session: _Session,
    ) -> RouteAnswer:
        excluded = set(req.exclude)
        stolen = set(req.steal)
        sources = [
            (node, bits)
            for node, bits in sorted(version.holders.items())
            if node != req.node
            and node not in excluded
            and node in live
            and regions.get(node) == region
        ]
        load: dict[str, int] = {}
        peers: dict[str, list[int]] = {}
        origin: list[int] = []
        wait: list[int] = []
        for index in req.want:
            holding = [node for node, bits in sources if index in bits]
            if holding:
                node = min(holding, key=lambda n: (load.get(n, 0), n))
                load[node] = load.get(node, 0) + 1
                peers.setdefault(node, []).append(index)
                continue
            lessee = version.leases.get(index)
            if (
                lessee is not None
                and lessee != req.node
                and lessee not in excluded
                and index not in stolen
            ):
                wait.append(index)
                continue
            if lessee is not None and lessee != req.node and lessee in version.sessions:
                version.sessions[lessee].leases.discard(index)
            version.leases[index] = req.node
            session.leases.add(index)
            origin.append(index)
        return RouteAnswer(peers, origin, wait, self.retry_after_s)

    def describe(self, live: Iterable[str], now_s: float) -> list[dict[str, object]]:
        """Every version: holders (chunks held, live or not) and active sessions."""
        alive = set(live)
        out: list[dict[str, object]] = []
        for (_, manifest_id), version in sorted(self._versions.items()):
            self._expire(version, now_s)
            out.append(
                {
                    "dataset": version.dataset,
                    "manifest_id": manifest_id,
                    "chunk_count": version.chunk_count,
                    "holders": [
                        {"node": node, "chunks": bits.count, "live": node in alive}
                        for node, bits in sorted(version.holders.items())
                    ],
                    "sessions": [
                        {"node": s.node, "region": s.region, "leases": len(s.leases)}
                        for s in sorted(version.sessions.values(), key=lambda s: s.node)
                    ],
                    "leases": len(version.leases),
                }
            )
        return out

"""Where a demo or test deployment runs: on a lab's nodes, or all on loopback.

A :class:`Site` runs commands "on a node" and says at which address and port a
node's service listens, and where another node reaches it (:meth:`Site.endpoint`).
:class:`LabSite` wraps a running lab (each node its own namespace and address,
the same ports everywhere, links emulated by the lab); :class:`LoopbackSite` puts
every node on 127.0.0.1 with its own ports, for machines without root, and
emulates inter-region links with user-space proxies (:mod:`netopt.lab.userlink`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from netopt.config.lab import LinkShape
from netopt.errors import LabError, ValidationError
from netopt.lab import Lab
from netopt.lab.userlink import UserLinks

__all__ = ["LabSite", "LoopbackSite", "Site"]


class Site(Protocol):
    """Nodes that can run commands."""

    @property
    def nodes(self) -> tuple[str, ...]: ...

    def region_of(self, node: str) -> str: ...

    def address(self, node: str) -> str: ...

    def port(self, node: str, base_port: int) -> int: ...

    def endpoint(self, src_node: str, dst_node: str, base_port: int) -> tuple[str, int]: ...

    def border_bytes(self, region_a: str, region_b: str) -> int: ...

    def exec(
        self, node: str, argv: Sequence[str], *, timeout_s: float | None = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...

    def popen(
        self, node: str, argv: Sequence[str], **popen_kwargs: Any
    ) -> subprocess.Popen[Any]: ...


class LabSite:
    """A running :class:`~netopt.lab.Lab` as a site."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.lab.nodes

    def region_of(self, node: str) -> str:
        return self.lab.region_of(node)

    def address(self, node: str) -> str:
        return self.lab.address(node)

    def port(self, node: str, base_port: int) -> int:
        return base_port

    def endpoint(self, src_node: str, dst_node: str, base_port: int) -> tuple[str, int]:
        """Where ``src_node`` reaches ``dst_node``'s service: the lab routes it over its links."""
        return self.address(dst_node), self.port(dst_node, base_port)

    def border_bytes(self, region_a: str, region_b: str) -> int:
        """Bytes the lab's link between two regions delivered so far, both directions.

        IP packets, headers included, of all traffic (probes too). 0 for one region
        given twice; ValidationError when the lab has no such link.
        """
        if region_a == region_b:
            return 0
        link = self.lab.counters().link(region_a, region_b)
        return link.a_to_b.bytes + link.b_to_a.bytes

    def exec(
        self, node: str, argv: Sequence[str], *, timeout_s: float | None = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.lab.exec(node, argv, timeout_s=timeout_s, check=check)

    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        return self.lab.popen(node, argv, **popen_kwargs)


class LoopbackSite:
    """Every node on 127.0.0.1; node i's ports are ``base + 100 * i``. Use as a context
    manager: leaving it kills every process it started and stops its link proxies.

    ``links`` maps a region pair (either order) to the link shape between them:
    :meth:`endpoint` then sends cross-region traffic through a user-space proxy
    with that link's delay, rate and (UDP only) loss. Without it, nothing is emulated.
    Raises ValidationError for a link naming an unknown region or one region twice.
    """

    PORT_STRIDE = 100

    def __init__(
        self,
        regions: Mapping[str, Sequence[str]],
        port_offset: int = 0,
        *,
        links: Mapping[tuple[str, str], LinkShape] | None = None,
        seed: int = 1,
    ) -> None:
        self._region_of = {node: region for region, nodes in regions.items() for node in nodes}
        self._nodes = tuple(self._region_of)
        self._port_offset = port_offset
        self._procs: list[subprocess.Popen[Any]] = []
        self._links: dict[frozenset[str], LinkShape] = {}
        for (a, b), shape in (links or {}).items():
            for region in (a, b):
                if region not in regions:
                    raise ValidationError(f"link {a}-{b} names unknown region {region!r}")
            if a == b:
                raise ValidationError(f"link {a}-{b} names one region twice")
            self._links[frozenset((a, b))] = shape
        self._seed = seed
        self._proxies: UserLinks | None = None
        # (src region, dst node, base port) -> (proxy port, dst region)
        self._proxy_ports: dict[tuple[str, str, int], tuple[int, str]] = {}
        self._proxy_lock = threading.Lock()

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    def region_of(self, node: str) -> str:
        return self._region_of[node]

    def address(self, node: str) -> str:
        return "127.0.0.1"

    def port(self, node: str, base_port: int) -> int:
        return base_port + self._port_offset + self.PORT_STRIDE * self._nodes.index(node)

    def endpoint(self, src_node: str, dst_node: str, base_port: int) -> tuple[str, int]:
        """Where ``src_node`` reaches ``dst_node``'s service on ``base_port``.

        The service's own port within a region (or where no link is configured);
        across regions, the port of a proxy (TCP and UDP on one number) that
        emulates the link, started on first use and shared by the source region's
        nodes. Raises KeyError for an unknown node, LabError when no proxy starts.
        """
        src_region, dst_region = self.region_of(src_node), self.region_of(dst_node)
        direct = self.port(dst_node, base_port)
        shape = self._links.get(frozenset((src_region, dst_region)))
        if src_region == dst_region or shape is None:
            return "127.0.0.1", direct
        key = (src_region, dst_node, base_port)
        with self._proxy_lock:
            if key not in self._proxy_ports:
                if self._proxies is None:
                    self._proxies = UserLinks(seed=self._seed)
                port = self._proxies.add("127.0.0.1", direct, shape, link=(src_region, dst_region))
                self._proxy_ports[key] = (port, dst_region)
            return "127.0.0.1", self._proxy_ports[key][0]

    def border_bytes(self, region_a: str, region_b: str) -> int:
        """Payload bytes (TCP and UDP, no headers) the proxies between two regions carried,
        both directions, since they started; 0 before any proxy exists."""
        wanted = frozenset((region_a, region_b))
        with self._proxy_lock:
            proxies = self._proxies
            ports = [
                port
                for (src_region, _, _), (port, dst_region) in self._proxy_ports.items()
                if frozenset((src_region, dst_region)) == wanted and region_a != region_b
            ]
        if proxies is None:
            return 0
        return sum(proxies.counters(port).bytes for port in ports)

    def exec(
        self, node: str, argv: Sequence[str], *, timeout_s: float | None = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise LabError(f"{' '.join(argv)} on {node} ran over {timeout_s} s") from None
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip()[-2000:]
            raise LabError(f"{' '.join(argv)} on {node} exited {proc.returncode}: {detail}")
        return proc

    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        popen_kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[Any] = subprocess.Popen(list(argv), **popen_kwargs)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Stop every process started here (SIGTERM, then SIGKILL after 10 s), then
        every link proxy."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self._procs.clear()
        with self._proxy_lock:
            proxies, self._proxies = self._proxies, None
            self._proxy_ports.clear()
        if proxies is not None:
            proxies.close()

    def __enter__(self) -> LoopbackSite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Where a demo or test deployment runs: on a lab's nodes, or all on loopback.

A :class:`Site` runs commands "on a node" and says at which address and port a
node's service listens. :class:`LabSite` wraps a running lab (each node its own
namespace and address, the same ports everywhere); :class:`LoopbackSite` puts
every node on 127.0.0.1 with its own ports, for machines without root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from netopt.errors import LabError
from netopt.lab import Lab

__all__ = ["LabSite", "LoopbackSite", "Site"]


class Site(Protocol):
    """Nodes that can run commands."""

    @property
    def nodes(self) -> tuple[str, ...]: ...

    def region_of(self, node: str) -> str: ...

    def address(self, node: str) -> str: ...

    def port(self, node: str, base_port: int) -> int: ...

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

    def exec(
        self, node: str, argv: Sequence[str], *, timeout_s: float | None = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.lab.exec(node, argv, timeout_s=timeout_s, check=check)

    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        return self.lab.popen(node, argv, **popen_kwargs)


class LoopbackSite:
    """Every node on 127.0.0.1; node i's ports are ``base + 100 * i``. Use as a context
    manager: leaving it kills every process it started."""

    PORT_STRIDE = 100

    def __init__(self, regions: Mapping[str, Sequence[str]], port_offset: int = 0) -> None:
        self._region_of = {node: region for region, nodes in regions.items() for node in nodes}
        self._nodes = tuple(self._region_of)
        self._port_offset = port_offset
        self._procs: list[subprocess.Popen[Any]] = []

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    def region_of(self, node: str) -> str:
        return self._region_of[node]

    def address(self, node: str) -> str:
        return "127.0.0.1"

    def port(self, node: str, base_port: int) -> int:
        return base_port + self._port_offset + self.PORT_STRIDE * self._nodes.index(node)

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
        """Stop every process started here: SIGTERM, then SIGKILL after 10 s."""
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

    def __enter__(self) -> LoopbackSite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

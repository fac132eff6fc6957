"""``Lab``: a multi-region cluster of network namespaces with emulated links.

    with Lab.start("configs/lab/two-region.yaml") as lab:
        lab.exec("hk-1", ["ping", "-c", "3", "us-1"])
        print(lab.counters().between("hk", "us").bytes)

The lab always comes down: on leaving the ``with`` block (normally, by an
exception, Ctrl-C or SIGTERM), at interpreter exit, and, if its owner was
killed outright, at the next ``Lab.start`` or ``netopt lab down``. Its relays
watch the owner process and exit with it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from netopt.config import LabTopology, load_settings, parse_settings, settings_to_dict
from netopt.errors import DependencyError, LabError
from netopt.lab import build, netem, netns
from netopt.lab.addressing import LabPlan, ground_truth_rtt_ms, plan_lab
from netopt.lab.counters import DirectionCounters, LabCounters, LinkCounters
from netopt.lab.relay import RelaySpec, relay_request
from netopt.lab.state import LabState, find_lab, list_labs, teardown, write_state

__all__ = ["Lab", "reap_stale_labs"]

_KILL_GRACE_S = 2.0
# SIGTERM becomes KeyboardInterrupt while any lab of this process is up, so that
# `with` blocks unwind and tear down; the previous handler returns after the last.
_GUARD_LOCK = threading.Lock()
_SIGTERM_GUARD: dict[str, Any] = {"labs": 0, "previous": None}


def _new_prefix() -> str:
    return "nl" + secrets.token_hex(3)


def reap_stale_labs(root: Path | None = None) -> list[str]:
    """Tear down labs whose owner process died without cleaning up; return their prefixes."""
    reaped = []
    for state in list_labs(root):
        if state.stale and not teardown(state, root):
            reaped.append(state.prefix)
    return reaped


class Lab:
    """A running lab. Build one with :meth:`start` (or find one with :meth:`attach`)."""

    def __init__(self, plan: LabPlan, state: LabState, root: Path | None) -> None:
        self.plan = plan
        self._state = state
        self._root = root
        self._relays: list[build.RelayProcess] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._guarded = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(
        cls,
        topology: LabTopology | str | os.PathLike[str],
        *,
        prefix: str | None = None,
        detach: bool = False,
        state_dir: Path | None = None,
    ) -> Lab:
        """Build the lab described by ``topology`` (an object or a YAML path).

        ``detach`` leaves it running after this process exits (``netopt lab up``);
        otherwise it is torn down by :meth:`close`, the ``with`` block, SIGTERM or
        interpreter exit. Raises PermissionDeniedError without CAP_NET_ADMIN,
        ConfigError for a bad file, LabError if building fails (after tearing
        down what was built).
        """
        netns.require_net_admin()
        if not isinstance(topology, LabTopology):
            topology = load_settings(topology, "lab")
        reap_stale_labs(state_dir)
        plan = plan_lab(topology, prefix or _new_prefix())
        clash = set(plan.namespaces) & netns.list_netns()
        if clash:
            raise LabError(f"namespaces already exist: {', '.join(sorted(clash))}")
        state = LabState(
            prefix=plan.prefix,
            name=topology.name,
            topology=settings_to_dict(topology),
            owner_pid=os.getpid(),
            detached=detach,
            namespaces=plan.namespaces,
            created_at_s=time.time(),
        )
        write_state(state, state_dir)
        lab = cls(plan, state, state_dir)
        if not detach:
            lab._install_guards()
        try:
            lab._build(detach)
        except BaseException:
            lab.close()
            raise
        return lab

    @classmethod
    def attach(cls, name: str | None = None, *, state_dir: Path | None = None) -> Lab:
        """The running lab called ``name`` (topology name or prefix; None: the only one).

        Closing an attached lab tears it down. Raises ValidationError if no lab
        (or more than one) matches.
        """
        state = find_lab(name, state_dir)
        topology = parse_settings(json.dumps(state.topology), f"lab {state.prefix} state", "lab")
        assert isinstance(topology, LabTopology)
        return cls(plan_lab(topology, state.prefix), state, state_dir)

    def _build(self, detach: bool) -> None:
        plan = self.plan
        directory = write_state(self._state, self._root)
        build.create_namespaces(plan)
        emulator = self._choose_emulator()
        self._save(emulator=emulator)
        relayed = emulator == "relay"
        specs: list[RelaySpec] = []
        keys: list[str | None] = []
        owner_pid = None if detach else os.getpid()
        for region in plan.regions:
            if region.emulated and relayed:
                hops = build.node_relay_specs(plan, region, directory, owner_pid)
                specs += hops
                keys += [None] * len(hops)
            elif region.emulated:
                hop = netem.netem_args(region.intra, fraction=0.5)
                build.configure_region(plan, region, hop, offloads=False)
            else:
                build.configure_region(plan, region, build.tbf_args(region.intra))
        for link in plan.links:
            if relayed:
                specs.append(build.link_relay_spec(plan, link, directory, owner_pid))
                keys.append(link.key)
            else:
                netem.configure_netem_link(plan, link)
        self._relays = build.start_relays(specs, keys, directory)
        self._save(relays=tuple(r.record for r in self._relays))
        build.wait_ready(self._relays, directory)
        for region in plan.regions:
            if region.emulated and relayed:
                build.configure_emulated_region(plan, region)
        for link in plan.links:
            if relayed:
                build.configure_link(plan, link)
        build.install_hosts_files(plan)
        self._save(ready=True)

    def _choose_emulator(self) -> str:
        requested = self.plan.topology.emulator
        has_netem = requested != "relay" and netns.kernel_has_qdisc(
            self.plan.regions[0].netns, "netem"
        )
        try:
            return netem.choose_emulator(requested, has_netem)
        except ValueError as exc:
            raise LabError(str(exc)) from None

    def _save(self, **changes: Any) -> None:
        self._state = replace(self._state, **changes)
        write_state(self._state, self._root)

    def _install_guards(self) -> None:
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            with _GUARD_LOCK:
                if _SIGTERM_GUARD["labs"] == 0:
                    _SIGTERM_GUARD["previous"] = signal.signal(
                        signal.SIGTERM, _sigterm_to_interrupt
                    )
                _SIGTERM_GUARD["labs"] += 1
            self._guarded = True

    def _remove_guards(self) -> None:
        atexit.unregister(self.close)
        if not self._guarded:
            return
        with _GUARD_LOCK:
            _SIGTERM_GUARD["labs"] -= 1
            if _SIGTERM_GUARD["labs"] == 0:
                with contextlib.suppress(ValueError, TypeError):  # not the main thread
                    signal.signal(signal.SIGTERM, _SIGTERM_GUARD["previous"])

    def close(self) -> None:
        """Tear the lab down: processes, relays, namespaces, hosts files, state.

        Idempotent. Raises LabError if something could not be removed.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._remove_guards()
        for proc in self._procs:
            netns.stop_process(proc, grace_s=_KILL_GRACE_S)
        problems = teardown(self._state, self._root)
        for relay in self._relays:
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.proc.wait(timeout=_KILL_GRACE_S)
        if problems:
            raise LabError(f"lab {self.prefix} was not fully removed: " + "; ".join(problems))

    def __enter__(self) -> Lab:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ names

    @property
    def prefix(self) -> str:
        """This lab's prefix (part of every namespace name)."""
        return self.plan.prefix

    @property
    def state(self) -> LabState:
        """What is recorded on disk about this lab (namespaces, relays)."""
        return self._state

    @property
    def name(self) -> str:
        """The topology's name."""
        return self.plan.topology.name

    @property
    def topology(self) -> LabTopology:
        """The topology the lab was built from."""
        return self.plan.topology

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names, region by region in file order."""
        return tuple(n.name for n in self.plan.nodes)

    @property
    def regions(self) -> tuple[str, ...]:
        """Region names in file order."""
        return tuple(r.name for r in self.plan.regions)

    def address(self, node: str) -> str:
        """The node's IPv4 address (in 198.18.0.0/15); ValidationError if unknown."""
        return self.plan.node(node).address

    def netns(self, node: str) -> str:
        """The name of the node's network namespace; ValidationError if unknown."""
        return self.plan.node(node).netns

    def region_of(self, node: str) -> str:
        """The node's region; ValidationError if unknown."""
        return self.plan.node(node).region

    def ground_truth_rtt_ms(self, node_a: str, node_b: str) -> float:
        """The RTT ping should see between two nodes, in ms (configured delays, both ways)."""
        return ground_truth_rtt_ms(self.plan, node_a, node_b)

    # ------------------------------------------------------------------ processes

    def exec(
        self,
        node: str,
        argv: Sequence[str],
        *,
        timeout_s: float | None = 60.0,
        check: bool = True,
        capture: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node`` and wait for it.

        Raises LabError when it times out or (with ``check``) exits non-zero,
        DependencyError when the program is missing.
        """
        cmd = netns.netns_exec_argv(self.netns(node), argv)
        try:
            proc = subprocess.run(
                cmd,
                capture_output=capture,
                text=True,
                timeout=timeout_s,
                input=input_text,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LabError(f"{' '.join(argv)} on {node} ran over {timeout_s} s") from None
        if check and proc.returncode != 0:
            if proc.returncode == 255 and "exec of" in (proc.stderr or ""):
                raise DependencyError(f"{argv[0]} cannot be run on {node}: {proc.stderr.strip()}")
            detail = (proc.stderr or proc.stdout or "").strip()[-2000:]
            raise LabError(f"{' '.join(argv)} on {node} exited {proc.returncode}: {detail}")
        return proc

    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``node`` without waiting; the lab kills it at teardown.

        Keyword arguments go to :class:`subprocess.Popen` (the process gets its own
        session unless ``start_new_session=False``).
        """
        popen_kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[Any] = subprocess.Popen(
            netns.netns_exec_argv(self.netns(node), argv), **popen_kwargs
        )
        self._procs.append(proc)
        return proc

    # ------------------------------------------------------------------ links

    def _link_relay(self, region_a: str, region_b: str) -> str:
        key = self.plan.link(region_a, region_b).key
        for record in self._state.relays:
            if record.link == key:
                return record.control_path
        raise LabError(f"link {key} of lab {self.prefix} has no relay")

    def set_link(self, region_a: str, region_b: str, up: bool) -> None:
        """Cut (``up=False``) or restore the link between two regions, both directions.

        While cut, every packet is dropped (counted as ``link_down``); routes stay.
        """
        if self._state.emulator == "netem":
            link = self.plan.link(region_a, region_b)
            netem.set_netem_link(self.plan, link, up)
            down = set(self._state.extra.get("down_links", ())) - {link.key}
            if not up:
                down.add(link.key)
            self._save(extra={**self._state.extra, "down_links": sorted(down)})
            return
        relay_request(self._link_relay(region_a, region_b), "up" if up else "down")

    def counters(self) -> LabCounters:
        """Per link and direction: delivered packets/bytes and drops by cause."""
        links = []
        down_links = set(self._state.extra.get("down_links", ()))
        for link in self.plan.links:
            if self._state.emulator == "netem":
                up = link.key not in down_links
                links.append(netem.netem_link_counters(self.plan, link, up))
                continue
            reply = relay_request(self._link_relay(link.a, link.b), "stats")
            links.append(
                LinkCounters(
                    a=link.a,
                    b=link.b,
                    up=bool(reply.get("up", True)),
                    a_to_b=DirectionCounters.from_dict(reply.get("a_to_b", {})),
                    b_to_a=DirectionCounters.from_dict(reply.get("b_to_a", {})),
                )
            )
        return LabCounters(tuple(links))

    def describe(self) -> dict[str, Any]:
        """Nodes, addresses and links as JSON-able data (``netopt lab status --json``)."""
        return {
            "name": self.name,
            "prefix": self.prefix,
            "owner_pid": self._state.owner_pid,
            "detached": self._state.detached,
            "ready": self._state.ready,
            "nodes": [
                {"name": n.name, "region": n.region, "address": n.address, "netns": n.netns}
                for n in self.plan.nodes
            ],
            "links": [
                {
                    "between": [link.a, link.b],
                    "rate_mbps": link.spec.rate_mbps,
                    "delay_ms": link.spec.delay_ms,
                    "jitter_ms": link.spec.jitter_ms,
                    "loss_ratio": link.spec.loss_ratio,
                    "queue_bytes": link.spec.queue_bytes,
                }
                for link in self.plan.links
            ],
        }


def _sigterm_to_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")

"""The packet relay: one process per emulated link, between two TUN devices.

``python -m netopt.lab.relay SPEC.json`` opens a TUN device in each of two
network namespaces (``setns`` + ``/dev/net/tun``), prints ``ready`` on stdout,
then moves IP packets between them, each direction through a
:class:`~netopt.lab.emulator.DirectionShaper`. Packets that survive wait in a FIFO
until their arrival time (ordered per direction, so a deque does). A UNIX
socket takes one-line commands: ``stats`` (counters as JSON), ``down``/``up``
(cut or restore the link). The relay exits on SIGTERM/SIGINT, when the process
it watches exits, and its TUN devices vanish with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netopt.errors import LabError
from netopt.lab.emulator import EARLY_NS, DirectionShape, DirectionShaper
from netopt.lab.netns import enter_netns

__all__ = ["Endpoint", "RelaySpec", "main", "open_tun", "relay_request", "run_relay"]

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_PR_SET_TIMERSLACK = 29
_MAX_PACKET_BYTES = 65536
_READ_BATCH = 64
_IDLE_WAIT_S = 1.0
_PRECISE_WAIT_NS = 1_000_000
_RELAY_NICE = -10
_RELAY_RT_PRIORITY = 1


@dataclass(frozen=True)
class Endpoint:
    """A TUN device to create: its namespace and interface name."""

    netns: str
    ifname: str


@dataclass(frozen=True)
class RelaySpec:
    """Everything one relay process needs, as written to its spec file."""

    label: str
    a: Endpoint
    b: Endpoint
    a_to_b: DirectionShape
    b_to_a: DirectionShape
    control_path: str
    seed: int = 1
    watch_pid: int | None = None

    def to_json(self) -> str:
        """The spec as JSON text."""
        data = {
            "label": self.label,
            "a": vars(self.a),
            "b": vars(self.b),
            "a_to_b": self.a_to_b.to_dict(),
            "b_to_a": self.b_to_a.to_dict(),
            "control_path": self.control_path,
            "seed": self.seed,
            "watch_pid": self.watch_pid,
        }
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> RelaySpec:
        """Parse :meth:`to_json` output; ValueError/KeyError/TypeError if malformed."""
        data = json.loads(text)
        return cls(
            label=str(data["label"]),
            a=Endpoint(**data["a"]),
            b=Endpoint(**data["b"]),
            a_to_b=DirectionShape(**data["a_to_b"]),
            b_to_a=DirectionShape(**data["b_to_a"]),
            control_path=str(data["control_path"]),
            seed=int(data["seed"]),
            watch_pid=data.get("watch_pid"),
        )


def open_tun(endpoint: Endpoint) -> int:
    """Create TUN device ``endpoint.ifname`` in ``endpoint.netns``; return its fd (non-blocking).

    The device lives as long as the fd is open. Raises LabError on failure.
    """
    with enter_netns(endpoint.netns):
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            ifr = struct.pack("16sH22x", endpoint.ifname.encode(), _IFF_TUN | _IFF_NO_PI)
            fcntl.ioctl(fd, _TUNSETIFF, ifr)
        except OSError as exc:
            os.close(fd)
            raise LabError(
                f"cannot create TUN {endpoint.ifname} in {endpoint.netns}: {exc}"
            ) from exc
    return fd


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def _handle_control(server: socket.socket, shapers: dict[str, DirectionShaper]) -> None:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return
    with conn:
        conn.settimeout(0.5)
        try:
            command = conn.recv(256).decode(errors="replace").strip()
        except OSError:
            return
        if command in ("down", "up"):
            for shaper in shapers.values():
                shaper.up = command == "up"
        reply: dict[str, Any] = {
            "up": all(s.up for s in shapers.values()),
            **{name: s.stats.to_dict() for name, s in shapers.items()},
        }
        if command not in ("stats", "down", "up"):
            reply = {"error": f"unknown command {command!r}"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")


def _pump(
    src: int, dst_queue: deque[tuple[int, bytes]], shaper: DirectionShaper, rng: random.Random
) -> None:
    now = time.monotonic_ns()
    offer = shaper.offer
    draw = rng.random
    append = dst_queue.append
    for _ in range(_READ_BATCH):
        try:
            packet = os.read(src, _MAX_PACKET_BYTES)
        except BlockingIOError:
            return
        arrival = offer(now, len(packet), draw(), draw())
        if arrival >= 0:
            append((arrival, packet))


def _flush(dst: int, queue: deque[tuple[int, bytes]], shaper: DirectionShaper, due: int) -> None:
    stats = shaper.stats
    write = os.write
    popleft = queue.popleft
    packets = size_bytes = 0
    while queue and queue[0][0] <= due:
        packet = popleft()[1]
        try:
            write(dst, packet)
        except OSError:  # the far device is down: the packet is lost with the link
            stats.drops_link_down += 1
            continue
        packets += 1
        size_bytes += len(packet)
    stats.packets += packets
    stats.bytes += size_bytes


def _timeout_s(q_ab: deque[tuple[int, bytes]], q_ba: deque[tuple[int, bytes]], now: int) -> float:
    if q_ab:
        next_ns = min(q_ab[0][0], q_ba[0][0]) if q_ba else q_ab[0][0]
    elif q_ba:
        next_ns = q_ba[0][0]
    else:
        return _IDLE_WAIT_S
    wait_ns = next_ns - now - EARLY_NS
    if wait_ns > 2 * _PRECISE_WAIT_NS:
        # Long sleeps wake late (deep idle states); finish with a short one.
        wait_ns -= _PRECISE_WAIT_NS
    return wait_ns / 1e9 if wait_ns > 0 else 0.0


def run_relay(spec: RelaySpec, fd_a: int, fd_b: int, server: socket.socket) -> None:
    """Relay packets until SIGTERM/SIGINT or the watched process exits."""
    rng_ab = random.Random(f"{spec.seed}:{spec.label}:a_to_b")
    rng_ba = random.Random(f"{spec.seed}:{spec.label}:b_to_a")
    ab, ba = DirectionShaper(spec.a_to_b), DirectionShaper(spec.b_to_a)
    q_ab: deque[tuple[int, bytes]] = deque()
    q_ba: deque[tuple[int, bytes]] = deque()
    shapers = {"a_to_b": ab, "b_to_a": ba}
    watch_fd = os.pidfd_open(spec.watch_pid) if spec.watch_pid else -1
    server_fd = server.fileno()
    readers = [fd_a, fd_b, server_fd] + ([watch_fd] if watch_fd >= 0 else [])
    clock_ns, wait = time.monotonic_ns, select.select
    try:
        while True:
            # Packets due within EARLY_NS go now: one wake-up serves a burst.
            due = clock_ns() + EARLY_NS
            if q_ab:
                _flush(fd_b, q_ab, ab, due)
            if q_ba:
                _flush(fd_a, q_ba, ba, due)
            ready = wait(readers, [], [], _timeout_s(q_ab, q_ba, due - EARLY_NS))[0]
            for fd in ready:
                if fd == fd_a:
                    _pump(fd_a, q_ab, ab, rng_ab)
                elif fd == fd_b:
                    _pump(fd_b, q_ba, ba, rng_ba)
                elif fd == server_fd:
                    _handle_control(server, shapers)
                else:
                    return  # the watched process exited
    finally:
        if watch_fd >= 0:
            os.close(watch_fd)


def relay_request(
    control_path: str | os.PathLike[str], command: str, *, timeout_s: float = 2.0
) -> Any:
    """Send one command to a running relay and return its JSON reply.

    Raises LabError if the relay does not answer.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(os.fspath(control_path))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError as exc:
        raise LabError(f"relay at {control_path} did not answer {command!r}: {exc}") from None
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        raise LabError(f"relay at {control_path} answered {command!r} badly") from None


def _raise_priority() -> None:
    """The relay is the lab's wire: a busy machine should delay it as little as possible.

    Real-time round-robin at the lowest priority preempts ordinary processes on
    wake-up (the kernel still keeps 5% of each CPU for them); without the
    privilege, a high nice value is the fallback.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(_RELAY_RT_PRIORITY))
    except OSError:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, _RELAY_NICE)


def _set_timer_slack_ns(slack_ns: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m netopt.lab.relay SPEC.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m netopt.lab.relay SPEC.json", file=sys.stderr)
        return 2
    spec = RelaySpec.from_json(Path(args[0]).read_text(encoding="utf-8"))
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _set_timer_slack_ns(1000)  # wake up on time: delay accuracy is the point
    _raise_priority()
    try:
        fd_a, fd_b = open_tun(spec.a), open_tun(spec.b)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.control_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(spec.control_path)
        server.listen(8)
        server.setblocking(False)
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        run_relay(spec, fd_a, fd_b, server)
    except _Stop:
        pass
    except LabError as exc:
        print(f"relay {spec.label}: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(OSError):
            os.unlink(spec.control_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

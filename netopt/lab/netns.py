"""Thin wrappers over ``ip``, ``tc`` and ``setns(2)``: the lab's system edge.

Every failure of a tool becomes a :class:`~netopt.errors.LabError` carrying the
command and its stderr; a missing tool becomes a DependencyError.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from netopt.errors import DependencyError, LabError, PermissionDeniedError
from netopt.fsutil import atomic_write_bytes

__all__ = [
    "NETNS_DIR",
    "NETNS_ETC_DIR",
    "add_netns",
    "delete_netns",
    "enter_netns",
    "has_net_admin",
    "ip_batch",
    "kernel_has_qdisc",
    "kill_pids",
    "list_netns",
    "netns_exec_argv",
    "netns_pids",
    "pid_alive",
    "remove_hosts_file",
    "require_net_admin",
    "run",
    "stop_process",
    "write_hosts_file",
]

NETNS_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
_CAP_NET_ADMIN = 12
_CLONE_NEWNET = 0x40000000


def has_net_admin() -> bool:
    """Whether this process holds CAP_NET_ADMIN (root normally does)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def require_net_admin(what: str = "the lab") -> None:
    """Raise PermissionDeniedError (exit code 2) unless CAP_NET_ADMIN is held."""
    if not has_net_admin():
        raise PermissionDeniedError(
            f"{what} needs CAP_NET_ADMIN to create network namespaces: run as root "
            "(for example with sudo)"
        )


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = 15.0,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a system tool, capturing its output.

    Raises DependencyError if the tool is missing, LabError if it times out or
    (with ``check``) exits non-zero.
    """
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            check=False,
        )
    except FileNotFoundError:
        raise DependencyError(f"{argv[0]} is not installed (needed by netopt lab)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)} did not finish within {timeout_s:g} s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LabError(f"{' '.join(argv)} failed (exit {proc.returncode}): {detail}")
    return proc


def ip_batch(netns: str | None, commands: Iterable[str]) -> None:
    """Run ``ip`` commands (one per line, without the leading ``ip``) in one process."""
    text = "\n".join(commands) + "\n"
    argv = ["ip", "-batch", "-"] if netns is None else ["ip", "-n", netns, "-batch", "-"]
    run(argv, input_text=text)


def netns_exec_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``netns`` (with its /etc/netns/<netns> files bound over /etc)."""
    return ["ip", "netns", "exec", netns, *argv]


def list_netns() -> set[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    try:
        return {p.name for p in NETNS_DIR.iterdir()}
    except FileNotFoundError:
        return set()


def add_netns(name: str) -> None:
    """Create a named namespace with its loopback up; LabError if it exists already."""
    if name in list_netns():
        raise LabError(f"network namespace {name} already exists")
    run(["ip", "netns", "add", name])
    ip_batch(name, ["link set lo up"])


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name``."""
    proc = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists (zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def kill_pids(pids: Iterable[int], *, grace_s: float = 2.0) -> None:
    """SIGTERM ``pids``, wait up to ``grace_s``, then SIGKILL the survivors."""
    targets = [p for p in pids if p > 1 and p != os.getpid()]
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        targets = [p for p in targets if pid_alive(p)]
        if not targets:
            return
        time.sleep(0.02)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_process(proc: subprocess.Popen[Any], *, grace_s: float = 2.0) -> None:
    """Stop a started process (its whole group if it leads one): SIGTERM, then SIGKILL.

    Waits up to ``grace_s`` after each signal and closes the pipes the caller left open.
    """
    if proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _leads_group(proc.pid):
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
                break
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def delete_netns(name: str) -> None:
    """Kill every process in namespace ``name``, then delete it. Missing is fine."""
    if name not in list_netns():
        return
    kill_pids(netns_pids(name))
    run(["ip", "netns", "delete", name], check=False)


_NSSWITCH = "".join(
    f"{db}: files\n"
    for db in ("passwd", "group", "shadow", "hosts", "networks", "protocols", "services")
)
_RESOLV_CONF = "# netopt lab: names come from /etc/hosts\nnameserver 127.0.0.1\n"


def _write_atomic(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_hosts_file(netns: str, text: str) -> Path:
    """Install ``text`` as /etc/hosts for processes started with ``ip netns exec netns``.

    Name lookups there use that file only (an nsswitch.conf of ``files``), so
    they never wait on a DNS server the lab cannot reach.
    """
    directory = NETNS_ETC_DIR / netns
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / "nsswitch.conf", _NSSWITCH)
    _write_atomic(directory / "resolv.conf", _RESOLV_CONF)
    path = directory / "hosts"
    _write_atomic(path, text)
    return path


def remove_hosts_file(netns: str) -> None:
    """Remove /etc/netns/<netns> (only that lab directory)."""
    shutil.rmtree(NETNS_ETC_DIR / netns, ignore_errors=True)
    with contextlib.suppress(OSError):
        NETNS_ETC_DIR.rmdir()  # only when empty: other labs may still use it


def kernel_has_qdisc(netns: str, kind: str) -> bool:
    """Whether the kernel offers qdisc ``kind`` (tried on ``lo`` of ``netns``, then removed)."""
    proc = run(["tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", kind], check=False)
    if proc.returncode != 0:
        return False
    run(["tc", "-n", netns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return True


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@contextlib.contextmanager
def enter_netns(name: str) -> Iterator[None]:
    """Move the calling thread into namespace ``name`` for the ``with`` block.

    Sockets and TUN devices opened inside stay in that namespace after the block.
    Raises LabError if the namespace is missing or setns(2) fails.
    """
    libc = _libc()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(NETNS_DIR / name, os.O_RDONLY)
        except FileNotFoundError:
            raise LabError(f"network namespace {name} does not exist") from None
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise LabError(f"setns({name}) failed: {os.strerror(err)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:  # pragma: no cover - cannot fail as root
                raise LabError("could not return to the original network namespace")
    finally:
        os.close(own)

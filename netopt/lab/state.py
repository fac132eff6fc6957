"""What a running lab leaves on disk, so that any process can find and remove it.

Each lab has a directory ``<state root>/<prefix>/`` (state root:
``$NETOPT_LAB_STATE_DIR`` or ``/run/netopt-lab``) holding ``state.json``, the
relays' spec files, control sockets and logs. The state is written before
anything is built and updated as things are, so a lab killed half-way can
still be torn down (``netopt lab down``, or the next ``Lab.start`` when the
owner is dead).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from netopt.errors import LabError, ValidationError
from netopt.fsutil import atomic_write_bytes
from netopt.lab import netns

__all__ = [
    "DEFAULT_STATE_ROOT",
    "LabState",
    "RelayRecord",
    "find_lab",
    "list_labs",
    "read_state",
    "state_root",
    "teardown",
    "write_state",
]

DEFAULT_STATE_ROOT = Path("/run/netopt-lab")
_STATE_FILE = "state.json"
_RELAY_MODULE = "netopt.lab.relay"


def state_root() -> Path:
    """Where lab state lives: ``$NETOPT_LAB_STATE_DIR`` or ``/run/netopt-lab``."""
    return Path(os.environ.get("NETOPT_LAB_STATE_DIR") or DEFAULT_STATE_ROOT)


@dataclass(frozen=True)
class RelayRecord:
    """One relay process: what it emulates and how to reach it."""

    label: str
    pid: int
    control_path: str
    link: str | None = None
    """``"a-b"`` for an inter-region link, None for an intra-region hop."""


@dataclass(frozen=True)
class LabState:
    """A lab as recorded on disk."""

    prefix: str
    name: str
    topology: dict[str, Any]
    owner_pid: int
    detached: bool
    namespaces: tuple[str, ...]
    relays: tuple[RelayRecord, ...] = ()
    ready: bool = False
    created_at_s: float = 0.0
    emulator: str = "relay"
    extra: dict[str, Any] = field(default_factory=dict)

    def with_relay(self, record: RelayRecord) -> LabState:
        """A copy with one more relay."""
        return replace(self, relays=(*self.relays, record))

    @property
    def stale(self) -> bool:
        """True for an attached lab whose owner process has gone."""
        return not self.detached and not netns.pid_alive(self.owner_pid)


def _dir(prefix: str, root: Path | None) -> Path:
    return (root or state_root()) / prefix


def write_state(state: LabState, root: Path | None = None) -> Path:
    """Write ``state`` atomically (temp file, fsync, rename); return the lab's directory."""
    directory = _dir(state.prefix, root)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_bytes(directory / _STATE_FILE, json.dumps(asdict(state), indent=2).encode())
    return directory


def read_state(directory: Path) -> LabState:
    """Read a lab's ``state.json``; LabError if it is missing or malformed."""
    try:
        data = json.loads((directory / _STATE_FILE).read_text(encoding="utf-8"))
        relays = tuple(RelayRecord(**r) for r in data.pop("relays", ()))
        return LabState(
            **{
                **data,
                "namespaces": tuple(data["namespaces"]),
                "relays": relays,
            }
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LabError(f"cannot read lab state in {directory}: {exc}") from None


def list_labs(root: Path | None = None) -> list[LabState]:
    """Every lab with a readable state file, oldest first."""
    base = root or state_root()
    labs: list[LabState] = []
    if not base.is_dir():
        return labs
    for directory in sorted(base.iterdir()):
        if (directory / _STATE_FILE).is_file():
            with contextlib.suppress(LabError):
                labs.append(read_state(directory))
    return sorted(labs, key=lambda s: s.created_at_s)


def find_lab(name: str | None, root: Path | None = None) -> LabState:
    """The lab called ``name`` (its topology name or its prefix), or the only lab.

    Raises ValidationError when none matches or the choice is ambiguous.
    """
    labs = list_labs(root)
    if name is not None:
        labs = [s for s in labs if name in (s.name, s.prefix)]
    if len(labs) == 1:
        return labs[0]
    if not labs:
        what = f"named {name!r} " if name else ""
        raise ValidationError(f"no lab {what}is up (see `netopt lab status`)")
    choices = ", ".join(f"{s.prefix} ({s.name})" for s in labs)
    raise ValidationError(f"several labs are up, name one of: {choices}")


def _is_relay(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return _RELAY_MODULE.encode() in cmdline


def teardown(state: LabState, root: Path | None = None) -> list[str]:
    """Remove everything ``state`` records: processes, relays, namespaces, files.

    Keeps going past failures; returns what could not be removed (empty when
    all went). Only the recorded namespaces (and the processes inside them) and
    relay pids (checked to be relays) are touched.
    """
    problems: list[str] = []
    netns.kill_pids([r.pid for r in state.relays if _is_relay(r.pid)], grace_s=3.0)
    for name in state.namespaces:
        try:
            netns.delete_netns(name)
        except LabError as exc:
            problems.append(str(exc))
        netns.remove_hosts_file(name)
    left = sorted(set(state.namespaces) & netns.list_netns())
    problems += [f"namespace {name} is still there" for name in left]
    problems += [f"relay {r.pid} is still running" for r in state.relays if _is_relay(r.pid)]
    if not problems:
        shutil.rmtree(_dir(state.prefix, root), ignore_errors=True)
    return problems

"""``netopt doctor --apply`` and ``--undo``: the safe sysctl fixes, on this node only.

:func:`plan_changes` (pure) picks, from the findings, the sysctls on the safe
list whose value would change. :func:`apply_changes` needs root: it writes an
undo file (JSON of the old values) before touching anything, then each value.
:func:`undo_changes` writes the old values back exactly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netopt.doctor.findings import Finding
from netopt.doctor.sysctl import read_sysctl, write_sysctl
from netopt.errors import NetoptError, PermissionDeniedError, ValidationError
from netopt.fsutil import atomic_write_bytes

__all__ = [
    "SAFE_SYSCTLS",
    "UNDO_FORMAT",
    "AppliedChange",
    "SysctlChange",
    "apply_changes",
    "plan_changes",
    "read_undo_file",
    "require_root",
    "undo_changes",
]

SAFE_SYSCTLS = frozenset(
    {
        "net.core.rmem_max",
        "net.core.wmem_max",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_congestion_control",
        "net.ipv4.tcp_mtu_probing",
        "net.ipv4.tcp_slow_start_after_idle",
    }
)
UNDO_FORMAT = "netopt-doctor-undo/1"


@dataclass(frozen=True)
class SysctlChange:
    """One sysctl to set: its current value and the new one."""

    name: str
    old: str
    new: str


@dataclass(frozen=True)
class AppliedChange:
    """What happened to one change (``error`` empty when it took)."""

    change: SysctlChange
    error: str = ""

    def to_dict(self) -> dict[str, str]:
        """JSON-able form."""
        return {
            "sysctl": self.change.name,
            "old": self.change.old,
            "new": self.change.new,
            "error": self.error,
        }


def require_root(what: str) -> None:
    """PermissionDeniedError unless this process runs as root."""
    if os.geteuid() != 0:
        raise PermissionDeniedError(f"{what} needs root (it writes sysctls); nothing was changed")


def plan_changes(
    findings: Iterable[Finding], current: Mapping[str, str | None]
) -> list[SysctlChange]:
    """Safe sysctls the findings ask for whose value differs from ``current`` (pure).

    A name asked for twice keeps its first value (findings come ranked); names
    off the safe list or unreadable now (None) are left out.
    """
    wanted: dict[str, str] = {}
    for finding in findings:
        for name, value in finding.sysctls:
            if name in SAFE_SYSCTLS:
                wanted.setdefault(name, value)
    changes = []
    for name, value in wanted.items():
        old = current.get(name)
        if old is not None and " ".join(value.split()) != old:
            changes.append(SysctlChange(name, old, value))
    return changes


def _netns_id() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "?"


def apply_changes(
    changes: Iterable[SysctlChange],
    undo_path: Path,
    write: Callable[[str, str], None] = write_sysctl,
) -> list[AppliedChange]:
    """Write the undo file (atomically), then each change; a failed one is reported, not raised.

    Raises PermissionDeniedError when not root, StorageError if the undo file
    cannot be written (then nothing was changed).
    """
    require_root("--apply")
    todo = list(changes)
    document = {
        "format": UNDO_FORMAT,
        "created_at_s": time.time(),
        "netns": _netns_id(),
        "values": {c.name: c.old for c in todo},
    }
    atomic_write_bytes(undo_path, (json.dumps(document, indent=2) + "\n").encode(), 0o600)
    results = []
    for change in todo:
        try:
            write(change.name, change.new)
        except NetoptError as exc:
            results.append(AppliedChange(change, str(exc)))
        else:
            results.append(AppliedChange(change))
    return results


def read_undo_file(path: Path) -> dict[str, str]:
    """The old values an undo file holds; ValidationError if it is not one of ours."""
    try:
        document: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{path}: not a readable undo file ({exc})") from None
    values = document.get("values") if isinstance(document, dict) else None
    if document.get("format") != UNDO_FORMAT or not isinstance(values, dict):
        raise ValidationError(f"{path}: not a netopt doctor undo file (format {UNDO_FORMAT})")
    for name, value in values.items():
        if name not in SAFE_SYSCTLS or not isinstance(value, str):
            raise ValidationError(f"{path}: refuses to restore {name!r} (not a safe sysctl)")
    if document.get("netns") not in (None, "?", _netns_id()):
        raise ValidationError(
            f"{path} was written in network namespace {document['netns']}, "
            f"this is {_netns_id()}: run --undo where --apply ran"
        )
    return {str(k): str(v) for k, v in values.items()}


def undo_changes(
    path: Path,
    write: Callable[[str, str], None] = write_sysctl,
    read: Callable[[str], str | None] = read_sysctl,
) -> list[AppliedChange]:
    """Restore every value of the undo file at ``path``.

    Raises PermissionDeniedError when not root, ValidationError for a bad file.
    """
    require_root("--undo")
    results = []
    for name, old in read_undo_file(path).items():
        change = SysctlChange(name, read(name) or "", old)
        try:
            write(name, old)
        except NetoptError as exc:
            results.append(AppliedChange(change, str(exc)))
        else:
            results.append(AppliedChange(change))
    return results

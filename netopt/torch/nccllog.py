"""Did NCCL read and accept the variables an env file set? Judged from its ``NCCL_DEBUG=INFO`` log.

Pure functions over the log text. NCCL reports the variables it reads in a few forms
(NVIDIA/nccl ``src/misc/param.cc`` ``ncclLoadParam``, the ``NCCL_PARAM`` macro of older
releases, ``src/misc/socket.cc``, ``src/net.cc``)::

    NCCL INFO NCCL_BUFFSIZE set by environment to 33554432.
    NCCL INFO Invalid value 4x for NCCL_BUFFSIZE, using default 4194304.
    NCCL INFO NCCL_SOCKET_IFNAME set by environment to =eth0
    NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>
    NCCL INFO Bootstrap : Using eth0:192.0.2.2<0>
    NCCL INFO Using network Socket

A variable counts as *accepted* only where the log shows NCCL read the value that was
set (or, for the interface, family and network, used exactly what was asked). It is
*rejected* on an "Invalid value", a different value read, a fallback (another interface,
family or network used), or any line that names it beside a marker such as "invalid",
"ignored", "unknown" or "deprecated", or in a ``NCCL WARN`` line. A variable the log never
mentions is *not echoed*: NCCL reads many of them only on paths a run may not take
(socket threads only when ranks connect over its network), so it cannot be confirmed
from that log -- listed as such, never passed off as accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from netopt.nccl import domains

__all__ = [
    "EnvCheck",
    "Status",
    "VarVerdict",
    "check_env_log",
    "ifname_admits",
    "loaded_variables",
    "merge_checks",
    "parse_env0",
]

Status = Literal["accepted", "rejected", "not_echoed"]
Reader = Literal["nccl", "torch"]

_SET_RE = re.compile(r"NCCL INFO (?P<name>[A-Z][A-Z0-9_]+) set by environment to (?P<value>.*)$")
_INVALID_RE = re.compile(r"Invalid value (?P<value>.*?) for (?P<name>[A-Z][A-Z0-9_]+)")
_NET_SOCKET_RE = re.compile(r"NET/Socket\s*: Using (?P<list>.*)$")
_NET_SOCKET_ITEM_RE = re.compile(r"\[\d+\](?P<ifname>[^:\s]+):(?P<address>\S+)")
_BOOTSTRAP_RE = re.compile(r"Bootstrap\s*: Using (?P<ifname>[^:\s]+):(?P<address>\S+)")
_NETWORK_RE = re.compile(r"Using network (?P<net>\S+)")
_NO_INTERFACE_RE = re.compile(r"no (usable )?(listening )?(socket )?interface found", re.I)
_NETWORK_MISSING_RE = re.compile(r"network (?P<net>\S+) not found", re.I)
_MARKERS = (
    "invalid",
    "ignor",
    "unknown",
    "unsupported",
    "not supported",
    "deprecated",
    "out of range",
    "too low",
    "too high",
    "not found",
)
_FAMILIES = {"AF_INET": 4, "AF_INET6": 6}


@dataclass(frozen=True)
class VarVerdict:
    """One variable the env file set: who reads it, what the log says, and the line(s) why."""

    name: str
    value: str
    reader: Reader
    status: Status
    evidence: str


@dataclass(frozen=True)
class EnvCheck:
    """Every variable's verdict, in the env file's order."""

    verdicts: tuple[VarVerdict, ...]

    def named(self, status: Status) -> tuple[str, ...]:
        """The names with ``status``."""
        return tuple(v.name for v in self.verdicts if v.status == status)


def parse_env0(data: bytes) -> dict[str, str]:
    """``env -0`` output as a mapping (entries without ``=`` are skipped)."""
    out: dict[str, str] = {}
    for entry in data.decode("utf-8", "replace").split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name:
            out[name] = value
    return out


def loaded_variables(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """What sourcing a file added or changed, sorted by name (bash's own ones left out)."""
    shell_own = {"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING"}
    return {
        name: after[name]
        for name in sorted(after)
        if name not in shell_own and before.get(name) != after[name]
    }


def ifname_admits(value: str, ifname: str) -> bool:
    """Whether ``NCCL_SOCKET_IFNAME=value`` lets NCCL use ``ifname`` (socket.cc matchIfList):
    a comma list of prefixes; ``=`` makes them exact names; ``^`` turns it into exclusions."""
    exclude = value.startswith("^")
    body = value.removeprefix("^")
    exact = body.startswith("=")
    names = [n for n in body.removeprefix("=").split(",") if n]
    hit = any(ifname == n if exact else ifname.startswith(n) for n in names)
    return not hit if exclude else hit


def _reader(name: str) -> Reader:
    spec = domains.VARIABLES.get(name)
    if spec is not None:
        return spec.reader
    return "nccl" if name.startswith("NCCL_") else "torch"


def _mentions(name: str, line: str) -> bool:
    return re.search(rf"(?<![A-Z0-9_]){re.escape(name)}(?![A-Z0-9_])", line) is not None


def _same_value(echoed: str, value: str) -> bool:
    echoed = echoed.strip()
    if echoed in (value, value + "."):
        return True
    try:  # ncclLoadParam prints the int64 it parsed, then a full stop
        return int(echoed.removesuffix("."), 0) == int(value, 0)
    except ValueError:
        return False


def _used_interfaces(lines: Iterable[str]) -> list[tuple[str, str, str]]:
    """(ifname, address, line) for each interface NCCL says it uses."""
    used: list[tuple[str, str, str]] = []
    for line in lines:
        if match := _NET_SOCKET_RE.search(line):
            used += [
                (m["ifname"], m["address"], line)
                for m in _NET_SOCKET_ITEM_RE.finditer(match["list"])
            ]
        elif match := _BOOTSTRAP_RE.search(line):
            used.append((match["ifname"], match["address"], line))
    return used


def _family(address: str) -> int:
    return 6 if ":" in address.split("<")[0] or address.startswith("[") else 4


def _rejection(name: str, value: str, lines: list[str]) -> str | None:
    for line in lines:
        invalid = _INVALID_RE.search(line)
        if invalid and invalid["name"] == name:
            return line
        if not _mentions(name, line):
            continue
        if "NCCL WARN" in line:
            return line
        echo = _SET_RE.search(line)
        if echo and echo["name"] == name and not _same_value(echo["value"], value):
            return f"NCCL read {echo['value'].strip()!r}, the file sets {value!r}: {line}"
        lowered = line.lower()
        if not echo and any(marker in lowered for marker in _MARKERS):
            return line
    return None


def _echo(name: str, value: str, lines: list[str]) -> str | None:
    for line in lines:
        echo = _SET_RE.search(line)
        if echo and echo["name"] == name and _same_value(echo["value"], value):
            return line
    return None


def _usage_verdict(name: str, value: str, lines: list[str]) -> tuple[Status, str] | None:
    """What the interface, family and network NCCL used say about the variable."""
    used = _used_interfaces(lines)
    if name == "NCCL_SOCKET_IFNAME":
        if any(_NO_INTERFACE_RE.search(line) for line in lines):
            return "rejected", next(ln for ln in lines if _NO_INTERFACE_RE.search(ln))
        stray = [(i, line) for i, _, line in used if not ifname_admits(value, i)]
        if stray:
            return "rejected", f"NCCL fell back to {stray[0][0]}: {stray[0][1]}"
        if used:
            return "accepted", used[0][2]
    if name == "NCCL_SOCKET_FAMILY":
        wanted = _FAMILIES.get(value)
        if wanted is None:
            return "rejected", f"{value!r} is neither AF_INET nor AF_INET6: NCCL ignores it"
        stray = [(a, line) for _, a, line in used if _family(a) != wanted]
        if stray:
            return "rejected", f"NCCL used IPv{_family(stray[0][0])}: {stray[0][1]}"
    if name == "NCCL_NET":
        for line in lines:
            if (missing := _NETWORK_MISSING_RE.search(line)) and missing[
                "net"
            ].lower() == value.lower():
                return "rejected", line
            if match := _NETWORK_RE.search(line):
                if match["net"].lower() != value.lower():
                    return "rejected", f"NCCL used network {match['net']}: {line}"
                return "accepted", line
    return None


def _verdict(name: str, value: str, lines: list[str], elsewhere: Mapping[str, str]) -> VarVerdict:
    reader = _reader(name)
    rejected = _rejection(name, value, lines)
    if rejected is not None:
        return VarVerdict(name, value, reader, "rejected", rejected.strip())
    usage = _usage_verdict(name, value, lines)
    if usage is not None and usage[0] == "rejected":
        return VarVerdict(name, value, reader, "rejected", usage[1].strip())
    echoed = _echo(name, value, lines)
    if echoed is not None:
        return VarVerdict(name, value, reader, "accepted", echoed.strip())
    if usage is not None:
        return VarVerdict(name, value, reader, "accepted", usage[1].strip())
    if name in elsewhere:
        return VarVerdict(name, value, reader, "accepted", elsewhere[name])
    why = (
        "not echoed by NCCL (cannot be confirmed from the log)"
        if reader == "nccl"
        else "read by PyTorch/Gloo, not NCCL: not in NCCL's log (cannot be confirmed from it)"
    )
    return VarVerdict(name, value, reader, "not_echoed", why)


def check_env_log(
    env: Mapping[str, str], log_text: str, confirmed_elsewhere: Mapping[str, str] | None = None
) -> EnvCheck:
    """A verdict for each of ``env`` (what the env file set) from ``log_text``.

    ``confirmed_elsewhere`` maps a name to evidence gathered outside NCCL's log (a Gloo
    group that formed on GLOO_SOCKET_IFNAME); it counts only where the log rejects nothing.
    """
    lines = log_text.splitlines()
    elsewhere = confirmed_elsewhere or {}
    return EnvCheck(tuple(_verdict(k, v, lines, elsewhere) for k, v in env.items()))


_RANK: dict[Status, int] = {"rejected": 2, "accepted": 1, "not_echoed": 0}


def merge_checks(first: EnvCheck, second: EnvCheck) -> EnvCheck:
    """Two runs' verdicts together: a rejection in either wins, then an acceptance."""
    theirs = {v.name: v for v in second.verdicts}
    merged = []
    for mine in first.verdicts:
        other = theirs.get(mine.name)
        if other is not None and _RANK[other.status] > _RANK[mine.status]:
            mine = replace(mine, status=other.status, evidence=other.evidence)
        merged.append(mine)
    return EnvCheck(tuple(merged))

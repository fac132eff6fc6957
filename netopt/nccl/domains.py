"""NCCL's (and PyTorch's) environment variables: documented domains and versions.

One row per variable netopt may emit, with the range of library versions that
read it and the values it accepts, taken from NCCL's documentation
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) and source (cited in
``source``). The tuner asks :func:`reads` before emitting a variable; tests run
:func:`check_value` / :func:`check_settings` over everything emitted.

Where a version is given as "since", it is the first release known to read the
variable; a few are conservative (the first release whose docs or source show it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from netopt.errors import ValidationError
from netopt.names import is_ifname
from netopt.nccl.model import EnvValue, NcclSettings, NcclVersion

__all__ = [
    "ALGO_NAMES",
    "COLLECTIVE_NAMES",
    "EXACT_IFNAME_SINCE",
    "MAX_SOCKETS",
    "MAX_THREADS",
    "PER_COLLECTIVE_ALGO_SINCE",
    "VARIABLES",
    "VarSpec",
    "check_settings",
    "check_value",
    "reads",
]

Kind = Literal["int", "pow2", "enum", "nccl_ifname", "gloo_ifname", "nccl_algo", "path"]
Reader = Literal["nccl", "torch"]

MAX_THREADS = 16
"""net_socket.cc ``MAX_THREADS``: NCCL_SOCKET_NTHREADS is capped at 16."""
MAX_SOCKETS = 64
"""net_socket.cc ``MAX_SOCKETS``: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64."""
MAX_CHANNELS = 32
"""Channel/CTA counts stay within 1..32 (MAXCHANNELS of the 2.x releases we target)."""

EXACT_IFNAME_SINCE: NcclVersion = (2, 5, 6)
"""'=' (exact interface name) in NCCL_SOCKET_IFNAME: NVIDIA/nccl PR #236 (merged
July 2019, after 2.4.8's docs); 2.5.6 is the first release we rely on for it."""
PER_COLLECTIVE_ALGO_SINCE: NcclVersion = (2, 24, 3)
"""``NCCL_ALGO="allreduce:ring;broadcast:tree"`` (src/graph/tuning.cc parseList)."""

COLLECTIVE_NAMES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
"""Prefixes NCCL_ALGO accepts (ncclFuncStr, compared case-insensitively)."""
ALGO_NAMES = ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
"""Algorithms NCCL_ALGO accepts (ncclAlgoStr, compared case-insensitively)."""


@dataclass(frozen=True)
class VarSpec:
    """One variable: who reads it, from which version, and which values it takes."""

    name: str
    reader: Reader
    kind: Kind
    since: NcclVersion
    until: NcclVersion | None = None  # first version that no longer reads it
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    source: str = ""


VARIABLES: dict[str, VarSpec] = {
    spec.name: spec
    for spec in (
        VarSpec(
            "NCCL_SOCKET_IFNAME",
            "nccl",
            "nccl_ifname",
            (2, 0, 0),
            source="env.html NCCL_SOCKET_IFNAME; src/misc/socket.cc ncclFindInterfaces",
        ),
        VarSpec(
            "NCCL_SOCKET_FAMILY",
            "nccl",
            "enum",
            (2, 4, 2),
            choices=("AF_INET", "AF_INET6"),
            source="socket.cc/socket.h envSocketFamily: strcmp AF_INET / AF_INET6",
        ),
        VarSpec(
            "NCCL_SOCKET_NTHREADS",
            "nccl",
            "int",
            (2, 4, 8),
            lo=1,
            hi=MAX_THREADS,
            source="net_socket.cc NCCL_PARAM(SocketNthreads); MAX_THREADS 16",
        ),
        VarSpec(
            "NCCL_NSOCKS_PERTHREAD",
            "nccl",
            "int",
            (2, 4, 8),
            lo=1,
            hi=MAX_SOCKETS,
            source="net_socket.cc NCCL_PARAM(SocketNsocksPerThread); product <= MAX_SOCKETS 64",
        ),
        VarSpec(
            "NCCL_BUFFSIZE",
            "nccl",
            "pow2",
            (2, 0, 0),
            lo=64 * 1024,
            hi=1 << 30,
            source="env.html NCCL_BUFFSIZE: bytes, default 4 MiB, powers of 2 recommended",
        ),
        VarSpec(
            "NCCL_MIN_NCHANNELS",
            "nccl",
            "int",
            (2, 5, 6),
            lo=1,
            hi=MAX_CHANNELS,
            source="env.html NCCL_MIN_NCHANNELS (formerly NCCL_MIN_NRINGS)",
        ),
        VarSpec(
            "NCCL_MIN_CTAS",
            "nccl",
            "int",
            (2, 17, 1),
            lo=1,
            hi=MAX_CHANNELS,
            source="env.html NCCL_MIN_CTAS (since 2.17, ncclConfig_t minCTAs)",
        ),
        VarSpec(
            "NCCL_ALGO",
            "nccl",
            "nccl_algo",
            (2, 5, 6),
            source="env.html NCCL_ALGO; src/graph/tuning.cc parseList (per collective 2.24+)",
        ),
        VarSpec(
            "NCCL_SOCKET_RETRY_CNT",
            "nccl",
            "int",
            (2, 24, 3),
            lo=0,
            hi=1000,
            source="socket.cc NCCL_PARAM(RetryCnt, 34); retries reworked in 2.24 (nccl#1515)",
        ),
        VarSpec(
            "NCCL_SOCKET_RETRY_SLEEP_MSEC",
            "nccl",
            "int",
            (2, 24, 3),
            lo=1,
            hi=60_000,
            source="socket.cc NCCL_PARAM(RetryTimeOut, 100); retry i sleeps i x this",
        ),
        VarSpec(
            "NCCL_IB_DISABLE",
            "nccl",
            "enum",
            (2, 0, 0),
            choices=("0", "1"),
            source="env.html NCCL_IB_DISABLE",
        ),
        VarSpec(
            "NCCL_NET",
            "nccl",
            "enum",
            (2, 10, 3),
            choices=("Socket", "IB"),
            source="env.html NCCL_NET (since 2.10): name of the network module",
        ),
        VarSpec(
            "NCCL_TUNER_CONFIG_FILE",
            "nccl",
            "path",
            (2, 19, 3),
            source="ext-tuner/example/plugin.c getenv; tuner plugins since 2.19",
        ),
        VarSpec(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "torch",
            "enum",
            (2, 2, 0),
            choices=("0", "1", "2", "3"),
            source="torch/csrc/distributed/c10d ProcessGroupNCCL (renamed in PyTorch 2.2)",
        ),
        VarSpec(
            "NCCL_ASYNC_ERROR_HANDLING",
            "torch",
            "enum",
            (1, 10, 0),
            choices=("0", "1"),
            source="PyTorch before 2.2 (still read, deprecated, later)",
        ),
        VarSpec(
            "GLOO_SOCKET_IFNAME",
            "torch",
            "gloo_ifname",
            (1, 0, 0),
            source="torch ProcessGroupGloo: comma-separated exact interface names",
        ),
    )
}


def _at_least(version: NcclVersion, since: NcclVersion) -> bool:
    return version >= since


def reads(name: str, nccl_version: NcclVersion, torch_version: NcclVersion) -> bool:
    """Whether the library version that owns ``name`` reads it."""
    spec = VARIABLES[name]
    version = nccl_version if spec.reader == "nccl" else torch_version
    if not _at_least(version, spec.since):
        return False
    return spec.until is None or version < spec.until


def check_value(
    key: str, value: str, nccl_version: NcclVersion, torch_version: NcclVersion
) -> None:
    """Raise ValidationError unless ``key=value`` is in the variable's documented domain
    and the given library version reads ``key``."""
    spec = VARIABLES.get(key)
    if spec is None:
        raise ValidationError(f"{key} is not in netopt's table of documented variables")
    if not reads(key, nccl_version, torch_version):
        owner = "NCCL" if spec.reader == "nccl" else "PyTorch"
        shown = ".".join(map(str, nccl_version if spec.reader == "nccl" else torch_version))
        raise ValidationError(f"{key} is not read by {owner} {shown} ({spec.source})")
    _check_domain(spec, value, nccl_version)


def _check_domain(spec: VarSpec, value: str, nccl_version: NcclVersion) -> None:
    bad = ValidationError(f"{spec.name}={value!r} is outside its domain ({spec.source})")
    if spec.kind in ("int", "pow2"):
        if not re.fullmatch(r"\d+", value):
            raise bad
        number = int(value)
        if (spec.lo is not None and number < spec.lo) or (spec.hi is not None and number > spec.hi):
            raise bad
        if spec.kind == "pow2" and number & (number - 1):
            raise bad
    elif spec.kind == "enum":
        if value not in spec.choices:
            raise bad
    elif spec.kind == "nccl_ifname":
        _check_nccl_ifname(value, nccl_version, bad)
    elif spec.kind == "gloo_ifname":
        if not all(is_ifname(name) for name in value.split(",")):
            raise bad
    elif spec.kind == "nccl_algo":
        _check_algo(value, nccl_version, bad)
    elif spec.kind == "path" and (not value or "\n" in value):
        raise bad


def _check_nccl_ifname(value: str, nccl_version: NcclVersion, bad: ValidationError) -> None:
    body = value.removeprefix("^")
    exact = body.startswith("=")
    body = body.removeprefix("=")
    if exact and nccl_version < EXACT_IFNAME_SINCE:
        raise ValidationError(
            f"NCCL_SOCKET_IFNAME={value!r}: '=' (exact name) needs NCCL "
            f"{'.'.join(map(str, EXACT_IFNAME_SINCE))}+"
        )
    if len(value) <= 1 or not all(is_ifname(name) for name in body.split(",")):
        raise bad  # socket.cc ignores values of length <= 1


def _check_algo(value: str, nccl_version: NcclVersion, bad: ValidationError) -> None:
    entries = value.split(";")
    for index, entry in enumerate(entries):
        prefix, sep, elems = entry.rpartition(":")
        if sep:
            if nccl_version < PER_COLLECTIVE_ALGO_SINCE:
                raise ValidationError(
                    f"NCCL_ALGO={value!r}: per-collective syntax needs NCCL "
                    f"{'.'.join(map(str, PER_COLLECTIVE_ALGO_SINCE))}+"
                )
            if prefix.lower() not in COLLECTIVE_NAMES:
                raise bad
        elif index > 0:
            raise bad  # tuning.cc: every entry but the first must have a prefix
        names = elems.removeprefix("^").split(",")
        if not all(n.lower() in ALGO_NAMES for n in names):
            raise bad


def check_settings(settings: NcclSettings, torch_version: NcclVersion) -> None:
    """Check every emitted value and the cross-variable rules.

    Raises ValidationError naming the first problem: a value outside its domain, a
    variable the version does not read, NCCL_PROTO forced, or
    NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD above 64.
    """
    for node in settings.nodes or ("",):
        env: dict[str, EnvValue] = {v.key: v for v in settings.common}
        env.update({v.key: v for v in settings.per_node.get(node, ())})
        for item in env.values():
            if not item.reason.strip() or "\n" in item.reason:
                raise ValidationError(f"{item.key} has no one-line reason")
            check_value(item.key, item.value, settings.nccl_version, torch_version)
        if "NCCL_PROTO" in env:
            raise ValidationError("NCCL_PROTO must never be forced")
        threads = env.get("NCCL_SOCKET_NTHREADS")
        socks = env.get("NCCL_NSOCKS_PERTHREAD")
        if threads and socks and int(threads.value) * int(socks.value) > MAX_SOCKETS:
            raise ValidationError(
                f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = "
                f"{int(threads.value) * int(socks.value)} exceeds {MAX_SOCKETS}"
            )

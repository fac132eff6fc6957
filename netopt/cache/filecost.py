"""What a sync costs per file on this node, beyond its bytes, measured by a real sync.

A tree of many small files is held back by the work done for each file, not by its
bytes: on the lab's 80 Mbit/s link a 100,000-file tree of 1-4 KB files moved 35 MB of
wire in 23-25 s where the bytes alone needed 4, and a plan that counted only bytes
predicted 64% too short. That work (the server reading and framing each file, the
client verifying, storing and writing it, then the rename) is this node's CPU and
filesystem, so it is measured on the filesystem the sync writes to, once per
filesystem, and kept beside the codec speeds (`file_cost_cache_path`, keyed by
`filesystem_key`: the device number and the filesystem's id, so a filesystem made again
on a re-used device, a loop device or a volume, is measured again; the lab's destination,
a fresh ext4 image each session on /dev/loop0, planned with a figure half the real one
when the key was the device number alone). A sync measures it only when its files are
likely to hold it back (`per_file_cost_s`): at least `MEASURE_FROM_FILES` files, and so many
that at `PER_FILE_LIKELY_S` each they would take longer than the plan's bytes. Measuring
costs ~2 s, on the sync's path: the lab's 7,947-file packages tree, measured because at
`PER_FILE_CEILING_S` its files could have outlasted its 5 s of bytes, paid it on its
first sync on a filesystem and fell behind rsync, while its files at the figure measured
were 1.2-1.4 s of work. Where only the ceiling says the files could bind, a sync that then
overran its plan (the files may have bound it) marks the filesystem (`keep_observed`), and
the next such sync on it measures.

The calibration is a first guess: loopback syncs of 1,000 files, where a real sync moves
its files over a link, compressed, beside whatever else the node runs (the lab's 100,000
files cost 1.3-1.5x the calibration's figure, its packet relay sharing the two cores). So
a sync the files bound (`observed_per_file_s`) adds the figure it showed to the ones kept
(`keep_observed`, at most `FIGURES_KEPT`), and the next plan takes their median. So does a
sync planned as bound by its bytes that overran its plan (`PLAN_OVERRUN`) by a figure its
files could have cost (at most `PER_FILE_CEILING_S`): a calibration that said too little
(the lab's fresh filesystem once measured 58 us, where its 100,000-file syncs then showed
108-109) plans the files short of the bytes, and the plan would never learn otherwise.

`measure_per_file_s` serves two directories with the real server (``netopt serve``, its
own process, on 127.0.0.1 with a random token), `FILES` files of `FILE_BYTES` and one
file of the same total size, syncs each with the real engine
(`netopt.cache.syncer.run_sync`, through a fresh cache) into a fresh directory, and
returns (many - one) / (`FILES` - 1), the median of `RUNS` pairs after a warm-up pair;
under TLS, over TLS. The server
runs on this node, beside the sync, as on a lab node; with the server on another
machine the figure is about the same where the client's work per file is the larger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane import trace
from netopt.dataplane.httpsource import ClientOptions
from netopt.errors import StorageError
from netopt.fsutil import atomic_write_bytes, nearest_existing
from netopt.tlsconf import ClientTls, current_client_tls, use_client_tls
from netopt.transfer.planner import CpuProfile, TransferPlan
from netopt.transfer.profile import default_codec_cache_path

if TYPE_CHECKING:
    from netopt.tlsca import ServerFiles

__all__ = [
    "FIGURES_KEPT",
    "FILES",
    "FILE_BYTES",
    "MEASURE_FROM_FILES",
    "PER_FILE_CEILING_S",
    "PER_FILE_LIKELY_S",
    "PLAN_OVERRUN",
    "RUNS",
    "file_cost_cache_path",
    "files_could_bind",
    "filesystem_key",
    "keep_observed",
    "measure_per_file_s",
    "observed_per_file_s",
    "per_file_cost_s",
]

MEASURE_FROM_FILES = 1000
"""A sync of fewer files does not measure the per-file cost (nor plans with one)."""
PER_FILE_CEILING_S = 700e-6
"""The highest per-file cost measured on this project's machines (687 us: ext4 mounted
``discard`` just after a tree was deleted; 128-266 us elsewhere). Files that would not
outlast the bytes even at this cost cannot bind the sync: they are never measured."""
PER_FILE_LIKELY_S = 300e-6
"""Above every per-file cost this project's machines showed in normal use (55-266 us
calibrated, 146-177 us shown by the lab's 100,000-file syncs): files that would not outlast
the bytes at this cost are not measured before a sync, unless a sync on the filesystem
overran its plan (`keep_observed`); the ceiling (`PER_FILE_CEILING_S`) then decides."""
PLAN_OVERRUN = 1.2
"""A sync that took this many times its plan's predicted time, or more, overran it (the
plan's goal is its predicted time within 20%)."""

FIGURES_KEPT = 5
"""Per-file figures kept per filesystem: the calibration, then what real syncs showed
(`keep_observed`); their median is planned with, so one sync slowed by something else
(a cut link, a busy node) moves it little."""

FILES = 1000
"""Files in the measured tree: enough that their cost stands well above a sync's own
(its connections, its manifest), a fraction of a second here."""
FILE_BYTES = 2048
"""Each file's size: the lab's 100,000-file tree is 1-4 KB files."""
RUNS = 3
"""Measured pairs of syncs, after one that warms both ends up; their median counts. Run
by run the figure spread 145-217 us a file here, the first pair the highest."""
SERVE_START_S = 60.0
"""How long the measuring server may take to start (a fresh interpreter, 1,000 files)."""
_PROFILE = CpuProfile(os.cpu_count() or 1, {}, {}, per_file_s=0.0)
"""What the measuring syncs plan with: no codec speeds (they send raw bytes) and a
per-file cost said known, so measuring calibrates nothing and never recurses."""


def _write_tree(root: Path) -> None:
    many, one = root / "many", root / "one"
    for sub in range(FILES // 100):
        (many / f"d{sub:02d}").mkdir(parents=True)
    parts: list[bytes] = []
    for i in range(FILES):
        data = os.urandom(FILE_BYTES // 2).hex().encode()  # unique: no chunk shared
        (many / f"d{i // 100:02d}" / f"f{i:04d}.txt").write_bytes(data)
        parts.append(data)
    one.mkdir()
    (one / "all.txt").write_bytes(b"".join(parts))


_SERVER_ENV_DROPPED = ("NETOPT_TOKEN", "NETOPT_TRACE", "NETOPT_TLS_CERT", "NETOPT_TLS_KEY",
                       "NETOPT_TLS_CA")  # fmt: skip
"""What the measuring server must not take from this process's environment: it is given
its own token and TLS, and must not write this sync's trace."""


_DIES_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the sync died before the line above
os.execv(sys.executable, [sys.executable, "-m", "netopt", *sys.argv[2:]])
"""
"""``netopt ARGS`` that gets SIGTERM when the thread that started it ends: a sync killed
while it measures (kill -9) leaves no server behind. The signal outlives the exec."""


async def _serve(
    root: Path, token_file: Path, tls: ServerFiles | None
) -> tuple[asyncio.subprocess.Process, int]:
    """``netopt serve ROOT`` as its own process on a free loopback port (token from
    ``token_file``; TLS with ``tls``): the process and its port."""
    env = {k: v for k, v in os.environ.items() if k not in _SERVER_ENV_DROPPED}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DIES_WITH_PARENT, str(os.getpid()),
        "serve", str(root), "--name", "calibration",
        "--bind", "127.0.0.1:0", "--token-file", str(token_file),
        *(tls.server_args() if tls is not None else []),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), SERVE_START_S)
        found = re.search(rb"netopt://127\.0\.0\.1:(\d+)/calibration", line)
        if found is None:
            raise RuntimeError(f"netopt serve said {line[:200]!r}")
        return proc, int(found.group(1))
    except BaseException:
        await _stop(proc)
        raise


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _timed_sync(port: int, token: str, dest: Path, cache: Path) -> float:
    request = SyncRequest(
        f"netopt://127.0.0.1:{port}/calibration",
        str(dest),
        str(cache),
        source_options=SourceOptions(
            client=ClientOptions(token=token), client_cpu=_PROFILE, zstd_level=0
        ),
    )
    start_s = time.perf_counter()
    await run_sync(request)
    return time.perf_counter() - start_s


async def _measure(work: Path, runs: int) -> float:
    _write_tree(work)
    token = secrets.token_hex(16)
    token_file = work / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    # As secure as the sync it calibrates: under TLS (a cluster CA set) it measures TLS
    # too, with a throwaway CA for 127.0.0.1, set for this calibration's context only.
    tls = None
    if current_client_tls().enabled:
        # Here, not at the top: the certificate library is ~40 ms to import, and every
        # sync of a tree imports this module.
        from netopt.tlsca import issue_server_files

        tls = issue_server_files(work / "tls", "calibration", ips=["127.0.0.1"])
        use_client_tls(ClientTls(ca_file=str(tls.ca_cert), where="the per-file calibration"))
    else:
        use_client_tls(ClientTls())
    servers = await asyncio.gather(
        _serve(work / "many", token_file, tls), _serve(work / "one", token_file, tls),
        return_exceptions=True,
    )  # fmt: skip
    try:
        for server in servers:
            if isinstance(server, BaseException):
                raise server
        (_, many_port), (_, one_port) = servers  # type: ignore[misc]
        per_file_s: list[float] = []
        for run in range(max(1, runs) + 1):  # the first pair warms both ends up, uncounted
            many_s = await _timed_sync(
                many_port, token, work / f"dest-many{run}", work / f"cache-many{run}"
            )
            one_s = await _timed_sync(
                one_port, token, work / f"dest-one{run}", work / f"cache-one{run}"
            )
            if run:
                per_file_s.append((many_s - one_s) / (FILES - 1))
        return max(0.0, statistics.median(per_file_s))
    finally:
        for server in servers:
            if not isinstance(server, BaseException):
                await _stop(server[0])


def measure_per_file_s(where: str | os.PathLike[str], runs: int = RUNS) -> float | None:
    """Seconds a sync spends per file beyond the file's bytes (see the module), measured
    in a temporary directory made under ``where`` (created if missing), removed after;
    None when it cannot be measured. Runs its own event loop: call it from a thread,
    never from a running loop."""
    base = Path(where)
    made = not base.exists()
    try:
        base.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="filecost-", dir=base))
    except OSError:
        return None
    try:
        with trace.paused():
            return asyncio.run(_measure(work, runs))
    except Exception:  # a calibration never fails a sync: None says unknown
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                base.rmdir()  # the directory made for it, if nothing else came into it


def file_cost_cache_path() -> Path:
    """``filecost.json`` beside the codec cache (`default_codec_cache_path`)."""
    return default_codec_cache_path().with_name("filecost.json")


_KEY = re.compile(r"\d{1,20}:\d{1,20}")
"""`filesystem_key`'s shape."""


def filesystem_key(path: str | os.PathLike[str]) -> str | None:
    """``DEV:FSID`` of the filesystem ``path`` is (or will be) on: its device number and
    its id (``statvfs``'s ``f_fsid``: ext4 and XFS derive it from the filesystem's UUID,
    tmpfs from its mount), so a filesystem made again on a re-used device number is
    another key. None when they cannot be read."""
    try:
        existing = nearest_existing(Path(path))
        return f"{os.stat(existing).st_dev}:{os.statvfs(existing).f_fsid}"
    except OSError:
        return None


def _figure(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    return None


def _cached(cache: Path) -> dict[str, list[float]]:
    """The kept figures by `filesystem_key`, oldest first (at most `FIGURES_KEPT`; a lone
    number, as older versions kept, is one figure; none: marked unsure, `keep_observed`);
    keys of any other shape (the device numbers alone that older versions kept) and values
    that are not per-file costs are dropped."""
    try:
        raw = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    known: dict[str, list[float]] = {}
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        figures = [f for f in map(_figure, values[-FIGURES_KEPT:]) if f is not None]
        if _KEY.fullmatch(str(key)) and len(figures) == len(values[-FIGURES_KEPT:]):
            known[str(key)] = figures
    return known


def _keep(cache: Path, known: dict[str, list[float]]) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache, json.dumps(known, indent=2).encode())
    except (OSError, StorageError):
        pass  # measured again next time


def files_could_bind(files: int, bytes_s: float, per_file_s: float = PER_FILE_LIKELY_S) -> bool:
    """Whether ``files`` files could take longer than the ``bytes_s`` seconds a plan
    gives the bytes, at ``per_file_s`` each (`PER_FILE_LIKELY_S`; `PER_FILE_CEILING_S`, the
    highest seen, where a filesystem is marked unsure)."""
    return files >= MEASURE_FROM_FILES and files * per_file_s >= bytes_s


def per_file_cost_s(
    where: str | os.PathLike[str], files: int, bytes_s: float, cache: Path | None = None
) -> float | None:
    """The per-file cost on ``where``'s filesystem for a sync of ``files`` files whose
    bytes the plan gives ``bytes_s`` seconds: None below `MEASURE_FROM_FILES`; else from
    ``cache`` (default `file_cost_cache_path`) when kept there (the median of the figures
    kept, `FIGURES_KEPT`); else, when the files could bind (`files_could_bind`: at
    `PER_FILE_LIKELY_S`, or at `PER_FILE_CEILING_S` on a filesystem marked unsure), measured
    under ``where`` now (~2 s, once per filesystem) and kept. None when not measured or it
    cannot be (the plan then counts bytes only). Blocking."""
    if files < MEASURE_FROM_FILES:
        return None
    cache = cache if cache is not None else file_cost_cache_path()
    key = filesystem_key(where)
    known = _cached(cache)
    if key is not None and known.get(key):
        return statistics.median(known[key])
    unsure = key is not None and key in known
    if not files_could_bind(files, bytes_s, PER_FILE_CEILING_S if unsure else PER_FILE_LIKELY_S):
        return None
    seconds = measure_per_file_s(where)
    if seconds is None or key is None:
        return seconds
    known[key] = [seconds]
    _keep(cache, known)
    return seconds


def observed_per_file_s(plan: TransferPlan, work_s: float, files: int) -> float | None:
    """The per-file cost a finished sync showed: its ``work_s`` seconds (from its start
    to its end, less the time it spent finding its per-file cost) less the plan's set-up,
    over the ``files`` it wrote, where its time can be its files': the plan said they bound
    it (bottleneck ``files``: the bytes took less), or it said the bytes did and the sync
    overran it (`PLAN_OVERRUN`) by a figure at most `PER_FILE_CEILING_S` (more is not what
    files cost: something else held it back). None for fewer than `MEASURE_FROM_FILES`
    files, or a figure that is no per-file cost (negative, a second or more)."""
    if files < MEASURE_FROM_FILES:
        return None
    figure = _figure((work_s - plan.setup_s) / files)
    if plan.bottleneck == "files":
        return figure
    overran = work_s >= plan.predicted_time_s * PLAN_OVERRUN
    return figure if overran and figure is not None and figure <= PER_FILE_CEILING_S else None


def keep_observed(
    where: str | os.PathLike[str], per_file_s: float, cache: Path | None = None
) -> None:
    """Add a figure a real sync showed (`observed_per_file_s`) to the ones kept for
    ``where``'s filesystem (see the module); the oldest goes beyond `FIGURES_KEPT`. Where
    none is kept (the sync planned without one, and overran), mark the filesystem unsure
    instead: its next sync whose files could bind at `PER_FILE_CEILING_S` measures. Blocking;
    a cache that cannot be written is left as it is."""
    cache = cache if cache is not None else file_cost_cache_path()
    key = filesystem_key(where)
    known = _cached(cache)
    if key is None or _figure(per_file_s) is None:
        return
    if known.get(key):
        known[key] = [*known[key], per_file_s][-FIGURES_KEPT:]
    elif key not in known:
        known[key] = []  # unsure
    else:
        return
    _keep(cache, known)

"""Host bottlenecks that starve GPUs: CPU load, frequency governor, memory, disk.

:func:`gather_host_facts` reads ``/proc`` and ``/sys`` and measures the dataset
directory's read throughput (bounded); :func:`check_host` is pure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from netopt.doctor.findings import Finding, Skipped

__all__ = [
    "DiskRead",
    "HostFacts",
    "check_host",
    "gather_host_facts",
    "measure_disk_read",
    "parse_meminfo",
]

DISK_PROBE_BYTES = 64 * 2**20
DISK_PROBE_LIMIT_S = 2.0
SLOW_DISK_MBPS = 200.0
LOW_MEMORY_RATIO = 0.10
_BLOCK_BYTES = 2**20


@dataclass(frozen=True)
class DiskRead:
    """A bounded read of a fresh temp file: bytes read, seconds, where."""

    directory: str
    read_bytes: int
    elapsed_s: float
    cache_dropped: bool

    @property
    def rate_mbps(self) -> float:
        """Read throughput in MB/s (10^6 bytes per second)."""
        return self.read_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else float("inf")


@dataclass(frozen=True)
class HostFacts:
    """What the host checks look at (None: could not be read)."""

    cpu_count: int
    load_1m: float | None
    governors: tuple[str, ...]
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    disk: DiskRead | None = None
    disk_error: str | None = None


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per field (``kB`` values multiplied out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            out[key.strip()] = int(parts[0]) * scale
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def measure_disk_read(
    directory: Path, size_bytes: int = DISK_PROBE_BYTES, limit_s: float = DISK_PROBE_LIMIT_S
) -> DiskRead:
    """Write a temp file of ``size_bytes`` in ``directory``, drop it from the page cache,
    and read it back for at most ``limit_s`` seconds. The file is always removed.

    Raises OSError when the directory is missing or unwritable (the caller reports it).
    """
    block = os.urandom(_BLOCK_BYTES)
    path = directory / f".netopt-doctor-{os.getpid()}.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            written = 0
            while written < size_bytes:
                written += os.write(fd, block[: min(_BLOCK_BYTES, size_bytes - written)])
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            dropped = True
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                dropped = False
            read_bytes = 0
            start_s = time.monotonic()
            while time.monotonic() - start_s < limit_s:
                chunk = os.read(fd, _BLOCK_BYTES)
                if not chunk:
                    break
                read_bytes += len(chunk)
            elapsed_s = time.monotonic() - start_s
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return DiskRead(str(directory), read_bytes, elapsed_s, dropped)


def gather_host_facts(dataset_dir: Path | None) -> HostFacts:
    """Read CPU, load, governors and memory; measure ``dataset_dir`` if given (never raises)."""
    load_text = _read("/proc/loadavg")
    governors: list[str] = []
    cpu_root = Path("/sys/devices/system/cpu")
    for gov_path in sorted(cpu_root.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        text = _read(str(gov_path))
        if text:
            governors.append(text.strip())
    mem = parse_meminfo(_read("/proc/meminfo") or "")
    disk: DiskRead | None = None
    disk_error: str | None = None
    if dataset_dir is not None:
        try:
            disk = measure_disk_read(dataset_dir)
        except OSError as exc:
            disk_error = f"{dataset_dir}: {exc.strerror or exc}"
    return HostFacts(
        cpu_count=len(os.sched_getaffinity(0)),
        load_1m=float(load_text.split()[0]) if load_text else None,
        governors=tuple(governors),
        mem_total_bytes=mem.get("MemTotal"),
        mem_available_bytes=mem.get("MemAvailable"),
        disk=disk,
        disk_error=disk_error,
    )


def _cpu_findings(facts: HostFacts) -> tuple[list[Finding], list[Skipped]]:
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    if facts.load_1m is None:
        skipped.append(Skipped("host.cpu", "/proc/loadavg unreadable: CPU load not checked"))
    elif facts.load_1m > facts.cpu_count:
        per_cpu = facts.load_1m / facts.cpu_count
        findings.append(
            Finding(
                check="host.cpu",
                impact=min(70.0, 20 + 40 * (per_cpu - 1)),
                title="CPUs are oversubscribed: data loading can starve the GPUs",
                evidence=f"1-minute load {facts.load_1m:g} on {facts.cpu_count} CPUs "
                f"({per_cpu:.2f} runnable per CPU)",
                fix="find the busy processes (top -o %CPU); lower DataLoader num_workers to "
                "fit the cores, or move other jobs off this node",
            )
        )
    if not facts.governors:
        skipped.append(Skipped("host.governor", "no cpufreq in /sys: CPU governor not checked"))
    else:
        slow = sorted({g for g in facts.governors if g in {"powersave", "conservative"}})
        if slow:
            findings.append(
                Finding(
                    check="host.governor",
                    impact=15,
                    title="CPU frequency governor is not performance",
                    evidence=f"scaling_governor: {', '.join(slow)} on "
                    f"{sum(g in slow for g in facts.governors)} of {len(facts.governors)} CPUs",
                    fix="cpupower frequency-set -g performance (or write performance to "
                    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)",
                )
            )
    return findings, skipped


def _memory_and_disk(facts: HostFacts) -> tuple[list[Finding], list[Skipped]]:
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    total, available = facts.mem_total_bytes, facts.mem_available_bytes
    if not total or available is None:
        skipped.append(Skipped("host.memory", "/proc/meminfo unreadable: memory not checked"))
    elif available / total < LOW_MEMORY_RATIO:
        findings.append(
            Finding(
                check="host.memory",
                impact=40,
                title="little free memory: the page cache cannot hold the dataset",
                evidence=f"MemAvailable {available / 2**30:.1f} GiB of {total / 2**30:.1f} GiB "
                f"({available / total:.0%})",
                fix="reduce DataLoader workers or prefetch depth, or stop other memory users",
            )
        )
    if facts.disk is not None:
        if facts.disk.rate_mbps < SLOW_DISK_MBPS:
            cached = "" if facts.disk.cache_dropped else " (page cache could not be dropped)"
            findings.append(
                Finding(
                    check="host.disk",
                    impact=45 if facts.disk.rate_mbps < SLOW_DISK_MBPS / 2 else 30,
                    title="dataset directory reads slowly",
                    subject=facts.disk.directory,
                    evidence=f"read {facts.disk.read_bytes / 1e6:.0f} MB from "
                    f"{facts.disk.directory} at {facts.disk.rate_mbps:.0f} MB/s{cached} "
                    f"(below {SLOW_DISK_MBPS:g} MB/s)",
                    fix="put the dataset cache on local NVMe (netopt sync into it), or raise "
                    "read-ahead: blockdev --setra 8192 /dev/DEVICE",
                )
            )
    elif facts.disk_error is not None:
        skipped.append(Skipped("host.disk", f"disk not measured: {facts.disk_error}"))
    else:
        skipped.append(Skipped("host.disk", "no --dataset-dir: disk read throughput not checked"))
    return findings, skipped


def check_host(facts: HostFacts) -> tuple[list[Finding], list[Skipped]]:
    """Findings about CPU load, governor, memory and disk, and what could not be checked."""
    cpu_findings, cpu_skipped = _cpu_findings(facts)
    other_findings, other_skipped = _memory_and_disk(facts)
    return cpu_findings + other_findings, cpu_skipped + other_skipped

"""Measure the planner's inputs: how data compresses, and how fast this node's codecs run.

`sample_file` / `sample_files` (`netopt.transfer.sampling`, re-exported here) read
stretches of a dataset and compress them at each zstd level.
`calibrate_codecs` times zstd and BLAKE3 on this node (best of a few runs after a
warm-up: the machines are shared, and one slow run must not rule a level out),
`measure_startup_s` times the CLI's start-up; `load_cpu_profile` does both
once and caches the result as JSON (``~/.cache/netopt/codec.json`` unless
``NETOPT_CODEC_CACHE`` or the ``path`` argument says otherwise).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import blake3
import zstandard

from netopt.errors import StorageError
from netopt.fsutil import atomic_write_bytes
from netopt.transfer.planner import CpuProfile
from netopt.transfer.sampling import DEFAULT_LEVELS, sample_bytes, sample_file, sample_files

__all__ = [
    "DEFAULT_LEVELS",
    "SYNC_STARTUP_MODULES",
    "calibrate_codecs",
    "cpu_profile_from_dict",
    "cpu_profile_to_dict",
    "default_codec_cache_path",
    "load_cpu_profile",
    "measure_startup_s",
    "sample_bytes",
    "sample_file",
    "sample_files",
    "startup_command",
]

_SLICE_BYTES = 1024 * 1024
_CACHE_VERSION = 4
_READABLE_VERSIONS = (2, 3, 4)
_STARTUP_VERSION = 4
"""Caches older than this timed a start-up that left out the sync engine and aiohttp
(~0.3 s of a ~0.7 s start): their start-up is measured again."""

SYNC_STARTUP_MODULES = (
    "netopt.cli.main",
    "netopt.cli.sync_cmd",
    "netopt.cli.cache_cmd",
    "netopt.cache.syncer",
    "netopt.dataplane.client",
    "netopt.config.discovery",
)
"""What a ``netopt sync`` process imports before it moves a byte: the CLI, the cache's
sync driver and its sources (aiohttp among them) and the data-plane client."""
_CALIBRATION_RUNS = 2


def _calibration_corpus(size_bytes: int) -> bytes:
    # JSON-lines-like text: codec speed depends on the data, and only compressible
    # data is ever compressed (the sample turns compression off for the rest).
    # Random data would flatter the codec: zstd skips over it several times faster.
    rng = random.Random(7)
    words = [f"{rng.choice('abcdefghij')}{rng.randrange(20000)}" for _ in range(20000)]
    lines: list[str] = []
    total = 0
    while total < size_bytes:
        line = json.dumps(
            {
                "id": total,
                "user": f"u{rng.randrange(10**6)}",
                "text": " ".join(rng.choices(words, k=rng.randrange(10, 40))),
                "score": round(rng.random(), 4),
            }
        )
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()[:size_bytes]


def _best_rate(func: Callable[[], object], size_bytes: int, runs: int) -> float:
    """Bytes per second of ``func`` over ``size_bytes``: the fastest of ``runs`` timings."""
    best_s = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        func()
        best_s = min(best_s, time.perf_counter() - start)
    return size_bytes / max(best_s, 1e-9)


def _compress_all(cctx: zstandard.ZstdCompressor, chunks: Sequence[bytes]) -> None:
    for c in chunks:
        cctx.compress(c)


def _decompress_all(frames: Sequence[bytes]) -> None:
    dctx = zstandard.ZstdDecompressor()
    for f in frames:
        dctx.decompress(f)


def _hash_all(chunks: Sequence[bytes]) -> None:
    for c in chunks:
        blake3.blake3(c).digest()


def calibrate_codecs(
    levels: Sequence[int] = DEFAULT_LEVELS,
    corpus_bytes: int = 4 * 1024 * 1024,
    runs: int = _CALIBRATION_RUNS,
) -> CpuProfile:
    """Time zstd (per level) and BLAKE3 on one core, 1 MiB chunks of text (1-2 s).

    Each level runs once untimed (warm-up), then ``runs`` timed passes; the fastest
    counts, because other processes on a shared machine only ever make a run slower.
    """
    corpus = _calibration_corpus(corpus_bytes)
    chunks = [corpus[i : i + _SLICE_BYTES] for i in range(0, len(corpus), _SLICE_BYTES)]
    compress: dict[int, float] = {}
    decompress: dict[int, float] = {}
    for level in levels:
        cctx = zstandard.ZstdCompressor(level=level)
        frames = [cctx.compress(c) for c in chunks]
        compress[level] = _best_rate(partial(_compress_all, cctx, chunks), len(corpus), runs)
        decompress[level] = _best_rate(partial(_decompress_all, frames), len(corpus), runs)
    hash_rate = _best_rate(partial(_hash_all, chunks), len(corpus), runs)
    return CpuProfile(
        cores=os.cpu_count() or 1,
        compress_bytes_per_s=compress,
        decompress_bytes_per_s=decompress,
        hash_bytes_per_s=hash_rate,
    )


def startup_command() -> list[str]:
    """The command `measure_startup_s` times: a fresh interpreter importing
    `SYNC_STARTUP_MODULES`."""
    return [sys.executable, "-c", "import " + ", ".join(SYNC_STARTUP_MODULES)]


def measure_startup_s(runs: int = 2, timeout_s: float = 30.0) -> float:
    """Seconds this node takes to start ``netopt sync`` (interpreter and the CLI's imports).

    The fastest of ``runs`` (at least one) fresh interpreters; 0.0 when one cannot be
    started or takes longer than ``timeout_s``.
    """
    best_s = math.inf
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        try:
            subprocess.run(
                startup_command(),
                check=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return 0.0
        best_s = min(best_s, time.perf_counter() - start)
    return best_s


def default_codec_cache_path() -> Path:
    """``$NETOPT_CODEC_CACHE``, else ``$XDG_CACHE_HOME/netopt/codec.json`` (~/.cache)."""
    override = os.environ.get("NETOPT_CODEC_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "netopt" / "codec.json"


def cpu_profile_to_dict(profile: CpuProfile) -> dict[str, object]:
    """A CpuProfile as JSON-able data (level keys as strings)."""
    return {
        "version": _CACHE_VERSION,
        "cores": profile.cores,
        "compress_bytes_per_s": {str(k): v for k, v in profile.compress_bytes_per_s.items()},
        "decompress_bytes_per_s": {str(k): v for k, v in profile.decompress_bytes_per_s.items()},
        "hash_bytes_per_s": profile.hash_bytes_per_s,
        "startup_s": profile.startup_s,
    }


def cpu_profile_from_dict(data: dict[str, object]) -> CpuProfile:
    """Parse `cpu_profile_to_dict` output; raises ValueError/TypeError/KeyError if malformed."""

    def levels(key: str) -> dict[int, float]:
        raw = data[key]
        if not isinstance(raw, dict):
            raise TypeError(f"{key} is not a mapping")
        return {int(k): float(v) for k, v in raw.items()}

    cores = data["cores"]
    hash_rate = data["hash_bytes_per_s"]
    startup_s = data.get("startup_s", 0.0)
    if not isinstance(cores, int) or not isinstance(hash_rate, int | float):
        raise TypeError("cores / hash_bytes_per_s have the wrong type")
    if not isinstance(startup_s, int | float) or not 0 <= startup_s < 600:
        raise ValueError("startup_s is not a number of seconds in [0, 600)")
    return CpuProfile(
        cores=cores,
        compress_bytes_per_s=levels("compress_bytes_per_s"),
        decompress_bytes_per_s=levels("decompress_bytes_per_s"),
        hash_bytes_per_s=float(hash_rate),
        startup_s=float(startup_s),
    )


def load_cpu_profile(
    path: str | os.PathLike[str] | None = None, levels: Sequence[int] = DEFAULT_LEVELS
) -> CpuProfile:
    """This node's codec speeds: from the cache file, or calibrated now and cached.

    A cache that is unreadable, malformed, from another core count or missing a
    level is recalibrated (codecs and the CLI start-up, 2-4 s); one from before
    version 4 has its start-up measured again. Failing to write
    the cache is not an error (the profile is still returned).
    """
    cache = Path(path) if path is not None else default_codec_cache_path()
    profile: CpuProfile | None = None
    try:
        loaded = json.loads(cache.read_text())
        if loaded.get("version") in _READABLE_VERSIONS:
            cached = cpu_profile_from_dict(loaded)
            if cached.cores == (os.cpu_count() or 1) and all(
                lvl in cached.compress_bytes_per_s for lvl in levels
            ):
                if loaded["version"] >= _STARTUP_VERSION:
                    return cached
                profile = replace(cached, startup_s=measure_startup_s())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    if profile is None:
        profile = replace(calibrate_codecs(levels), startup_s=measure_startup_s())
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache, json.dumps(cpu_profile_to_dict(profile), indent=2).encode())
    except (OSError, StorageError):
        pass
    return profile

"""Cumulative totals of the syncs into one cache, per dataset, for the node's agent to export.

`netopt sync` is a command, not a service, so Prometheus cannot scrape it. Each sync that
ends (well or not) adds its figures to ``<cache dir>/sync-totals.json`` (`record_sync`), and
the agent, whose ``cache.dir`` is that directory, exports the totals as counters at every
scrape (`read_totals`): transfer throughput (``rate(written) / rate(seconds)``), the cache
hit ratio (bytes reused from the cache over bytes the sync needed) and the bytes that did
not cross a border (fetched from in-region peers instead of the origin).

The file is netopt's own but is read as untrusted input: a missing, torn or hand-edited file
gives no totals (or the entries that check out), never an error at a scrape. At most
`MAX_DATASETS` datasets are kept (the least recently synced go first), so the label set,
and the file, stay bounded. Writers serialize through ``flock`` on a lock file beside it and
replace the file atomically. Recording never fails a sync: a read-only or full cache
directory is logged once per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from netopt.errors import StorageError
from netopt.fsutil import atomic_write_bytes
from netopt.names import is_dataset_name

__all__ = [
    "MAX_DATASETS",
    "TOTALS_FILE",
    "SyncTotals",
    "read_totals",
    "record_sync",
]

log = logging.getLogger(__name__)

TOTALS_FILE = "sync-totals.json"
MAX_DATASETS = 256
"""Datasets whose totals one cache keeps (one label value each at the agent's /metrics)."""
MAX_FILE_BYTES = 1024 * 1024
"""A totals file larger than this is not read (256 entries take about 100 KB)."""
_VERSION = 1
_warned = False


@dataclass(frozen=True)
class SyncTotals:
    """One dataset's syncs into this cache, summed since the cache was made."""

    runs_ok: int = 0
    runs_failed: int = 0
    written_bytes: int = 0
    """Bytes of files written into DEST."""
    reused_bytes: int = 0
    """Bytes the syncs needed and found in the cache or DEST already (cache hits)."""
    fetched_bytes: int = 0
    """Bytes of chunks the syncs had to fetch (logical, before compression)."""
    origin_wire_bytes: int = 0
    """Wire bytes fetched from the dataset's source (across the border, for a remote origin)."""
    peer_wire_bytes: int = 0
    """Wire bytes fetched from in-region peers: bytes that did not cross the border again."""
    seconds: float = 0.0
    """Wall clock of the syncs, ended well or not."""
    last_success_s: float = 0.0
    """Unix time of the last sync that ended well (0: none yet)."""
    last_run_s: float = 0.0

    def plus(self, other: SyncTotals) -> SyncTotals:
        return SyncTotals(
            runs_ok=self.runs_ok + other.runs_ok,
            runs_failed=self.runs_failed + other.runs_failed,
            written_bytes=self.written_bytes + other.written_bytes,
            reused_bytes=self.reused_bytes + other.reused_bytes,
            fetched_bytes=self.fetched_bytes + other.fetched_bytes,
            origin_wire_bytes=self.origin_wire_bytes + other.origin_wire_bytes,
            peer_wire_bytes=self.peer_wire_bytes + other.peer_wire_bytes,
            seconds=self.seconds + other.seconds,
            last_success_s=max(self.last_success_s, other.last_success_s),
            last_run_s=max(self.last_run_s, other.last_run_s),
        )


def _entry_from(raw: object) -> SyncTotals | None:
    """A checked entry, or None for anything that is not one (types, signs, finiteness)."""
    if not isinstance(raw, dict) or set(raw) - {f.name for f in fields(SyncTotals)}:
        return None
    values: dict[str, Any] = {}
    for f in fields(SyncTotals):
        value = raw.get(f.name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value) or value < 0 or value > 2**62:
            return None
        values[f.name] = float(value) if f.type == "float" else int(value)
    return SyncTotals(**values)


def read_totals(cache_dir: str | os.PathLike[str]) -> dict[str, SyncTotals]:
    """The totals in ``cache_dir`` by dataset; entries that do not check out are left out."""
    path = Path(cache_dir) / TOTALS_FILE
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return {}
    if len(data) > MAX_FILE_BYTES:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != _VERSION:
        return {}
    datasets = doc.get("datasets")
    if not isinstance(datasets, dict):
        return {}
    out: dict[str, SyncTotals] = {}
    for name, raw in datasets.items():
        entry = _entry_from(raw)
        if is_dataset_name(name) and entry is not None:
            out[name] = entry
    if len(out) > MAX_DATASETS:
        newest = sorted(out, key=lambda n: out[n].last_run_s, reverse=True)[:MAX_DATASETS]
        out = {name: out[name] for name in newest}
    return out


def _merged(totals: dict[str, SyncTotals], dataset: str, run: SyncTotals) -> dict[str, SyncTotals]:
    out = dict(totals)
    out[dataset] = out.get(dataset, SyncTotals()).plus(run)
    if len(out) > MAX_DATASETS:
        keep = sorted(out, key=lambda n: out[n].last_run_s, reverse=True)[:MAX_DATASETS]
        out = {name: out[name] for name in keep}
    return out


def record_sync(
    cache_dir: str | os.PathLike[str], dataset: str, run: SyncTotals, now_s: float | None = None
) -> bool:
    """Add one sync's figures to the cache's totals; False (logged once) when it could not.

    ``run`` holds this sync's figures; its ``last_*`` fields are set here from ``now_s``.
    """
    global _warned
    if not is_dataset_name(dataset):
        return False
    now = time.time() if now_s is None else now_s
    run = replace(run, last_run_s=now, last_success_s=now if run.runs_ok else 0.0)
    root = Path(cache_dir)
    if not root.is_dir():
        return False  # no cache yet (a sync that failed before making it): nothing to add to
    try:
        fd = os.open(root / f"{TOTALS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("sync totals not recorded in %s: %s", root, exc.strerror or exc)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        merged = _merged(read_totals(root), dataset, run)
        doc = {
            "version": _VERSION,
            "datasets": {name: asdict(entry) for name, entry in sorted(merged.items())},
        }
        atomic_write_bytes(root / TOTALS_FILE, json.dumps(doc).encode())
        return True
    except (OSError, StorageError) as exc:
        if not _warned:
            _warned = True
            log.warning("sync totals not recorded in %s: %s", root, exc)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)

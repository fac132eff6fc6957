"""Where a node's cache is and where in it the dataset versions are: light enough to be
used before anything else is loaded (the start-up prefetch of ``netopt sync`` names
the versions held before the sync engine is imported).

The cache keeps each version it synced as ``manifests/NAME/MANIFEST_ID.json``
(`netopt.cache.store.Cache.add_manifest`; read back by
`netopt.cache.storedmanifests`). Every path here is derived from a checked dataset
name and a checked id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from netopt.names import is_dataset_name, is_hash_id, validate_dataset_name, validate_hash_id

__all__ = ["MANIFESTS_DIR", "default_cache_dir", "manifest_file", "stored_manifest_ids"]

MANIFESTS_DIR = "manifests"
"""Where under a cache directory the versions are kept, one directory per dataset."""


def default_cache_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/netopt/cache`` (default ``~/.cache``): the cache without a config."""
    base = (os.environ if env is None else env).get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "netopt", "cache")


def manifest_file(cache_root: str | os.PathLike[str], name: str, manifest_id: str) -> Path:
    """``CACHE/manifests/NAME/ID.json``; PathTraversalError unless both are checked names."""
    validate_dataset_name(name)
    validate_hash_id(manifest_id, "manifest id")
    return Path(cache_root) / MANIFESTS_DIR / name / f"{manifest_id}.json"


def stored_manifest_ids(
    cache_root: str | os.PathLike[str], name: str, limit: int
) -> tuple[str, ...]:
    """The ids of the versions of ``name`` stored under ``cache_root``, newest first (by
    the file's mtime), at most ``limit``; () for a name that is not a dataset name or a
    cache that holds none (never raises: a cache that cannot be read names nothing)."""
    if not is_dataset_name(name):
        return ()
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(Path(cache_root) / MANIFESTS_DIR / name) as entries:
            for entry in entries:
                stem, dot, ext = entry.name.partition(".")
                if dot and ext == "json" and is_hash_id(stem) and entry.is_file():
                    found.append((entry.stat().st_mtime_ns, stem))
    except OSError:
        return ()
    found.sort(reverse=True)
    return tuple(mid for _, mid in found[: max(0, limit)])

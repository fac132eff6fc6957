"""The dataset versions a cache holds, read back without opening the cache.

A cache keeps each version it synced as ``manifests/NAME/MANIFEST_ID.json``: the
manifest's canonical JSON, the bytes its id names (`netopt.cache.store.Cache.add_manifest`
writes `Manifest.canonical_json`). A sync names the newest of them when it asks a netopt
server for the manifest (``If-None-Match``, `netopt.dataplane.manifestversions`), and reads
the one the server says is current back from here instead of fetching it again.

Both run before the cache is opened (its index, its lock): listing a directory and
reading one file. A file is used only when its bytes hash to its name (a file cut short
or changed by hand is not), and only as the bytes of that version, so nothing here
trusts the file's name or content beyond that check; every path is derived from a
checked dataset name and a checked id.
"""

from __future__ import annotations

import json
import os
from functools import partial

import blake3

from netopt.cachepaths import manifest_file, stored_manifest_ids
from netopt.dataplane.manifestversions import KNOWN_VERSIONS_MAX, KnownManifests
from netopt.dataplane.sync import gc_paused
from netopt.errors import NetoptError
from netopt.transfer.manifest import Manifest, manifest_from_dict

__all__ = ["known_manifests", "load_stored_manifest", "stored_manifest_bytes"]


def stored_manifest_bytes(
    cache_root: str | os.PathLike[str], name: str, manifest_id: str
) -> bytes | None:
    """The stored bytes of version ``manifest_id`` of ``name``, or None when they are not
    there or do not hash to the id (cut short, changed by hand) (blocking)."""
    try:
        raw = manifest_file(cache_root, name, manifest_id).read_bytes()
    except (OSError, NetoptError):
        return None
    return raw if blake3.blake3(raw).hexdigest() == manifest_id else None


def load_stored_manifest(
    cache_root: str | os.PathLike[str], name: str, manifest_id: str
) -> Manifest | None:
    """The stored version ``manifest_id`` of ``name``, or None when it is not there, its
    bytes do not hash to the id, or it does not parse as a manifest of that name
    (blocking). Its canonical JSON and id are the file's bytes and name: not made again."""
    raw = stored_manifest_bytes(cache_root, name, manifest_id)
    if raw is None:
        return None
    try:
        with gc_paused():
            manifest = manifest_from_dict(json.loads(raw))
    except (ValueError, RecursionError, NetoptError):
        return None
    if manifest.name != name:
        return None
    # The bytes that hash to the id are the version's canonical form (this cache wrote
    # them from Manifest.canonical_json): what the cached properties would compute.
    manifest.__dict__["canonical_json"] = raw
    manifest.__dict__["manifest_id"] = manifest_id
    return manifest


def known_manifests(cache_root: str | os.PathLike[str], name: str) -> KnownManifests:
    """What a sync of ``name`` through the cache at ``cache_root`` may name to its server."""
    return KnownManifests(
        stored_manifest_ids(cache_root, name, KNOWN_VERSIONS_MAX),
        partial(load_stored_manifest, cache_root, name),
    )

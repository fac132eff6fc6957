"""A node's cache as datasets its agent serves to peers (read-only).

The agent and ``netopt sync`` are separate processes sharing the cache
directory. ``netopt sync`` holds the cache lock and writes; the agent only reads
what is complete by construction (chunk files appear by rename, packed chunks once
their pack is durable and indexed, manifest files by atomic replace), so it needs
no lock. A chunk evicted between the
catalogue's answer and a peer's request reads as missing: the batch stream is
cut and the peer fetches that chunk elsewhere.

Each dataset is served as the union of its cached versions: a peer asks for
chunks by content name, so any version's chunk is the same bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from netopt.cache.packfmt import PACK_MAX_CHUNK_BYTES, PackReader
from netopt.cache.storedmanifests import load_stored_manifest
from netopt.cachepaths import MANIFESTS_DIR
from netopt.errors import IntegrityError, StorageError
from netopt.names import is_dataset_name, is_hash_id
from netopt.transfer.manifest import Manifest
from netopt.transfer.planner import CpuProfile, SampleProfile
from netopt.transfer.profile import cpu_profile_from_dict, default_codec_cache_path, sample_bytes

__all__ = ["CachedDataset", "CachedDatasets", "agent_cpu_profile"]

SAMPLE_CHUNKS = 4
SAMPLE_PIECE_BYTES = 256 * 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedDataset:
    """One dataset of the cache: its newest manifest, every version's chunks."""

    root: Path
    manifest: Manifest
    index: Mapping[str, int]
    """chunk name -> length, over every cached version of the dataset."""
    sample: SampleProfile = field(default_factory=lambda: SampleProfile({}, 0))
    packs: PackReader | None = None

    def read_chunk(self, chunk_id: str) -> bytes:
        """The chunk's bytes, verified. StorageError when it is not (or no longer) cached,
        IntegrityError when the stored bytes do not match its name."""
        if not is_hash_id(chunk_id):
            raise StorageError(f"bad chunk name {chunk_id[:16]!r}")
        data = _read_stored(self.root, self.packs, chunk_id, self.index.get(chunk_id, 0))
        if len(data) != self.index.get(chunk_id) or blake3.blake3(data).hexdigest() != chunk_id:
            raise IntegrityError(f"cached chunk {chunk_id[:16]} does not verify")
        return data


class CachedDatasets(Mapping[str, CachedDataset]):
    """Name -> :class:`CachedDataset` for a cache directory, re-read when its manifests change."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._loaded: dict[str, tuple[tuple[tuple[str, int], ...], CachedDataset]] = {}
        self._packs = PackReader(self.root / "packs")
        self._loading: dict[str, asyncio.Lock] = {}

    def _versions(self, name: str) -> tuple[tuple[str, int], ...]:
        folder = self.root / MANIFESTS_DIR / name
        try:
            entries = [(p.name, p.stat().st_mtime_ns) for p in folder.glob("*.json")]
        except OSError:
            return ()
        return tuple(sorted(entries))

    def _load(self, name: str, versions: tuple[tuple[str, int], ...]) -> CachedDataset | None:
        newest: tuple[int, Manifest] | None = None
        index: dict[str, int] = {}
        for file_name, mtime_ns in versions:
            stem = file_name.removesuffix(".json")
            manifest = load_stored_manifest(self.root, name, stem) if is_hash_id(stem) else None
            if manifest is None:
                log.warning(
                    "skipping cached manifest %s/%s/%s: gone, not its version's bytes, or "
                    "not a manifest of %s", MANIFESTS_DIR, name, file_name, name,
                )  # fmt: skip
                continue
            index.update(manifest.unique_chunks())
            if newest is None or mtime_ns > newest[0]:
                newest = (mtime_ns, manifest)
        if newest is None:
            return None
        sample = self._sample(newest[1], index)
        return CachedDataset(self.root, newest[1], index, sample, self._packs)

    def _sample(self, manifest: Manifest, index: Mapping[str, int]) -> SampleProfile:
        """How the dataset compresses, from up to SAMPLE_CHUNKS of its cached chunks (a
        node fetching across the border from this agent plans its zstd level with it)."""
        pieces = []
        for chunk_id in list(manifest.unique_chunks())[:: max(1, len(index) // SAMPLE_CHUNKS)]:
            try:
                data = _read_stored(self.root, self._packs, chunk_id, index[chunk_id])
            except StorageError:
                continue
            pieces.append(data[:SAMPLE_PIECE_BYTES])
            if len(pieces) == SAMPLE_CHUNKS:
                break
        return sample_bytes(pieces) if pieces else SampleProfile({}, 0)

    def __getitem__(self, name: str) -> CachedDataset:
        """The dataset as stored now, read on this thread if it changed (blocking: the
        data plane's routes use `load`)."""
        if not is_dataset_name(name):
            raise KeyError(name)
        versions = self._versions(name)
        if not versions:
            raise KeyError(name)
        loaded = self._loaded.get(name)
        if loaded is None or loaded[0] != versions:
            dataset = self._load(name, versions)
            if dataset is None:
                raise KeyError(name)
            self._loaded[name] = (versions, dataset)
            return dataset
        return loaded[1]

    async def load(self, name: str) -> CachedDataset | None:
        """The dataset as stored now (None: not stored), for the data plane's routes.

        Reading a changed dataset parses every cached version's manifest and samples
        its chunks: about a second for a 100,000-file tree, which on the event loop
        held every peer's requests and the agent's own measurements back. It runs in a
        thread, once per change however many requests ask meanwhile; only requests for
        this dataset wait for it. Checking for a change (a stat per cached version)
        stays on the loop.
        """
        if not is_dataset_name(name):
            return None
        versions = self._versions(name)
        if not versions:
            self._loaded.pop(name, None)
            return None
        loaded = self._loaded.get(name)
        if loaded is not None and loaded[0] == versions:
            return loaded[1]
        # One lock per stored dataset: the names reaching here exist in the cache.
        async with self._loading.setdefault(name, asyncio.Lock()):
            loaded = self._loaded.get(name)
            versions = self._versions(name)
            if loaded is not None and loaded[0] == versions:
                return loaded[1]
            dataset = await asyncio.to_thread(self._load, name, versions) if versions else None
            if dataset is None:
                self._loaded.pop(name, None)
                return None
            self._loaded[name] = (versions, dataset)
            return dataset

    def __iter__(self) -> Iterator[str]:
        try:
            names = sorted(p.name for p in (self.root / MANIFESTS_DIR).iterdir() if p.is_dir())
        except OSError:
            return iter(())
        return iter(n for n in names if is_dataset_name(n))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _read_stored(root: Path, packs: PackReader | None, chunk_id: str, length: int) -> bytes:
    """A cached chunk's stored bytes (unverified): its pack record or its file."""
    if packs is not None and length < PACK_MAX_CHUNK_BYTES:
        data = packs.read(chunk_id)
        if data is not None:
            return data
    try:
        return (root / "chunks" / chunk_id[:2] / chunk_id).read_bytes()
    except OSError as exc:
        raise StorageError(f"chunk {chunk_id[:16]} is not in the cache: {exc}") from exc


def agent_cpu_profile() -> CpuProfile:
    """This node's codec speeds if a netopt command calibrated them already (the agent
    does not spend seconds calibrating at start); empty maps otherwise, which makes a
    fetching node plan no compression."""
    try:
        profile = cpu_profile_from_dict(json.loads(default_codec_cache_path().read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return CpuProfile(os.cpu_count() or 1, {}, {})
    return dataclasses.replace(profile, cores=os.cpu_count() or 1)

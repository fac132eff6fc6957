"""Datasets as the data-plane server sees them: a manifest and an index into files on disk.

`load_dataset` chunks a directory into a manifest, indexes where each chunk lies and
samples how well the data compresses; `ServedDataset.read_chunk` reads one chunk back
and checks it against its name. `DatasetView` is what the routes
(`netopt.dataplane.handlers`) need of any dataset, this one or an agent's cache. No
aiohttp here: loading a dataset does not import the web server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import blake3

from netopt.errors import IntegrityError, StorageError, ValidationError
from netopt.names import is_dataset_name
from netopt.transfer.manifest import Manifest, build_manifest
from netopt.transfer.planner import SampleProfile
from netopt.transfer.profile import sample_files

if TYPE_CHECKING:
    from netopt.dataplane.frames import FrameStore

__all__ = ["DatasetView", "LoadingDatasets", "ServedDataset", "index_chunks", "load_dataset"]


class DatasetView(Protocol):
    """What the routes need of a dataset: its manifest, which chunks it has, a sample."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def index(self) -> Mapping[str, object]: ...

    @property
    def sample(self) -> SampleProfile: ...

    def read_chunk(self, chunk_id: str) -> bytes:
        """The verified bytes of one chunk (blocking); StorageError, IntegrityError."""
        ...


@runtime_checkable
class LoadingDatasets(Protocol):
    """Served datasets whose lookup may read them from disk first (an agent's cache,
    `netopt.cache.peerserve.CachedDatasets`): the routes look them up with `load`, which
    reads off the event loop, so a dataset being read does not hold back the others."""

    async def load(self, name: str) -> DatasetView | None:
        """The dataset ``name`` as stored now (None: not stored)."""
        ...


@dataclass(frozen=True)
class ServedDataset:
    """A dataset held in memory as its manifest plus an index to read chunks from disk."""

    manifest: Manifest
    root: Path
    index: Mapping[str, tuple[str, int, int]]
    sample: SampleProfile
    frames: FrameStore | None = None
    """Chunks precompressed at a high level (``netopt serve --precompress``), if any."""
    versioned: bool = False
    """Whether the files may change under it (`netopt.dataplane.origin.LiveDataset`): a
    chunk not in the index then belonged to an older version (410), not to no version."""

    def read_chunk(self, chunk_id: str) -> bytes:
        """Read and verify one chunk (blocking). Raises KeyError, StorageError, IntegrityError."""
        rel, offset, length = self.index[chunk_id]
        try:
            # Descriptor calls on a joined string: a tree of small files pays a path
            # object and a file object per chunk otherwise (a third of a stream's CPU).
            fd = os.open(f"{self.root}/{rel}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.pread(fd, length, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"cannot read {rel}: {exc}") from exc
        if len(data) != length or blake3.blake3(data).hexdigest() != chunk_id:
            raise IntegrityError(f"{rel} changed on disk since the manifest was built")
        return data


def index_chunks(manifest: Manifest) -> dict[str, tuple[str, int, int]]:
    """Where each chunk of ``manifest`` lies: name -> (path, offset, length), first use."""
    index: dict[str, tuple[str, int, int]] = {}
    for entry in manifest.files:
        for ref in entry.chunks:
            index.setdefault(ref.chunk_id, (entry.path, ref.offset_bytes, ref.length_bytes))
    return index


def load_dataset(root: str | os.PathLike[str], name: str, avg_chunk_bytes: int) -> ServedDataset:
    """Chunk ``root`` into a manifest, index its chunks and sample its compressibility."""
    if not is_dataset_name(name):
        raise ValidationError(f"dataset name {name!r} is not allowed (letters, digits, . _ -)")
    base = Path(root).resolve()
    manifest = build_manifest(base, name, avg_chunk_bytes)
    index = index_chunks(manifest)
    files = [base / f.path for f in manifest.files if f.size_bytes > 0]
    # As a stream with a context sends it (clients ask for one; see dataplane.streamctx).
    sample = sample_files(files, in_stream=True) if files else SampleProfile({}, 0)
    return ServedDataset(manifest, base, index, sample)

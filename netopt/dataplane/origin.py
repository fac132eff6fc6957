"""A served directory that follows its changes: every answer describes the files as they are.

`netopt serve DIR` used to chunk DIR once at start and serve that snapshot; a file
changed in place was then either served stale (its manifest) or refused (its
chunks no longer matched). `LiveDataset` publishes a new version instead: before
the info or the manifest is answered, `fresh` asks the `TreeWatcher` whether
anything changed (inotify; a stat walk where inotify is not available) and, if so,
re-chunks only the files whose size, mtime, ctime or inode changed and publishes
the new manifest. Chunks are content-addressed, so a client that started on the
old version still gets every chunk the files share; a chunk the files no longer
hold is answered ``410 DatasetChanged`` and the client starts again on the new
version (`netopt.cache.syncer.run_sync`), keeping what it already fetched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from netopt.chunking import chunk_file
from netopt.dataplane.served import ServedDataset, index_chunks, load_dataset
from netopt.dataplane.watch import FileStamp, TreeWatcher, stat_tree
from netopt.errors import PathTraversalError, StorageError
from netopt.transfer.manifest import FileEntry, Manifest, validate_rel_path
from netopt.transfer.planner import SampleProfile

if TYPE_CHECKING:
    from netopt.dataplane.frames import FrameStore

__all__ = ["LiveDataset", "TreeChange", "diff_stamps", "rebuild_manifest"]

log = logging.getLogger(__name__)

RunInThread = Callable[[Callable[[], bool]], Awaitable[bool]]


@dataclass(frozen=True)
class TreeChange:
    """Paths whose stamps differ between two stat walks."""

    changed: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)


def diff_stamps(old: Mapping[str, FileStamp], new: Mapping[str, FileStamp]) -> TreeChange:
    """What changed from ``old`` to ``new`` (pure)."""
    changed = tuple(sorted(p for p in new.keys() & old.keys() if new[p] != old[p]))
    added = tuple(sorted(new.keys() - old.keys()))
    removed = tuple(sorted(old.keys() - new.keys()))
    return TreeChange(changed, added, removed)


def rebuild_manifest(
    root: Path, manifest: Manifest, change: TreeChange, stamps: Mapping[str, FileStamp]
) -> tuple[Manifest, dict[str, FileStamp]]:
    """``manifest`` with ``change`` applied: changed and added files chunked again.

    Returns the new manifest and the stamps of the files it describes (taken before
    each file was read, so a write during the read shows up as a change next time).
    A file that vanished in between is left out. Raises StorageError when a file
    cannot be read; a file whose name could not be served safely is left out (logged).
    """
    entries = {f.path: f for f in manifest.files}
    kept = dict(stamps)
    for rel in change.removed:
        entries.pop(rel, None)
    for rel in (*change.changed, *change.added):
        path = root / rel
        try:
            validate_rel_path(rel)
        except PathTraversalError as exc:
            # A name no client could write safely: not served, remembered so the next
            # walk does not take it for new again.
            log.warning("not serving %r: %s", rel, exc)
            entries.pop(rel, None)
            kept[rel] = stamps[rel]
            continue
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(rel)
            chunks = tuple(chunk_file(path, manifest.avg_chunk_bytes))
        except FileNotFoundError:
            entries.pop(rel, None)
            kept.pop(rel, None)
            continue
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        entries[rel] = FileEntry(
            rel,
            st.st_size,
            stat.S_IMODE(st.st_mode) & 0o777,
            st.st_mtime_ns,
            chunks,
        )
        kept[rel] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    files = tuple(entries[p] for p in sorted(entries, key=_walk_order))
    return dataclasses.replace(manifest, files=files), kept


def _walk_order(rel: str) -> tuple[tuple[int, str], ...]:
    """`build_manifest`'s order (``os.walk`` top down, sorted): in each directory its
    files first, then each subdirectory's contents, names sorted at each level."""
    *dirs, name = rel.split("/")
    return (*((1, d) for d in dirs), (0, name))


class LiveDataset:
    """A directory served as a dataset whose versions follow the files.

    Reads of `manifest`, `index`, `sample` and `read_chunk` see the current
    version; `fresh` brings it up to date first. One refresh runs at a time, and
    a request waits only for a refresh that started after it arrived.
    """

    def __init__(self, dataset: ServedDataset, stamps: dict[str, FileStamp]) -> None:
        self._current = dataclasses.replace(dataset, versioned=True)
        self._stamps = stamps
        self._watcher = TreeWatcher()
        self._watcher.watch(stat_tree(dataset.root)[1])
        self._lock = asyncio.Lock()
        self._refreshed_from_s = time.monotonic()
        self.versions_published = 1

    @classmethod
    def load(cls, root: str | os.PathLike[str], name: str, avg_chunk_bytes: int) -> LiveDataset:
        """Chunk ``root`` (blocking) and follow it from then on."""
        base = Path(root).resolve()
        stamps, _ = stat_tree(base)
        return cls(load_dataset(base, name, avg_chunk_bytes), stamps)

    @property
    def current(self) -> ServedDataset:
        """The version published last."""
        return self._current

    @property
    def manifest(self) -> Manifest:
        """The current version's manifest."""
        return self._current.manifest

    @property
    def index(self) -> Mapping[str, object]:
        """The current version's chunk index."""
        return self._current.index

    @property
    def sample(self) -> SampleProfile:
        """How the data compresses (sampled from the first version)."""
        return self._current.sample

    def read_chunk(self, chunk_id: str) -> bytes:
        """Read and verify one chunk of the current version (blocking)."""
        return self._current.read_chunk(chunk_id)

    def with_frames(self, frames: FrameStore) -> None:
        """Serve precompressed frames (``netopt serve --precompress``) from now on."""
        self._current = dataclasses.replace(self._current, frames=frames)

    @property
    def watching(self) -> str:
        """How changes are noticed, for the serve banner and logs."""
        if self._watcher.active:
            return "inotify"
        return f"stat walk ({self._watcher.reason})"

    def refresh(self) -> bool:
        """Publish a new version if the files changed (blocking); True when it did."""
        if not self._watcher.changed():
            return False
        root = self._current.root
        stamps, dirs = stat_tree(root)
        self._watcher.watch(dirs)
        change = diff_stamps(self._stamps, stamps)
        if not change:
            return False
        old = self._current
        manifest, kept = rebuild_manifest(root, old.manifest, change, stamps)
        # The compressibility sample of the first version still describes the data well
        # enough to plan with; sampling again on every change would cost each request.
        self._current = dataclasses.replace(old, manifest=manifest, index=index_chunks(manifest))
        self._stamps = kept
        self.versions_published += 1
        log.info(
            "dataset %s changed (%d changed, %d added, %d removed files): version %s",
            manifest.name,
            len(change.changed),
            len(change.added),
            len(change.removed),
            manifest.manifest_id[:16],
        )
        return True

    async def fresh(self, run_in_thread: RunInThread) -> ServedDataset:
        """The current version after a refresh that started after this call."""
        asked_s = time.monotonic()
        async with self._lock:
            if self._refreshed_from_s < asked_s:
                started_s = time.monotonic()
                await run_in_thread(self.refresh)
                self._refreshed_from_s = started_s
        return self._current

    def close(self) -> None:
        """Stop watching."""
        self._watcher.close()

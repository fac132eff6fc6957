"""The served manifests, encoded once per version: canonical JSON and its zstd frame.

Before, every manifest request serialized the whole manifest again (a 100k-file
tree: ~18 MB of JSON, about a second of the server's CPU) and sent it uncompressed.
`ManifestEncodings` keeps, per dataset, the encoded forms of the last
`VERSIONS_KEPT` versions (the current one and the one before, while requests that
started on it still hold it), made in the server's thread pool, once per version
however many requests arrive together. A version is known by its `Manifest` object
(a served dataset keeps one per version; the cache holds it weakly, so it never
keeps an old version's file entries alive), and forgotten once that object is gone,
once `VERSIONS_KEPT` newer ones were encoded, or when its dataset is beyond the
`DATASETS_KEPT` asked for last: memory stays bounded on a server whose files keep
changing or an agent whose cache holds many datasets.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from netopt.dataplane.manifestwire import compress_manifest
from netopt.transfer.manifest import Manifest

__all__ = ["DATASETS_KEPT", "VERSIONS_KEPT", "EncodedManifest", "ManifestEncodings"]

VERSIONS_KEPT = 2
"""Encoded versions kept per dataset: the current one and the previous one."""

DATASETS_KEPT = 64
"""Datasets whose encodings are kept (the least recently asked for goes first)."""

RunInThread = Callable[[Callable[[], "EncodedManifest"]], Awaitable["EncodedManifest"]]


@dataclass(frozen=True)
class EncodedManifest:
    """One manifest version as the manifest route sends it."""

    manifest_id: str
    plain: bytes
    """The canonical JSON (`Manifest.canonical_json`: the same bytes, not a copy)."""
    zstd: bytes
    """``plain`` as one zstd frame at `netopt.dataplane.manifestwire.MANIFEST_ZSTD_LEVEL`."""


def encode(manifest: Manifest) -> EncodedManifest:
    """``manifest``'s id, canonical JSON and zstd frame (blocking: CPU)."""
    plain = manifest.canonical_json
    return EncodedManifest(manifest.manifest_id, plain, compress_manifest(plain))


@dataclass(frozen=True)
class _Held:
    manifest: weakref.ref[Manifest]
    encoding: asyncio.Future[EncodedManifest]


class ManifestEncodings:
    """Encoded manifests by dataset name, `VERSIONS_KEPT` versions each."""

    def __init__(
        self, versions_kept: int = VERSIONS_KEPT, datasets_kept: int = DATASETS_KEPT
    ) -> None:
        self._versions_kept = max(1, versions_kept)
        self._datasets_kept = max(1, datasets_kept)
        self._by_name: OrderedDict[str, list[_Held]] = OrderedDict()
        self.encoded = 0
        """Versions encoded so far (for tests and operators)."""

    def versions_held(self, name: str) -> int:
        """Encoded versions (done or in progress) held for ``name``."""
        return len(self._by_name.get(name, ()))

    def _encode(self, manifest: Manifest) -> EncodedManifest:
        encoded = encode(manifest)
        self.encoded += 1
        return encoded

    async def get(self, name: str, manifest: Manifest, run: RunInThread) -> EncodedManifest:
        """``manifest`` (a version of dataset ``name``) encoded; the encoding runs through
        ``run`` (the server's thread pool) unless this version is held already."""
        held = self._by_name.setdefault(name, [])
        self._by_name.move_to_end(name)
        while len(self._by_name) > self._datasets_kept:
            self._by_name.popitem(last=False)
        # By identity: a served dataset keeps one Manifest object per version, so a
        # lookup never hashes 18 MB of JSON again; versions no one holds are dropped.
        held[:] = [e for e in held if e.manifest() is not None]
        entry = next((e for e in held if e.manifest() is manifest), None)
        if entry is None:
            encoding = asyncio.ensure_future(run(partial(self._encode, manifest)))
            entry = _Held(weakref.ref(manifest), encoding)
            held.append(entry)
            del held[: -self._versions_kept]
        try:
            # Shielded: a client that goes away does not cancel the others' encoding.
            return await asyncio.shield(entry.encoding)
        except Exception:
            if entry in held:
                held.remove(entry)  # failed: the next request tries again
            raise

"""``netopt cache verify``: find chunks that no longer match their BLAKE3 name, repair them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from netopt.cache.sources import SourceOptions, open_source, source_kind
from netopt.cache.store import Cache
from netopt.dataplane.chunkio import decode_chunk
from netopt.errors import IntegrityError, NetworkError, StorageError

__all__ = ["VerifyReport", "repair_from", "scan_chunks", "verify_cache"]


@dataclass(frozen=True)
class VerifyReport:
    """What verify found: corrupt chunks are removed; missing ones are used by a dataset."""

    checked: int
    corrupt: tuple[str, ...]
    missing: tuple[str, ...]
    repaired: tuple[str, ...] = ()

    @property
    def unrepaired(self) -> tuple[str, ...]:
        """Chunks still absent that a current dataset version needs."""
        done = set(self.repaired)
        return tuple(c for c in sorted(set(self.corrupt) | set(self.missing)) if c not in done)

    def to_dict(self) -> dict[str, object]:
        """JSON-able form."""
        return {
            "checked": self.checked,
            "corrupt": list(self.corrupt),
            "missing": list(self.missing),
            "repaired": list(self.repaired),
            "unrepaired": list(self.unrepaired),
            "ok": not self.unrepaired,
        }


def scan_chunks(cache: Cache) -> tuple[int, list[str]]:
    """Re-hash every stored chunk (blocking); remove and return the ones that fail."""
    corrupt: list[str] = []
    checked = 0
    for cid in list(cache.iter_chunk_ids()):
        checked += 1
        try:
            cache.read(cid, record=False)
        except IntegrityError:
            corrupt.append(cid)
        except KeyError:
            continue
    return checked, corrupt


async def repair_from(
    cache: Cache, source: str, wanted: dict[str, int], opts: SourceOptions
) -> list[str]:
    """Fetch ``wanted`` chunks (name -> length) from SOURCE, verify and store them.

    Chunks the source does not hold are skipped; StorageError / NetworkError propagate.
    """
    repaired: list[str] = []
    async with open_source(source, opts) as opened:
        offered = opened.manifest.unique_chunks()
        for cid, length in sorted(wanted.items()):
            if offered.get(cid) != length:
                continue
            try:
                raw = await opened.source.fetch_chunk(cid, length)
                data = await asyncio.to_thread(decode_chunk, raw, cid, length)
            except (IntegrityError, NetworkError):
                continue
            await asyncio.to_thread(cache.put, cid, data)
            repaired.append(cid)
    return repaired


async def verify_cache(
    cache: Cache, source: str | None = None, opts: SourceOptions | None = None
) -> VerifyReport:
    """Check every chunk; with ``source``, fetch the corrupt and missing ones again.

    Raises StorageError when the cache cannot be read.
    """
    checked, corrupt = await asyncio.to_thread(scan_chunks, cache)
    try:
        needed = await asyncio.to_thread(cache.referenced)
    except StorageError:
        needed = {}
    missing = sorted(c for c in needed if not cache.has(c) and c not in corrupt)
    repaired: list[str] = []
    if source is not None:
        wanted = {c: needed[c] for c in [*corrupt, *missing] if c in needed}
        base = opts or SourceOptions()
        # A directory is chunked here: cut it as each cached dataset was cut.
        sizes = {base.avg_chunk_bytes}
        if source_kind(source) == "path":
            sizes = {cache.manifest(name).avg_chunk_bytes for name in list(cache.datasets)}
        for avg_chunk_bytes in sorted(sizes):
            left = {c: n for c, n in wanted.items() if c not in repaired}
            if left:
                chunked = replace(base, avg_chunk_bytes=avg_chunk_bytes)
                repaired += await repair_from(cache, source, left, chunked)
    return VerifyReport(checked, tuple(corrupt), tuple(missing), tuple(repaired))

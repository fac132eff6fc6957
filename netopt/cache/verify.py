"""``netopt cache verify``: find chunks that no longer match their BLAKE3 name, repair them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from netopt.cache.sources import Source, SourceOptions, parse_source
from netopt.cache.store import Cache
from netopt.dataplane.chunkio import decode_chunk
from netopt.errors import IntegrityError, NetworkError, StorageError

__all__ = ["VerifyReport", "repair_from", "scan_chunks", "verify_cache"]


@dataclass(frozen=True)
class VerifyReport:
    """What verify found: corrupt chunks are removed; missing ones are used by a dataset.

    ``errors``: what stopped verify short of its job (a full disk during a repair, an
    index or manifest it could not read or write); what it found is reported anyway.
    """

    checked: int
    corrupt: tuple[str, ...]
    missing: tuple[str, ...]
    repaired: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

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
            "errors": list(self.errors),
            "ok": not self.unrepaired and not self.errors,
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
    cache: Cache, source: Source, wanted: dict[str, int], opts: SourceOptions, repaired: list[str]
) -> None:
    """Fetch ``wanted`` chunks (name -> length) from SOURCE, verify and store them,
    appending each stored one to ``repaired`` (so it holds them when an error stops it).

    Chunks the source does not hold are skipped; StorageError / NetworkError propagate.
    """
    async with source.open(opts) as opened:
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


async def verify_cache(
    cache: Cache, source: str | None = None, opts: SourceOptions | None = None
) -> VerifyReport:
    """Check every chunk; with ``source``, fetch the corrupt and missing ones again.

    A repair that fails (a full disk, the source gone) ends the repairs and is listed
    in the report's ``errors``. Raises ValidationError for a bad ``source`` (before any
    chunk is checked) and StorageError when a chunk cannot be read.
    """
    base = opts or SourceOptions()
    origin = parse_source(source, base.name) if source is not None else None
    checked, corrupt = await asyncio.to_thread(scan_chunks, cache)
    errors: list[str] = []
    try:
        needed = await asyncio.to_thread(cache.referenced)
    except StorageError as exc:
        needed = {}
        errors.append(f"cannot tell which chunks the datasets need: {exc}")
    missing = sorted(c for c in needed if not cache.has(c) and c not in corrupt)
    repaired: list[str] = []
    if origin is not None:
        wanted = {c: needed[c] for c in [*corrupt, *missing] if c in needed}
        try:
            await _repair(cache, origin, base, wanted, repaired)
        except (StorageError, NetworkError) as exc:
            errors.append(f"repair stopped: {exc}")
    return VerifyReport(checked, tuple(corrupt), tuple(missing), tuple(repaired), tuple(errors))


async def _repair(
    cache: Cache,
    source: Source,
    base: SourceOptions,
    wanted: dict[str, int],
    repaired: list[str],
) -> None:
    """Repair ``wanted`` from SOURCE into ``repaired``; a directory is chunked as each
    cached dataset was cut."""
    sizes = {base.avg_chunk_bytes}
    if source.recut_on_open:
        sizes = {cache.manifest(name).avg_chunk_bytes for name in list(cache.datasets)}
    for avg_chunk_bytes in sorted(sizes):
        left = {c: n for c, n in wanted.items() if c not in repaired}
        if left:
            chunked = replace(base, avg_chunk_bytes=avg_chunk_bytes)
            await repair_from(cache, source, left, chunked, repaired)

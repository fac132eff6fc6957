"""Cache policy, pure: which chunks to evict, and how reads feed access statistics.

The policy is LFU with aging and a most-recent-first tie break:

- a chunk's score is its access count (reads, halved by `age_access` when the
  counts grow large, so yesterday's hot data can cool down);
- victims are taken lowest count first; among equal counts the chunk read most
  recently goes first.

Why that tie break: in an epoch-order cyclic scan over a dataset larger than
the cache, every chunk is read once per epoch. Plain LRU evicts exactly the
chunk that is needed next and hits nothing. Here the chunks that stayed in the
cache through an epoch were read again (their counts grew) while each newly
admitted chunk ties with the previous newcomer and replaces it, so a fixed
part of the dataset (about the cache's size) stays resident and hits every
epoch. Pinned and in-use chunks are never candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

__all__ = [
    "AGING_FACTOR",
    "ChunkAccess",
    "age_access",
    "evict",
    "needs_aging",
    "record_access",
]

AGING_FACTOR = 16
"""Counts are halved when their sum exceeds this many reads per tracked chunk."""


@dataclass(frozen=True)
class ChunkAccess:
    """How often and when (a logical tick, not wall time) a chunk was read."""

    count: int
    last_tick: int


def record_access(previous: ChunkAccess | None, tick: int) -> ChunkAccess:
    """The statistics after one more read at logical time ``tick``."""
    if previous is None:
        return ChunkAccess(1, tick)
    return ChunkAccess(previous.count + 1, max(tick, previous.last_tick))


def needs_aging(access: Mapping[str, ChunkAccess]) -> bool:
    """True when the counts have grown past `AGING_FACTOR` reads per tracked chunk."""
    total = sum(a.count for a in access.values())
    return bool(access) and total > AGING_FACTOR * len(access)


def age_access(access: Mapping[str, ChunkAccess]) -> dict[str, ChunkAccess]:
    """Halve every count (rounding down); entries that reach zero are dropped."""
    return {
        cid: ChunkAccess(a.count // 2, a.last_tick) for cid, a in access.items() if a.count >= 2
    }


def evict(
    sizes_bytes: Mapping[str, int],
    capacity_bytes: int,
    pins: Set[str],
    access: Mapping[str, ChunkAccess],
) -> tuple[str, ...]:
    """The chunks to delete so the cache fits in ``capacity_bytes``, in eviction order.

    ``sizes_bytes`` is the cache's content (chunk name -> bytes on disk), ``pins``
    the chunks that must stay (pinned datasets and data in use), ``access`` the
    read statistics (absent: never read). When the unpinned chunks are not enough,
    every unpinned chunk is returned and the cache stays over capacity; the
    caller decides whether that is an error.
    """
    used_bytes = sum(sizes_bytes.values())
    if used_bytes <= capacity_bytes:
        return ()
    never = ChunkAccess(0, -1)

    def key(cid: str) -> tuple[int, int, str]:
        a = access.get(cid, never)
        return (a.count, -a.last_tick, cid)

    victims: list[str] = []
    for cid in sorted((c for c in sizes_bytes if c not in pins), key=key):
        if used_bytes <= capacity_bytes:
            break
        victims.append(cid)
        used_bytes -= sizes_bytes[cid]
    return tuple(victims)

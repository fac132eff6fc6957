"""Parts asked at once, a straggler asked again: a hedged request.

A small sync fetches its chunk as up to 32 parts at once, one per warm connection
(`netopt.dataplane.streamwork.parts_per_chunk`), each within its connection's first
flight, so the whole chunk should be in one round trip after it is asked. On a lossy
link a few parts lose a packet and wait for the sender's loss recovery instead. On the
lab's 140 ms, 1%-loss link (32 parts of ~10 KB), most parts were in 147-190 ms after
they were asked; in five syncs of six, one to four parts came at 286-430 ms (a tail-loss
probe) or at 700-770 ms (a retransmission timeout), and the sync waited 0.3-0.6 s more
for them: a 1 MB sync took 1.2-1.3 s instead of ~0.85 s.

So a part still out when the parts in so far show it late (`late_after_s`) is asked
again, on another connection (one whose part is in is idle), and the first copy in
wins; the others are cut. A part gets at most `MAX_COPIES` copies, each asked once the
one before it is late, so a link that is slow for every part costs no more than that.
A copy that fails leaves the part to its other copies; a part whose every copy failed
fails the whole (`gather_hedged` raises its error, and cuts the rest).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from netopt.dataplane import trace

__all__ = ["HEDGE_AFTER", "HEDGE_SLACK_S", "MAX_COPIES", "gather_hedged", "late_after_s"]

T = TypeVar("T")

HEDGE_AFTER = 1.5
"""A part out this many times the median time the parts in so far took is late. The
parts of one chunk are asked together and are the same size, so on the lab they came
within 1.3x of their median unless a packet was lost (1.7-5x)."""

HEDGE_SLACK_S = 0.05
"""And it is late only this much past that median at least: on loopback or a LAN the
median is a few ms, and a scheduler's hiccup is not a lost packet."""

MAX_COPIES = 3
"""The most copies of one part asked (the first included)."""


def late_after_s(arrived_s: Sequence[float], count: int) -> float | None:
    """How long a copy of one of ``count`` parts may be out before the part is asked
    again, from the times the parts in so far took (``arrived_s``, from when they were
    asked): `HEDGE_AFTER` times their median, and `HEDGE_SLACK_S` more than it at least.
    None while fewer than half of the parts are in: too few to say what is late."""
    if count < 2 or 2 * len(arrived_s) < count:
        return None
    median_s = statistics.median(arrived_s)
    return max(median_s * HEDGE_AFTER, median_s + HEDGE_SLACK_S)


async def gather_hedged(count: int, fetch: Callable[[int], Awaitable[T]]) -> list[T]:
    """``fetch(part)`` for each of ``count`` parts, at once, and each late part again
    (see the module doc): the first copy of each part in, in part order. The first error
    of a part whose every copy failed is raised, the other requests cut."""
    started_s = time.monotonic()
    results: dict[int, T] = {}
    arrived_s: list[float] = []
    out: dict[asyncio.Future[T], int] = {}
    newest_s: dict[int, float] = {}
    copies = [0] * count
    cut: list[asyncio.Future[T]] = []

    def ask(part: int) -> None:
        out[asyncio.ensure_future(fetch(part))] = part
        newest_s[part] = time.monotonic()
        copies[part] += 1

    for part in range(count):
        ask(part)
    try:
        while len(results) < count:
            timeout_s = None
            late_s = late_after_s(arrived_s, count)
            if late_s is not None:
                now_s = time.monotonic()
                waiting = [p for p in range(count) if p not in results and copies[p] < MAX_COPIES]
                for part in waiting:
                    if now_s - newest_s[part] >= late_s:
                        ask(part)
                        trace.count("chunk_part_hedges")
                due_s = [newest_s[p] + late_s - now_s for p in waiting if copies[p] < MAX_COPIES]
                timeout_s = max(0.0, min(due_s)) if due_s else None
            done, _ = await asyncio.wait(
                out, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task not in out:
                    continue  # a copy cut as another of its part came in the same wait
                part = out.pop(task)
                exc = task.exception()
                if exc is not None:
                    if part in out.values():
                        continue  # another copy of the part is still coming
                    raise exc
                results[part] = task.result()
                arrived_s.append(time.monotonic() - started_s)
                for other in [t for t, p in out.items() if p == part]:
                    other.cancel()  # the part is in: its other copies are cut
                    cut.append(other)
                    del out[other]
    finally:
        for task in out:
            task.cancel()
        await asyncio.gather(*out, *cut, return_exceptions=True)
    return [results[part] for part in range(count)]

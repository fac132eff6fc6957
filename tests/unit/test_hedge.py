"""Hedged parts (`netopt.dataplane.hedge`): the decision of when a part is late, and the
gathering above the I/O edge with fake fetches (the edge, a real server that holds a
part back, is `tests/service/test_sync_round_trips.py`)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from netopt.dataplane.hedge import (
    HEDGE_AFTER,
    HEDGE_SLACK_S,
    MAX_COPIES,
    gather_hedged,
    late_after_s,
)
from netopt.errors import NetworkError


def test_no_part_is_late_before_half_the_parts_are_in() -> None:
    assert late_after_s([], 4) is None
    assert late_after_s([0.15], 4) is None
    assert late_after_s([0.15], 1) is None  # one part: nothing to compare it with
    assert late_after_s([0.15, 0.16], 4) is not None
    assert late_after_s([0.15] * 15, 32) is None
    assert late_after_s([0.15] * 16, 32) is not None


def test_late_is_a_multiple_of_the_median_and_never_within_the_slack() -> None:
    # The lab's parts: in at 147-190 ms; a lost packet's part at 286 ms or later.
    arrived_s = [0.147, 0.150, 0.160, 0.165, 0.170, 0.190]
    late_s = late_after_s(arrived_s, 8)
    assert late_s == pytest.approx(HEDGE_AFTER * 0.1625)
    assert 0.190 < late_s < 0.286
    # On loopback the median is a few ms: a hiccup within the slack is not late.
    fast = late_after_s([0.002, 0.003, 0.003], 4)
    assert fast == pytest.approx(0.003 + HEDGE_SLACK_S)


Step = tuple[float, Exception | None] | None
"""One copy of a part: answer (or raise the exception) after that many seconds; None:
held forever."""


async def _gather(
    steps: dict[int, list[Step]], count: int
) -> tuple[list[str], Counter[int], list[int]]:
    """`gather_hedged` over fakes: copy N of part P does ``steps[P][N]`` (the last one
    again for later copies; 10 ms and an answer for a part not named); returns the
    results, the copies asked per part and the parts of the copies cut."""
    asked: Counter[int] = Counter()
    cut: list[int] = []

    async def fetch(part: int) -> str:
        plan = steps.get(part, [(0.01, None)])
        step = plan[min(asked[part], len(plan) - 1)]
        asked[part] += 1
        copy = asked[part]
        try:
            if step is None:
                await asyncio.Event().wait()
                raise AssertionError("unreachable")
            await asyncio.sleep(step[0])
        except asyncio.CancelledError:
            cut.append(part)
            raise
        if step[1] is not None:
            raise step[1]
        return f"part {part} copy {copy}"

    results = await gather_hedged(count, fetch)
    return results, asked, cut


async def test_parts_that_come_together_are_each_asked_once() -> None:
    results, asked, cut = await _gather({}, 8)
    assert results == [f"part {p} copy 1" for p in range(8)]
    assert asked == Counter(range(8))
    assert cut == []


async def test_a_part_held_back_is_asked_again_and_the_held_copy_is_cut() -> None:
    async with asyncio.timeout(5):
        results, asked, cut = await _gather({3: [None, (0.01, None)]}, 8)
    assert results == [f"part {p} copy {2 if p == 3 else 1}" for p in range(8)]
    assert asked == Counter([*range(8), 3])
    assert cut == [3]  # the held request is not left open


async def test_a_part_held_back_every_time_is_asked_at_most_max_copies_times() -> None:
    asked: Counter[int] = Counter()

    async def fetch(part: int) -> int:
        asked[part] += 1
        if part == 0:
            await asyncio.Event().wait()
        await asyncio.sleep(0.01)
        return part

    task = asyncio.ensure_future(gather_hedged(4, fetch))
    await asyncio.sleep(1.0)  # many times the late threshold here (~60 ms)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert asked == Counter({0: MAX_COPIES, 1: 1, 2: 1, 3: 1})


async def test_a_failed_copy_leaves_the_part_to_its_other_copy() -> None:
    # Part 2's first copy fails after 0.3 s; its later copies, each asked once the one
    # before was late, are still out then: the first of them in is the part's answer,
    # no error, and the last is cut.
    async with asyncio.timeout(5):
        results, asked, cut = await _gather({2: [(0.3, NetworkError("cut")), (0.5, None)]}, 4)
    assert results[2] == "part 2 copy 2"
    assert asked == Counter({0: 1, 1: 1, 2: MAX_COPIES, 3: 1})
    assert cut == [2]


async def test_a_part_whose_every_copy_failed_fails_the_whole_and_cuts_the_rest() -> None:
    with pytest.raises(NetworkError, match="cut"):
        async with asyncio.timeout(5):
            await _gather({0: [(0.0, NetworkError("cut"))], 1: [None], 2: [None]}, 4)

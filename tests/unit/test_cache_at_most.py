"""`at_most`: calls in order of their results, never more than the limit at once, the
first failure cancelling the rest and raised as it is."""

from __future__ import annotations

import asyncio

import pytest

from netopt.cache.remotefiles import at_most


async def test_results_keep_their_order_and_the_limit_holds() -> None:
    running = 0
    most = 0

    async def call(index: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (index % 3))
        running -= 1
        return index * 10

    assert await at_most(4, 30, call) == [i * 10 for i in range(30)]
    assert most == 4
    assert await at_most(4, 0, call) == []


async def test_the_first_failure_cancels_the_others_and_is_raised_as_is() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def call(index: int) -> int:
        started.append(index)
        if index == 2:
            raise KeyError("the third")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise
        return index

    with pytest.raises(KeyError, match="the third"):
        await asyncio.wait_for(at_most(3, 100, call), 5)
    assert sorted(started) == [0, 1, 2]  # no call started after the failure
    assert sorted(cancelled) == [0, 1]

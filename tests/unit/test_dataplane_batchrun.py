"""ThreadBatcher: many blocking calls per pool hand-off, results and errors to each caller."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from netopt.dataplane.batchrun import MAX_BATCH, MAX_BATCH_BYTES, ThreadBatcher


def test_calls_queued_together_share_hand_offs_and_keep_their_results() -> None:
    async def main() -> tuple[list[int], ThreadBatcher]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            batcher = ThreadBatcher(pool, 2)
            results = await asyncio.gather(*(batcher.run(lambda x: x * x, i) for i in range(500)))
            return list(results), batcher

    results, batcher = asyncio.run(main())
    assert results == [i * i for i in range(500)]
    assert batcher.calls == 500
    # 500 calls queued in one turn of the loop: at most two threads' worth of batches of
    # MAX_BATCH, not one hand-off per call.
    assert batcher.handoffs <= -(-500 // MAX_BATCH) + 2
    assert batcher.handoffs >= 2  # split over both threads


def test_an_error_reaches_only_its_caller_and_heavy_calls_spread_over_threads() -> None:
    def work(i: int) -> str:
        if i == 3:
            raise ValueError("three")
        return threading.current_thread().name

    async def main() -> tuple[list[object], ThreadBatcher]:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="b") as pool:
            batcher = ThreadBatcher(pool, 2)
            calls = [batcher.run(work, i, weight_bytes=MAX_BATCH_BYTES) for i in range(6)]
            return await asyncio.gather(*calls, return_exceptions=True), batcher

    results, batcher = asyncio.run(main())
    assert isinstance(results[3], ValueError)
    assert str(results[3]) == "three"
    assert all(isinstance(r, str) and r.startswith("b") for i, r in enumerate(results) if i != 3)
    assert batcher.handoffs == 6  # a call as heavy as a whole batch goes alone


def test_a_call_cancelled_before_its_batch_starts_does_not_run() -> None:
    ran: list[int] = []
    gate = threading.Event()

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as pool:
            batcher = ThreadBatcher(pool, 1)
            first = asyncio.ensure_future(batcher.run(gate.wait, 5))
            await asyncio.sleep(0.05)  # the first batch runs (and blocks) on the one thread
            second = asyncio.ensure_future(batcher.run(ran.append, 2))
            await asyncio.sleep(0.01)
            second.cancel()
            gate.set()
            assert await first is True
            with pytest.raises(asyncio.CancelledError):
                await second
            assert await batcher.run(ran.append, 3) is None

    asyncio.run(main())
    assert ran == [3]

"""`blocking`: small work on the loop's own thread, large or unsized work on a pool
thread, the result and the error as the call gives them."""

from __future__ import annotations

import threading

import pytest

from netopt.dataplane.onloop import ON_LOOP_MAX_BYTES, blocking


def _thread_name(_: object = None) -> str:
    return threading.current_thread().name


async def test_small_work_runs_on_the_loop_and_the_rest_on_a_thread() -> None:
    loop_thread = _thread_name()
    assert await blocking(0, _thread_name) == loop_thread
    assert await blocking(ON_LOOP_MAX_BYTES, _thread_name, 1) == loop_thread
    assert await blocking(ON_LOOP_MAX_BYTES + 1, _thread_name) != loop_thread
    assert await blocking(-1, _thread_name) != loop_thread  # unknown size: not small


async def test_errors_come_as_the_call_raises_them() -> None:
    def fail(size_bytes: int) -> None:
        raise OSError(f"refused {size_bytes}")

    for size_bytes in (10, ON_LOOP_MAX_BYTES * 4):
        with pytest.raises(OSError, match=f"refused {size_bytes}"):
            await blocking(size_bytes, fail, size_bytes)

"""Blocking work small enough to run on the event loop itself: the project's one rule
of where a small file operation runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["ON_LOOP_MAX_BYTES", "blocking"]

P = ParamSpec("P")
T = TypeVar("T")

ON_LOOP_MAX_BYTES = 256 * 1024
"""Blocking work on at most this many bytes (a small chunk's verify, store and write, a
small file's download, cut and read-back) runs on the loop itself. Such work is Python
that holds the interpreter lock: on a pool thread it ran beside nothing and paid a lock
hand-off at every system call it made (a 20,000-file sync made 265,000 futex calls, 13 a
file; inline: -20% of the client's CPU; a web origin's 4,800 images made 1.4 million). Its
writes go to the page cache and the fsyncs stay in the flushers' threads, so such a call
takes about a millisecond. Larger work (hashing, decompressing and copying release the
lock) goes to a thread."""


async def blocking(size_bytes: int, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)``: on the loop when it handles at most `ON_LOOP_MAX_BYTES`
    (``size_bytes``; a negative size, unknown, is not small), else on a pool thread."""
    if 0 <= size_bytes <= ON_LOOP_MAX_BYTES:
        return call(*args, **kwargs)
    return await asyncio.to_thread(call, *args, **kwargs)

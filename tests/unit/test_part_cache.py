"""`PartCache`: a chunk asked for in parts is read once, its waiters share the read or its
error, and what is kept stays within its bound and its time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from netopt.dataplane.partcache import PartCache
from netopt.errors import IntegrityError


def test_parts_asked_at_once_share_one_read() -> None:
    cache = PartCache()
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []
    data = bytes(range(256)) * 8192  # 2 MiB

    def read() -> bytes:
        calls.append(1)
        started.set()
        assert release.wait(10)
        return data

    with ThreadPoolExecutor(max_workers=32) as pool:
        first = pool.submit(cache.get, "a" * 64, read)
        assert started.wait(10)
        rest = [pool.submit(cache.get, "a" * 64, read) for _ in range(31)]
        release.set()
        got = [first.result(10)] + [f.result(10) for f in rest]
    assert all(g is data for g in got)
    assert len(calls) == 1
    assert (cache.reads, cache.shared) == (1, 31)
    assert cache.get("a" * 64, read) is data  # kept: no second read
    assert len(calls) == 1


def test_a_failed_read_fails_its_waiters_and_is_not_kept() -> None:
    cache = PartCache()
    started = threading.Event()
    release = threading.Event()

    def bad() -> bytes:
        started.set()
        assert release.wait(10)
        raise IntegrityError("changed on disk")

    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(cache.get, "b" * 64, bad)
        assert started.wait(10)
        waiters = [pool.submit(cache.get, "b" * 64, bad) for _ in range(3)]
        release.set()
        for future in [first, *waiters]:
            with pytest.raises(IntegrityError):
                future.result(10)
    assert cache.kept_bytes == 0
    assert cache.get("b" * 64, lambda: b"good") == b"good"  # read again
    assert cache.reads == 2


def test_kept_bytes_stay_within_the_bound_least_recently_asked_dropped() -> None:
    cache = PartCache(max_bytes=10)
    reads: list[str] = []

    def reader(name: str, size: int) -> Callable[[], bytes]:
        def read() -> bytes:
            reads.append(name)
            return name.encode()[:1] * size

        return read

    cache.get("a", reader("a", 4))
    cache.get("b", reader("b", 4))
    cache.get("a", reader("a", 4))  # a asked again: b is now the least recent
    cache.get("c", reader("c", 4))  # 12 > 10: b dropped
    assert cache.kept_bytes == 8
    cache.get("a", reader("a", 4))
    cache.get("b", reader("b", 4))
    assert reads == ["a", "b", "c", "b"]
    assert cache.kept_bytes <= 10
    cache.get("big", reader("big", 11))  # larger than the bound: read, not kept
    cache.get("big", reader("big", 11))
    assert reads[-2:] == ["big", "big"]
    assert cache.kept_bytes <= 10


def test_a_chunk_not_asked_for_a_while_is_dropped() -> None:
    now = [100.0]
    cache = PartCache(keep_s=10.0, clock=lambda: now[0])
    reads: list[int] = []

    def read() -> bytes:
        reads.append(1)
        return b"x" * 100

    cache.get("a", read)
    now[0] += 9.0
    cache.get("a", read)  # kept, and asked: its time starts again
    now[0] += 9.0
    cache.get("a", read)
    assert len(reads) == 1
    now[0] += 10.5
    cache.get("other", lambda: b"y")  # any request drops what went unused
    assert cache.kept_bytes == 1
    cache.get("a", read)
    assert len(reads) == 2


def test_a_sweep_drops_what_went_unused_and_says_whether_anything_is_left() -> None:
    now = [0.0]
    cache = PartCache(keep_s=10.0, clock=lambda: now[0])
    cache.get("a", lambda: b"x" * 10)
    now[0] = 5.0
    cache.get("b", lambda: b"y" * 10)
    now[0] = 11.0
    assert cache.sweep() is True  # "a" dropped, "b" still fresh
    assert cache.kept_bytes == 10
    now[0] = 15.5
    assert cache.sweep() is False
    assert cache.kept_bytes == 0

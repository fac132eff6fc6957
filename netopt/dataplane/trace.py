"""An opt-in timeline of one sync process, for benchmarks: ``NETOPT_TRACE=FILE``.

With the variable set, the data plane marks milestones (first chunk byte, last
chunk byte, files written, ...) on the system-wide monotonic clock, sums the
seconds spent in costly steps (decoding, cache puts, fsyncs, file writes) and
counts bytes per stream; at exit the process writes it all to FILE as JSON,
with its own CPU seconds. A benchmark that notes ``time.monotonic()`` when it
launches the process can then lay the milestones on one timeline. Without the
variable every call is a cheap no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Iterator

__all__ = [
    "TRACE_ENV",
    "add_seconds",
    "count",
    "enabled",
    "mark",
    "mark_last",
    "paused",
    "timed",
]

TRACE_ENV = "NETOPT_TRACE"

_PATH = os.environ.get(TRACE_ENV) or None
_lock = threading.Lock()
_marks: dict[str, float] = {}
_seconds: dict[str, float] = {}
_counts: dict[str, float] = {}


def enabled() -> bool:
    """True when this process records a timeline."""
    return _PATH is not None


def mark(name: str) -> None:
    """Record the first time (monotonic s) ``name`` happened."""
    if _PATH is not None and name not in _marks:
        _marks[name] = time.monotonic()


def mark_last(name: str) -> None:
    """Record the latest time (monotonic s) ``name`` happened."""
    if _PATH is not None:
        _marks[name] = time.monotonic()


def add_seconds(name: str, seconds: float) -> None:
    """Add ``seconds`` to the total of ``name`` (thread-safe)."""
    if _PATH is not None:
        with _lock:
            _seconds[name] = _seconds.get(name, 0.0) + seconds


def count(name: str, amount: float = 1) -> None:
    """Add ``amount`` to the counter ``name`` (thread-safe)."""
    if _PATH is not None:
        with _lock:
            _counts[name] = _counts.get(name, 0) + amount


_UNTIMED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""What `timed` returns without a trace: one shared object, no generator per call (a tree
of small files times a few steps per chunk)."""


def timed(name: str) -> contextlib.AbstractContextManager[None]:
    """Add the seconds the block takes to the total of ``name``."""
    return _UNTIMED if _PATH is None else _timed(name)


@contextlib.contextmanager
def _timed(name: str) -> Iterator[None]:
    start_s = time.monotonic()
    try:
        yield
    finally:
        add_seconds(name, time.monotonic() - start_s)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing while the block runs, in the whole process: a calibration that runs
    a sync of its own (`netopt.cache.filecost`) must not mark the real sync's first byte."""
    global _PATH
    path, _PATH = _PATH, None
    try:
        yield
    finally:
        _PATH = path


def _dump() -> None:
    if _PATH is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    mark_last("exit")
    data = {
        "pid": os.getpid(),
        "marks": dict(sorted(_marks.items(), key=lambda kv: kv[1])),
        "seconds": _seconds,
        "counts": _counts,
        "cpu_user_s": usage.ru_utime,
        "cpu_system_s": usage.ru_stime,
    }
    with contextlib.suppress(OSError), open(_PATH, "w") as f:
        json.dump(data, f, indent=1)


if _PATH is not None:
    mark("trace_import")
    atexit.register(_dump)

"""The zstd level that follows the link while a transfer runs (as ``zstd --adapt`` does).

The plan's level is a first guess made from link figures that may be wrong (a default
rate, a stale measurement). While chunks flow, the client measures what each level
achieves over windows of about `WINDOW_S` and moves the level one step at a time:

- the link holds the transfer back (the wire runs at the known link rate, or the CPUs
  have headroom at this level): compress harder, when the model says the next level
  carries more logical data over the same wire;
- the CPU holds it back (the logical rate is near what the codec sustains at this
  level): back off to a cheaper level;
- neither does (the wire carries under `LINK_IDLE` of a known link rate while the
  codec has room; or the client's event loop was on the CPU for `LOOP_BUSY` of the
  window): something else holds it back, such as a tree of small files with its
  per-file costs on either end, or CPUs shared with other work. Stay: no level carries
  more past that limit, and a higher one costs the sender's CPU for nothing;
- a step that measured worse than where it came from is undone, and not tried again
  while that measurement is fresh (`STALE_S`): the hill climb's check on the model.

`next_level` is the pure decision; `LevelAdapter` keeps the windows (the clock is
passed in), attributing each frame to the level it was asked at, so chunks asked
before a change do not count for the new level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from netopt.transfer.planner import (
    HEADER_EFFICIENCY,
    LEVEL_GAIN_MIN,
    MIN_USEFUL_RATIO,
    CpuProfile,
    SampleProfile,
    cpu_rate_bps,
    pair_cpu_profile,
)

__all__ = [
    "CPU_HEADROOM",
    "LINK_FULL",
    "LINK_IDLE",
    "LOOP_BUSY",
    "STALE_S",
    "WINDOW_S",
    "LevelAdapter",
    "LevelModel",
    "Window",
    "level_models",
    "next_level",
]

WINDOW_S = 0.75
"""Seconds of frames one measurement covers."""
SETTLE_MAX_S = 3.0
"""After a change, frames asked at the old level are waited for this long at most
before the new level's window opens."""
CPU_HEADROOM = 0.7
"""Below this share of what the codec sustains at a level, the CPU is not the limit."""
LINK_FULL = 0.8
"""At this share of the known link rate (goodput), the link is the limit."""
LINK_IDLE = 0.5
"""Below this share of a known link rate (goodput) on the wire, the link is not the limit.
Measured on the lab's 80 Mbit/s link, a 100,000-file tree: 15-24 Mbit/s on the wire at
every level from 1 to 9 (the logical rate 60-88 Mbit/s at each, within the noise), while
the sender's CPU rose (10.3 s a sync at level 1, 12.2 s at level 3, 1.17 cores in
``top`` at levels 5-9)."""
LOOP_BUSY = 0.85
"""At this share of a window spent on the CPU by the receiving event loop's thread, the
receiver itself is the limit: its loop is near a whole core. (On the two-core lab, where
the server shares the machine, a 100,000-file sync's loop measured 0.6-0.78 a window:
there `LINK_IDLE` is what holds the level.)"""
STALE_S = 10.0
"""A level's measured rate guides the climb for this long; then the level may be tried again."""
MAX_SAMPLES = 512
"""Samples `LevelAdapter.samples` keeps (a long transfer keeps the latest)."""


@dataclass(frozen=True)
class LevelModel:
    """What a level promises: its sampled ratio and the logical bits/s the CPUs sustain."""

    ratio: float
    cpu_bps: float


@dataclass(frozen=True)
class Window:
    """What one level achieved over one measurement window."""

    level: int
    seconds: float
    wire_bytes: int
    logical_bytes: int
    loop_busy_share: float | None = None
    """CPU seconds of the receiving event loop's thread per second of the window (None:
    not measured)."""

    @property
    def wire_bps(self) -> float:
        return self.wire_bytes * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def logical_bps(self) -> float:
        return self.logical_bytes * 8 / self.seconds if self.seconds > 0 else 0.0


def level_models(
    sample: SampleProfile, server_cpu: CpuProfile, client_cpu: CpuProfile
) -> dict[int, LevelModel]:
    """The levels a fetch may use (0, and each sampled level both CPUs calibrated whose
    ratio is worth it), with what each promises."""
    cpu = pair_cpu_profile(server_cpu, client_cpu)
    models = {0: LevelModel(1.0, math.inf)}
    for level, ratio in sample.ratio_by_level.items():
        rate_bps = cpu_rate_bps(level, cpu)
        if level > 0 and ratio >= MIN_USEFUL_RATIO and rate_bps > 0:
            models[level] = LevelModel(ratio, rate_bps)
    return models


def next_level(
    window: Window,
    models: Mapping[int, LevelModel],
    measured: Mapping[int, tuple[float, float]],
    now_s: float,
    link_bps: float | None,
) -> int:
    """The level to ask for next, one step from ``window.level`` at most.

    ``measured``: level -> (logical bits/s it achieved, when); entries older than
    `STALE_S` are ignored. ``link_bps``: the link's line rate when known (a
    measurement, a flag, this client's rate limit), None when it is a guess.
    """
    current = window.level
    if current not in models:
        return current  # a level this fetch cannot model (forced): leave it
    levels = sorted(models)
    lower = [lvl for lvl in levels if lvl < current]
    higher = [lvl for lvl in levels if lvl > current]
    fresh = {lvl: bps for lvl, (bps, at_s) in measured.items() if now_s - at_s <= STALE_S}
    logical_bps = window.logical_bps
    # The check on the model: a neighbour that measured better wins back.
    for neighbour in lower[-1:] + higher[:1]:
        if fresh.get(neighbour, 0.0) > logical_bps * LEVEL_GAIN_MIN:
            return neighbour
    link_full = link_bps is not None and window.wire_bps >= LINK_FULL * link_bps * HEADER_EFFICIENCY
    cpu_spare = logical_bps < CPU_HEADROOM * models[current].cpu_bps
    link_idle = link_bps is not None and window.wire_bps < LINK_IDLE * link_bps * HEADER_EFFICIENCY
    busy = window.loop_busy_share
    loop_bound = not link_full and busy is not None and busy >= LOOP_BUSY
    if cpu_spare and (link_idle or loop_bound):
        return current  # neither the wire nor the codec: no level moves more past the limit
    if link_full or cpu_spare:
        # The wire is the limit: a higher ratio carries more over it, while the CPUs keep up.
        for level in higher:
            model = models[level]
            predicted_bps = min(model.cpu_bps, window.wire_bps * model.ratio)
            if predicted_bps <= logical_bps * LEVEL_GAIN_MIN:
                continue
            if level in fresh and fresh[level] <= logical_bps:
                break  # tried, and no better: stay
            return level
        return current
    # The CPUs are the limit: a cheaper level frees them, the wire has room.
    if lower and lower[-1] not in fresh:
        return lower[-1]
    return current


@dataclass
class LevelAdapter:
    """The measurement windows of one fetch and the level they lead to.

    Call `asked` when a chunk is requested (with the level it is asked at) and
    `arrived` when its frame has been read, on the receiving event loop's thread with
    that thread's CPU clock (``time.thread_time()``) when it can; `arrived` answers the
    level to ask at from then on. ``samples``: ``(t_s, level, wire_bps, logical_bps,
    loop_busy_share)`` per window.
    """

    models: Mapping[int, LevelModel]
    level: int
    link_bps: float | None
    started_s: float
    measured: dict[int, tuple[float, float]] = field(default_factory=dict)
    samples: list[tuple[float, int, float, float, float | None]] = field(default_factory=list)
    changes: int = 0
    _asked: dict[str, int] = field(default_factory=dict)
    _window_s: float | None = None
    _changed_s: float | None = None
    _wire_bytes: int = 0
    _logical_bytes: int = 0
    _loop_cpu_s: float | None = None

    def asked(self, chunk_id: str, level: int) -> None:
        self._asked[chunk_id] = level

    def _settling(self, now_s: float) -> bool:
        """True while frames asked at another level are still due (for a while at most)."""
        if self._changed_s is None:
            return False
        if now_s - self._changed_s < SETTLE_MAX_S and any(
            lvl != self.level for lvl in self._asked.values()
        ):
            return True
        self._changed_s = None
        return False

    def arrived(
        self,
        chunk_id: str,
        wire_bytes: int,
        logical_bytes: int,
        now_s: float,
        loop_cpu: Callable[[], float] | None = None,
    ) -> int:
        """Count one frame; the level to ask at next. ``loop_cpu``: the event loop thread's
        CPU clock (s), read only where a window opens or closes (a thread's CPU clock is
        a system call: read per frame on the lab's 100,000-file sync, py-spy put 7% of the
        loop thread's samples in it, a figure sampling inflates for system calls)."""
        asked_level = self._asked.pop(chunk_id, self.level)
        if asked_level != self.level or self._settling(now_s):
            return self.level
        if self._window_s is None:
            self._window_s = now_s  # the window opens with its first frame: count the rest
            self._loop_cpu_s = loop_cpu() if loop_cpu is not None else None
            return self.level
        self._wire_bytes += wire_bytes
        self._logical_bytes += logical_bytes
        seconds = now_s - self._window_s
        if seconds < WINDOW_S:
            return self.level
        loop_cpu_s = loop_cpu() if loop_cpu is not None else None
        busy = None
        if loop_cpu_s is not None and self._loop_cpu_s is not None:
            busy = max(0.0, loop_cpu_s - self._loop_cpu_s) / seconds
        window = Window(self.level, seconds, self._wire_bytes, self._logical_bytes, busy)
        self.measured[self.level] = (window.logical_bps, now_s)
        if len(self.samples) >= MAX_SAMPLES:
            del self.samples[0]
        self.samples.append(
            (now_s - self.started_s, self.level, window.wire_bps, window.logical_bps, busy)
        )
        chosen = next_level(window, self.models, self.measured, now_s, self.link_bps)
        self._window_s = now_s
        self._loop_cpu_s = loop_cpu_s
        self._wire_bytes = self._logical_bytes = 0
        if chosen != self.level:
            self.level = chosen
            self.changes += 1
            self._changed_s = now_s
            self._window_s = None
        return self.level

    def to_list(self) -> list[dict[str, float | int | None]]:
        """``levels_over_time`` of ``netopt sync --json`` (``loop_busy``: the receiving
        loop's CPU share of the window, None when not measured)."""
        return [
            {
                "t_s": round(t_s, 3),
                "level": level,
                "goodput_mbps": round(wire_bps / 1e6, 2),
                "logical_mbps": round(logical_bps / 1e6, 2),
                "loop_busy": None if busy is None else round(busy, 3),
            }
            for t_s, level, wire_bps, logical_bps, busy in self.samples
        ]

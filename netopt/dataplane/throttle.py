"""A token bucket that limits bytes per second across all of a transfer's streams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate_bytes_per_s`` sustained, bursts up to ``burst_bytes``.

    ``take(n)`` waits until ``n`` bytes may pass; a take larger than the burst
    is let through once the bucket is full and leaves a debt, so big reads never
    deadlock. ``clock`` returns seconds (the event loop's clock by default).
    """

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst_bytes: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"rate_bytes_per_s must be > 0, got {rate_bytes_per_s}")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes if burst_bytes is not None else rate_bytes_per_s / 10
        self._clock = clock
        self._tokens = self.burst_bytes
        self._last_s: float | None = None
        self._lock = asyncio.Lock()

    def _now_s(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def _refill(self) -> None:
        now_s = self._now_s()
        if self._last_s is not None:
            elapsed_s = max(0.0, now_s - self._last_s)
            self._tokens = min(self.burst_bytes, self._tokens + elapsed_s * self.rate_bytes_per_s)
        self._last_s = now_s

    async def take(self, n_bytes: int) -> None:
        """Wait until ``n_bytes`` may pass, then spend them."""
        async with self._lock:
            self._refill()
            need = min(float(n_bytes), self.burst_bytes)
            while self._tokens < need:
                await asyncio.sleep((need - self._tokens) / self.rate_bytes_per_s)
                self._refill()
            self._tokens -= n_bytes

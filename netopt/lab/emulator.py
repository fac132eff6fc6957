"""The link emulator's decisions: what happens to one packet on one direction of a link.

Everything here is pure over its inputs: the clock (``now_ns``) and the random
draws are arguments, so the shaping logic is tested without root, TUN devices or
sleeping. :mod:`netopt.lab.relay` feeds it packets read from TUN devices, and the
unprivileged demo's user-space proxies (:mod:`netopt.lab.userlink`) feed it chunks of
TCP streams (:meth:`DirectionShaper.send`: delay and rate, no queue limit, no loss)
and datagrams (:meth:`DirectionShaper.offer`): one clock for both ways of emulating.

Model, per direction (what a WAN link does to a packet):

1. A cut link (``up`` false) drops every packet (cause ``link_down``).
2. A serializer sends packets one after another at ``rate_bps``; the bytes
   waiting for it form a tail-drop queue of ``queue_bytes`` (cause ``queue``).
3. A packet that got through the serializer is lost on the wire with
   probability ``loss_ratio`` (cause ``loss``); it still used its link time.
4. Survivors arrive ``delay_ns`` (plus a uniform ``±jitter_ns``) after their
   last bit left. Arrivals keep their order, as on one physical path: jitter
   never reorders packets, it only spreads their gaps.

Packet sizes are IP packet sizes (what a TUN device carries); link-layer
framing is not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from netopt.config.lab import LinkShape

__all__ = [
    "DROP_LINK_DOWN",
    "DROP_LOSS",
    "DROP_QUEUE",
    "EARLY_NS",
    "DirectionShape",
    "DirectionShaper",
    "DirectionStats",
    "serialization_ns",
]

EARLY_NS = 50_000
"""The relay and the user-space proxies send a packet due within this many ns at once (one
wake-up serves a burst): an emulated one-way delay may come this much short of its
configuration, a round trip twice this."""
DROP_LOSS = -1
"""``offer`` result: random loss on the wire."""
DROP_QUEUE = -2
"""``offer`` result: the tail-drop queue was full."""
DROP_LINK_DOWN = -3
"""``offer`` result: the link is cut."""

_NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class DirectionShape:
    """One direction of an emulated link, in the units the relay works in."""

    rate_bps: float
    delay_ns: int = 0
    jitter_ns: int = 0
    loss_ratio: float = 0.0
    queue_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.rate_bps <= 0:
            raise ValueError(f"rate_bps must be > 0, not {self.rate_bps}")
        if not 0 <= self.loss_ratio < 1:
            raise ValueError(f"loss_ratio must be in [0, 1), not {self.loss_ratio}")
        if self.delay_ns < 0 or self.jitter_ns < 0 or self.jitter_ns > self.delay_ns:
            raise ValueError("need 0 <= jitter_ns <= delay_ns")
        if self.queue_bytes <= 0:
            raise ValueError(f"queue_bytes must be > 0, not {self.queue_bytes}")

    @classmethod
    def from_link(cls, shape: LinkShape, *, fraction: float = 1.0) -> DirectionShape:
        """The relay's view of a configured link shape.

        ``fraction`` (0 < f <= 1) gives one hop of a path that the shape describes
        end to end: delay and jitter scale by ``f`` and the loss ratio is chosen so
        that ``1/f`` such hops lose ``loss_ratio`` overall.
        """
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], not {fraction}")
        loss_ratio = 1.0 - (1.0 - shape.loss_ratio) ** fraction
        return cls(
            rate_bps=shape.rate_bps,
            delay_ns=round(shape.delay_ms * fraction * 1e6),
            jitter_ns=round(shape.jitter_ms * fraction * 1e6),
            loss_ratio=loss_ratio,
            queue_bytes=shape.queue_bytes,
        )

    def to_dict(self) -> dict[str, float | int]:
        """JSON-able fields (the relay's command line carries them)."""
        return asdict(self)


def serialization_ns(size_bytes: int, rate_bps: float) -> int:
    """Time to put ``size_bytes`` on a link of ``rate_bps``, in nanoseconds (rounded up)."""
    return -(-size_bytes * 8 * _NS_PER_S // int(rate_bps)) if rate_bps >= 1 else 0


class DirectionStats:
    """Mutable per-direction counters (the relay's hot loop updates them in place)."""

    __slots__ = ("bytes", "drops_link_down", "drops_loss", "drops_queue", "packets")

    def __init__(self) -> None:
        self.packets = 0
        self.bytes = 0
        self.drops_loss = 0
        self.drops_queue = 0
        self.drops_link_down = 0

    def to_dict(self) -> dict[str, int]:
        """Counters as JSON-able data: delivered packets/bytes and drops by cause."""
        return {
            "packets": self.packets,
            "bytes": self.bytes,
            "drops_loss": self.drops_loss,
            "drops_queue": self.drops_queue,
            "drops_link_down": self.drops_link_down,
        }


class DirectionShaper:
    """Decides, packet by packet, when (or whether) a packet leaves one link direction.

    State is two numbers: when the serializer is next free and when the last
    packet arrives. Not thread-safe; one shaper per direction (user-space proxies
    sharing a link direction share one, in one event loop).
    """

    __slots__ = (
        "_busy_until_ns",
        "_delay_ns",
        "_jitter_ns",
        "_last_arrival_ns",
        "_loss_ratio",
        "_ns_per_byte",
        "_queue_ns",
        "shape",
        "stats",
        "up",
    )

    def __init__(self, shape: DirectionShape, stats: DirectionStats | None = None) -> None:
        self.shape = shape
        self.stats = stats if stats is not None else DirectionStats()
        self.up = True
        self._busy_until_ns = 0
        self._last_arrival_ns = 0
        self._ns_per_byte = 8 * _NS_PER_S / shape.rate_bps
        # The queue as the time it takes to drain: a full queue is queue_bytes of work.
        self._queue_ns = shape.queue_bytes * self._ns_per_byte
        self._delay_ns = shape.delay_ns
        self._jitter_ns = shape.jitter_ns
        self._loss_ratio = shape.loss_ratio

    @classmethod
    def from_link(cls, shape: LinkShape) -> DirectionShaper:
        """A shaper for one direction of ``shape``; ValueError for an impossible shape."""
        return cls(DirectionShape.from_link(shape))

    @property
    def ns_per_byte(self) -> float:
        """Serialisation time of one byte, in ns."""
        return self._ns_per_byte

    def offer(self, now_ns: int, size_bytes: int, loss_draw: float, jitter_draw: float) -> int:
        """Decide one packet's fate.

        ``loss_draw`` and ``jitter_draw`` are uniform random numbers in [0, 1).
        Returns the arrival time in ns (>= ``now_ns``) or a negative ``DROP_*``
        code; drop counters are updated here, delivery counters by the caller
        when it actually hands the packet on (:meth:`delivered`).
        """
        stats = self.stats
        if not self.up:
            stats.drops_link_down += 1
            return DROP_LINK_DOWN
        busy = self._busy_until_ns
        if busy < now_ns:
            busy = now_ns
        work_ns = size_bytes * self._ns_per_byte
        if busy - now_ns + work_ns > self._queue_ns:
            stats.drops_queue += 1
            return DROP_QUEUE
        busy = int(busy + work_ns)
        self._busy_until_ns = busy
        if loss_draw < self._loss_ratio:
            stats.drops_loss += 1
            return DROP_LOSS
        return self._arrival(busy, jitter_draw)

    def send(self, now_ns: int, size_bytes: int, jitter_draw: float) -> int:
        """Put ``size_bytes`` of a TCP stream on the link: no queue limit, no loss (TCP
        cannot lose bytes above the socket API); the arrival time in ns.

        ``jitter_draw`` is uniform in [0, 1). The caller keeps the queue bounded
        (see :meth:`room_bytes`).
        """
        busy = self._busy_until_ns
        if busy < now_ns:
            busy = now_ns
        busy = int(busy + size_bytes * self._ns_per_byte)
        self._busy_until_ns = busy
        return self._arrival(busy, jitter_draw)

    def _arrival(self, left_ns: int, jitter_draw: float) -> int:
        """When bytes whose last bit left at ``left_ns`` arrive: after the delay, with
        jitter that spreads gaps but never reorders (one path, first in first out)."""
        arrival = left_ns + self._delay_ns
        if self._jitter_ns:
            arrival += int((2.0 * jitter_draw - 1.0) * self._jitter_ns)
        if arrival < self._last_arrival_ns:
            arrival = self._last_arrival_ns
        self._last_arrival_ns = arrival
        return arrival

    def delivered(self, size_bytes: int) -> None:
        """Count a packet handed on to the far side."""
        self.stats.packets += 1
        self.stats.bytes += size_bytes

    def backlog_bytes(self, now_ns: int) -> int:
        """Bytes waiting for the serializer at ``now_ns``."""
        return max(0, int((self._busy_until_ns - now_ns) / self._ns_per_byte))

    def room_bytes(self, now_ns: int) -> int:
        """Bytes the queue still takes at ``now_ns`` (0 when full)."""
        return max(0, self.shape.queue_bytes - self.backlog_bytes(now_ns))

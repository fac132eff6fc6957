"""TCP connect RTT: the fallback where UDP probes are blocked.

Each sample is the time a TCP handshake takes to the peer's bulk sink (SYN to
SYN-ACK, as the kernel reports the connection established), so it includes the
peer's kernel but no application. Series made here are marked
``method="tcp-connect"``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from netopt.errors import PeerUnreachableError
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeSeries, ProbeTarget, Reply

__all__ = ["TcpConnectProber", "tcp_connect_rtt_ms"]


async def tcp_connect_rtt_ms(
    host: str, port: int, timeout_s: float, clock: Clock = SYSTEM_CLOCK
) -> float:
    """One TCP handshake's duration in milliseconds.

    Raises PeerUnreachableError when the connection is refused, fails or takes
    longer than ``timeout_s``.
    """
    t0_ns = clock.now_ns()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        raise PeerUnreachableError(
            f"TCP connect to {host}:{port} timed out after {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise PeerUnreachableError(f"TCP connect to {host}:{port} failed: {exc}") from None
    rtt_ms = (clock.now_ns() - t0_ns) / 1e6
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return rtt_ms


@dataclass
class TcpConnectProber:
    """``count`` TCP connects to the target's sink port, ``interval_s`` apart.

    A failed connect is a lost sample; if the very first one fails the target is
    taken as unreachable (PeerUnreachableError) rather than waiting out the series.
    """

    count: int
    interval_s: float = 0.2
    timeout_s: float = 2.0
    clock: Clock = SYSTEM_CLOCK

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """Measure ``target`` by TCP connects; the series says ``tcp-connect``."""
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        sent: list[float] = []
        replies: list[Reply] = []
        for seq in range(self.count):
            delay_s = start_s + seq * self.interval_s - loop.time()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            sent.append(self.clock.now_ns() / 1e9)
            try:
                rtt_ms = await tcp_connect_rtt_ms(
                    target.host, target.sink_port, self.timeout_s, self.clock
                )
            except PeerUnreachableError:
                if seq == 0:
                    raise
                continue
            replies.append(Reply(seq, sent[-1] + rtt_ms / 1e3, rtt_ms))
        return ProbeSeries("tcp-connect", tuple(sent), tuple(replies), self.timeout_s, str(target))

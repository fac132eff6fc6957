"""Measuring a lab with real tools (ping, iperf3), for tests and benchmarks.

The parsers are pure (text in, numbers out); the runners execute inside lab
nodes via :meth:`netopt.lab.Lab.exec`.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any

from netopt.errors import LabError

if TYPE_CHECKING:
    from netopt.lab.lab import Lab

__all__ = [
    "TCP_IP_HEADER_BYTES",
    "binomial_interval",
    "ip_rate_mbps",
    "iperf3_json",
    "parse_ping_avg_ms",
    "ping_avg_ms",
    "process_cpu_s",
    "udp_receive_buffer_drops",
]

TCP_IP_HEADER_BYTES = 52
"""IPv4 (20) + TCP with timestamps (32): what each full segment carries besides payload."""

_PING_SUMMARY_RE = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/")
_IPERF3_BUSY_RETRIES = 20


def parse_ping_avg_ms(text: str) -> float:
    """The average RTT (ms) from ping's summary line; LabError if there is none."""
    match = _PING_SUMMARY_RE.search(text)
    if not match:
        raise LabError(f"no RTT summary in ping output: {text.strip()[-300:]}")
    return float(match.group(2))


def ping_avg_ms(
    lab: Lab, src: str, dst: str, *, count: int = 20, interval_s: float = 0.05
) -> float:
    """Average RTT from ``src`` to ``dst`` over ``count`` pings, in ms."""
    argv = ["ping", "-n", "-q", "-c", str(count), "-i", f"{interval_s:g}", dst]
    proc = lab.exec(src, argv, timeout_s=count * interval_s + 30, check=False)
    return parse_ping_avg_ms(proc.stdout)


def iperf3_json(
    lab: Lab, src: str, dst: str, args: list[str], *, port: int = 5201, timeout_s: float = 60
) -> dict[str, Any]:
    """Run ``iperf3 -c dst -J args`` in ``src`` (an iperf3 server must run in ``dst``).

    Retries while the server is busy with another test. Raises LabError when
    iperf3 reports an error.
    """
    argv = ["iperf3", "-c", dst, "-p", str(port), "-J", *args]
    result: dict[str, Any] = {}
    for _ in range(_IPERF3_BUSY_RETRIES):
        proc = lab.exec(src, argv, timeout_s=timeout_s, check=False)
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            raise LabError(f"iperf3 gave no JSON: {proc.stderr.strip()[-300:]}") from None
        if "busy" not in str(result.get("error", "")):
            break
        time.sleep(0.5)
    if "error" in result:
        raise LabError(f"iperf3 {src} -> {dst}: {result['error']}")
    return result


def ip_rate_mbps(result: dict[str, Any]) -> float:
    """The IP-level rate (Mbit/s) of an iperf3 TCP result: goodput plus TCP/IP headers.

    Emulated links shape IP packets, so this is what compares with ``rate_mbps``
    (goodput alone is about 3.5% lower at a 1500-byte MTU).
    """
    goodput_bps = float(result["end"]["sum_received"]["bits_per_second"])
    mss_bytes = int(result.get("start", {}).get("tcp_mss_default") or 1448)
    return goodput_bps * (mss_bytes + TCP_IP_HEADER_BYTES) / mss_bytes / 1e6


def binomial_interval(n: int, p: float, confidence: float = 0.99) -> tuple[int, int]:
    """The central ``confidence`` range ``[low, high]`` of counts of Binomial(n, p).

    ``P(X < low) <= (1 - confidence) / 2`` and likewise above ``high``.
    """
    if n < 0 or not 0 <= p <= 1:
        raise ValueError(f"need n >= 0 and 0 <= p <= 1, not n={n}, p={p}")
    if p in (0.0, 1.0):
        return (0, 0) if p == 0 else (n, n)
    tail = (1 - confidence) / 2
    log_p, log_q = math.log(p), math.log1p(-p)
    cdf = 0.0
    low: int | None = None
    for k in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        cdf += math.exp(log_pmf + k * log_p + (n - k) * log_q)
        if low is None and cdf > tail:
            low = k
        if cdf >= 1 - tail:
            return (low if low is not None else k), k
    return (low if low is not None else 0), n


def udp_receive_buffer_drops(lab: Lab, node: str) -> int:
    """UDP datagrams ``node``'s kernel dropped so far because a socket buffer was full.

    A receiver that falls behind (a busy CPU) loses datagrams the link delivered;
    subtract the change in this count from a UDP test's loss to get the link's.
    """
    lines = lab.exec(node, ["cat", "/proc/net/snmp"]).stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("Udp:")]
    if len(rows) < 2:
        raise LabError(f"no Udp counters in /proc/net/snmp of {node}")
    return int(dict(zip(rows[0][1:], rows[1][1:], strict=True))["RcvbufErrors"])


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system, seconds) used so far by ``pid``; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

"""``iperf3 -J`` as a subprocess, against a peer that runs ``iperf3 -s``.

Never the PyPI ``iperf3`` wrapper: it hangs once a result exceeds 64 KiB and
redirects the whole process's stdout (see LAB.md). :func:`parse_iperf3_json` is
pure; :func:`run_iperf3` runs the binary with a hard time limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from dataclasses import dataclass
from typing import Any

from netopt.errors import DependencyError, NetworkError, PeerUnreachableError, ProtocolError

__all__ = ["DEFAULT_IPERF3_PORT", "IperfResult", "iperf3_argv", "parse_iperf3_json", "run_iperf3"]

DEFAULT_IPERF3_PORT = 5201


@dataclass(frozen=True)
class IperfResult:
    """The end-of-test summary of one ``iperf3 -J`` run."""

    sent_bps: float
    received_bps: float
    retransmits: int | None
    streams: int
    congestion_control: str | None
    duration_s: float
    mean_rtt_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data; every numeric key carries its unit."""
        return dict(vars(self))


def iperf3_argv(
    host: str,
    port: int,
    *,
    duration_s: float,
    streams: int,
    congestion_control: str | None,
    connect_timeout_s: float,
    binary: str = "iperf3",
) -> list[str]:
    """The iperf3 client command line.

    iperf3 reads ``-t`` as whole seconds (``-t 0.5`` would mean ``-t 0``: run
    forever), so the duration is rounded to at least one second.
    """
    seconds = str(max(1, round(duration_s)))
    argv = [binary, "-c", host, "-p", str(port), "-J", "-t", seconds, "-P", str(streams)]
    argv += ["--connect-timeout", str(max(1, int(connect_timeout_s * 1000)))]
    if congestion_control and congestion_control != "default":
        argv += ["-C", congestion_control]
    return argv


def parse_iperf3_json(text: str | bytes) -> IperfResult:
    """Parse ``iperf3 -J`` output.

    Raises PeerUnreachableError when iperf3 reports it could not connect,
    NetworkError for any other error it reports, ProtocolError for output that
    is not an iperf3 result.
    """
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"iperf3 printed something that is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("iperf3 printed JSON that is not an object")
    error = data.get("error")
    if error:
        if "connect" in str(error):
            raise PeerUnreachableError(f"iperf3: {error}")
        raise NetworkError(f"iperf3: {error}")
    try:
        end = data["end"]
        sent = end["sum_sent"]
        received = end["sum_received"]
        streams = end.get("streams", [])
        rtts = [s["sender"].get("mean_rtt") for s in streams if "sender" in s]
        rtts_us = [float(r) for r in rtts if isinstance(r, int | float)]
        return IperfResult(
            sent_bps=float(sent["bits_per_second"]),
            received_bps=float(received["bits_per_second"]),
            retransmits=int(sent["retransmits"]) if "retransmits" in sent else None,
            streams=len(streams),
            congestion_control=end.get("sender_tcp_congestion"),
            duration_s=float(received.get("seconds", sent.get("seconds", 0.0))),
            mean_rtt_ms=sum(rtts_us) / len(rtts_us) / 1e3 if rtts_us else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"iperf3 result lacks an expected field: {exc!r}") from None


async def run_iperf3(
    host: str,
    port: int = DEFAULT_IPERF3_PORT,
    *,
    duration_s: float = 5.0,
    streams: int = 1,
    congestion_control: str | None = None,
    timeout_s: float = 5.0,
    binary: str = "iperf3",
) -> IperfResult:
    """Run ``iperf3 -c host -J`` and parse its result; killed after its duration + timeout + 5 s.

    Raises DependencyError when iperf3 is not installed, PeerUnreachableError when
    the server cannot be reached, NetworkError/ProtocolError as parse_iperf3_json.
    """
    path = shutil.which(binary)
    if path is None:
        raise DependencyError(f"{binary} is not installed (apt install iperf3)")
    argv = iperf3_argv(
        host,
        port,
        duration_s=duration_s,
        streams=streams,
        congestion_control=congestion_control,
        connect_timeout_s=timeout_s,
        binary=path,
    )
    limit_s = max(1, round(duration_s)) + timeout_s + 5
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(
            proc.communicate(), max(1, round(duration_s)) + timeout_s + 5
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise PeerUnreachableError(
            f"iperf3 to {host}:{port} did not finish within {limit_s:g} s"
        ) from None
    if not stdout.strip():
        message = stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        raise NetworkError(f"iperf3 to {host}:{port} failed: {message}")
    return parse_iperf3_json(stdout)

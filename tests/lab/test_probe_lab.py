"""Measurement accuracy against the lab's configured link (configs/lab/two-region.yaml).

hk <-> us: 100 Mbit/s, 40 ms one-way, 0.5% loss per direction. The reflector and
sink run on us-1 (`netopt probe serve`), the prober on hk-1 (`netopt probe --json`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netopt.lab import Lab

pytestmark = pytest.mark.lab

TOKEN = "lab-probe-token-0123456789"
PORT = 7471
CONFIGURED_RATE_BPS = 100e6
LOSS_PER_DIRECTION = 0.005


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("probe-lab") / "token"
    path.write_text(TOKEN)
    return path


@pytest.fixture(scope="module")
def us_server(two_region_lab: Lab, token_file: Path) -> Iterator[str]:
    address = two_region_lab.address("us-1")
    proc = two_region_lab.popen(
        "us-1",
        [
            sys.executable,
            "-m",
            "netopt",
            "probe",
            "serve",
            "--bind",
            f"{address}:{PORT}",
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"{address}:{PORT}" in line, line
        yield address
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def probe(lab: Lab, target: str, token_file: Path, *args: str, timeout_s: float = 120) -> Any:
    done = lab.exec(
        "hk-1",
        [
            sys.executable,
            "-m",
            "netopt",
            "probe",
            f"{target}:{PORT}",
            "--token-file",
            str(token_file),
            "--json",
            *args,
        ],
        check=False,
        timeout_s=timeout_s,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def ping_median_ms(lab: Lab, node: str, address: str, count: int) -> float:
    done = lab.exec(node, ["ping", "-n", "-c", str(count), "-i", "0.02", address], timeout_s=60)
    times = sorted(float(m) for m in re.findall(r"time=([0-9.]+) ms", done.stdout))
    assert times, done.stdout
    return times[len(times) // 2]


def test_rtt_and_loss_match_the_configured_link(
    two_region_lab: Lab, us_server: str, token_file: Path
) -> None:
    # ping alongside, as an independent reference for what the emulated link does now.
    ping_ms: list[float] = []
    pinger = threading.Thread(
        target=lambda: ping_ms.append(ping_median_ms(two_region_lab, "hk-2", us_server, 200))
    )
    pinger.start()
    try:
        data = probe(
            two_region_lab,
            us_server,
            token_file,
            "--duration",
            "6",
            "--rate",
            "1000",
            "--spacing",
            "fixed",
            "--timeout",
            "1",
        )
    finally:
        pinger.join()
    assert data["method"] == "udp"
    assert data["probes_sent"] >= 5000
    round_trip_loss = 1 - (1 - LOSS_PER_DIRECTION) ** 2
    low, high = data["loss_ratio_ci95"]
    assert low <= round_trip_loss <= high, (data["loss_ratio"], low, high)
    assert data["outages"] == []
    p50_ms = data["rtt_ms"]["p50"]
    truth_ms = two_region_lab.ground_truth_rtt_ms("hk-1", "us-1")
    assert abs(p50_ms - ping_ms[0]) <= 1.0, (data["rtt_ms"], ping_ms)
    if abs(ping_ms[0] - truth_ms) > 1.0:
        # The user-space link emulator falls behind when the machine is overloaded.
        pytest.xfail(f"the emulated link itself is off: ping p50 {ping_ms[0]} ms vs {truth_ms}")
    assert abs(p50_ms - truth_ms) <= 1.0, (data["rtt_ms"], truth_ms)


def test_multi_stream_bbr_reaches_the_configured_rate(
    two_region_lab: Lab, us_server: str, token_file: Path
) -> None:
    data = probe(
        two_region_lab,
        us_server,
        token_file,
        "--duration",
        "1",
        "--rate",
        "50",
        "--bandwidth",
        "--cc",
        "bbr",
        "--bandwidth-duration",
        "6",
    )
    bandwidth = data["bandwidth"]
    assert bandwidth["congestion_control"] == "bbr"
    assert bandwidth["streams"] >= 2
    assert bandwidth["streams_chosen"] == "rtt-and-loss"
    assert abs(bandwidth["aggregate_bps"] - CONFIGURED_RATE_BPS) <= 0.1 * CONFIGURED_RATE_BPS, (
        bandwidth
    )
    assert 0 < bandwidth["single_stream_bps"] <= 1.05 * CONFIGURED_RATE_BPS
    assert bandwidth["buffer_delay_pct"] is not None


def test_a_3_s_cut_is_one_outage_of_3_s(
    two_region_lab: Lab, us_server: str, token_file: Path
) -> None:
    def hk_to_us_packets() -> int:
        (link,) = two_region_lab.counters().links
        return link.a_to_b.packets + link.b_to_a.packets

    prober = two_region_lab.popen(
        "hk-1",
        [
            sys.executable,
            "-m",
            "netopt",
            "probe",
            f"{us_server}:{PORT}",
            "--token-file",
            str(token_file),
            "--json",
            "--duration",
            "10",
            "--rate",
            "100",
            "--spacing",
            "fixed",
            "--timeout",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Cut only once probing is under way (start-up takes a while on a busy machine).
        before = hk_to_us_packets()
        deadline = time.monotonic() + 30
        while hk_to_us_packets() - before < 100:
            assert time.monotonic() < deadline, "the prober never started"
            assert prober.poll() is None, prober.communicate()
            time.sleep(0.05)
        time.sleep(1.0)
        two_region_lab.set_link("hk", "us", up=False)
        try:
            time.sleep(3.0)
        finally:
            two_region_lab.set_link("hk", "us", up=True)
        out, err = prober.communicate(timeout=60)
    finally:
        if prober.poll() is None:
            prober.kill()
            prober.communicate()
    assert prober.returncode == 0, err + out
    outages = json.loads(out)["outages"]
    assert len(outages) == 1, outages
    assert abs(outages[0]["duration_s"] - 3.0) <= 0.5, outages
    assert not outages[0]["ongoing"]

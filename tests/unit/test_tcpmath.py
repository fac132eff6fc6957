"""The one home of TCP's per-flow arithmetic (window cap, Mathis bound, flow ceiling)."""

from __future__ import annotations

import math

import pytest

from netopt.tcpmath import (
    INITIAL_WINDOW_BYTES,
    idle_restart_s,
    is_loss_based,
    mathis_bound_bps,
    tcp_flow_ceiling_bps,
    window_cap_bps,
)


def test_mathis_bound() -> None:
    # 1448 B, 140 ms, 1% loss: about 1.0 Mbit/s (LAB.md: ~0.7-1 Mbit/s per cubic flow).
    assert mathis_bound_bps(140, 0.01) == pytest.approx(1448 * 8 / 0.14 * 12.2)
    assert mathis_bound_bps(80, 0.01, mss_bytes=8948) == pytest.approx(8948 * 8 / 0.08 * 12.2)
    assert math.isinf(mathis_bound_bps(140, 0.0))
    assert math.isinf(mathis_bound_bps(0.0, 0.01))


def test_window_cap() -> None:
    assert window_cap_bps(131072, 80) == pytest.approx(13_107_200)
    assert math.isinf(window_cap_bps(131072, 0))


def test_flow_ceiling_is_the_lower_bound_and_bbr_escapes_loss() -> None:
    window = 4 * 2**20
    cubic = tcp_flow_ceiling_bps(80, 0.01, "cubic", window_bytes=window)
    assert cubic == pytest.approx(mathis_bound_bps(80, 0.01))
    assert tcp_flow_ceiling_bps(80, 0.01, "bbr", window_bytes=window) == window_cap_bps(window, 80)
    # no loss: the window alone; a small window caps even a loss-based flow
    assert tcp_flow_ceiling_bps(80, 0.0, "cubic", window_bytes=window) == window_cap_bps(window, 80)
    assert tcp_flow_ceiling_bps(80, 1e-6, "reno", window_bytes=65536) == window_cap_bps(65536, 80)
    assert is_loss_based("cubic")
    assert is_loss_based("reno")
    assert not is_loss_based("bbr")


def test_idle_restart_pays_the_slow_start_ramp() -> None:
    # 100 Mbit/s, 80 ms RTT: BDP 1 MB, about 69 initial windows: 7 rounds to reach it
    rtt, rate = 0.08, 100e6
    bdp = rate / 8 * rtt
    ramp = INITIAL_WINDOW_BYTES * (2**7 - 1)
    assert ramp >= bdp > INITIAL_WINDOW_BYTES * (2**6 - 1)
    # a long transfer: the 7 rounds, less the ramp's bytes at the rate
    assert idle_restart_s(20e6, rtt, rate) == pytest.approx(7 * rtt - ramp * 8 / rate)
    # a short one ends inside the ramp: 262 KB takes 5 rounds (IW x 31 >= 262 KB > IW x 15)
    assert idle_restart_s(262_144, rtt, rate) == pytest.approx(5 * rtt - 262_144 * 8 / rate)
    assert idle_restart_s(1000, rtt, rate) == pytest.approx(rtt - 1000 * 8 / rate)
    # nothing to ramp: a BDP within the initial window, or nothing sent
    assert idle_restart_s(20e6, 0.001, rate) == 0.0
    assert idle_restart_s(0, rtt, rate) == 0.0

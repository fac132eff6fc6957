"""The adaptive level's decision (`next_level`), its windows (`LevelAdapter`) and the
link figures' sources (`choose_figures`)."""

from __future__ import annotations

import math

import pytest

from netopt.transfer.adapt import (
    LOOP_BUSY,
    STALE_S,
    WINDOW_S,
    LevelAdapter,
    LevelModel,
    Window,
    level_models,
    next_level,
)
from netopt.transfer.figures import RATE_GUESS, Figure, choose_figures
from netopt.transfer.planner import CpuProfile, LinkProfile, SampleProfile

# Logical bits/s the CPUs sustain and the sampled ratio, per level (0: off).
MODELS = {
    0: LevelModel(1.0, math.inf),
    1: LevelModel(2.4, 1.6e9),
    3: LevelModel(2.7, 600e6),
    5: LevelModel(2.9, 300e6),
    9: LevelModel(3.1, 60e6),
}


def window(level: int, wire_bps: float, ratio: float, seconds: float = 1.0) -> Window:
    wire_bytes = int(wire_bps / 8 * seconds)
    return Window(level, seconds, wire_bytes, int(wire_bytes * ratio))


def test_a_link_bound_transfer_compresses_harder() -> None:
    # 20 Mbit/s on the wire at level 1: the CPUs could do 80x that.
    assert next_level(window(1, 20e6, 2.4), MODELS, {}, 0.0, None) == 3
    assert next_level(window(3, 20e6, 2.7), MODELS, {}, 0.0, None) == 5
    # level 9's CPU rate (60 Mbit/s logical) is below 20 Mbit/s x 3.1: not worth it
    assert next_level(window(5, 20e6, 2.9), MODELS, {}, 0.0, None) == 5


def test_a_full_known_link_compresses_harder_even_near_the_cpu_limit() -> None:
    # 250 Mbit/s logical at level 3 (600 x 0.7 = 420: headroom) on a 100 Mbit/s link
    win = window(3, 92e6, 2.7)
    assert next_level(win, MODELS, {}, 0.0, 100e6) == 5


def test_a_cpu_bound_transfer_backs_off() -> None:
    # level 9 sustains 60 Mbit/s logical, and that is what it gets: the CPU is the limit
    assert next_level(window(9, 19e6, 3.1), MODELS, {}, 0.0, None) == 5
    # at level 1 the CPUs limit too: off is cheaper still
    assert next_level(window(1, 600e6, 2.4), MODELS, {}, 0.0, None) == 0


def test_a_step_that_measured_worse_is_undone_and_not_retried_while_fresh() -> None:
    measured = {3: (54e6, 0.0)}  # level 3 did 54 Mbit/s logical
    # at 5 it does only 40 (a loaded CPU the model did not see): back to 3
    assert next_level(window(5, 14e6, 2.9), MODELS, measured, 1.0, None) == 3
    measured = {3: (54e6, 0.0), 5: (40e6, 1.0)}
    # at 3 again, link-bound: 5 is not tried again while its measurement is fresh
    assert next_level(window(3, 20e6, 2.7), MODELS, measured, 2.0, None) == 3
    # ... and is, once it is stale
    assert next_level(window(3, 20e6, 2.7), MODELS, measured, 2.0 + STALE_S, None) == 5


def test_a_forced_level_the_fetch_cannot_model_stays() -> None:
    assert next_level(window(19, 20e6, 3.5), MODELS, {}, 0.0, None) == 19


def test_level_models_keep_levels_both_sides_calibrated_and_worth_it() -> None:
    sample = SampleProfile({1: 2.0, 3: 2.3, 7: 1.01, 12: 2.6}, 1000)
    server = CpuProfile(2, {1: 300e6, 3: 100e6, 7: 30e6}, {})
    client = CpuProfile(4, {}, {1: 900e6, 3: 900e6, 7: 900e6})
    models = level_models(sample, server, client)
    assert sorted(models) == [0, 1, 3]  # 7: ratio under 1.05; 12: not calibrated
    assert models[3].ratio == 2.3
    assert models[3].cpu_bps == 2 * 100e6 * 8 / 3  # the planner's CPU share


def test_the_adapter_measures_each_level_from_frames_asked_at_it() -> None:
    adapter = LevelAdapter(MODELS, 1, None, started_s=0.0)
    frame_wire, frame_logical = 25_000, 60_000  # 20 Mbit/s wire at 1 frame per 10 ms
    now_s, level, n = 0.0, 1, 0

    def deliver(count: int) -> None:
        nonlocal now_s, level, n
        for _ in range(count):
            cid = f"c{n}"
            n += 1
            adapter.asked(cid, level)
            now_s += 0.01
            level = adapter.arrived(cid, frame_wire, frame_logical, now_s)

    adapter.asked("late", 1)  # on a slow stream: it arrives after the change
    deliver(int(WINDOW_S / 0.01) + 2)
    assert level == 3  # link-bound: one step up
    assert adapter.samples[0][1] == 1
    assert adapter.samples[0][2] == pytest.approx(20e6)
    # Until the chunk asked at level 1 has arrived, no window opens for level 3.
    deliver(int(WINDOW_S / 0.01) + 2)
    assert len(adapter.samples) == 1  # still settling: "late" has not arrived
    adapter.arrived("late", frame_wire, frame_logical, now_s)
    deliver(int(WINDOW_S / 0.01) + 3)
    assert [s[1] for s in adapter.samples] == [1, 3]
    assert adapter.to_list()[1]["level"] == 3


def test_a_busy_receiver_holds_the_level() -> None:
    # The wire carries 20 Mbit/s at level 1 and the CPU model has room (the climb of
    # test_a_link_bound_transfer_compresses_harder), but the receiving loop was on the
    # CPU for 0.9 of the window: a tree of small files, bound by its per-file costs.
    busy = Window(1, 1.0, 2_500_000, 6_000_000, LOOP_BUSY + 0.05)
    assert next_level(busy, MODELS, {}, 0.0, None) == 1
    idle = Window(1, 1.0, 2_500_000, 6_000_000, LOOP_BUSY - 0.3)
    assert next_level(idle, MODELS, {}, 0.0, None) == 3
    # A full known link still compresses harder: the wire is the limit, busy or not.
    full = Window(3, 1.0, 11_500_000, 31_000_000, 0.95)
    assert next_level(full, MODELS, {}, 0.0, 100e6) == 5


def test_a_known_link_far_from_full_holds_the_level() -> None:
    # 20 Mbit/s on a known 100 Mbit/s link, the codec with room: neither is the limit.
    assert next_level(window(1, 20e6, 2.4), MODELS, {}, 0.0, 100e6) == 1
    # At 60 Mbit/s (over LINK_IDLE) the wire may be the limit (a ramp, a shared link).
    assert next_level(window(1, 60e6, 2.4), MODELS, {}, 0.0, 100e6) == 3


@pytest.mark.parametrize(("cpu_per_frame_s", "climbs"), [(0.0095, False), (0.002, True)])
def test_the_adapter_measures_the_loops_cpu_share(cpu_per_frame_s: float, climbs: bool) -> None:
    adapter = LevelAdapter(MODELS, 1, None, started_s=0.0)
    now_s = cpu_s = 0.0
    level = 1
    for n in range(int(WINDOW_S / 0.01) + 2):
        adapter.asked(f"c{n}", level)
        now_s += 0.01
        cpu_s += cpu_per_frame_s
        level = adapter.arrived(f"c{n}", 25_000, 60_000, now_s, lambda at=cpu_s: at)
    assert adapter.samples[0][4] == pytest.approx(cpu_per_frame_s / 0.01)
    assert adapter.to_list()[0]["loop_busy"] == round(cpu_per_frame_s / 0.01, 3)
    assert level == (3 if climbs else 1)


def test_figures_say_where_each_came_from() -> None:
    rtt = Figure(81.0, "tcp handshake")
    guessed = choose_figures(rtt)
    assert guessed.rate_bps.source == RATE_GUESS
    assert not guessed.rate_known
    assert guessed.rtt_ms == rtt
    limited = choose_figures(rtt, rate_limit_bps=20e6)
    assert limited.rate_bps.value == 20e6
    assert limited.rate_known
    measured = LinkProfile(rate_bps=95e6, rtt_ms=80.0, loss_ratio=0.01, single_stream_bps=60e6)
    found = choose_figures(rtt, measured=measured, measured_source="link hk-1 -> us-1")
    assert found.rate_bps == Figure(95e6, "link hk-1 -> us-1")
    assert found.loss_ratio == Figure(0.01, "link hk-1 -> us-1")
    assert found.rtt_ms == rtt  # this connection's own round trips win
    assert found.link("bbr").single_stream_bps == 60e6
    flagged = choose_figures(rtt, rate_flag_bps=50e6, loss_flag=0.0, measured=measured)
    assert flagged.rate_bps.source == "--link-rate-mbps"
    assert flagged.loss_ratio.source == "--link-loss"
    assert set(found.to_dict()) == {"rtt_ms", "rate_bps", "loss_ratio"}

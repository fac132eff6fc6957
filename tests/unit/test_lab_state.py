"""Lab bookkeeping without root: counters, netem arguments, state files, the CLI's refusal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netopt.cli import lab_cmd
from netopt.cli.main import main
from netopt.config.lab import LinkShape
from netopt.errors import LabError, ValidationError
from netopt.lab import netns
from netopt.lab.build import tbf_args
from netopt.lab.counters import DirectionCounters, LabCounters, LinkCounters
from netopt.lab.measure import binomial_interval, parse_ping_avg_ms
from netopt.lab.netem import choose_emulator, netem_args
from netopt.lab.state import LabState, RelayRecord, find_lab, list_labs, read_state, write_state


def counters() -> LabCounters:
    return LabCounters(
        (
            LinkCounters(
                a="hk",
                b="us",
                up=True,
                a_to_b=DirectionCounters(packets=10, bytes=15000, drops_loss=1),
                b_to_a=DirectionCounters(packets=5, bytes=300, drops_queue=2, drops_link_down=3),
            ),
        )
    )


def test_counters_by_direction() -> None:
    lab = counters()
    assert lab.between("hk", "us").bytes == 15000
    assert lab.between("us", "hk").drops == 5
    assert lab.between("us", "hk").offered_packets == 10
    assert lab.total_bytes() == 15300
    with pytest.raises(ValidationError):
        lab.between("hk", "eu")


def test_counters_to_dict() -> None:
    data = counters().to_dict()
    link = data["links"][0]
    assert link["link"] == "hk-us"
    assert link["hk->us"] == {
        "packets": 10,
        "bytes": 15000,
        "drops": {"loss": 1, "queue": 0, "link_down": 0},
    }
    assert link["us->hk"]["drops"]["link_down"] == 3
    reply = {"packets": 1, "bytes": 2, "drops_loss": 3, "drops_queue": 4, "drops_link_down": 5}
    assert DirectionCounters.from_dict(reply).drops == 12


def test_emulator_choice() -> None:
    assert choose_emulator("auto", kernel_has_netem=False) == "relay"
    assert choose_emulator("auto", kernel_has_netem=True) == "netem"
    assert choose_emulator("relay", kernel_has_netem=True) == "relay"
    with pytest.raises(ValueError, match="no netem"):
        choose_emulator("netem", kernel_has_netem=False)


def test_netem_arguments() -> None:
    shape = LinkShape(rate_mbps=100, delay_ms=40, jitter_ms=2, loss_ratio=0.005)
    args = netem_args(shape)
    assert args[:4] == ["netem", "delay", "40.000ms", "2.000ms"]
    assert args[args.index("loss") + 2] == "0.500000%"
    assert args[args.index("rate") + 1] == "100000000bit"
    # The limit holds the queue plus 42 ms of packets in flight at 100 Mbit/s.
    assert int(args[-1]) >= (shape.queue_bytes + 525_000) // 1500
    assert netem_args(shape, up=False)[args.index("loss") + 2] == "100.000000%"
    assert netem_args(shape, fraction=0.5)[2] == "20.000ms"


def test_tbf_arguments() -> None:
    args = tbf_args(LinkShape(rate_mbps=1000))
    assert args[:3] == ["tbf", "rate", "1000000000bit"]
    assert int(args[args.index("burst") + 1]) >= 1500


def state(prefix: str, name: str = "two-region", **kw: object) -> LabState:
    fields: dict[str, object] = {
        "prefix": prefix,
        "name": name,
        "topology": {"regions": {"a": {"nodes": ["a-1"]}}},
        "owner_pid": os.getpid(),
        "detached": False,
        "namespaces": (f"{prefix}_a", f"{prefix}-a-1"),
        "relays": (RelayRecord("link-a-b", 123, "/x.sock", "a-b"),),
        "created_at_s": 1.0,
    }
    fields.update(kw)
    return LabState(**fields)  # type: ignore[arg-type]


def test_state_round_trip(tmp_path: Path) -> None:
    original = state("nl1")
    directory = write_state(original, tmp_path)
    assert read_state(directory) == original
    assert not original.stale


def test_find_lab_by_name_prefix_or_alone(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no lab is up"):
        find_lab(None, tmp_path)
    write_state(state("nl1"), tmp_path)
    assert find_lab(None, tmp_path).prefix == "nl1"
    write_state(state("nl2", created_at_s=2.0), tmp_path)
    assert [s.prefix for s in list_labs(tmp_path)] == ["nl1", "nl2"]
    assert find_lab("nl2", tmp_path).prefix == "nl2"
    with pytest.raises(ValidationError, match="several labs"):
        find_lab("two-region", tmp_path)
    with pytest.raises(ValidationError, match="named 'x'"):
        find_lab("x", tmp_path)


def test_dead_owner_makes_a_stale_lab() -> None:
    assert state("nl1", owner_pid=2**22 + 12345).stale
    assert not state("nl1", owner_pid=2**22 + 12345, detached=True).stale


@pytest.mark.parametrize(
    "argv",
    [
        ["lab", "up", "configs/lab/two-region.yaml"],
        ["lab", "down"],
        ["lab", "status", "--json"],
        ["lab", "exec", "hk-1", "--", "true"],
        ["lab", "link", "hk", "us", "--down"],
    ],
)
def test_without_net_admin_the_cli_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setattr(netns, "has_net_admin", lambda: False)
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "CAP_NET_ADMIN" in out.out + out.err


def test_lab_commands_are_registered() -> None:
    assert set(lab_cmd.lab_group.commands) == {"up", "down", "status", "exec", "link"}


def test_ping_summary_parsing() -> None:
    text = "rtt min/avg/max/mdev = 80.494/80.614/81.223/0.149 ms, pipe 2\n"
    assert parse_ping_avg_ms(text) == 80.614
    with pytest.raises(LabError, match="no RTT summary"):
        parse_ping_avg_ms("100% packet loss\n")


def test_binomial_interval() -> None:
    low, high = binomial_interval(1000, 0.02)
    assert low < 20 < high
    assert (low, high) == (10, 32)  # P(X<=9)=0.0047, P(X>32)=0.0043
    assert binomial_interval(50, 0.0) == (0, 0)
    with pytest.raises(ValueError, match="need n"):
        binomial_interval(10, 1.5)

"""A lab comes up with names, addresses and counters, and always comes down completely."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netopt.errors import LabError
from netopt.lab import Lab, reap_stale_labs
from netopt.lab.netns import NETNS_ETC_DIR, list_netns, pid_alive
from netopt.lab.state import list_labs
from tests.lab.conftest import MakeLab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]

SMALL = """\
kind: lab
name: small
regions:
  a: {nodes: [a-1, a-2]}
  b: {nodes: [b-1]}
links:
  - {between: [a, b], rate_mbps: 200, delay_ms: 2}
"""


def gone(lab_prefix: str, relay_pids: list[int]) -> None:
    """Assert nothing of a lab is left: namespaces, hosts files, relays, state."""
    assert not [ns for ns in list_netns() if ns.startswith(lab_prefix)]
    assert not any(NETNS_ETC_DIR.glob(f"{lab_prefix}*"))
    assert not [pid for pid in relay_pids if pid_alive(pid)]
    assert lab_prefix not in [s.prefix for s in list_labs()]


def relay_pids(lab: Lab) -> list[int]:
    return [r.pid for r in lab.state.relays]


def test_nodes_resolve_each_other_and_have_loopback(two_region_lab: Lab) -> None:
    lab = two_region_lab
    assert lab.nodes == ("hk-1", "hk-2", "us-1", "us-2")
    for node in lab.nodes:
        hosts = lab.exec("hk-1", ["getent", "hosts", node]).stdout.split()
        assert hosts[0] == lab.address(node)
        assert hosts[0].startswith("198.18.")
    lo = lab.exec("us-2", ["ip", "-br", "link", "show", "lo"]).stdout
    assert "UP" in lo
    lab.exec("us-2", ["ping", "-c", "1", "-W", "2", "127.0.0.1"])
    assert lab.netns("hk-1").endswith("-hk-1")


def test_exec_failures_are_lab_errors(two_region_lab: Lab) -> None:
    with pytest.raises(LabError, match="exited 1"):
        two_region_lab.exec("hk-1", ["false"])
    assert two_region_lab.exec("hk-1", ["false"], check=False).returncode == 1
    with pytest.raises(LabError, match="ran over"):
        two_region_lab.exec("hk-1", ["sleep", "5"], timeout_s=0.3)


def test_counters_count_every_byte_and_cut_links_drop(make_lab: MakeLab) -> None:
    lab = make_lab(SMALL)
    # 10 pings of 1000-byte IP packets: exactly 10 x 1000 bytes each way on a clean link.
    lab.exec("a-2", ["ping", "-q", "-c", "10", "-i", "0.02", "-s", "972", "b-1"])
    counters = lab.counters()
    assert counters.between("a", "b").packets == 10
    assert counters.between("a", "b").bytes == 10_000
    assert counters.between("b", "a").bytes == 10_000
    assert counters.to_dict()["links"][0]["a->b"]["bytes"] == 10_000

    lab.set_link("b", "a", up=False)
    down = lab.exec("a-1", ["ping", "-c", "3", "-i", "0.05", "-W", "1", "b-1"], check=False)
    assert down.returncode != 0
    counters = lab.counters()
    assert not counters.link("a", "b").up
    assert counters.between("a", "b").drops_link_down == 3

    lab.set_link("a", "b", up=True)
    lab.exec("a-1", ["ping", "-c", "1", "-W", "2", "b-1"])
    assert lab.counters().link("a", "b").up


def test_intra_region_delay_goes_through_the_emulator(make_lab: MakeLab) -> None:
    lab = make_lab(
        SMALL.replace("{nodes: [a-1, a-2]}", "{nodes: [a-1, a-2], intra: {delay_ms: 3}}")
    )
    out = lab.exec("a-1", ["ping", "-q", "-c", "10", "-i", "0.05", "a-2"]).stdout
    avg_ms = float(out.rsplit("=", 1)[1].split("/")[1])
    truth_ms = lab.ground_truth_rtt_ms("a-1", "a-2")
    assert truth_ms == pytest.approx(6.0, abs=0.01)
    assert truth_ms - 0.2 <= avg_ms <= truth_ms + 2.0


def test_two_labs_at_once_do_not_collide(make_lab: MakeLab) -> None:
    first, second = make_lab(SMALL), make_lab(SMALL)
    assert first.prefix != second.prefix
    assert not {first.netns(n) for n in first.nodes} & {second.netns(n) for n in second.nodes}
    for lab in (first, second):
        lab.exec("a-1", ["ping", "-c", "1", "-W", "2", "b-1"])
    assert first.address("b-1") == second.address("b-1")  # same plan, separate worlds


def test_exception_and_popen_processes_are_cleaned_up() -> None:
    seen: dict[str, object] = {}

    def use_lab_then_fail() -> None:
        with Lab.start(REPO / "configs/lab/two-region.yaml") as lab:
            seen["sleeper"] = lab.popen("hk-1", ["sleep", "300"])
            seen["prefix"], seen["pids"] = lab.prefix, relay_pids(lab)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        use_lab_then_fail()
    sleeper = seen["sleeper"]
    assert isinstance(sleeper, subprocess.Popen)
    assert sleeper.poll() is not None
    gone(str(seen["prefix"]), list(seen["pids"]))  # type: ignore[call-overload]


def _owner_script(tmp_path: Path) -> Path:
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from netopt.lab import Lab\n"
        f"lab = Lab.start({str(REPO / 'configs/lab/two-region.yaml')!r})\n"
        "print(lab.prefix, *[r.pid for r in lab.state.relays], flush=True)\n"
        "time.sleep(120)\n"
    )
    return script


def _start_owner(tmp_path: Path) -> tuple[subprocess.Popen[str], str, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, str(_owner_script(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    words = proc.stdout.readline().split()
    assert words, "the owner process did not start its lab"
    return proc, words[0], [int(w) for w in words[1:]]


def test_sigterm_tears_down(tmp_path: Path) -> None:
    proc, prefix, pids = _start_owner(tmp_path)
    assert [ns for ns in list_netns() if ns.startswith(prefix)]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()
    gone(prefix, pids)


def test_killed_owner_leaves_nothing_after_reaping(tmp_path: Path) -> None:
    proc, prefix, pids = _start_owner(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the relays watch their owner and exit with it
    assert prefix in reap_stale_labs()
    gone(prefix, pids)


def test_netem_requested_without_netem_is_refused_cleanly(make_lab: MakeLab) -> None:
    before = set(list_netns())
    message = ""
    try:
        make_lab(SMALL + "emulator: netem\n")
    except LabError as exc:
        message = str(exc)
    else:  # pragma: no cover - only on kernels that have netem
        pytest.skip("this kernel has netem")
    assert "no netem" in message
    ours = ("-a-1", "-a-2", "-b-1", "_a", "_b")
    assert not [ns for ns in set(list_netns()) - before if ns.endswith(ours)]

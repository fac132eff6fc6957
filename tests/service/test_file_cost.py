"""The per-file cost a many-file sync plans with: measured by real syncs on a real
filesystem, kept per filesystem, and planned with by a real sync of a tree."""

from __future__ import annotations

import contextvars
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from netopt.cache import filecost
from netopt.transfer.manifest import STATE_DIR_NAME
from netopt.transfer.planner import TransferPlan
from tests.service.cache_helpers import mount_tmpfs, sync_served_tree, umount
from tests.service.dataplane_helpers import CPU
from tests.service.serve_process import REPO


def _key(path: Path) -> str:
    """The filesystem's device number and id, as the kept figures are keyed."""
    return f"{os.stat(path).st_dev}:{os.statvfs(path).f_fsid}"


def test_measured_on_the_filesystem_then_read_from_its_cache(tmp_path: Path) -> None:
    cache = tmp_path / "filecost.json"
    where = tmp_path / "dest" / STATE_DIR_NAME
    seconds = filecost.per_file_cost_s(where, filecost.MEASURE_FROM_FILES, 0.0, cache)
    assert seconds is not None
    # Above what a file's system calls alone take, far below a millisecond on any disk
    # that a sync of 1,000 files should not take a second over.
    assert 5e-6 < seconds < 5e-3
    assert not where.exists()  # the directory it made for measuring is gone
    kept = json.loads(cache.read_text())
    assert kept == {_key(tmp_path): [seconds]}
    # Known now: read back, not measured again (a figure no measurement gives).
    cache.write_text(json.dumps({_key(tmp_path): [0.5]}))
    # Kept figures are used even where the files could not bind (no cost to know them).
    assert filecost.per_file_cost_s(where, 5000, 1e6, cache) == 0.5
    # As older versions kept it: one number.
    cache.write_text(json.dumps({_key(tmp_path): 0.25}))
    assert filecost.per_file_cost_s(where, 5000, 1e6, cache) == 0.25


def _plan(bottleneck: str, setup_s: float = 0.5) -> TransferPlan:
    return TransferPlan(
        codec="zstd", zstd_level=3, expected_ratio=4.0, chunk_size_bytes=1 << 21, streams=4,
        per_flow_ceiling_bps=60e6, wire_rate_bps=70e6, logical_rate_bps=100e6,
        predicted_time_s=12.0, bottleneck=bottleneck,  # type: ignore[arg-type]
        startup_s=0.5, setup_s=setup_s,
    )  # fmt: skip


def test_what_a_sync_the_files_bound_showed_per_file() -> None:
    files = 100_000
    # The lab's 100,000-file tree: 18.5 s from the sync's start, 0.9 s of set-up.
    seen = filecost.observed_per_file_s(_plan("files", 0.9), 18.5, files)
    assert seen == pytest.approx((18.5 - 0.9) / files)
    # Bound by anything else, its time is not its files'.
    for other in ("link", "cpu", "disk"):
        assert filecost.observed_per_file_s(_plan(other), 18.5, files) is None
    # Too few files to tell; figures that are no per-file cost.
    assert filecost.observed_per_file_s(_plan("files"), 18.5, 999) is None
    assert filecost.observed_per_file_s(_plan("files", 2.0), 1.0, files) is None
    assert filecost.observed_per_file_s(_plan("files"), 5000.0, 1000) is None


def test_figures_syncs_showed_are_kept_beside_the_calibration(tmp_path: Path) -> None:
    cache = tmp_path / "filecost.json"
    where = tmp_path / "dest"
    # Nothing calibrated on this filesystem: nothing kept (the plan had no figure).
    filecost.keep_observed(where, 150e-6, cache)
    assert not cache.exists()
    cache.write_text(json.dumps({_key(tmp_path): [100e-6], "1:2": [1e-3]}))
    filecost.keep_observed(where, 160e-6, cache)
    kept = json.loads(cache.read_text())
    assert kept == {_key(tmp_path): [100e-6, 160e-6], "1:2": [1e-3]}
    assert filecost.per_file_cost_s(where, 5000, 0.0, cache) == pytest.approx(130e-6)
    for seen in (150e-6, 155e-6, 900e-6, 140e-6):
        filecost.keep_observed(where, seen, cache)
    kept = json.loads(cache.read_text())
    # The newest `FIGURES_KEPT`; the median of them, so one slow sync moves it little.
    assert kept[_key(tmp_path)] == [160e-6, 150e-6, 155e-6, 900e-6, 140e-6]
    assert filecost.FIGURES_KEPT == 5
    assert filecost.per_file_cost_s(where, 5000, 0.0, cache) == pytest.approx(155e-6)
    # A figure that is no per-file cost is not kept.
    for bad in (-1e-6, 1.5, float("nan")):
        filecost.keep_observed(where, bad, cache)
    assert json.loads(cache.read_text()) == kept


def test_a_filesystem_made_again_on_the_same_device_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A figure kept for one filesystem is not used for the next one mounted where it was
    # with the device number it had (tmpfs here; the lab's fresh ext4 image on /dev/loop0
    # each session), nor a figure the device number alone keyed.
    mnt = tmp_path / "mnt"
    cache = tmp_path / "filecost.json"
    measured: list[Path] = []

    def measure(where: Path) -> float:
        measured.append(Path(where))
        return 0.25

    monkeypatch.setattr(filecost, "measure_per_file_s", measure)
    mount_tmpfs(mnt, "1m")
    try:
        first = filecost.filesystem_key(mnt / "dest")
        assert first is not None
        device = os.stat(mnt).st_dev
        cache.write_text(json.dumps({first: 0.5, str(device): 0.5}))
        assert filecost.per_file_cost_s(mnt / "dest", 5000, 0.0, cache) == 0.5
        assert measured == []
    finally:
        umount(mnt)
    mnt.rmdir()
    mount_tmpfs(mnt, "1m")
    try:
        if os.stat(mnt).st_dev != device:
            pytest.skip("the tmpfs came back with another device number")
        second = filecost.filesystem_key(mnt / "dest")
        assert second is not None
        assert second != first
        assert filecost.per_file_cost_s(mnt / "dest", 5000, 0.0, cache) == 0.25
        assert measured == [mnt / "dest"]
        assert json.loads(cache.read_text()) == {first: [0.5], second: [0.25]}
    finally:
        umount(mnt)


def test_a_few_files_measure_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> float:
        raise AssertionError("measured for a small sync")

    monkeypatch.setattr(filecost, "measure_per_file_s", refuse)
    cache = tmp_path / "filecost.json"
    assert filecost.per_file_cost_s(tmp_path, filecost.MEASURE_FROM_FILES - 1, 0.0, cache) is None
    # Enough files, but their bytes outlast them even at the highest per-file cost seen.
    files = 10_000
    bytes_s = files * filecost.PER_FILE_CEILING_S * 1.01
    assert filecost.per_file_cost_s(tmp_path, files, bytes_s, cache) is None
    assert not cache.exists()


def test_measured_only_where_the_files_could_bind() -> None:
    # The lab's figures: the packages tree's 7,947 files against 6.9 s of bytes (the
    # measurement's ~2.5 s put it behind rsync while its files were ~1 s of work), and
    # the 100,000-file tree against ~6 s of bytes (its files bound it: 23-25 s).
    assert not filecost.files_could_bind(7_947, 6.9)
    assert filecost.files_could_bind(100_000, 6.0)
    assert filecost.files_could_bind(filecost.MEASURE_FROM_FILES, 0.0)
    assert not filecost.files_could_bind(filecost.MEASURE_FROM_FILES - 1, 0.0)


def test_a_bad_cache_is_ignored_and_an_unusable_place_measures_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "filecost.json"
    dev = _key(tmp_path)
    bad_cases = ("[1, 2]", "{not json", json.dumps({dev: "fast"}), json.dumps({dev: 7.0}),
                 json.dumps({f"../{dev}": 0.5}), json.dumps({dev.split(":")[0]: 0.5}))  # fmt: skip
    for bad in bad_cases:
        cache.write_text(bad)
        assert filecost._cached(cache) == {}
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert filecost.measure_per_file_s(blocker / "under") is None


def _tree(src: Path, suffix: str, content: Callable[[int], bytes]) -> None:
    """`filecost.MEASURE_FROM_FILES` files under ``src``, in 7 directories: file i holds
    ``content(i)``."""
    for i in range(filecost.MEASURE_FROM_FILES):
        path = src / f"d{i % 7}" / f"f{i:05d}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content(i))


async def test_a_tree_sync_plans_with_the_measured_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETOPT_CODEC_CACHE", str(tmp_path / "codec.json"))
    src = tmp_path / "src"
    _tree(src, ".txt", lambda i: b"row %d\n" % i * (1 + i % 40))
    report = await sync_served_tree(
        src, tmp_path / "dest", tmp_path / "cache", replace(CPU, per_file_s=None)
    )
    kept = json.loads((tmp_path / "filecost.json").read_text())
    assert list(kept) == [_key(tmp_path)]
    calibrated, seen = kept[_key(tmp_path)]
    plan = report.transfer_plan
    assert plan is not None
    assert plan.bottleneck == "files"  # on loopback the files, not the bytes, bind
    assert plan.work_s == pytest.approx(filecost.MEASURE_FROM_FILES * calibrated)
    for i in (0, 999):
        rel = f"d{i % 7}/f{i:05d}.txt"
        assert (tmp_path / "dest" / rel).read_bytes() == (src / rel).read_bytes()
    assert not (tmp_path / "dest" / STATE_DIR_NAME).exists()
    # What the sync showed per file is kept beside the calibration: its time less the
    # calibration's (it measured, a second or more) and the plan's set-up, per file.
    assert 0.2 < report.file_cost_s < report.seconds
    assert report.summary is not None
    assert report.summary.files_written == filecost.MEASURE_FROM_FILES
    assert seen == pytest.approx(
        (report.seconds - report.file_cost_s - plan.setup_s) / filecost.MEASURE_FROM_FILES
    )
    # The next sync on this filesystem measures nothing and plans with their median.
    again = await sync_served_tree(
        src, tmp_path / "dest2", tmp_path / "cache2", replace(CPU, per_file_s=None)
    )
    assert again.file_cost_s < 0.2
    assert again.transfer_plan is not None
    assert again.transfer_plan.work_s == pytest.approx(
        filecost.MEASURE_FROM_FILES * (calibrated + seen) / 2
    )
    assert len(json.loads((tmp_path / "filecost.json").read_text())[_key(tmp_path)]) == 3


async def test_a_tree_whose_bytes_outlast_its_files_is_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,000 files of 4 KB planned for a 2 Mbit/s link: 16 s of bytes, where the files
    # at the highest per-file cost seen are 0.7 s. A real sync measures nothing.
    monkeypatch.setenv("NETOPT_CODEC_CACHE", str(tmp_path / "codec.json"))
    src = tmp_path / "src"
    _tree(src, ".bin", lambda _: os.urandom(4096))
    report = await sync_served_tree(
        src, tmp_path / "dest", tmp_path / "cache", replace(CPU, per_file_s=None), 2e6
    )
    assert not (tmp_path / "filecost.json").exists()
    plan = report.transfer_plan
    assert plan is not None
    assert plan.bottleneck != "files"
    assert plan.work_s > filecost.MEASURE_FROM_FILES * filecost.PER_FILE_CEILING_S
    rel = "d3/f00003.bin"
    assert (tmp_path / "dest" / rel).read_bytes() == (src / rel).read_bytes()


def test_under_tls_it_measures_over_tls_and_leaves_the_callers_tls(tmp_path: Path) -> None:
    # A sync with a cluster CA set speaks TLS on netopt://: the calibration serves with a
    # throwaway CA of its own (the caller's CA signed nothing for 127.0.0.1) and sets it for
    # its own context only.
    from netopt.tlsca import issue_server_files
    from netopt.tlsconf import ClientTls, current_client_tls, use_client_tls

    users = issue_server_files(tmp_path / "users-tls", "node-1", ips=["198.18.0.1"])
    mine = ClientTls(ca_file=str(users.ca_cert))
    context = contextvars.copy_context()

    def calibrate() -> tuple[float | None, ClientTls]:
        use_client_tls(mine)
        return filecost.measure_per_file_s(tmp_path / "m"), current_client_tls()

    seconds, after = context.run(calibrate)
    assert seconds is not None
    assert 5e-6 < seconds < 5e-3
    assert after == mine


_STARTS_A_SERVER = """
import asyncio, sys, time
from pathlib import Path
from netopt.cache import filecost

root, token = Path(sys.argv[1]), Path(sys.argv[2])
proc, port = asyncio.run(filecost._serve(root, token, None))
print(proc.pid, port, flush=True)
time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_killed_sync_leaves_no_measuring_server(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "a.txt").write_text("a")
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sync = subprocess.Popen(
        [sys.executable, "-c", _STARTS_A_SERVER, str(tmp_path / "root"), str(token)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    server_pid = 0
    try:
        assert sync.stdout is not None
        server_pid = int(sync.stdout.readline().split()[0])
        assert not _gone(server_pid)  # the measuring server is up
        sync.kill()  # as kill -9 of a sync in the middle of measuring
        sync.wait()
        deadline = time.monotonic() + 15
        while not _gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(server_pid), "the measuring server outlived the sync"
    finally:
        sync.kill()
        sync.wait()
        if sync.stdout is not None:
            sync.stdout.close()
        if server_pid and not _gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)  # the failure's orphan, not left running

"""The plan of a sync counts the bytes it will fetch: the manifest's chunks each once,
not the dataset's size. A tree whose files repeat one another (copies of an image, a
vendored package twice) fetches each chunk once; planned by its size, the lab's image
corpus (12 % repeated) was predicted 24 % too slow. Real server and client on
localhost; the plan is compared, not timed."""

from __future__ import annotations

import os
from pathlib import Path

from netopt.dataplane.client import sync_url
from netopt.transfer.planner import TransferPlan
from tests.service.cache_helpers import sync_served_tree
from tests.service.dataplane_helpers import CPU, FAST, check_tree, start
from tests.service.test_dataplane_prefetch import CLIENT

LINK_BPS = 8e6
"""A slow link: the bytes on the wire decide the predicted time."""


async def _plan_of(root: Path, dest: Path) -> TransferPlan:
    runner, port, _, _ = await start(root)
    plans: list[TransferPlan] = []
    try:
        await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, CLIENT, client_cpu=CPU,
            sync_options=FAST, link_rate_bps=LINK_BPS, startup_s=0, on_plan=plans.append,
        )  # fmt: skip
    finally:
        await runner.cleanup()
    return plans[0]


async def test_files_that_repeat_each_other_are_planned_as_fetched_once(tmp_path: Path) -> None:
    blob = os.urandom(2 * 1024 * 1024)  # incompressible: the wire carries it as it is
    files = {f"copy{i}.bin": blob for i in range(8)}
    for rel, data in files.items():
        (tmp_path / "copies" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "copies" / rel).write_bytes(data)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "copy0.bin").write_bytes(blob)
    copies = await _plan_of(tmp_path / "copies", tmp_path / "dest-copies")
    one = await _plan_of(tmp_path / "one", tmp_path / "dest-one")
    check_tree(tmp_path / "dest-copies", files)
    # 16 MB of files, 2 MB of chunks: the plan is that of the 2 MB (at 8 Mbit/s, 2 s of
    # wire), not of 16 MB (16 s).
    assert copies.predicted_time_s < 1.5 * one.predicted_time_s, (copies, one)
    assert copies.predicted_time_s < 8.0


async def test_a_resync_reports_the_plan_of_what_it_fetches(tmp_path: Path) -> None:
    # 8 MB of random files on a planned 8 Mbit/s link: a cold sync is planned at ~8 s
    # of wire. Run again with one file changed, it fetches that file's chunks only, and
    # with nothing changed nothing: the plans it reports say so, and the cold sync's
    # plan is the source's own.
    src = tmp_path / "src"
    files = {f"f{i}.bin": os.urandom(1024 * 1024) for i in range(8)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    cold = await sync_served_tree(src, dest, cache, CPU, link_rate_bps=LINK_BPS)
    (src / "f3.bin").write_bytes(os.urandom(1024 * 1024))
    one = await sync_served_tree(src, dest, cache, CPU, link_rate_bps=LINK_BPS)
    none = await sync_served_tree(src, dest, cache, CPU, link_rate_bps=LINK_BPS)
    files["f3.bin"] = (src / "f3.bin").read_bytes()
    check_tree(dest, files)
    assert cold.transfer_plan is not None
    assert one.transfer_plan is not None
    assert none.transfer_plan is not None
    assert one.plan.bytes_to_fetch == 1024 * 1024
    assert none.plan.bytes_to_fetch == 0
    # The wire part of each plan: 8 MB, 1 MB, nothing (each plan also counts its fixed
    # costs, which do not change with the bytes).
    assert cold.transfer_plan.work_s > 6.0
    assert 0.5 < one.transfer_plan.work_s < cold.transfer_plan.work_s / 4
    assert none.transfer_plan.work_s < 0.1
    assert none.transfer_plan.predicted_time_s < cold.transfer_plan.predicted_time_s - 6.0

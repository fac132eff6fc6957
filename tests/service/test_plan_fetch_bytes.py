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

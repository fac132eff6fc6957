"""The step meter's totals reach the node's agent (a real one on localhost), and a meter
whose directory is read-only, full or missing warns once while the loop goes on.

The meter here runs without torch: its timing of a loop needs none (a fake clock
gives the steps known parts).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from netopt.cli.train_status import MAX_BODY_BYTES
from netopt.torch.stepmeter import StepMeter
from tests.service.agent_helpers import running_agent
from tests.service.cache_helpers import mount_tmpfs, umount

STEPS = 12


def metered_loop(**meter_args: object) -> StepMeter:
    """STEPS steps of 1 s: 0.25 s data wait, 0.75 s compute (a fake clock)."""
    now = [0.0]
    meter = StepMeter(clock=lambda: now[0], **meter_args)  # type: ignore[arg-type]

    def loader():
        for i in range(STEPS):
            now[0] += 0.25
            yield i

    for _ in meter.batches(loader()):
        now[0] += 0.75
    return meter


def _get(url: str) -> str:
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback (asserted)
        body: bytes = response.read()
    return body.decode()


async def test_agent_exports_each_jobs_totals_and_status_shows_shares(tmp_path: Path) -> None:
    train = tmp_path / "train"
    train.mkdir()
    # The agent is not running yet: the meter never talks to it, so nothing to warn about.
    for rank in (0, 1):
        metered_loop(job="lm-small", rank=rank, agent_dir=train, prom_every=5)
    (train / "evil.1.json").write_text(json.dumps({"job": "other", "rank": 1}))
    async with running_agent(tmp_path, "t0ken", f"train_dir: {train}\n") as agent:
        base = f"http://127.0.0.1:{agent.http_port}"
        text = await asyncio.to_thread(_get, base + "/metrics")
        samples = {
            (s.name, s.labels.get("rank")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("netopt_train_") and s.labels.get("job") == "lm-small"
        }
        # written every 5 steps (and 5 s) and at the loop's end: all 12 steps
        assert samples[("netopt_train_steps_total", "1")] == STEPS
        assert samples[("netopt_train_step_seconds_total", "0")] == pytest.approx(12.0)
        assert samples[("netopt_train_data_wait_seconds_total", "0")] == pytest.approx(3.0)
        assert samples[("netopt_train_comm_exposed_seconds_total", "0")] == 0
        assert "netopt_agent_train_files_rejected 1.0" in text
        promtool = shutil.which("promtool")
        if promtool is not None:  # Prometheus's conventions (base units, _total counters)
            lint = await asyncio.to_thread(
                subprocess.run,
                [promtool, "check", "metrics"],
                input=text, capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert lint.returncode == 0, lint.stdout + lint.stderr
            assert lint.stdout.strip() == "", lint.stdout
        answer = json.loads(await asyncio.to_thread(_get, base + "/v1/train"))
        assert answer["rejected_files"] == 1
        assert [j["rank"] for j in answer["jobs"]] == [0, 1]
        assert answer["jobs"][0]["shares"]["data_wait"] == pytest.approx(0.25)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "status", "--agent", base,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        shown = out.decode()
        assert "lm-small" in shown
        assert "25%" in shown  # data wait
        assert "75%" in shown  # compute


def _meter_warns_once_and_goes_on(directory: Path) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        meter = metered_loop(
            job="j", log_path=directory / "steps.jsonl", agent_dir=directory, prom_every=1
        )
    assert len(meter.records) == STEPS  # every step measured
    whats = sorted(str(w.message).split(" (")[0] for w in caught)
    assert len(whats) == 2  # once for the log, once for the agent's file
    assert any("step log" in w for w in whats)
    assert any("agent's train file" in w for w in whats)


def test_meter_on_a_read_only_file_system_warns_once_per_file(tmp_path: Path) -> None:
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "1m")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        _meter_warns_once_and_goes_on(mnt)
    finally:
        umount(mnt)


def test_meter_on_a_full_disk_warns_once_per_file(tmp_path: Path) -> None:
    mnt = tmp_path / "full"
    mount_tmpfs(mnt, "64k")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError, match="No space left"):  # noqa: PT012
                while True:  # until ENOSPC; a 64 KiB tmpfs, so a few writes
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        _meter_warns_once_and_goes_on(mnt)
    finally:
        umount(mnt)


def test_meter_refuses_a_job_name_that_could_be_a_path_before_the_first_step() -> None:
    from netopt.errors import ValidationError

    with pytest.raises(ValidationError, match="job name"):
        StepMeter("../etc/passwd", agent_dir="/tmp")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"x" * (2 * MAX_BODY_BYTES), "over"),
        (b"not json", "not JSON"),
        (b'{"jobs": {"a": 1}}', "no list"),
        (b'{"jobs": [{"job": "../x", "rank": 0, "steps": 1, "seconds": {}}]}', "malformed"),
        (
            json.dumps(
                {
                    "jobs": [
                        {
                            "job": "j",
                            "rank": 0,
                            "steps": 1,
                            "seconds": dict.fromkeys(
                                ("step", "data_wait", "comm_exposed", "compute"), 1e99
                            ),
                        }
                    ]
                }
            ).encode(),
            "malformed",
        ),
    ],
)
async def test_status_refuses_a_hostile_agents_answer(body: bytes, match: str) -> None:
    """A real server on localhost answers /v1/train with hostile data: a clear error."""
    from aiohttp import web

    from netopt.cli.train_status import _get, _parse
    from netopt.errors import ProtocolError

    async def train(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.add_routes([web.get("/v1/train", train)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    try:
        with pytest.raises(ProtocolError, match=match):
            _parse(url, await _get(url, 5.0))
    finally:
        await runner.cleanup()

"""The agent config's transfer keys reach ``netopt sync --config`` (a real serve, a real
sync): ``cache.max_parallel_streams`` caps the plan's streams, ``cache.rate_limit_mbps``
limits the client, ``cache.congestion_control`` is the sockets' default; options win."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.service.serve_process import REPO, serve_process


def _sync(port: int, tmp_path: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    dest = tmp_path / f"dest-{len(list(tmp_path.glob('dest-*')))}"
    return subprocess.run(
        [sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds", str(dest),
         "--config", str(config), "--no-share", "--json", *extra],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        check=False, timeout=120,
    )  # fmt: skip


def test_agent_cache_keys_set_the_sync_defaults(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(4 * 2**20))
    config = tmp_path / "agent.yaml"
    config.write_text(
        "kind: agent\nnode: n1\nregion: hk\ncoordinator_url: http://127.0.0.1:1\n"
        f"cache: {{dir: {tmp_path / 'cache'}, max_parallel_streams: 1, rate_limit_mbps: 40,"
        " congestion_control: reno}\n"
    )
    with serve_process(src, tmp_path) as served:
        done = _sync(served.port, tmp_path, config)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["transfer_plan"]["streams"] == 1  # the plan would take more here
        assert report["link_figures"]["rate_bps"]["value"] == 40e6
        # An option wins over the config; more streams than the config allows is refused.
        done = _sync(served.port, tmp_path, config, "--rate-limit-mbps", "80")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["link_figures"]["rate_bps"]["value"] == 80e6
        done = _sync(served.port, tmp_path, config, "--streams", "4")
        assert done.returncode == 2
        assert "cache.max_parallel_streams" in done.stdout + done.stderr  # --json: on stdout
    # Without the cap the same sync plans several streams (so the cap above is what did it).
    config.write_text(
        config.read_text().replace("max_parallel_streams: 1", "max_parallel_streams: 64")
    )
    with serve_process(src, tmp_path) as served:
        done = _sync(served.port, tmp_path, config, "--link-rate-mbps", "400")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["transfer_plan"]["streams"] > 1

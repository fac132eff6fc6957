"""The start-up the planner counts is the start-up a sync has: the calibration's probe
imports every netopt and aiohttp module that a real ``netopt sync`` of a netopt:// URL
loads before it fails to reach the server (before its first byte, then)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from netopt.transfer.profile import startup_command

REPO = Path(__file__).resolve().parents[2]
_IMPORTED = re.compile(r"import time:[^|]*\|[^|]*\|\s*(\S+)\s*$")


def _imported(argv: list[str]) -> set[str]:
    """The modules ``argv`` (a Python command) imports, from ``-X importtime``."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return {m[1] for line in proc.stderr.splitlines() if (m := _IMPORTED.match(line))}


def test_the_startup_probe_imports_what_a_sync_loads(tmp_path: Path) -> None:
    sync = _imported(
        [sys.executable, "-m", "netopt", "sync", "netopt://127.0.0.1:1/ds",
         str(tmp_path / "dest"), "--cache-dir", str(tmp_path / "cache"), "--json"]
    )  # fmt: skip
    probe = _imported(startup_command())
    ours = {name for name in sync if name.split(".")[0] in ("netopt", "aiohttp")}
    assert "aiohttp" in ours  # the run got that far
    assert "netopt.cache.syncer" in ours
    assert sorted(ours - probe - {"netopt.__main__"}) == []

"""The start-up the planner counts is the start-up a sync has: the calibration's probe
imports every netopt and aiohttp module that a real ``netopt sync`` of a netopt:// URL
loads before it fails to reach the server (before its first byte, then); a small sync
leaves the certificate library unloaded."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from netopt.transfer.profile import startup_command
from tests.service.serve_process import serve_process

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
    # Nothing listens on port 1: the sync fails at once (no retry window), after it
    # has loaded what it runs.
    sync = _imported(
        [sys.executable, "-m", "netopt", "sync", "netopt://127.0.0.1:1/ds",
         str(tmp_path / "dest"), "--cache-dir", str(tmp_path / "cache"), "--json",
         "--retry-window-s", "0"]
    )  # fmt: skip
    probe = _imported(startup_command())
    ours = {name for name in sync if name.split(".")[0] in ("netopt", "aiohttp")}
    assert "aiohttp" in ours  # the run got that far
    assert "netopt.cache.syncer" in ours
    assert sorted(ours - probe - {"netopt.__main__"}) == []


def test_a_small_sync_leaves_the_certificate_library_unloaded(tmp_path: Path) -> None:
    # A sync of a few files never issues a certificate: importing the library that does
    # (~40 ms) came after the manifest, on the path to the first chunk request.
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"one small file\n" * 1000)
    with serve_process(src, tmp_path) as served:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "netopt", "sync",
             f"netopt://127.0.0.1:{served.port}/ds", str(tmp_path / "dest"),
             "--cache-dir", str(tmp_path / "cache"), "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert (tmp_path / "dest" / "a.txt").read_bytes() == (src / "a.txt").read_bytes()
    imported = {m[1] for line in proc.stderr.splitlines() if (m := _IMPORTED.match(line))}
    assert "netopt.cache.syncer" in imported
    assert sorted(m for m in imported if m.split(".")[0] == "cryptography") == []
    # --json prints with print_json: rich (the people's output) is never loaded.
    assert sorted(m for m in imported if m.split(".")[0] == "rich") == []

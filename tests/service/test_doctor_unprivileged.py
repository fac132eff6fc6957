"""`netopt doctor --json` as an unprivileged user: it runs, and says what it could not check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*NOBODY, sys.executable, "-m", "netopt", "doctor", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd="/",
    )


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="dropping to uid 65534 needs root and setpriv",
)


def test_doctor_without_root_reports_what_it_could_not_check() -> None:
    proc = _as_nobody("--peers", "127.0.0.1", "--no-mtu")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    reasons = {s["check"]: s["reason"] for s in report["not_checked"]}
    assert "not root" in reasons["apply"]
    if shutil.which("nvidia-smi") is None:
        assert reasons["gpu"] == "no nvidia-smi: GPU not checked"
    assert "no cluster token" in reasons["clock"]
    assert "no --dataset-dir" in reasons["host.disk"]
    assert report["facts"]["tcp"]["tcp_rmem_bytes"] is not None
    # Nothing listens on 127.0.0.1:29500 here, so the rendezvous port is reported.
    assert any(
        f["subject"] == f"{report['facts']['node']} -> 127.0.0.1 tcp/29500"
        for f in report["findings"]
    )


def test_apply_without_root_changes_nothing() -> None:
    proc = _as_nobody("--apply")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"] == "PermissionDeniedError"

"""scripts/gpu_check.sh end to end on CPU (``--cpu``: Gloo instead of NCCL), inside a
network namespace this test creates, with a stand-in nvidia-smi on PATH.

The namespace has lo and one veth NIC at 198.18.7.1/24: nccl-env must choose that NIC,
the Gloo group binds to it, and no packet leaves the namespace.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from netopt.lab.netns import add_netns, delete_netns, ip_batch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
NETNS = "netopt-gpucheck-t"
FAKE_SMI = """#!/bin/sh
# nvidia-smi --query-gpu=index,name,utilization.gpu,pcie.link.width.current,... (csv)
echo "0, NVIDIA H200, 37, 16, 16, 5, 5"
"""

pytestmark = [
    pytest.mark.lab,
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


@pytest.fixture
def netns() -> Iterator[str]:
    add_netns(NETNS)
    try:
        ip_batch(NETNS, [
            "link set lo up",
            "link add gc0 type veth peer name gc1",
            "address add 198.18.7.1/24 dev gc0",
            "link set gc1 up",
            "link set gc0 up",
        ])  # fmt: skip
        yield NETNS
    finally:
        delete_netns(NETNS)


def _run(netns: str, out: Path, bin_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NETOPT_PYTHON": sys.executable,
           "NETOPT_GPU_CHECK_NO_SETUP": "1"}  # fmt: skip
    argv = ["ip", "netns", "exec", netns, "bash", str(SCRIPT), "--cpu", "--out", str(out), *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)


def test_the_cpu_path_checks_every_step_and_reports_what_nccl_cannot_confirm(
    netns: str, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = tmp_path / "out"
    proc = _run(netns, out, bin_dir, "--budget-s", "240")
    report = json.loads((out / "report.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert report["mode"] == "cpu"
    for name in ("probe", "nccl_env", "allreduce_1rank", "hooks", "busbw", "env_log", "doctor"):
        assert steps[name]["status"] == "pass", (name, steps[name]["reason"], proc.stdout[-3000:])
    # The env file named the namespace's NIC, as bash loaded it.
    assert steps["nccl_env"]["details"]["variables"]["NCCL_SOCKET_IFNAME"] == "=gc0"
    assert "GLOO_SOCKET_IFNAME" in report["accepted"]  # the Gloo group formed on gc0
    # Gloo prints no NCCL log: every NCCL variable is listed as unconfirmed, none passed.
    assert "NCCL_SOCKET_IFNAME" in report["not_echoed"]
    assert report["rejected"] == []
    assert report["verdict"] == "unconfirmed"
    assert proc.returncode == 3
    hooks = steps["hooks"]["details"]
    assert hooks["hook:bf16_compress_hook"]["buckets"] >= 2
    assert hooks["hook:bf16_compress_hook"]["grads_in_wire_dtype"] is True
    assert max(hooks["hook:powerSGD_hook"]["grad_matrix_ranks"]) <= 2
    assert steps["doctor"]["details"]["gpus"][0]["pcie_width"] == 16
    assert steps["busbw"]["details"]["with_env"][0]["busbw_gbps"] > 0


def test_without_a_usable_python_the_script_still_writes_a_failing_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "NETOPT_PYTHON": "/nonexistent/python",
           "NETOPT_GPU_CHECK_NO_SETUP": "1", "HOME": str(tmp_path)}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail"
    assert report["steps"][0]["status"] == "fail"
    assert "NETOPT_GPU_CHECK_NO_SETUP" in report["steps"][0]["reason"]

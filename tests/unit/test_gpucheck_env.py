"""The env file gpu_check.sh checks: real `netopt nccl-env` output for this machine's
interfaces, loaded in bash with `set -a; . ./nccl.env`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from netopt.agent.host import local_nics
from netopt.errors import NetoptError
from netopt.torch.gpucheck import load_env_file
from netopt.torch.gpucheck_report import TWIN_NODE, WanFigures, local_links_document, node_name

REPO = Path(__file__).resolve().parents[2]


def _assignments(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line and not line.startswith(" "):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_set_a_loads_every_assignment_of_the_real_nccl_env_output(tmp_path: Path) -> None:
    nics = local_nics()
    if not any(n.name != "lo" and n.addresses for n in nics):
        pytest.skip("this machine has no NIC besides lo for nccl-env to choose")
    node = node_name(socket.gethostname())
    document = local_links_document(node, nics, WanFigures(), "2026-01-01T00:00:00Z")
    (tmp_path / "links.yaml").write_text(yaml.safe_dump(document))
    subprocess.run(
        [sys.executable, "-m", "netopt", "nccl-env", "--links", "links.yaml",
         "--nodes", f"{node},{TWIN_NODE}", "--nccl-version", "2.27.5",
         "--torch-version", "2.13.0", "-o", "nccl.env"],
        cwd=tmp_path, check=True, timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    text = (tmp_path / "nccl.env").read_text()
    loaded = load_env_file(tmp_path)
    assert loaded == _assignments(text)
    # A WAN pair makes netopt set the socket and buffer variables, each read as written.
    for key in ("NCCL_SOCKET_IFNAME", "NCCL_SOCKET_NTHREADS", "NCCL_BUFFSIZE", "NCCL_ALGO"):
        assert key in loaded
    assert loaded["NCCL_SOCKET_IFNAME"].startswith("=")  # an exact name, never lo
    assert loaded["NCCL_SOCKET_IFNAME"] != "=lo"


def test_a_file_bash_cannot_source_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NetoptError, match="could not load"):
        load_env_file(tmp_path)  # no nccl.env
    (tmp_path / "nccl.env").write_text("A=1\nif then\n")
    with pytest.raises(NetoptError, match="could not load"):
        load_env_file(tmp_path)

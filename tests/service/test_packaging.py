"""The wheel and sdist build from the repository and install in a clean virtualenv.

A real ``python -m build`` (the build backend from pyproject.toml), a fresh venv with no
site packages, ``pip install`` of the wheel (its dependencies from the package index, as
a user's install does), then the installed ``netopt`` runs: ``--version`` and a config
check. The sdist holds what a rebuild needs (LICENSE, README, pyproject, the package).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


@pytest.mark.timeout(600)
def test_wheel_and_sdist_build_and_install_in_a_clean_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)], timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("netopt-*.whl")
    (sdist,) = dist.glob("netopt-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "netopt/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Dist: matplotlib" not in metadata.split("Provides-Extra")[0]
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml", "netopt/__init__.py"} <= members

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "-q", str(wheel)], timeout=400)
    assert installed.returncode == 0, installed.stderr[-2000:]
    netopt = venv / "bin" / "netopt"
    version = _run([str(netopt), "--version"], timeout=60, cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert "0." in version.stdout
    env = {"NETOPT_TOKEN": "packaging-test-token-0123456789", "PATH": "/usr/bin:/bin"}
    check = _run(
        [str(netopt), "config", "check", "--kind", "agent", str(REPO / "configs" / "agent.yaml")],
        timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # The core install has no demo extra: `netopt demo` says how to get it.
    demo = _run([str(netopt), "demo", "--loopback"], timeout=60, cwd=tmp_path, env=env)
    assert demo.returncode != 0
    assert "netopt[demo]" in demo.stdout + demo.stderr

"""A real ``netopt serve`` in a subprocess, for tests that measure the server's own
memory (``VmHWM``), descriptors and log."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"serving netopt://127\.0\.0\.1:(\d+)/")


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory so far (``VmHWM``)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _limit_files(max_files: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, hard))


@contextmanager
def serve_process(
    directory: Path, tmp_path: Path, *, max_files: int = 1024, chunk_size_bytes: int = 65536
) -> Iterator[ServeProcess]:
    """``netopt serve DIRECTORY --no-auth`` on a free localhost port, with ``max_files``
    descriptors (a common default), its stderr in a log file. Stopped on exit."""
    log_path = tmp_path / "serve.log"
    out_path = tmp_path / "serve.out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [
        sys.executable, "-m", "netopt", "serve", str(directory), "--name", "ds", "--no-auth",
        "--bind", "127.0.0.1:0", "--cc", "default", "--threads", "2",
        "--chunk-size", str(chunk_size_bytes), "--codec-cache", str(tmp_path / "codec.json"),
    ]  # fmt: skip
    with log_path.open("wb") as log, out_path.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=out, stderr=log,
            preexec_fn=lambda: _limit_files(max_files),
        )  # fmt: skip
    try:
        deadline_s = time.monotonic() + 60
        port = None
        while port is None:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline_s, "netopt serve did not start"
            found = _SERVING.search(out_path.read_text())
            port = int(found.group(1)) if found else None
            time.sleep(0.05)
        yield ServeProcess(proc, port, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

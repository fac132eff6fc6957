"""A real ``netopt serve`` of a tree of many small files, synced by a real ``netopt sync``
under a low open-file limit (RLIMIT_NOFILE), compared byte for byte."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOKEN = "many-files-token-0123456789abcdef"
FILES = int(os.environ.get("NETOPT_TEST_MANY_FILES", "20000"))
"""How many files; the default keeps the test near a minute on a 2-core machine (20,000:
the sync takes ~49 s there; 100,000 take ~310 s, see scripts/bench_many_files.py)."""
OPEN_FILES_LIMIT = 256


def make_tree(root: Path, files: int, seed: int = 5) -> int:
    """``files`` files of 200 B to 4 KB under two levels of directories; the total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        path = root / f"d{i % 50:02d}" / f"e{(i // 50) % 40:02d}" / f"f{i:06d}.bin"
        if i % 2000 == 0 or not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(200, 4000))
        path.write_bytes(data)
        total += len(data)
    return total


def _low_open_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES_LIMIT, OPEN_FILES_LIMIT))


def _same_tree(a: Path, b: Path) -> None:
    left = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    right = sorted(
        p.relative_to(b) for p in b.rglob("*") if p.is_file() and ".netopt" not in p.as_posix()
    )
    assert left == right
    for rel in left:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_sync_of_many_files_under_a_low_open_file_limit(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    total = make_tree(src, FILES)
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    trace_path = tmp_path / "sync-trace.json"
    serve = subprocess.Popen(
        [sys.executable, "-m", "netopt", "serve", str(src), "--name", "ds",
         "--bind", "127.0.0.1:0", "--chunk-size", "65536", "--threads", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()  # printed once the tree is chunked and listening
        match = re.search(r"netopt://127\.0\.0\.1:(\d+)/ds", line)
        assert match, f"serve said {line!r}"
        started_s = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{match[1]}/ds",
             str(dest), "--cache-dir", str(cache), "--json"],
            cwd=REPO, env={**env, "NETOPT_TRACE": str(trace_path)}, capture_output=True,
            text=True, timeout=240, preexec_fn=_low_open_file_limit,
        )  # fmt: skip
        sync_s = time.monotonic() - started_s
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        if serve.stdout is not None:
            serve.stdout.close()
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    report = json.loads(done.stdout)
    assert report["files"] == report["files_written"] == FILES
    assert report["logical_bytes"] == total
    _same_tree(src, dest)
    # Most small frames were read in the groups that arrived together (one task and one
    # pool hand-off a group), not one by one.
    counts = json.loads(trace_path.read_text())["counts"]
    assert counts.get("frames_read_buffered", 0) > FILES // 2, counts
    print(f"{FILES} files, {total} bytes: sync took {sync_s:.1f} s")

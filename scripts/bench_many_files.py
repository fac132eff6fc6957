#!/usr/bin/env python3
"""Time a real ``netopt sync`` from a real ``netopt serve`` on loopback, for trees of many files.

    .venv/bin/python scripts/bench_many_files.py --json-out /tmp/many.json
    .venv/bin/python scripts/bench_many_files.py --repo /tmp/other-checkout   # "before"

Cases (built once under --work-dir, reused by later runs):

- ``small``: ``--small-files`` files of 1-4 KB cut from real text (the venv's ``.py``
  files), 50 per directory;
- ``packages``: about 5,000 installed-package files (about 100 MB) copied from the
  venv's site-packages, torch (and the nvidia / triton wheels) left out;
- ``big``: one 100 MB file (pseudo-random bytes, incompressible);
- ``joined``: one file holding the ``small`` tree's files concatenated (the same bytes as
  one big file: the yardstick of "a tree moves as fast as one big file").

Each run starts ``netopt serve`` (``--no-auth``, 64 KiB chunks) of the case, then times
``netopt sync URL DEST --cache-dir CACHE --json`` into an empty DEST and an empty cache,
under ``ulimit -n 256``; the sync's own ``seconds`` and the wall time of the process
are reported, with files/s. ``--repo`` runs another checkout's netopt (its source first
on PYTHONPATH) with the same data. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
SITE_PACKAGES = SITE / "site-packages"
SKIP_PACKAGES = ("torch", "nvidia", "triton", "functorch", "torchgen")
OPEN_FILES_LIMIT = 256
_SERVING = re.compile(r"netopt://127\.0\.0\.1:(\d+)/ds")


def _text_corpus(limit_bytes: int) -> bytes:
    """Real text: the venv's .py files concatenated, up to ``limit_bytes``."""
    parts: list[bytes] = []
    total = 0
    for path in sorted(SITE_PACKAGES.rglob("*.py")):
        if any(part.startswith(SKIP_PACKAGES) for part in path.relative_to(SITE_PACKAGES).parts):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        parts.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return b"".join(parts)


def build_small(root: Path, files: int) -> None:
    text = _text_corpus(8 * 1024 * 1024)
    rng = random.Random(14)
    for i in range(files):
        path = root / f"d{i // 2500:03d}" / f"e{(i // 50) % 50:02d}" / f"f{i:06d}.py"
        if i % 50 == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        size = rng.randint(1024, 4096)
        start = rng.randrange(0, len(text) - size)
        path.write_bytes(text[start : start + size])


def build_packages(root: Path, files: int, limit_bytes: int) -> None:
    copied = total = 0
    for path in sorted(SITE_PACKAGES.rglob("*")):
        rel = path.relative_to(SITE_PACKAGES)
        if rel.parts[0].startswith(SKIP_PACKAGES) or "__pycache__" in rel.parts:
            continue
        if not path.is_file() or path.is_symlink():
            continue
        size = path.stat().st_size
        if size > 8 * 1024 * 1024 or total + size > limit_bytes:
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, root / rel)
        copied += 1
        total += size
        if copied >= files:
            break


def build_big(root: Path, size_bytes: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(15)
    with (root / "big.bin").open("wb") as f:
        for _ in range(size_bytes // (1 << 20)):
            f.write(rng.randbytes(1 << 20))


def build_joined(root: Path, small: Path) -> None:
    with (root / "joined.bin").open("wb") as out:
        for path in sorted(p for p in small.rglob("*") if p.is_file()):
            out.write(path.read_bytes())


def build(case: str, work: Path, args: argparse.Namespace) -> Path:
    sized = case in ("small", "joined")
    src = work / f"src-{case}-{args.small_files}" if sized else work / f"src-{case}"
    marker = work / f"{src.name}.complete"
    if marker.exists():
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    if case == "small":
        build_small(src, args.small_files)
    elif case == "joined":
        build_joined(src, build("small", work, args))
    elif case == "packages":
        build_packages(src, 5000, 100 * 1024 * 1024)
    else:
        build_big(src, 100 * 1024 * 1024)
    marker.write_text("")
    return src


def _tree_stats(root: Path) -> tuple[int, int]:
    files = total = 0
    for path in root.rglob("*"):
        if path.is_file():
            files += 1
            total += path.stat().st_size
    return files, total


def _low_open_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES_LIMIT, OPEN_FILES_LIMIT))


def run_case(case: str, src: Path, work: Path, repo: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    dest, cache = work / "dest", work / "cache"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    serve = subprocess.Popen(
        [sys.executable, "-m", "netopt", "serve", str(src), "--name", "ds", "--no-auth",
         "--bind", "127.0.0.1:0", "--chunk-size", "65536", "--cc", "default"],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        match = _SERVING.search(line)
        if not match:
            raise SystemExit(f"netopt serve said {line!r}")
        started_s = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{match[1]}/ds",
             str(dest), "--cache-dir", str(cache), "--json", "--cc", "default"],
            cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s,
            preexec_fn=_low_open_file_limit,
        )  # fmt: skip
        wall_s = time.monotonic() - started_s
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        if serve.stdout is not None:
            serve.stdout.close()
    if done.returncode != 0:
        raise SystemExit(f"netopt sync failed: {(done.stdout + done.stderr)[-2000:]}")
    report = json.loads(done.stdout)
    files, total = _tree_stats(src)
    if report["files_written"] != files or report["logical_bytes"] != total:
        raise SystemExit(f"{case}: the sync wrote {report['files_written']} of {files} files")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return {
        "case": case,
        "repo": str(repo),
        "files": files,
        "bytes": total,
        "sync_s": report["seconds"],
        "wall_s": round(wall_s, 3),
        "files_per_s": round(files / wall_s, 1),
        "mbytes_per_s": round(total / wall_s / 1e6, 2),
        "chunks_fetched": report["chunks_fetched"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="small,packages,big", help="small,packages,big,joined")
    parser.add_argument("--small-files", type=int, default=100_000)
    parser.add_argument("--repo", type=Path, default=REPO, help="the netopt checkout to run")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/netopt-bench-many"))
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    rows = []
    for case in args.cases.split(","):
        src = build(case, args.work_dir, args)
        rows.append(run_case(case, src, args.work_dir, args.repo.resolve(), args.timeout_s))
        row = rows[-1]
        print(
            f"{row['case']:9s} {row['files']:7d} files {row['bytes'] / 1e6:7.1f} MB  "
            f"{row['wall_s']:7.1f} s  {row['files_per_s']:8.1f} files/s  "
            f"{row['mbytes_per_s']:6.1f} MB/s  (sync {row['sync_s']:.1f} s)",
            flush=True,
        )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

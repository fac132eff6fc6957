"""A web-directory sync's timeline (``NETOPT_TRACE``) marks the steps of its open, which
the benchmark's ``--trace`` prints for ``netopt-web``: the crawl, the first file listed,
the first part's answer, the parts in and joined, the downloads in and chunked.

The origin is a real aiohttp static server on loopback (a listing, ranges, ETag), the
sync a real ``netopt sync`` process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from netopt.cache.spool import PARTS_MIN_BYTES
from tests.service.cache_helpers import static_origin, tree

REPO = Path(__file__).resolve().parents[2]

ORDER = (
    "web_crawled",
    "web_first_listed",
    "spool_first_part_answer",
    "spool_parts_in",
    "spool_joined",
    "download_last_file_in",
    "download_last_file_chunked",
    "sync_done",
)
"""The marks a sync of a large file from a web origin makes, in the order they come."""


async def test_a_web_sync_marks_its_open_in_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    large_bytes = 2 * PARTS_MIN_BYTES + 12_345
    (src / "large.bin").write_bytes(os.urandom(large_bytes))
    (src / "small.txt").write_bytes(b"a small file\n" * 50)
    trace_path = tmp_path / "trace.json"
    env = {**os.environ, "NETOPT_TRACE": str(trace_path)}
    env.pop("NETOPT_TOKEN", None)
    async with static_origin(src) as url:
        sync = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "sync", url, str(tmp_path / "dest"),
            "--cache-dir", str(tmp_path / "cache"), "--json",
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(sync.communicate(), timeout=120)
    assert sync.returncode == 0, (out + err).decode()[-2000:]
    assert tree(tmp_path / "dest") == tree(src)
    timeline = json.loads(trace_path.read_text())
    marks, counts = timeline["marks"], timeline["counts"]
    missing = [name for name in ORDER if name not in marks]
    assert not missing, (missing, sorted(marks))
    times = [marks[name] for name in ORDER]
    assert times == sorted(times), dict(zip(ORDER, times, strict=True))
    # The large file came in parts (one a connection), the small one whole.
    assert counts["spool_parts"] >= 2, counts
    assert marks["download_first_file_in"] <= marks["download_last_file_in"]

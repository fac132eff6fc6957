"""``netopt sync netopt://...`` starts its first requests (`netopt.dataplane.prefetch`)
before it imports the heavy parts: asyncio, aiohttp, the YAML config loader, rich and
the sync engine. They cost about 0.1 s of a 2-core machine's CPU (measured with ``-X
importtime``); imported first, they delayed every sync's first round trip by that much
(on a 140 ms link, 1 MB takes about 1 s in all)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A clean interpreter runs the real command line with `prefetch.start` wrapped: the
# modules loaded when it is called are written out, then it goes on as usual.
_PROBE = """
import json, sys
from netopt.dataplane import prefetch
real = prefetch.start
def start(*args, **kwargs):
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(sys.modules), f)
    return real(*args, **kwargs)
prefetch.start = start
from netopt.cli.main import main
sys.exit(main(sys.argv[2:]))
"""

HEAVY = ("asyncio", "aiohttp", "yaml", "rich", "netopt.config", "netopt.cache", "zstandard")


def test_a_netopt_sync_starts_its_requests_before_the_heavy_imports(tmp_path: Path) -> None:
    loaded_at_start = tmp_path / "modules.json"
    # Nothing listens on port 1: the sync fails at once (no retry window).
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(loaded_at_start), "sync",
         "netopt://127.0.0.1:1/ds", str(tmp_path / "dest"), "--cache-dir",
         str(tmp_path / "cache"), "--json", "--retry-window-s", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "NETOPT_TOKEN": "a-token-of-16-chars-or-more"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert json.loads(proc.stdout)["error"]  # the normal path reported the failure
    modules = json.loads(loaded_at_start.read_text())
    assert "netopt.cli.sync_cmd" in modules  # it was the command line that called it
    early = [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert early == [], f"imported before the first requests: {early}"

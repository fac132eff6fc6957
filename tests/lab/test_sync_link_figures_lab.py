"""The link figures a sync plans with, on the lab's border link (80 ms RTT).

`netopt serve` on us-1, a sync on hk-1; ``--json``'s ``link_figures.rtt_ms`` must be
within 25% of the configured round trip, with the start-up prefetch (the CLI on a
plain netopt:// URL, whose data sockets are connected by the prefetch and taken over:
such a socket's "connect" takes microseconds and is no round trip) and without it
(the in-process API, `run_sync`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netopt.lab import Lab
from netopt.tlsca import ServerFiles, issue_server_files

PORT = 7496
CONFIGURED_RTT_MS = 80.0
"""configs/lab/two-region.yaml: 40 ms one way across the border."""
TOLERANCE = 0.25
TOKEN = "lab-figures-token-0123456789"
IN_PROCESS = """
import asyncio, json, os, sys
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.httpsource import ClientOptions
from netopt.tlsconf import ClientTls, use_client_tls
url, dest, cache, ca = sys.argv[1:5]
use_client_tls(ClientTls(ca_file=ca))
options = SourceOptions(client=ClientOptions(token=os.environ["NETOPT_TOKEN"]))
request = SyncRequest(source=url, dest=dest, cache_dir=cache, source_options=options)
report = asyncio.run(run_sync(request))
print(json.dumps(report.to_dict()))
"""


def _netopt(*args: str) -> list[str]:
    return [sys.executable, "-m", "netopt", *args]


@pytest.fixture(scope="module")
def served(
    two_region_lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ServerFiles]]:
    """The dataset's URL and the server's TLS files: TLS and a token, as users run it (the
    handshake's extra round trip must not be taken for the link's)."""
    root = tmp_path_factory.mktemp("figures")
    src = root / "src"
    src.mkdir()
    address = two_region_lab.address("us-1")
    pki = issue_server_files(root / "tls", "us-1", ips=[address])
    (src / "a.jsonl").write_bytes(b"".join(b'{"id": %d, "v": "abc"}\n' % i for i in range(60000)))
    (src / "b.bin").write_bytes(os.urandom(1_000_000))
    server = two_region_lab.popen("us-1", _netopt(
        "serve", str(src), "--name", "ds", "--bind", f"{address}:{PORT}", *pki.server_args(),
    ), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())  # fmt: skip
    try:
        assert server.stdout is not None
        assert "serving" in server.stdout.readline()
        yield f"netopt://{address}:{PORT}/ds", pki
    finally:
        server.kill()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


def _env() -> dict[str, str]:
    return {**os.environ, "NETOPT_TOKEN": TOKEN}


def _run(lab: Lab, argv: list[str]) -> dict[str, Any]:
    proc = lab.popen(
        "hk-1", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    summary: dict[str, Any] = json.loads(out)
    return summary


def _check_rtt(summary: dict[str, Any]) -> float:
    rtt = summary["link_figures"]["rtt_ms"]
    assert abs(rtt["value"] - CONFIGURED_RTT_MS) <= TOLERANCE * CONFIGURED_RTT_MS, rtt
    assert rtt["source"], rtt
    assert summary["transfer_plan"]["reasons"][0].startswith("link figures: rtt")
    return float(rtt["value"])


@pytest.mark.lab
@pytest.mark.parametrize("run", range(3))
def test_the_cli_plans_with_the_links_rtt(
    two_region_lab: Lab, served: tuple[str, ServerFiles], tmp_path: Path, run: int
) -> None:
    """With the prefetch (three runs: which socket connects first depends on timing)."""
    url, pki = served
    summary = _run(two_region_lab, _netopt(
        "sync", url, str(tmp_path / "dst"), "--json", "--cache-dir", str(tmp_path / "c"),
        *pki.client_args(),
    ))  # fmt: skip
    _check_rtt(summary)
    rate = summary["link_figures"]["rate_bps"]
    assert "default guess" in rate["source"]  # no coordinator, no flags: said so


@pytest.mark.lab
def test_the_in_process_api_plans_with_the_links_rtt(
    two_region_lab: Lab, served: tuple[str, ServerFiles], tmp_path: Path
) -> None:
    """Without the prefetch: handshakes and first bytes of its own connections."""
    url, pki = served
    summary = _run(two_region_lab, [
        sys.executable, "-c", IN_PROCESS, url, str(tmp_path / "dst"), str(tmp_path / "c"),
        str(pki.ca_cert),
    ])  # fmt: skip
    _check_rtt(summary)

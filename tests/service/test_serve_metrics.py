"""A real ``netopt serve`` exports Prometheus metrics at /metrics: its requests, the chunks
and bytes a real ``netopt sync`` took from it, and the served version; the names pass
``promtool check metrics``; the endpoint needs no token while the data still does."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.service.serve_process import REPO

TOKEN = "serve-metrics-token-0123456789abcdef"


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    assert url.startswith("http://127.0.0.1:")
    request = urllib.request.Request(url)  # noqa: S310 - loopback http only (asserted)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _value(text: str, sample: str) -> float:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert found, f"{sample} not in\n{text}"
    return float(found.group(1))


def test_serve_metrics_count_a_real_sync(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.bin": os.urandom(300_000), "sub/b.txt": b"line of text\n" * 20_000}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    env = {**os.environ, "NETOPT_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "netopt", "serve", str(src), "--name", "ds",
         "--bind", "127.0.0.1:0", "--chunk-size", "65536", "--threads", "2",
         "--codec-cache", str(tmp_path / "codec.json")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        match = re.search(r"netopt://127\.0\.0\.1:(\d+)/ds", line)
        assert match, f"serve said {line!r}"
        base = f"http://127.0.0.1:{match[1]}"
        status, before = _get(base + "/metrics")
        assert status == 200
        assert _value(before, "netopt_serve_chunk_requests_total") == 0
        assert _value(before, 'netopt_serve_dataset_files{dataset="ds"}') == 2
        total = sum(len(d) for d in files.values())
        assert _value(before, 'netopt_serve_dataset_bytes{dataset="ds"}') == total
        chunks = _value(before, 'netopt_serve_dataset_chunks{dataset="ds"}')
        assert chunks >= 2
        assert _get(base + "/v1/datasets/ds")[0] == 401  # the data still needs the token
        done = subprocess.run(
            [sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{match[1]}/ds",
             str(tmp_path / "dest"), "--cache-dir", str(tmp_path / "cache"), "--json"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
        fetched = json.loads(done.stdout)["chunks_fetched"]
        status, after = _get(base + "/metrics")
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        if serve.stdout is not None:
            serve.stdout.close()
    for rel, data in files.items():
        assert (tmp_path / "dest" / rel).read_bytes() == data
    assert fetched == chunks
    assert _value(after, "netopt_serve_chunk_requests_total") >= fetched
    sent = _value(after, "netopt_serve_sent_payload_bytes_total")
    assert 0 < sent <= total + 4096 * chunks
    assert TOKEN not in after
    assert re.search(r'netopt_serve_requests_total\{method="GET",route="/v1/datasets/\{name\}",'
                     r'status="401"\} 1\.0', after), after  # fmt: skip
    assert (
        _value(after, 'netopt_serve_requests_total{method="GET",route="/metrics",status="200"}')
        >= 1
    )
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/setup.sh --dev)")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=after, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr

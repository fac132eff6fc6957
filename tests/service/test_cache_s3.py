"""An S3-compatible bucket prefix as a sync SOURCE, against moto's standalone server on loopback."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from netopt.cache.s3 import S3Options, S3Url, object_rel_path, parse_s3_url
from netopt.cache.sources import SourceOptions
from netopt.cache.spool import MAX_PARTS, PART_BYTES, PARTS_MIN_BYTES, split_spans
from netopt.cache.syncer import run_sync
from netopt.cli.main import main
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import PathTraversalError, ValidationError
from tests.service.cache_helpers import CHUNK_BYTES, fake_aws_env, request, tree

pytest.importorskip("aiobotocore", reason="the s3 extra (aiobotocore) is not installed")
pytest.importorskip("moto", reason="moto[server] (dev extra) is not installed")

SMALL_FILES = 20
SMALL_BYTES = 40_000
BIG_BYTES = 1_500_000
_START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server as a subprocess on 127.0.0.1; stopped (by pid) at the end."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline_s = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline_s:
                    pytest.fail("moto server did not start")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_aws_env(monkeypatch, tmp_path)


async def _put(endpoint: str, bucket: str, objects: dict[str, bytes], create: bool) -> None:
    from aiobotocore.session import AioSession

    async with AioSession().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        if create:
            await client.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            await client.put_object(Bucket=bucket, Key=key, Body=body)


def _dataset(seed: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    objects = {"big.bin": rng.randbytes(BIG_BYTES)}
    for i in range(SMALL_FILES):
        objects[f"shards/s{i:03d}.bin"] = rng.randbytes(SMALL_BYTES)
    return objects


def _options(endpoint: str) -> SourceOptions:
    s3 = S3Options(endpoint_url=endpoint, region="us-east-1", max_attempts=1)
    return SourceOptions(avg_chunk_bytes=CHUNK_BYTES, s3=s3)


def test_parse_and_key_rules() -> None:
    assert parse_s3_url("s3://bkt/a/b") == S3Url("bkt", "a/b/")
    assert parse_s3_url("s3://bkt") == S3Url("bkt", "")
    with pytest.raises(ValidationError):
        parse_s3_url("s3://x/")
    url = S3Url("bkt", "ds/")
    assert object_rel_path(url, "ds/shards/a.bin") == "shards/a.bin"
    for bad in ("ds/../../etc/passwd", "ds//abs", "ds/a\x00b", "ds/.netopt-sync/x"):
        with pytest.raises(PathTraversalError, match="s3://bkt/ds/"):
            object_rel_path(url, bad)


async def test_s3_source_then_delta_resync(tmp_path: Path, moto_endpoint: str) -> None:
    objects = _dataset()
    total_bytes = sum(len(b) for b in objects.values())
    await _put(moto_endpoint, "data", {f"ds/{k}": v for k, v in objects.items()}, create=True)
    await _put(moto_endpoint, "data", {"other/x.bin": b"not under the prefix"}, create=False)
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    req = request("s3://data/ds", dest, cache, source_options=_options(moto_endpoint))

    first = await run_sync(req)
    assert first.source_kind == "s3"
    assert first.dataset == "ds"
    assert tree(dest) == objects
    assert first.wire_bytes == total_bytes  # every object once, nothing outside the prefix

    changed = random.Random("edit").randbytes(SMALL_BYTES)
    await _put(moto_endpoint, "data", {"ds/shards/s007.bin": changed}, create=False)
    second = await run_sync(req)
    assert tree(dest) == objects | {"shards/s007.bin": changed}
    assert second.plan.files_to_write == 1
    assert second.wire_bytes == SMALL_BYTES  # only the changed object moved

    third = await run_sync(replace(req, dry_run=True))
    assert third.plan.files_to_write == 0
    assert third.wire_bytes == 0


async def test_traversal_key_is_refused(tmp_path: Path, moto_endpoint: str) -> None:
    await _put(moto_endpoint, "evil", {"ds/ok.bin": b"x", "ds/../escape": b"y"}, create=True)
    req = request("s3://evil/ds", tmp_path / "dest", tmp_path / "cache")
    req = replace(req, source_options=_options(moto_endpoint))
    with pytest.raises(PathTraversalError, match=r"s3://evil/ds/.*ds/\.\./escape"):
        await run_sync(req)
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "dest").exists()


def _cli(endpoint: str, source: str, tmp_path: Path) -> list[str]:
    dest, cache = str(tmp_path / "dest"), str(tmp_path / "cache")
    s3 = ["--s3-endpoint-url", endpoint, "--s3-region", "us-east-1"]
    return ["sync", source, dest, "--cache-dir", cache, *s3]


def test_cli_wrong_bucket_exit_2(
    tmp_path: Path, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_cli(moto_endpoint, "s3://no-such-bucket/ds", tmp_path)) == 2
    err = capsys.readouterr().err
    assert "no-such-bucket" in err
    assert "does not exist" in err
    assert "testing-secret" not in err


def test_cli_dead_endpoint_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    # Tried again for the retry window (an endpoint restarting), then a clear error.
    assert main([*_cli(dead, "s3://data/ds", tmp_path), "--retry-window-s", "1"]) == 1
    err = capsys.readouterr().err
    assert "unreachable" in err
    assert "retry window 1 s" in err
    assert "s3://data/ds/" in err
    assert "testing-secret" not in err


async def test_known_objects_are_read_by_ranges(tmp_path: Path, moto_endpoint: str) -> None:
    """A fresh cache with remembered chunking: chunks come from ranged GETs, not re-downloads."""
    objects = {"a.bin": random.Random(3).randbytes(300_000), "b/c.bin": b"small"}
    await _put(moto_endpoint, "ranges", {f"p/{k}": v for k, v in objects.items()}, create=True)
    opts = replace(_options(moto_endpoint), state_dir=str(tmp_path / "state"))
    first = await run_sync(
        request("s3://ranges/p", tmp_path / "d1", tmp_path / "c1", source_options=opts)
    )
    second = await run_sync(
        request("s3://ranges/p", tmp_path / "d2", tmp_path / "c2", source_options=opts)
    )
    assert tree(tmp_path / "d2") == objects
    assert first.wire_bytes == second.wire_bytes == sum(len(b) for b in objects.values())
    assert second.summary is not None
    assert second.summary.chunks_fetched >= 4  # 300 kB in ~64 kB chunks, each a ranged GET


async def test_a_download_cut_mid_object_resumes_with_a_ranged_get(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """The connection carrying ``big.bin`` is cut part way (a proxy in front of the
    server): the open's next try asks for the rest of it by range, not for all of it."""
    from tests.service.dataplane_helpers import Proxy

    objects = {"big.bin": _dataset(seed=3)["big.bin"]}
    await _put(moto_endpoint, "cut", {f"ds/{k}": v for k, v in objects.items()}, create=True)
    port = int(moto_endpoint.rsplit(":", 1)[1])
    # One connection a request (the server closes each): the listing, then big.bin.
    proxy = Proxy(port, kill_connection=2, kill_after_bytes=BIG_BYTES // 2)
    proxy_port = await proxy.start()
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    source_options = _options(f"http://127.0.0.1:{proxy_port}")
    window = SyncOptions(retry_window_s=10, backoff_initial_s=0.05, backoff_max_s=0.1)
    try:
        report = await run_sync(
            request("s3://cut/ds", dest, cache, source_options=source_options, sync_options=window)
        )
    finally:
        await proxy.close()
    assert proxy.killed == 1, proxy.connections
    assert tree(dest) == objects
    # The try that succeeded moved the rest of big.bin, not all of it.
    assert BIG_BYTES // 2 <= report.wire_bytes < BIG_BYTES
    assert not list((cache / "sources").glob("spool-s3-*"))


async def test_a_large_object_comes_in_ranged_parts(tmp_path: Path, moto_endpoint: str) -> None:
    """An object of at least `PARTS_MIN_BYTES` is asked for in ranged parts at once, one
    connection each (counted by a proxy in front of the server, which closes each)."""
    from tests.service.dataplane_helpers import Proxy

    objects = {"large.bin": random.Random(7).randbytes(PARTS_MIN_BYTES * 2)}
    await _put(moto_endpoint, "parts", {f"ds/{k}": v for k, v in objects.items()}, create=True)
    proxy = Proxy(int(moto_endpoint.rsplit(":", 1)[1]))
    proxy_port = await proxy.start()
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    source_options = _options(f"http://127.0.0.1:{proxy_port}")
    try:
        report = await run_sync(
            request("s3://parts/ds", dest, cache, source_options=source_options)
        )
    finally:
        await proxy.close()
    assert tree(dest) == objects
    assert report.wire_bytes == len(objects["large.bin"])  # each byte once
    # The listing, then a connection per part.
    size = len(objects["large.bin"])
    assert proxy.connections >= 1 + len(
        split_spans([(0, size)], min(MAX_PARTS, size // PART_BYTES))
    )

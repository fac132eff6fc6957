"""netopt sync through the cache: each source kind, delta byte counts, dry run, residency."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.cli.main import main
from netopt.errors import ResidencyError
from tests.service.cache_helpers import make_dataset, request, served_options, tree
from tests.service.dataplane_helpers import CPU, FAST, TOKEN, start


async def test_path_source_then_delta_resync_moves_under_3_percent(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    # 32 MB: a 1% edit is then several average chunks (64 KiB) long, as in real datasets.
    total = make_dataset(src, big_bytes=30_000_000)
    first = await run_sync(request(str(src), dest, cache))
    assert tree(dest) == tree(src)
    assert first.summary is not None
    assert first.wire_bytes == total
    # Change 1% of the bytes: 320 kB in the middle of the big file.
    big = bytearray((src / "big.bin").read_bytes())
    big[13_000_000:13_320_000] = random.Random(9).randbytes(320_000)
    (src / "big.bin").write_bytes(big)
    second = await run_sync(request(str(src), dest, cache))
    assert tree(dest) == tree(src)
    assert 320_000 <= second.wire_bytes <= 0.03 * total
    assert second.plan.bytes_reused >= len(big) - 0.03 * total
    # Change 1% again: eight whole files of the fifty small ones.
    for i in range(0, 50, 7)[:8]:
        (src / "shards" / f"s{i:03d}.bin").write_bytes(random.Random(i).randbytes(40_000))
    third = await run_sync(request(str(src), dest, cache))
    assert tree(dest) == tree(src)
    assert third.wire_bytes == 8 * 40_000 <= 0.03 * total
    assert third.plan.files_to_write == 8


async def test_netopt_and_manifest_url_sources_share_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    total = make_dataset(src)
    runner, port, stats, manifest = await start(src, "ds")
    try:
        opts = served_options(TOKEN, CPU)
        cache = tmp_path / "cache"
        url = f"netopt://127.0.0.1:{port}/ds"
        first = await run_sync(
            request(url, tmp_path / "a", cache, source_options=opts, sync_options=FAST)
        )
        assert first.source_kind == "netopt"
        assert tree(tmp_path / "a") == tree(src)
        assert first.summary is not None
        assert first.summary.fetched_logical_bytes == total
        served = sum(stats.chunk_requests.values())
        # Same dataset named by its manifest URL, into a second directory: all from the cache.
        murl = f"http://127.0.0.1:{port}/v1/datasets/ds/manifest"
        second = await run_sync(
            request(murl, tmp_path / "b", cache, source_options=opts, sync_options=FAST)
        )
        assert second.source_kind == "http-manifest"
        assert tree(tmp_path / "b") == tree(src)
        assert sum(stats.chunk_requests.values()) == served
        assert second.summary is not None
        assert second.summary.fetched_logical_bytes == 0
        assert second.plan.bytes_reused == sum(manifest.unique_chunks().values())
        assert second.wire_bytes < 0.01 * total  # the info and manifest requests only
    finally:
        await runner.cleanup()


def test_cli_dry_run_and_json_summary(tmp_path: Path, capsys) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    total = make_dataset(src)
    args = [str(src), str(dest), "--cache-dir", str(cache), "--chunk-size", "65536", "--json"]
    assert main(["sync", *args, "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"]
    assert plan["plan"]["bytes_to_fetch"] == total
    assert not dest.exists()
    assert main(["sync", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 51
    assert out["wire_bytes"] == total
    assert out["reused_bytes"] == 0
    assert {"seconds", "throughput_mbps", "fetched_logical_bytes"} <= set(out)
    assert main(["sync", *args, "--dry-run"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["plan"]["files_to_write"] == 0
    assert again["plan"]["bytes_to_fetch"] == 0


def test_cli_residency_refusal(tmp_path: Path, capsys) -> None:
    src = tmp_path / "scans"
    make_dataset(src)
    catalogue = tmp_path / "datasets.yaml"
    catalogue.write_text(
        f"kind: datasets\ndatasets:\n  - name: scans\n    origin: {src}\n    residency: [hk]\n"
    )
    args = ["sync", str(src), str(tmp_path / "d"), "--cache-dir", str(tmp_path / "c")]
    args += ["--datasets", str(catalogue), "--json"]
    assert main([*args, "--region", "us"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "ResidencyError"
    assert "residency: [hk]" in out["message"]
    assert "'us'" in out["message"]
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "c").exists()
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"kind: agent\nnode: hk-1\nregion: hk\ncache:\n  dir: {tmp_path / 'c'}\n")
    assert main([*args[:-3], "--datasets", str(catalogue), "--config", str(agent)]) == 0
    assert tree(tmp_path / "d") == tree(src)


async def test_residency_refused_before_contacting_source(tmp_path: Path) -> None:
    from netopt.config.datasets import DatasetSpec, DatasetsSettings

    catalogue = DatasetsSettings((DatasetSpec("ds", "netopt://127.0.0.1:1/ds", ("hk",)),))
    req = request("netopt://127.0.0.1:1/ds", tmp_path / "d", tmp_path / "c", catalogue=catalogue)
    with pytest.raises(ResidencyError):
        await run_sync(req)


def test_cache_cli_ls_pin_evict_gc(tmp_path: Path, capsys) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    total = make_dataset(src)
    assert (
        main(
            [
                "sync",
                str(src),
                str(tmp_path / "d"),
                "--cache-dir",
                str(cache),
                "--json",
                "--chunk-size",
                "65536",
            ]
        )
        == 0
    )
    capsys.readouterr()
    base = ["--cache-dir", str(cache), "--json"]
    assert main(["cache", "ls", *base]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["used_bytes"] == total
    assert listing["datasets"][0]["name"] == "src"
    assert main(["cache", "pin", "src", *base]) == 0
    assert main(["cache", "evict", "--to", "0", *base]) == 0
    capsys.readouterr()
    with Cache.open(cache) as c:
        assert c.used_bytes == total
        assert c.pins == {"src"}
    assert main(["cache", "unpin", "src", *base]) == 0
    capsys.readouterr()
    assert main(["cache", "evict", "--to", "4000000", *base]) == 0
    evicted = json.loads(capsys.readouterr().out)
    assert evicted["used_bytes"] <= 4_000_000
    assert evicted["evicted_chunks"] > 0
    # An old version's chunks go at gc.
    (src / "big.bin").write_bytes(b"x" * 1000)
    assert (
        main(
            [
                "sync",
                str(src),
                str(tmp_path / "d"),
                "--cache-dir",
                str(cache),
                "--json",
                "--chunk-size",
                "65536",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["cache", "gc", *base]) == 0
    gc = json.loads(capsys.readouterr().out)
    with Cache.open(cache) as c:
        assert set(c.sizes_bytes) <= set(c.referenced())
        assert c.versions("src") == [c.datasets["src"]]
    assert gc["removed_chunks"] >= 0
    assert main(["cache", "pin", "nope", *base]) == 2

"""The cache's sync totals: summed per dataset, bounded, and read as untrusted input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netopt.cache import synctotals
from netopt.cache.synctotals import MAX_DATASETS, TOTALS_FILE, SyncTotals, read_totals, record_sync


def test_runs_add_up_per_dataset(tmp_path: Path) -> None:
    assert record_sync(tmp_path, "ds", SyncTotals(runs_ok=1, written_bytes=10, seconds=1.5), 100.0)
    assert record_sync(tmp_path, "ds", SyncTotals(runs_failed=1, seconds=0.5), 200.0)
    assert record_sync(tmp_path, "other", SyncTotals(runs_ok=1, peer_wire_bytes=7), 150.0)
    totals = read_totals(tmp_path)
    assert totals["ds"] == SyncTotals(
        runs_ok=1, runs_failed=1, written_bytes=10, seconds=2.0, last_success_s=100.0,
        last_run_s=200.0,
    )  # fmt: skip
    assert totals["other"].peer_wire_bytes == 7


def test_the_least_recently_synced_datasets_go_first(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "datasets": {f"ds{i}": {"runs_ok": 1, "last_run_s": i} for i in range(MAX_DATASETS + 5)},
    }
    (tmp_path / TOTALS_FILE).write_text(json.dumps(doc))
    assert len(read_totals(tmp_path)) == MAX_DATASETS  # a hand-made long file: bounded on read
    record_sync(tmp_path, "new", SyncTotals(runs_ok=1), now_s=1e9)
    totals = read_totals(tmp_path)
    assert len(totals) == MAX_DATASETS
    assert "new" in totals
    assert "ds0" not in totals
    assert f"ds{MAX_DATASETS + 4}" in totals
    stored = json.loads((tmp_path / TOTALS_FILE).read_text())["datasets"]
    assert len(stored) == MAX_DATASETS  # and bounded on write


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"[1, 2]",
        b'{"version": 99, "datasets": {}}',
        b'{"version": 1, "datasets": []}',
        b"[" * 100_000,
    ],
)
def test_a_torn_or_foreign_file_gives_no_totals(tmp_path: Path, content: bytes) -> None:
    (tmp_path / TOTALS_FILE).write_bytes(content)
    assert read_totals(tmp_path) == {}


def test_entries_that_do_not_check_out_are_left_out(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "datasets": {
            "good": {"runs_ok": 3},
            "../escape": {"runs_ok": 1},
            "negative": {"runs_ok": -1},
            "text": {"runs_ok": "3"},
            "flag": {"runs_ok": True},
            "unknown": {"runs_ok": 1, "surprise": 2},
            "nan": {"seconds": float("nan")},
        },
    }
    (tmp_path / TOTALS_FILE).write_text(json.dumps(doc))
    assert list(read_totals(tmp_path)) == ["good"]
    assert record_sync(tmp_path, "good", SyncTotals(runs_ok=1))
    assert read_totals(tmp_path)["good"].runs_ok == 4  # the bad entries are dropped, not kept


def test_an_oversized_file_is_not_read(tmp_path: Path) -> None:
    (tmp_path / TOTALS_FILE).write_bytes(b" " * (synctotals.MAX_FILE_BYTES + 1))
    assert read_totals(tmp_path) == {}


def test_a_read_only_cache_never_fails_the_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(synctotals, "_warned", False)  # warned once per process
    if os.geteuid() == 0:
        # Root ignores modes: a lock that cannot be opened fails alike.
        (tmp_path / f"{TOTALS_FILE}.lock").mkdir()
        assert not record_sync(tmp_path, "ds", SyncTotals(runs_ok=1))
    else:
        tmp_path.chmod(0o500)
        try:
            assert not record_sync(tmp_path, "ds", SyncTotals(runs_ok=1))
        finally:
            tmp_path.chmod(0o700)
    assert not record_sync(tmp_path, "../bad name", SyncTotals(runs_ok=1))
    assert "sync totals not recorded" in caplog.text


def test_no_cache_directory_is_no_totals_and_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(synctotals, "_warned", False)
    missing = tmp_path / "never-made"
    assert not record_sync(missing, "ds", SyncTotals(runs_failed=1))
    assert not missing.exists()
    assert "sync totals not recorded" not in caplog.text

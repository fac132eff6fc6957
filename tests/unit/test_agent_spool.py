"""The agent's on-disk spool: order, bounds, crash leftovers."""

from __future__ import annotations

from pathlib import Path

from netopt.agent.spool import Spool


def test_batches_replay_in_order_and_leave_on_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    for i in range(5):
        spool.put({"batch_id": f"b{i}", "summaries": [i]})
    pending = spool.pending()
    assert [b.body["batch_id"] for b in pending] == ["b0", "b1", "b2", "b3", "b4"]
    spool.ack(pending[0])
    spool.ack(pending[1])
    assert [b.body["batch_id"] for b in spool.pending()] == ["b2", "b3", "b4"]


def test_survives_a_restart(tmp_path: Path) -> None:
    Spool(tmp_path, max_bytes=1 << 20).put({"batch_id": "x"})
    (tmp_path / ".batch-000000000002.json.abc.tmp").write_bytes(b"half")
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert [b.body["batch_id"] for b in again.pending()] == ["x"]
    assert not list(tmp_path.glob("*.tmp"))
    assert again.put({"batch_id": "y"}) == 2


def test_full_spool_drops_oldest_first_and_counts(tmp_path: Path) -> None:
    body = {"batch_id": "", "pad": "x" * 100}
    spool = Spool(tmp_path, max_bytes=600)
    for i in range(10):
        spool.put({**body, "batch_id": f"b{i}"})
    ids = [b.body["batch_id"] for b in spool.pending()]
    assert ids == [f"b{i}" for i in range(10 - len(ids), 10)]
    assert spool.size_bytes <= 600
    assert spool.dropped_batches == 10 - len(ids)
    assert spool.dropped_batches > 0


def test_unreadable_batch_is_dropped_not_fatal(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put({"batch_id": "ok"})
    (tmp_path / "batch-000000000002.json").write_bytes(b"{not json")
    assert [b.body["batch_id"] for b in spool.pending()] == ["ok"]
    assert spool.dropped_batches == 1

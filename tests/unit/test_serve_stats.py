"""ServeStats keeps bounded memory however many distinct chunks a long-running server serves."""

from netopt.dataplane.handlers import ServeStats


def test_per_chunk_counts_stop_at_the_bound_and_the_total_goes_on() -> None:
    stats = ServeStats(tracked_chunks_max=2)
    for chunk_id in ["a", "b", "c", "a", "d", "b"]:
        stats.count_chunk(chunk_id)
    assert stats.chunk_requests_total == 6
    assert dict(stats.chunk_requests) == {"a": 2, "b": 2}


def test_default_bound_tracks_many_chunks() -> None:
    stats = ServeStats()
    for i in range(1000):
        stats.count_chunk(f"{i:064x}")
    assert stats.chunk_requests_total == 1000
    assert len(stats.chunk_requests) == 1000

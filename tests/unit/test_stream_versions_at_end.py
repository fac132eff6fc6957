"""`httpsource.stream_versions_at_end`: when the versions the streams named at their
ends stand in for the end-of-sync version check (no info request, a round trip)."""

from __future__ import annotations

from netopt.dataplane.httpsource import stream_versions_at_end

V, W = "a" * 64, "b" * 64


def test_every_stream_naming_the_version_stands_in_for_the_check() -> None:
    assert stream_versions_at_end([V]) == V
    assert stream_versions_at_end([V, V, V]) == V


def test_a_stream_cut_before_a_later_end_is_covered_by_that_end() -> None:
    # A stream cut in the tail (its chunks taken over by others) names nothing; the
    # stream that closed after it named the version after every read.
    assert stream_versions_at_end([V, None, V]) == V
    assert stream_versions_at_end([None, None, V]) == V


def test_the_last_stream_cut_or_two_versions_or_nothing_needs_the_check() -> None:
    assert stream_versions_at_end([]) is None
    assert stream_versions_at_end([V, V, None]) is None  # nothing named after the cut
    assert stream_versions_at_end([V, W]) is None
    assert stream_versions_at_end([W, None, V]) is None  # the version changed meanwhile

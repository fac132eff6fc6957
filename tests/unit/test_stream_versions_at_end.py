"""`httpsource.stream_versions_at_end`: when the versions the streams named at their
ends stand in for the end-of-sync version check (no info request, a round trip)."""

from __future__ import annotations

from netopt.dataplane.httpsource import stream_versions_at_end

V, W = "a" * 64, "b" * 64


def test_every_stream_naming_the_version_stands_in_for_the_check() -> None:
    assert stream_versions_at_end([V]) == V
    assert stream_versions_at_end([V, V, V]) == V


def test_a_cut_stream_two_versions_or_nothing_needs_the_check() -> None:
    assert stream_versions_at_end([]) is None
    # A stream cut in the tail named nothing, and a later end frame does not cover it:
    # the server may have read its last chunks after that frame was made.
    assert stream_versions_at_end([V, None, V]) is None
    assert stream_versions_at_end([V, V, None]) is None
    assert stream_versions_at_end([V, W]) is None

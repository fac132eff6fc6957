"""`netopt.dataplane.manifestwire`: which Accept-Encoding values get zstd, and the codec."""

from __future__ import annotations

import pytest

from netopt.dataplane.limits import BodyTooLarge
from netopt.dataplane.manifestwire import accepts_zstd, compress_manifest, decode_manifest_body


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("", False),
        ("gzip, deflate", False),
        ("zstd", True),
        ("gzip, deflate, br, zstd", True),
        ("ZSTD", True),
        ("zstd;q=0.5", True),
        ("zstd; q=1", True),
        ("zstd;q=0", False),
        ("zstd;q=0.0", False),
        ("zstd;q=bogus", False),
        ("xzstd, zstdx", False),
        ("*", False),  # plain for a wildcard: only a client that names zstd decodes it
    ],
)
def test_accepts_zstd(header: str | None, expected: bool) -> None:
    assert accepts_zstd(header) is expected


def test_round_trip_and_the_bound_is_exact() -> None:
    text = b'{"files":[' + b'{"path":"a"},' * 1000 + b'{"path":"b"}]}'
    frame = compress_manifest(text)
    assert len(frame) < len(text) / 10
    assert decode_manifest_body(frame, "zstd", len(text), "here") == text
    assert decode_manifest_body(frame, " Zstd ", len(text), "here") == text
    assert decode_manifest_body(text, None, len(text), "here") is text
    assert decode_manifest_body(text, "identity", len(text), "here") is text
    with pytest.raises(BodyTooLarge, match="declares"):
        decode_manifest_body(frame, "zstd", len(text) - 1, "here")

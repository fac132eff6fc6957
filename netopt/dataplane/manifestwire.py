"""A manifest on the wire: canonical JSON, zstd-compressed once per version, decoded bounded.

The server answers ``GET /v1/datasets/NAME/manifest`` with the manifest's canonical
JSON (`Manifest.canonical_json`, the bytes its ``manifest_id`` names), compressed
with zstd at `MANIFEST_ZSTD_LEVEL` (``Content-Encoding: zstd``) when the request's
``Accept-Encoding`` names zstd, else plain (old clients, curl). The compressed form is
made once per version (`netopt.dataplane.manifestcache`), not per request.

The route serves one byte range of either body (``Range: bytes=A-B``, RFC 9110): 206
with ``Content-Range``, 416 past the end, the whole body for anything else it cannot
serve as one range (several ranges, another unit, a header that does not parse,
an ``If-Range`` naming another version). `byte_range` is that rule. The start-up
prefetch fetches a large manifest as pieces over several connections at once
(`netopt.dataplane.manifestpieces`): on a long link one connection's slow start,
not the link, held a 100k-file tree's 4.8 MB manifest back.

A client asks with `ACCEPT_ZSTD` and decodes with `decode_manifest_body`: a body in an
encoding it did not ask for, a frame that declares or decodes to more than the
manifest cap, a truncated frame, trailing bytes or garbage are a ProtocolError
(`BodyTooLarge` for the size cases), never an allocation of the peer's choosing.
Stdlib and zstandard only: `netopt.dataplane.prefetch` uses this from its threads.
"""

from __future__ import annotations

import zstandard

from netopt.dataplane.limits import BodyTooLarge
from netopt.dataplane.manifestpieces import is_decimal
from netopt.errors import ProtocolError

__all__ = [
    "ACCEPT_ZSTD",
    "MANIFEST_ZSTD_LEVEL",
    "RangeNotSatisfiable",
    "accepts_zstd",
    "byte_range",
    "compress_manifest",
    "decode_manifest_body",
]

MANIFEST_ZSTD_LEVEL = 1
"""zstd level of a served manifest. Measured on the manifests of trees of 1-4 KB files
(`scripts/bench_manifest.py`'s, 20k / 100k files: 3.5 / 17.6 MB of JSON): level 1
7 / 31 ms at 3.62x; 3: 17 / 76 ms at 3.31x; 7-15 are slower and no smaller (3.2-3.4x,
the chunk names are random hex); 19: 2.3 / 14 s at 4.0x, too long a wait for the first
request after a change. Paid once per version."""

ACCEPT_ZSTD = "zstd"
"""The ``Accept-Encoding`` a netopt client sends for a manifest."""

_MAX_WINDOW_BYTES = 1 << 24
"""The largest zstd window a client accepts (level 19 uses 8 MiB): a frame may not make
the decoder reserve more."""


def accepts_zstd(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header value names zstd with a non-zero q."""
    if not accept_encoding:
        return False
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() != "zstd":
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


class RangeNotSatisfiable(ValueError):
    """A ``Range`` that starts at or past the end of the body (answered 416)."""


def byte_range(header: str | None, total_bytes: int) -> tuple[int, int] | None:
    """The one range ``[start, end)`` of a body of ``total_bytes`` that a ``Range``
    header value asks for, clipped to the body; None for the whole body: no header, a
    unit other than ``bytes``, several ranges, or a value that does not parse (RFC 9110
    lets a server ignore those). RangeNotSatisfiable when the range starts at or past
    the end, or is a suffix of 0 bytes."""
    if header is None:
        return None
    unit, sep, spec = header.strip().partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not _digits(first, last):
        return None
    if total_bytes == 0 and (first or last):
        raise RangeNotSatisfiable(f"bytes={spec.strip()} of an empty body")
    if not first:  # a suffix: the last N bytes
        if not last:
            return None
        suffix = int(last)
        if suffix == 0:
            raise RangeNotSatisfiable(f"bytes=-0 of {total_bytes} bytes")
        return max(0, total_bytes - suffix), total_bytes
    start = int(first)
    if last and int(last) < start:
        return None  # not a valid range: ignored
    if start >= total_bytes:
        raise RangeNotSatisfiable(f"bytes={spec.strip()} of {total_bytes} bytes")
    end = total_bytes if not last else int(last) + 1
    return start, min(end, total_bytes)


def _digits(*parts: str) -> bool:
    """Each part empty or `is_decimal`."""
    return all(p == "" or is_decimal(p) for p in parts)


def compress_manifest(canonical_json: bytes) -> bytes:
    """One zstd frame of ``canonical_json``, its content size declared (blocking)."""
    return zstandard.ZstdCompressor(level=MANIFEST_ZSTD_LEVEL).compress(canonical_json)


def decode_manifest_body(
    body: bytes | bytearray, content_encoding: str | None, max_bytes: int, where: str
) -> bytes | bytearray:
    """The manifest JSON of a response ``body`` sent with ``content_encoding``, at most
    ``max_bytes`` of it (blocking for a compressed body: run it off the event loop).

    Plain (no encoding, or ``identity``): the body as it is. ``zstd``: exactly one
    frame, decoded into at most ``max_bytes``. Raises BodyTooLarge when the frame
    declares or decodes to more, ProtocolError for any other encoding or a frame that
    is not whole and well formed.
    """
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != ACCEPT_ZSTD:
        raise ProtocolError(
            f"{where}: the manifest came with Content-Encoding {encoding[:40]!r}, "
            f"which was not asked for (only {ACCEPT_ZSTD})"
        )
    try:
        declared = zstandard.frame_content_size(bytes(body[:18]))
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"{where}: the manifest is not a zstd frame: {exc}") from None
    if declared > max_bytes:
        raise BodyTooLarge(
            f"{where}: the manifest frame declares {declared} bytes, at most {max_bytes} expected"
        )
    dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW_BYTES)
    try:
        # A declared size (checked above) is what is allocated; without one, the output
        # stops at max_bytes and a longer frame fails as incomplete.
        return dctx.decompress(body, max_output_size=max_bytes, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        if declared < 0 and _decodes_past(dctx, body, max_bytes):
            raise BodyTooLarge(
                f"{where}: the manifest frame decodes to more than the {max_bytes} bytes expected"
            ) from None
        raise ProtocolError(f"{where}: the manifest's zstd frame is malformed: {exc}") from None


def _decodes_past(
    dctx: zstandard.ZstdDecompressor, body: bytes | bytearray, max_bytes: int
) -> bool:
    """Whether ``body``'s first frame holds more than ``max_bytes`` (reading one byte more
    at most): tells a frame too large from a broken one."""
    try:
        with dctx.stream_reader(body, read_across_frames=False) as reader:
            return len(reader.read(max_bytes + 1)) > max_bytes
    except zstandard.ZstdError:
        return False

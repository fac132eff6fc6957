"""One zstd context per stream: real compressor output, and frames a lying server could send."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import blake3
import pytest
import zstandard

from netopt.dataplane.chunkio import RawChunk, decode_chunk
from netopt.dataplane.streamctx import (
    BLOCK_MAX_BYTES,
    BUNDLE_HEAD,
    BUNDLE_MAX_BYTES,
    BUNDLE_MAX_CHUNKS,
    WINDOW_LOG,
    ContextDecoder,
    ContextEncoder,
    ContextError,
    fits_bundle,
)
from netopt.errors import IntegrityError
from netopt.transfer.sampling import _stream_bytes


def _real_files() -> list[bytes]:
    files = sorted(Path(__file__).resolve().parents[2].joinpath("netopt").rglob("*.py"))
    return [p.read_bytes() for p in files if p.stat().st_size > 0]


def _name(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def _block(kind: int, size: int, last: int = 0) -> bytes:
    return (last | kind << 1 | size << 3).to_bytes(3, "little")


def test_a_stream_of_real_files_round_trips_and_beats_chunk_by_chunk() -> None:
    chunks = [*_real_files(), os.urandom(300_000), b"x" * 2_000_000]
    encoder, decoder = ContextEncoder(), ContextDecoder()
    stream_bytes = 0
    for index, data in enumerate(chunks):
        payload, new = encoder.encode(data, 3)
        assert new == (index == 0)
        stream_bytes += len(payload)
        assert decoder.decode(payload, new, _name(data), len(data)) == data
    text = chunks[:-2]
    one_by_one = sum(len(zstandard.ZstdCompressor(level=3).compress(c)) for c in text)
    encoder, in_stream = ContextEncoder(), 0
    for data in text:
        in_stream += len(encoder.encode(data, 3)[0])
    assert in_stream < one_by_one * 0.9  # the files refer to each other's text


def test_a_level_change_starts_a_new_context_the_decoder_follows() -> None:
    chunks = _real_files()[:40]
    encoder, decoder = ContextEncoder(), ContextDecoder()
    for index, data in enumerate(chunks):
        level = 1 if index < 20 else 6
        payload, new = encoder.encode(data, level)
        assert new == (index in (0, 20))
        assert decoder.decode(payload, new, _name(data), len(data)) == data


def test_a_frame_before_its_context_or_out_of_order_is_refused() -> None:
    first, second = _real_files()[:2]
    encoder = ContextEncoder()
    p1, _ = encoder.encode(first, 3)
    p2, _ = encoder.encode(second, 3)
    with pytest.raises(ContextError, match="before its context"):
        ContextDecoder().decode(p2, False, _name(second), len(second))
    decoder = ContextDecoder()
    # The second frame decoded without the first's history (as a fresh context) fails.
    with pytest.raises(ContextError):
        decoder.decode(p1[: zstandard.frame_header_size(p1)] + p2, True, _name(second), len(second))


def test_a_wrong_chunk_is_a_bad_copy_and_spoils_the_context() -> None:
    data = _real_files()[0]
    payload, new = ContextEncoder().encode(data, 3)
    decoder = ContextDecoder()
    with pytest.raises(ContextError, match="does not decode") as caught:
        decoder.decode(payload, new, "0" * 64, len(data))
    assert isinstance(caught.value, IntegrityError)  # charged as a bad copy
    with pytest.raises(ContextError, match="before its context"):
        decoder.decode(payload[zstandard.frame_header_size(payload) :], False, _name(data), 10)


def _header() -> bytes:
    payload, _ = ContextEncoder().encode(b"seed", 1)
    return payload[: zstandard.frame_header_size(payload)]


@pytest.mark.parametrize(
    ("blocks", "match"),
    [
        # An RLE block is 4 bytes for up to 128 KiB out: 1 MiB of them is a 32 GiB bomb.
        (_block(1, BLOCK_MAX_BYTES) + b"A", None),
        (_block(0, 5, last=1) + b"hello", "must not end"),
        (_block(3, 5) + b"hello", "bad zstd block"),
        (_block(0, BLOCK_MAX_BYTES + 1), "bad zstd block"),
        (_block(0, 50) + b"short", "ends inside a block"),
        (b"\x01", "inside a block header"),
    ],
    ids=["rle-bomb", "frame-end", "reserved-type", "oversized", "truncated", "cut-header"],
)
def test_hostile_blocks_are_refused_with_bounded_memory(blocks: bytes, match: str | None) -> None:
    payload = _header() + blocks * (1 if match else 256 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(ContextError, match=match):
            ContextDecoder().decode(payload, True, "0" * 64, 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(payload) + 4 * BLOCK_MAX_BYTES


def test_a_frame_declaring_a_larger_window_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(
        3, window_log=WINDOW_LOG + 2, write_content_size=0, write_checksum=0
    )
    data = _real_files()[0]
    big = zstandard.ZstdCompressor(compression_params=params).compressobj()
    payload = big.compress(data) + big.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    with pytest.raises(ContextError, match="unexpected frame"):
        ContextDecoder().decode(payload, True, _name(data), len(data))


def test_stream_frames_are_refused_outside_their_stream() -> None:
    data = b"abc" * 1000
    payload, _ = ContextEncoder().encode(data, 3)
    for codec in ("zstd-stream", "zstd-stream-new"):
        with pytest.raises(IntegrityError, match="outside its stream"):
            decode_chunk(RawChunk(payload, codec, len(payload)), _name(data), len(data))  # type: ignore[arg-type]


def test_a_verified_identity_chunk_is_not_hashed_again_but_others_are() -> None:
    data = b"abc" * 1000
    name = _name(data)
    assert decode_chunk(RawChunk(data, "identity", 10, verified=True), name, len(data)) == data
    with pytest.raises(IntegrityError, match="BLAKE3"):
        decode_chunk(RawChunk(data, "identity", 10), "0" * 64, len(data))


def _bundles(chunks: list[bytes]) -> list[list[bytes]]:
    """``chunks`` cut into bundles as a server cuts what it has queued (`fits_bundle`)."""
    bundles: list[list[bytes]] = []
    for data in chunks:
        if bundles and fits_bundle(sum(map(len, bundles[-1])), len(bundles[-1]), len(data)):
            bundles[-1].append(data)
        else:
            bundles.append([data])
    return bundles


def test_bundles_of_real_files_round_trip_smaller_than_a_flush_per_chunk() -> None:
    chunks = [c for c in _real_files() if len(c) < 8 * 1024][:600]
    bundles = _bundles(chunks)
    assert max(map(len, bundles)) > 8  # small files share bundles
    assert all(sum(map(len, b)) <= BUNDLE_MAX_BYTES or len(b) == 1 for b in bundles)
    encoder, decoder = ContextEncoder(), ContextDecoder()
    bundled_bytes = 0
    for index, bundle in enumerate(bundles):
        if len(bundle) == 1:
            payload, new = encoder.encode(bundle[0], 3)
            assert decoder.decode(payload, new, _name(bundle[0]), len(bundle[0])) == bundle[0]
            bundled_bytes += len(payload)
            continue
        payload = encoder.encode_bundle(bundle, 3)
        count, new = BUNDLE_HEAD.unpack_from(payload)
        assert (count, bool(new)) == (len(bundle), index == 0)
        body = memoryview(payload)[BUNDLE_HEAD.size :]
        pieces = decoder.decode_bundle(body, bool(new), [(_name(c), len(c)) for c in bundle])
        assert pieces == bundle
        bundled_bytes += len(payload) - BUNDLE_HEAD.size
    # What the plan's sample measures is what the stream sends.
    assert bundled_bytes == _stream_bytes(chunks, 3)
    flushed = ContextEncoder()
    per_chunk = sum(len(flushed.encode(c, 3)[0]) for c in chunks)
    assert bundled_bytes < per_chunk * 0.97


def test_a_bundle_with_a_wrong_chunk_names_it_and_spoils_the_context() -> None:
    chunks = [c for c in _real_files() if len(c) < 4 * 1024][:5]
    payload = ContextEncoder().encode_bundle(chunks, 3)
    body = memoryview(payload)[BUNDLE_HEAD.size :]
    named = [(_name(c), len(c)) for c in chunks]
    named[3] = (_name(b"something else"), len(chunks[3]))
    decoder = ContextDecoder()
    with pytest.raises(ContextError, match=f"chunk {named[3][0][:16]}") as caught:
        decoder.decode_bundle(body, True, named)
    assert caught.value.chunk_id == named[3][0]  # charged to it, not to the bundle's first
    with pytest.raises(ContextError, match="before its context"):
        decoder.decode_bundle(body[10:], False, named)
    # Lengths that do not add up to what the bundle holds: a bad copy, not a crash.
    short = [(_name(c), len(c)) for c in chunks]
    short[-1] = (short[-1][0], len(chunks[-1]) - 1)
    with pytest.raises(ContextError, match="decodes to more than"):
        ContextDecoder().decode_bundle(body, True, short)


def test_a_bundle_bomb_is_refused_with_bounded_memory() -> None:
    seed = ContextEncoder().encode(b"x", 1)[0]
    header = seed[: zstandard.frame_header_size(seed)]
    body = memoryview(
        header + _block(1, BLOCK_MAX_BYTES) + b"A" * 1 + _block(1, BLOCK_MAX_BYTES) * 4096
    )
    chunks = [(_name(b"a" * 1000), 1000), (_name(b"b" * 1000), 1000)]
    tracemalloc.start()
    try:
        with pytest.raises(ContextError):
            ContextDecoder().decode_bundle(body, True, chunks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * BLOCK_MAX_BYTES


def test_a_bundle_outside_its_count_range_is_not_encoded() -> None:
    with pytest.raises(ValueError, match="bundle of 1"):
        ContextEncoder().encode_bundle([b"one"], 3)
    with pytest.raises(ValueError, match="bundle of 65"):
        ContextEncoder().encode_bundle([b"x"] * (BUNDLE_MAX_CHUNKS + 1), 3)

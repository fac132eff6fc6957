"""The probe wire format: round trips, every kind of bad input, replay window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netopt.errors import ProtocolError
from netopt.measure.packet import (
    KIND_REPLY,
    KIND_REQUEST,
    MAX_PACKET_BYTES,
    MIN_PACKET_BYTES,
    MalformedPacketError,
    OversizedPacketError,
    PacketError,
    PacketKey,
    ProbePacket,
    ReplayedPacketError,
    ReplayWindow,
    TruncatedPacketError,
    UnauthenticatedPacketError,
    decode,
    decode_fields,
    encode,
    encode_reply,
    encode_request,
    make_reply,
)

KEY = PacketKey("cluster-token-0123456789")
OTHER = PacketKey("another-cluster-token-xyz")

packets = st.builds(
    ProbePacket,
    kind=st.sampled_from([KIND_REQUEST, KIND_REPLY]),
    session=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**32 - 1),
    sender_ns=st.integers(0, 2**64 - 1),
    refl_rx_ns=st.integers(0, 2**64 - 1),
    refl_tx_ns=st.integers(0, 2**64 - 1),
    padding_bytes=st.integers(0, 1400),
)


@given(packets)
def test_encode_decode_round_trip(packet: ProbePacket) -> None:
    data = encode(packet, KEY)
    assert MIN_PACKET_BYTES <= len(data) <= MAX_PACKET_BYTES
    assert decode(data, KEY) == packet


@settings(max_examples=300)
@given(st.binary(max_size=2000))
def test_random_bytes_never_escape_the_error_tree(data: bytes) -> None:
    with pytest.raises(PacketError) as caught:  # a forgery would need 2^-128 luck
        decode(data, KEY)
    assert isinstance(caught.value, ProtocolError)
    assert caught.value.reason in {"malformed", "truncated", "oversized", "unauthenticated"}


@settings(max_examples=200)
@given(packets, st.data())
def test_any_bit_flip_is_rejected(packet: ProbePacket, data: st.DataObject) -> None:
    wire = bytearray(encode(packet, KEY))
    bit = data.draw(st.integers(0, len(wire) * 8 - 1))
    wire[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(PacketError):
        decode(bytes(wire), KEY)


@settings(max_examples=100)
@given(packets, st.data())
def test_any_truncation_is_rejected(packet: ProbePacket, data: st.DataObject) -> None:
    wire = encode(packet, KEY)
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises((TruncatedPacketError, MalformedPacketError, UnauthenticatedPacketError)):
        decode(wire[:cut], KEY)


def test_each_error_names_its_counter() -> None:
    wire = encode(ProbePacket(KIND_REQUEST, 7, 1, 123, padding_bytes=10), KEY)
    with pytest.raises(OversizedPacketError):
        decode(bytes(MAX_PACKET_BYTES + 1), KEY)
    with pytest.raises(TruncatedPacketError):
        decode(wire[:20], KEY)
    with pytest.raises(TruncatedPacketError):
        decode(wire[:-1], KEY)
    with pytest.raises(MalformedPacketError):
        decode(wire + b"x", KEY)
    with pytest.raises(MalformedPacketError):
        decode(b"XX" + wire[2:], KEY)
    with pytest.raises(UnauthenticatedPacketError):
        decode(wire, OTHER)


def test_reply_keeps_the_probe_and_adds_reflector_times() -> None:
    request = ProbePacket(KIND_REQUEST, 9, 4, 1000, padding_bytes=3)
    reply = make_reply(request, 2000, 2500)
    assert (reply.kind, reply.session, reply.seq, reply.sender_ns) == (KIND_REPLY, 9, 4, 1000)
    assert (reply.refl_rx_ns, reply.refl_tx_ns, reply.padding_bytes) == (2000, 2500, 3)


def test_encode_refuses_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="padding"):
        encode(ProbePacket(KIND_REQUEST, 1, 1, 1, padding_bytes=1401), KEY)
    with pytest.raises(ValueError, match="range"):
        encode(ProbePacket(KIND_REQUEST, 1, 2**32, 1), KEY)
    with pytest.raises(ValueError, match="empty"):
        PacketKey("")


def test_replay_window_accepts_new_and_reordered_refuses_repeats() -> None:
    window = ReplayWindow(window=64)
    for seq in (0, 1, 5, 3, 2):
        window.check(1, seq)
    for seq in (0, 1, 5, 3):
        with pytest.raises(ReplayedPacketError):
            window.check(1, seq)
    window.check(2, 0)  # another session (sender)
    window.check(1, 200)
    with pytest.raises(ReplayedPacketError, match="older"):
        window.check(1, 100)
    window.check(1, 199)


@given(st.lists(st.integers(0, 300), max_size=200))
def test_replay_window_accepts_each_seq_at_most_once(seqs: list[int]) -> None:
    window = ReplayWindow(window=64)
    accepted: list[int] = []
    for seq in seqs:
        try:
            window.check(1, seq)
        except ReplayedPacketError:
            continue
        accepted.append(seq)
    assert len(accepted) == len(set(accepted))


def test_replay_window_memory_is_bounded() -> None:
    window = ReplayWindow(window=8, max_sessions=10)
    for session in range(100_000):
        window.check(session, 0)
    assert len(window) == 10


@given(st.binary(max_size=200))
def test_tag_is_truncated_hmac_sha256(data: bytes) -> None:
    import hashlib
    import hmac

    token = "cluster-token-0123456789"
    key = hmac.new(token.encode(), b"netopt-probe-v1", hashlib.sha256).digest()
    assert PacketKey(token).tag(data) == hmac.digest(key, data, "sha256")[:16]


@given(
    session=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**32 - 1),
    sender_ns=st.integers(0, 2**64 - 1),
    padding=st.integers(0, 300),
    rx_ns=st.integers(0, 2**64 - 1),
    tx_ns=st.integers(0, 2**64 - 1),
)
@settings(max_examples=50)
def test_fast_paths_match_encode_and_decode(
    session: int, seq: int, sender_ns: int, padding: int, rx_ns: int, tx_ns: int
) -> None:
    request = ProbePacket(KIND_REQUEST, session, seq, sender_ns, padding_bytes=padding)
    wire = encode_request(session, seq, sender_ns, padding, KEY)
    assert wire == encode(request, KEY)
    fields = decode_fields(wire, KEY)
    assert fields == (KIND_REQUEST, session, seq, padding, sender_ns, 0, 0)
    assert encode_reply(fields, rx_ns, tx_ns, KEY) == encode(make_reply(request, rx_ns, tx_ns), KEY)


def test_decode_fields_rejects_what_decode_rejects() -> None:
    wire = encode_request(7, 1, 123, 0, KEY)
    with pytest.raises(UnauthenticatedPacketError):
        decode_fields(wire, OTHER)
    with pytest.raises(TruncatedPacketError):
        decode_fields(wire[:-1], KEY)
    with pytest.raises(MalformedPacketError):
        decode_fields(wire + b"x", KEY)

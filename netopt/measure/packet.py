"""The probe wire format: STAMP (RFC 8762) / TWAMP-light style, authenticated.

One UDP datagram, network byte order::

    magic       2s  b"NQ"
    version     B   1
    kind        B   1 = request (prober -> reflector), 2 = reply
    session     Q   random per prober session: the sender id the replay check keys on
    seq         I   0, 1, 2, ... within the session
    pad_len     H   bytes of padding that follow the header
    sender_ns   Q   prober's clock when the request left (any epoch)
    refl_rx_ns  Q   reflector's clock when the request arrived (0 in requests)
    refl_tx_ns  Q   reflector's clock when the reply left (0 in requests)
    padding     pad_len bytes
    tag         16  HMAC-SHA256 (truncated, as STAMP does) over everything before it

The key is derived from the cluster token, so a packet from a host without the
token, or from another cluster, fails the tag check. RTT is
``(t4 - sender_ns) - (refl_tx_ns - refl_rx_ns)``: the reflector's own time is
taken out and no clock has to agree with any other.

Parsing is pure: :func:`decode` returns a :class:`ProbePacket` or raises a
:class:`PacketError` (a :class:`netopt.errors.ProtocolError`) whose ``reason``
names the counter it belongs to.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from netopt.errors import ProtocolError

__all__ = [
    "HEADER_BYTES",
    "KIND_REPLY",
    "KIND_REQUEST",
    "MAX_PACKET_BYTES",
    "MAX_PADDING_BYTES",
    "MIN_PACKET_BYTES",
    "TAG_BYTES",
    "MalformedPacketError",
    "OversizedPacketError",
    "PacketError",
    "PacketFields",
    "PacketKey",
    "ProbePacket",
    "ReplayWindow",
    "ReplayedPacketError",
    "TruncatedPacketError",
    "UnauthenticatedPacketError",
    "decode",
    "decode_fields",
    "encode",
    "encode_reply",
    "encode_request",
    "make_reply",
]

MAGIC: Final = b"NQ"
VERSION: Final = 1
KIND_REQUEST: Final = 1
KIND_REPLY: Final = 2
_HEADER = struct.Struct("!2sBBQIHQQQ")
HEADER_BYTES: Final = _HEADER.size
TAG_BYTES: Final = 16
MAX_PADDING_BYTES: Final = 1400
MIN_PACKET_BYTES: Final = HEADER_BYTES + TAG_BYTES
MAX_PACKET_BYTES: Final = MIN_PACKET_BYTES + MAX_PADDING_BYTES
_U64: Final = 2**64 - 1
_KEY_LABEL: Final = b"netopt-probe-v1"


class PacketError(ProtocolError):
    """A datagram that is not a valid probe packet; ``reason`` names its counter."""

    reason = "malformed"


class MalformedPacketError(PacketError):
    """Wrong magic, version, kind or length fields."""

    reason = "malformed"


class TruncatedPacketError(PacketError):
    """Shorter than its header and tag say it must be."""

    reason = "truncated"


class OversizedPacketError(PacketError):
    """Longer than the largest packet netopt ever sends."""

    reason = "oversized"


class UnauthenticatedPacketError(PacketError):
    """The HMAC tag does not match: forged, corrupted or from another cluster."""

    reason = "unauthenticated"


class ReplayedPacketError(PacketError):
    """A (session, seq) seen before, or too old to tell."""

    reason = "replayed"


class PacketKey:
    """The HMAC-SHA256 key for probe packets, derived from the cluster token.

    The inner and outer SHA-256 states of HMAC (RFC 2104) are computed once, so a
    tag costs two hash copies instead of a fresh HMAC set-up per packet.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the cluster token is empty")
        key = hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest().ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def tag(self, data: bytes | bytearray | memoryview) -> bytes:
        """The 16-byte tag of ``data``: HMAC-SHA256 truncated, as STAMP does."""
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:TAG_BYTES]


@dataclass(frozen=True, slots=True)
class ProbePacket:
    """One probe request or reply, as carried on the wire."""

    kind: int
    session: int
    seq: int
    sender_ns: int
    refl_rx_ns: int = 0
    refl_tx_ns: int = 0
    padding_bytes: int = 0


def _padding(size: int) -> bytes:
    """``size`` zero bytes (shared objects for the usual sizes)."""
    return _ZEROS[size] if size < len(_ZEROS) else bytes(size)


_ZEROS: Final = tuple(bytes(n) for n in range(257))


def _seal(header: bytes, padding_bytes: int, key: PacketKey) -> bytes:
    body = header + _padding(padding_bytes) if padding_bytes else header
    return body + key.tag(body)


_pack_header = _HEADER.pack


def encode(packet: ProbePacket, key: PacketKey) -> bytes:
    """The datagram for ``packet``, tagged with ``key``.

    Raises ValueError for fields outside their wire ranges (a programming error).
    """
    if packet.kind not in (KIND_REQUEST, KIND_REPLY):
        raise ValueError(f"unknown packet kind {packet.kind}")
    if not 0 <= packet.padding_bytes <= MAX_PADDING_BYTES:
        raise ValueError(f"padding_bytes {packet.padding_bytes} is outside 0..{MAX_PADDING_BYTES}")
    try:
        header = _HEADER.pack(
            MAGIC,
            VERSION,
            packet.kind,
            packet.session,
            packet.seq,
            packet.padding_bytes,
            packet.sender_ns & _U64,
            packet.refl_rx_ns & _U64,
            packet.refl_tx_ns & _U64,
        )
    except struct.error as exc:
        raise ValueError(f"packet field out of range: {exc}") from None
    return _seal(header, packet.padding_bytes, key)


def encode_request(
    session: int, seq: int, sender_ns: int, padding_bytes: int, key: PacketKey
) -> bytes:
    """``encode`` of a request, without building a ProbePacket (the prober's hot path).

    Raises ValueError (struct.error) for fields outside their wire ranges.
    """
    body = _pack_header(
        MAGIC, VERSION, KIND_REQUEST, session, seq, padding_bytes, sender_ns & _U64, 0, 0
    )
    if padding_bytes:
        body += _padding(padding_bytes)
    return body + key.tag(body)


def encode_reply(fields: PacketFields, refl_rx_ns: int, refl_tx_ns: int, key: PacketKey) -> bytes:
    """The reply datagram to a request whose :func:`decode_fields` are ``fields``
    (same session, seq, sender time and size; the reflector's hot path)."""
    _, session, seq, pad_len, sender_ns, _, _ = fields
    body = _pack_header(
        MAGIC, VERSION, KIND_REPLY, session, seq, pad_len, sender_ns, refl_rx_ns & _U64,
        refl_tx_ns & _U64,
    )  # fmt: skip
    if pad_len:
        body += _padding(pad_len)
    return body + key.tag(body)


PacketFields = tuple[int, int, int, int, int, int, int]
"""``(kind, session, seq, pad_len, sender_ns, refl_rx_ns, refl_tx_ns)``."""


def decode_fields(data: bytes | bytearray | memoryview, key: PacketKey) -> PacketFields:
    """Parse and authenticate one datagram into a plain tuple (see :data:`PacketFields`).

    The same checks and errors as :func:`decode`, without building a ProbePacket.
    """
    size = len(data)
    if size > MAX_PACKET_BYTES:
        raise OversizedPacketError(f"{size} bytes is more than {MAX_PACKET_BYTES}")
    if size < MIN_PACKET_BYTES:
        raise TruncatedPacketError(f"{size} bytes is less than {MIN_PACKET_BYTES}")
    # Plain slices: for datagrams this small they are cheaper than memoryviews.
    magic, version, kind, session, seq, pad_len, sender_ns, rx_ns, tx_ns = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedPacketError("not a netopt probe packet (bad magic)")
    if version != VERSION:
        raise MalformedPacketError(f"unsupported probe version {version}")
    if kind != KIND_REQUEST and kind != KIND_REPLY:
        raise MalformedPacketError(f"unknown packet kind {kind}")
    body_bytes = HEADER_BYTES + pad_len
    if size != body_bytes + TAG_BYTES:
        if size < body_bytes + TAG_BYTES:
            raise TruncatedPacketError(
                f"{size} bytes, but its header says {body_bytes + TAG_BYTES}"
            )
        raise MalformedPacketError(f"{size} bytes, but its header says {body_bytes + TAG_BYTES}")
    if not hmac.compare_digest(key.tag(data[:body_bytes]), data[body_bytes:]):
        raise UnauthenticatedPacketError("bad authentication tag")
    return kind, session, seq, pad_len, sender_ns, rx_ns, tx_ns


def decode(data: bytes | bytearray | memoryview, key: PacketKey) -> ProbePacket:
    """Parse and authenticate one datagram.

    Raises OversizedPacketError, TruncatedPacketError, MalformedPacketError or
    UnauthenticatedPacketError (all PacketError, a ProtocolError); never anything else.
    """
    kind, session, seq, pad_len, sender_ns, rx_ns, tx_ns = decode_fields(data, key)
    return ProbePacket(kind, session, seq, sender_ns, rx_ns, tx_ns, pad_len)


def make_reply(request: ProbePacket, refl_rx_ns: int, refl_tx_ns: int) -> ProbePacket:
    """The reply a reflector sends for ``request`` (same size: symmetric, as in STAMP)."""
    return ProbePacket(
        KIND_REPLY,
        request.session,
        request.seq,
        request.sender_ns,
        refl_rx_ns & _U64,
        refl_tx_ns & _U64,
        request.padding_bytes,
    )


class ReplayWindow:
    """Sliding-window replay check per session, like IPsec's per SA.

    Keyed by what the tag authenticates, the session (the sender id) and its
    sequence number, never by the source address: an address is not
    authenticated, so one captured request resent from many addresses is still
    one request. Remembers the highest sequence number of each session and which
    of the last ``window`` numbers were seen. At most ``max_sessions`` sessions
    are kept (least recently used go first), so memory stays bounded whatever
    arrives: each session costs one entry of two ints.
    """

    def __init__(self, window: int = 1024, max_sessions: int = 4096) -> None:
        if window < 1 or max_sessions < 1:
            raise ValueError("window and max_sessions must be positive")
        self.window = window
        self.max_sessions = max_sessions
        self._mask = (1 << window) - 1
        self._sessions: OrderedDict[int, tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def check(self, session: int, seq: int) -> None:
        """Record (session, seq); raise ReplayedPacketError if already seen or too old."""
        state = self._sessions.get(session)
        if state is None:
            self._sessions[session] = (seq, 1)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return
        self._sessions.move_to_end(session)
        highest, seen = state
        if seq > highest:
            shift = seq - highest
            seen = ((seen << shift) | 1) & self._mask if shift < self.window else 1
            self._sessions[session] = (seq, seen)
            return
        behind = highest - seq
        if behind >= self.window:
            raise ReplayedPacketError(f"seq {seq} is older than the replay window")
        bit = 1 << behind
        if seen & bit:
            raise ReplayedPacketError(f"seq {seq} of session {session:#x} was seen before")
        self._sessions[session] = (highest, seen | bit)

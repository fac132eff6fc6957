"""dataplane/sockets.py: the one home of setting a socket's congestion control."""

from __future__ import annotations

import socket

import pytest

from netopt.dataplane.sockets import set_congestion_control, try_congestion_control
from netopt.errors import DependencyError


def congestion_control_of(sock: socket.socket) -> str:
    """What the kernel runs on ``sock`` (read straight from ``TCP_CONGESTION``)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


def test_set_and_read_back_on_a_real_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        set_congestion_control(sock, "reno")  # built into every Linux kernel
        assert congestion_control_of(sock) == "reno"


def test_an_unknown_algorithm_is_one_error_and_the_fallback_keeps_the_default() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        before = congestion_control_of(sock)
        with pytest.raises(DependencyError, match="'no-such-cc' is not available"):
            set_congestion_control(sock, "no-such-cc")
        assert try_congestion_control(sock, "no-such-cc") is False
        assert congestion_control_of(sock) == before
        assert try_congestion_control(sock, "reno") is True

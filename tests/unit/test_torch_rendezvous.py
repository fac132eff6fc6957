"""The rendezvous port: free, and never one the kernel hands out as a local port."""

from __future__ import annotations

import random
import socket

from netopt.torch.rendezvous import PORT_RANGE, ephemeral_range, rendezvous_port


def test_the_ephemeral_range_is_read_or_linux_default() -> None:
    assert ephemeral_range("1024\t2048\n") == (1024, 2048)
    assert ephemeral_range("junk") == (32768, 60999)
    assert ephemeral_range("5000 100") == (32768, 60999)
    assert ephemeral_range("0 70000") == (32768, 60999)
    low, high = ephemeral_range()
    assert 0 < low <= high <= 65535


def test_the_port_is_free_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    for seed in range(20):
        port = rendezvous_port(rng=random.Random(seed))
        assert not low <= port <= high
        assert PORT_RANGE[0] <= port <= PORT_RANGE[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free: rank 0 can listen on it


def test_a_taken_port_is_skipped() -> None:
    low, high = ephemeral_range()
    first = rendezvous_port(rng=random.Random(7))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        again = rendezvous_port(rng=random.Random(7))  # the same first pick, now taken
        assert again != first
        assert not low <= again <= high

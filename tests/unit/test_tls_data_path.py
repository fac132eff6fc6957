"""The data plane's TLS cost cutters: writes in pieces under TLS, glibc heap thresholds."""

from __future__ import annotations

import os
import platform

import pytest

from netopt.dataplane.heap import tune_heap
from netopt.dataplane.sending import TLS_WRITE_BYTES, write_pieces


@pytest.mark.parametrize("size", [1, TLS_WRITE_BYTES, TLS_WRITE_BYTES + 1, 5 * TLS_WRITE_BYTES - 7])
def test_tls_writes_are_pieces_of_at_most_the_bound_and_add_up(size: int) -> None:
    data = os.urandom(size)
    pieces = write_pieces(data, secure=True)
    assert all(0 < len(p) <= TLS_WRITE_BYTES for p in pieces)
    assert len(pieces) == -(-size // TLS_WRITE_BYTES)
    assert b"".join(pieces) == data


def test_plain_writes_stay_one_and_empty_data_is_no_write() -> None:
    data = os.urandom(3 * TLS_WRITE_BYTES)
    assert [bytes(p) for p in write_pieces(data, secure=False)] == [data]
    assert write_pieces(b"", secure=True) == []
    assert write_pieces(b"", secure=False) == []


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_heap_thresholds_are_set_once_on_glibc() -> None:
    assert tune_heap() is True
    assert tune_heap() is True  # idempotent: the first answer

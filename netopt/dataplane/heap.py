"""The process's heap settings for moving data: glibc malloc's thresholds, fixed at start.

asyncio's TLS transport (``asyncio.sslproto``) allocates a buffer for every TLS record
it decrypts (``SSLObject.read(256 KiB)``, cut down to the record's 16 KiB) and one for
every batch of records it encrypts. glibc serves an allocation over its mmap threshold
(128 KiB at start) with a fresh mapping, and gives the top of the heap back to the
kernel once more than its trim threshold (128 KiB at start) is free there. Its dynamic
rule raises both only when a *mapped* block is freed whole, which the cut-down record
buffers never are: a TLS client of a loopback bulk transfer measured ~350,000 minor page
faults per GB (each page of every buffer mapped, zero-filled and unmapped again), and
1.7-2.1 CPU s/GB against 0.6-0.9 with the thresholds fixed at the values below
(/tmp bench of one asyncio TLS sender and receiver, 512 MiB, 1 MiB writes; plain TCP:
0.2-0.3 s/GB and no such faults either way).

The values are those glibc's dynamic rule ends at on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``,
32 MiB, and twice that for trimming), so no allocation is served differently from a
process that has run long enough for the rule to get there: blocks of up to 32 MiB come
from the heap, and at most 64 MiB of freed memory stays at the top of each arena
instead of going back to the kernel at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_heap"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 32 * 1024**2
"""Allocations above this get their own mapping (glibc's ``M_MMAP_THRESHOLD``)."""
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""Free memory at the top of a heap above this goes back to the kernel (``M_TRIM_THRESHOLD``)."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_tuned: bool | None = None


def tune_heap() -> bool:
    """Fix glibc malloc's mmap and trim thresholds for this process (once; later calls
    return the first answer). False where the C library is not glibc or refuses."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt to speak of)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not _tuned:
        log.debug("mallopt refused the heap thresholds; glibc's defaults stay")
    return _tuned

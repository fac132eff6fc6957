"""The data plane: serve datasets as verified, compressed chunks and fetch them in parallel.

The names below are loaded on first use (PEP 562), so that importing one light module
of the package (``netopt.dataplane.prefetch``, ``trace``, ``sockets``) does not import
aiohttp and the sync engine: ``netopt sync`` starts its first requests before that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netopt.dataplane.chunkio import (
        ChunkSink,
        ChunkSource,
        DirChunkSink,
        MemoryChunkSink,
        MemoryChunkSource,
        RawChunk,
        decode_chunk,
        encode_chunk,
    )
    from netopt.dataplane.sync import sync_manifest
    from netopt.dataplane.synctypes import SyncOptions, SyncProgress, SyncSummary

_HOMES = {
    "ChunkSink": "chunkio",
    "ChunkSource": "chunkio",
    "DirChunkSink": "chunkio",
    "MemoryChunkSink": "chunkio",
    "MemoryChunkSource": "chunkio",
    "RawChunk": "chunkio",
    "decode_chunk": "chunkio",
    "encode_chunk": "chunkio",
    "SyncOptions": "synctypes",
    "SyncProgress": "synctypes",
    "SyncSummary": "synctypes",
    "sync_manifest": "sync",
}

__all__ = [
    "ChunkSink",
    "ChunkSource",
    "DirChunkSink",
    "MemoryChunkSink",
    "MemoryChunkSource",
    "RawChunk",
    "SyncOptions",
    "SyncProgress",
    "SyncSummary",
    "decode_chunk",
    "encode_chunk",
    "sync_manifest",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)

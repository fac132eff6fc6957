"""The data plane: serve datasets as verified, compressed chunks and fetch them in parallel."""

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
from netopt.dataplane.sync import SyncOptions, SyncProgress, SyncSummary, sync_manifest

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

"""A generated JSON-lines dataset (training-log-like records), deterministic per seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["write_jsonl_dataset"]

_WORDS = tuple(
    [
        "gradient",
        "tensor",
        "shard",
        "epoch",
        "batch",
        "token",
        "loss",
        "optimizer",
        "checkpoint",
        "region",
        "border",
        "latency",
        "bandwidth",
        "allreduce",
        "ring",
        "tree",
        "socket",
        "buffer",
        "channel",
        "stream",
        "chunk",
        "cache",
    ]
)


def write_jsonl_dataset(directory: Path, total_bytes: int, files: int = 4, seed: int = 7) -> int:
    """Write about ``total_bytes`` of JSON lines over ``files`` files; returns bytes written."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    per_file = max(1, total_bytes // files)
    written = 0
    for index in range(files):
        lines = []
        size = 0
        record = 0
        while size < per_file:
            line = json.dumps(
                {
                    "id": f"{index:02d}-{record:08d}",
                    "step": rng.randrange(1_000_000),
                    "loss": round(rng.uniform(0.5, 4.0), 5),
                    "text": " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(8, 40))),
                    "tags": rng.sample(_WORDS, 3),
                }
            )
            lines.append(line)
            size += len(line) + 1
            record += 1
        data = ("\n".join(lines) + "\n").encode()
        (directory / f"part-{index:03d}.jsonl").write_bytes(data)
        written += len(data)
    return written

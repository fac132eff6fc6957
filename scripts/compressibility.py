"""How far compression can take a transfer of some data: zstd ratio and speed per level.

For each level: the ratio over whole chunks (as the data plane compresses them), the
compression and decompression speed of one core, and the effective rate a link of
``--link-payload-mbps`` would give with that ratio if the CPU kept up (the ceiling of
any on-the-fly or precompressed transfer at that level).

    .venv/bin/python scripts/compressibility.py FILE [--levels 1,3,5,9,19] [--json-out F]
    .venv/bin/python scripts/compressibility.py --generate-mb 24   # bench_transfer's JSON-lines
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transfer import make_data


def measure(data: bytes, chunk_bytes: int, chunks: int, level: int) -> dict[str, float]:
    """Ratio, compress and decompress MB/s of one core at ``level`` over ``chunks`` chunks."""
    pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)][:chunks]
    raw = sum(len(p) for p in pieces)
    cctx = zstandard.ZstdCompressor(level=level)
    start = time.perf_counter()
    frames = [cctx.compress(p) for p in pieces]
    compress_s = time.perf_counter() - start
    dctx = zstandard.ZstdDecompressor()
    start = time.perf_counter()
    for frame in frames:
        dctx.decompress(frame)
    decompress_s = time.perf_counter() - start
    return {
        "level": level,
        "ratio": raw / sum(len(f) for f in frames),
        "compress_mb_per_s": raw / compress_s / 1e6,
        "decompress_mb_per_s": raw / decompress_s / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", nargs="?", help="data to measure")
    parser.add_argument("--generate-mb", type=int, default=0, help="use bench_transfer's data")
    parser.add_argument("--levels", default="1,3,5,9,19")
    parser.add_argument("--chunk-mib", type=int, default=4, help="the data plane's chunk size")
    parser.add_argument("--chunks", type=int, default=4, help="chunks measured per level")
    parser.add_argument("--link-payload-mbps", type=float, default=92.0, help="e.g. iperf3's")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    chunk_bytes = args.chunk_mib * 1024 * 1024
    if args.file:
        with open(args.file, "rb") as f:
            data = f.read(chunk_bytes * args.chunks)
    elif args.generate_mb:
        with tempfile.TemporaryDirectory() as tmp:
            data = make_data(Path(tmp), args.generate_mb)["jsonl"].read_bytes()
    else:
        parser.error("give FILE or --generate-mb N")
    rows = [measure(data, chunk_bytes, args.chunks, int(x)) for x in args.levels.split(",")]
    print("| level | ratio | compress MB/s (1 core) | decompress MB/s | link-bound Mbit/s |")
    print("|---|---|---|---|---|")
    for row in rows:
        row["link_bound_mbps"] = args.link_payload_mbps * row["ratio"]
        print(
            f"| {row['level']} | {row['ratio']:.2f} | {row['compress_mb_per_s']:.1f} "
            f"| {row['decompress_mb_per_s']:.0f} | {row['link_bound_mbps']:.0f} |"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

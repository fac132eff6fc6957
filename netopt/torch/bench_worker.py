"""One rank of ``netopt bench allreduce``: ``python -m netopt.torch.bench_worker ...``.

Joins a ``torch.distributed`` group over TCP, times ``all_reduce`` of float32
tensors of each size (after warm-up), checks one result per size, and, on rank
0, prints one line ``NETOPT_BENCH {json}`` with the slowest rank's mean time per
size. Exit codes: 0 ok, 2 bad arguments, 3 a wrong all-reduce result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

__all__ = ["RESULT_PREFIX", "main"]

RESULT_PREFIX = "NETOPT_BENCH "


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="netopt.torch.bench_worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    parser.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ifname", help="interface for Gloo (GLOO_SOCKET_IFNAME)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one rank; see the module docstring."""
    args = _parse(argv)
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    from netopt.torch.hooks import import_torch

    torch = import_torch()
    dist = torch.distributed
    host, _, port = args.master.rpartition(":")
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://{host}:{port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout_s),
    )
    device = "cpu"
    if args.backend == "nccl":
        device = f"cuda:{args.rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            elements = max(1, size // 4)
            tensor = torch.empty(elements, dtype=torch.float32, device=device)
            tensor.fill_(float(args.rank + 1))
            dist.all_reduce(tensor)
            expected = args.world * (args.world + 1) / 2
            if abs(float(tensor[0].item()) - expected) > 1e-3 * expected:
                print(f"rank {args.rank}: all-reduce gave {tensor[0].item()}, not {expected}",
                      file=sys.stderr)  # fmt: skip
                return 3
            for _ in range(args.warmup):
                dist.all_reduce(tensor)
            dist.barrier()
            if device != "cpu":
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(tensor)
            if device != "cpu":
                torch.cuda.synchronize()
            mean_s = (time.perf_counter() - started) / max(1, args.iters)
            slowest = torch.tensor([mean_s], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            results.append({"size_bytes": elements * 4, "time_s": float(slowest.item())})
    finally:
        dist.destroy_process_group()
    if args.rank == 0:
        document = {"backend": args.backend, "world": args.world, "results": results}
        sys.stdout.write(RESULT_PREFIX + json.dumps(document) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

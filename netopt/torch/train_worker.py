"""One rank of ``netopt bench train``: ``python -m netopt.torch.train_worker ...``.

Joins a Gloo group over TCP, builds the byte-level language model of
:mod:`netopt.torch.trainbench` from the seed (every rank and both runs start from
the same weights), and trains ``--steps`` steps on the token shards in the data
order of :func:`~netopt.torch.trainbench.sample_order` (the same in both runs).
Data comes from ``--data-url`` (a plain HTTP client: each shard fetched whole from
the origin the first time a sample needs it, then kept in memory) or from
``--data-dir`` (a ``netopt sync`` destination, read through :class:`CachedDataset`
with the shards prefetched in the order the samples need them). A
:class:`StepMeter` times every step. Every rank prints one line
``NETOPT_TRAIN {json}``: its losses, its step records and its wall time.
Exit codes: 0 ok, 2 bad arguments, 3 a non-finite loss.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from netopt.torch.procexit import exit_skipping_teardown
from netopt.torch.trainbench import (
    RESULT_PREFIX,
    TRAIN_HOOKS,
    ModelShape,
    batch_indices,
    sample_order,
    shard_name,
)

__all__ = ["main"]

POWERSGD_START_ITER = 1
"""Synchronous (uncompressed) steps before PowerSGD starts: step 0, the one after which
DDP rebuilds its buckets (so PowerSGD's memories are built once, on the final buckets).
Each of them sends every gradient byte across the border (22.8 MB for the default model,
about 2 s at 100 Mbit/s): one is the least that gives PowerSGD a first full gradient."""


def _wire_bytes(model: Any, args: argparse.Namespace) -> int:
    """S: the bytes one step's all-reduce carries, the mean over the steps (PowerSGD:
    the full gradients for the warm-up steps, then P and Q, the rest uncompressed; the
    alternating variant: P or Q in turn, P first, the rest uncompressed every step)."""
    from netopt.torch.lowrank import LowRankState

    full = 4 * sum(int(p.numel()) for p in model.parameters())
    if "fp16" in args.hook:
        return full // 2
    if "powersgd" not in args.hook:
        return full
    probe = LowRankState(None, None, None, args.powersgd_rank)
    plain = p_bytes = q_bytes = 0
    for p in model.parameters():
        shape = tuple(p.shape)
        if probe.compresses(shape):
            rows, cols = int(shape[0]), int(p.numel()) // int(shape[0])
            r = min(rows, cols, args.powersgd_rank)
            p_bytes, q_bytes = p_bytes + 4 * r * rows, q_bytes + 4 * r * cols
        else:
            plain += 4 * int(p.numel())
    warm = min(int(args.steps), POWERSGD_START_ITER)
    low = args.steps - warm
    if args.hook.endswith("-alternating"):
        compressed = low * plain + (low + 1) // 2 * p_bytes + low // 2 * q_bytes
    else:
        compressed = low * (plain + p_bytes + q_bytes)
    return int((warm * full + compressed) // args.steps)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="netopt.torch.train_worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    parser.add_argument("--ifname", help="interface for Gloo (GLOO_SOCKET_IFNAME)")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--shard-bytes", type=int, required=True)
    parser.add_argument("--hook", choices=TRAIN_HOOKS, default="none")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument(
        "--bucket-cap-mb", type=int, help="DDP's bucket_cap_mb, with gradient_as_bucket_view"
    )
    parser.add_argument(
        "--no-broadcast-buffers", action="store_true",
        help="DDP(broadcast_buffers=False): the model's buffers never change (a constant mask)",
    )  # fmt: skip
    parser.add_argument("--regions", default="", help="comma-separated region of each rank")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-url", help="base URL of the shards (plain HTTP)")
    source.add_argument("--data-dir", help="a netopt sync destination holding the shards")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--job", default="bench-train")
    parser.add_argument("--log", help="the StepMeter's JSON-lines log")
    parser.add_argument("--mark-dir", help="rank 0 creates 'start' and 'end' here around the steps")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def _http_source(base: str, timeout_s: float) -> Callable[[int], bytes]:
    shards: dict[int, bytes] = {}

    def get(index: int) -> bytes:
        if index not in shards:
            url = f"{base.rstrip('/')}/{shard_name(index)}"
            with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310
                shards[index] = reply.read()
        return shards[index]

    return get


def _cached_source(root: str, needed: list[int]) -> Callable[[int], bytes]:
    from netopt.torch.dataset import CachedDataset

    dataset = CachedDataset(root, prefetch_depth=4, prefetch_threads=2)
    index_of = {path: i for i, path in enumerate(dataset.files)}
    by_shard = [index_of[shard_name(s)] for s in range(len(dataset.files))]
    dataset.set_order([by_shard[s] for s in needed])
    shards: dict[int, bytes] = {}

    def get(index: int) -> bytes:
        if index not in shards:
            data = dataset[by_shard[index]]
            assert isinstance(data, bytes)
            shards[index] = data
        return shards[index]

    return get


def _batches(
    torch: Any, get: Callable[[int], bytes], args: argparse.Namespace, order: list[tuple[int, int]]
) -> Iterator[tuple[Any, Any]]:
    for step in range(args.steps):
        rows = []
        for index in batch_indices(step, args.rank, args.world, args.batch):
            shard, offset = order[index % len(order)]
            rows.append(get(shard)[offset : offset + args.seq + 1])
        tokens = torch.tensor([list(r) for r in rows], dtype=torch.long)
        yield tokens[:, :-1], tokens[:, 1:]


def _register_hook(torch: Any, ddp: Any, args: argparse.Namespace, meter: Any) -> tuple[str, str]:
    from netopt.torch.hierarchical import HierarchicalState, hierarchical_hook, region_groups
    from netopt.torch.hooks import apply_comm_hook

    regions = [r for r in args.regions.split(",") if r]
    if args.hook == "none":
        return apply_comm_hook(ddp, "none", meter=meter).name, ""
    if args.hook == "fp16":
        applied = apply_comm_hook(ddp, "bf16_compress_hook", meter=meter)
        return applied.name, applied.note
    if args.hook == "powersgd":
        applied = apply_comm_hook(
            ddp, "powerSGD_hook", powersgd_rank=args.powersgd_rank,
            start_powersgd_iter=POWERSGD_START_ITER,
            meter=meter,
        )  # fmt: skip
        return applied.name, applied.note
    if args.hook == "hierarchical":
        applied = apply_comm_hook(ddp, "hierarchical_allreduce_hook", regions=regions, meter=meter)
        return applied.name, ""
    if args.hook.startswith("hierarchical-powersgd"):
        applied = apply_comm_hook(
            ddp, "hierarchical_powerSGD_hook", regions=regions, powersgd_rank=args.powersgd_rank,
            start_powersgd_iter=POWERSGD_START_ITER, meter=meter,
            powersgd_alternate=args.hook.endswith("-alternating"),
        )  # fmt: skip
        return applied.name, applied.note
    state = HierarchicalState(torch, region_groups(torch, regions))

    def fp16_hierarchical(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
        buffer = bucket.buffer()

        def back(future):  # type: ignore[no-untyped-def]
            buffer.copy_(future.value())
            return buffer

        return hierarchical_hook(state, _Half(buffer.to(torch.float16))).then(back)

    ddp.register_comm_hook(state, meter.wrap_hook(fp16_hierarchical))
    return (
        "hierarchical_allreduce_hook+fp16",
        "the bucket sent as fp16 through the region hierarchy",
    )


class _Half:
    """A bucket stand-in whose buffer is the fp16 copy (what hierarchical_hook reads)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def buffer(self) -> Any:
        return self._tensor


def _mark(args: argparse.Namespace, name: str) -> None:
    """Tell the bench (which reads the lab's byte counters) where the steps begin and end."""
    if args.mark_dir and args.rank == 0:
        with open(os.path.join(args.mark_dir, name), "w", encoding="utf-8") as handle:
            handle.write(f"{time.time()}\n")


def main(argv: list[str] | None = None) -> int:
    """Run one rank; see the module docstring."""
    args = _parse(argv)
    if args.steps < 1 or args.world < 1 or not 0 <= args.rank < args.world:
        print("need --steps >= 1 and 0 <= --rank < --world", file=sys.stderr)
        return 2
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    from netopt.torch.hooks import import_torch
    from netopt.torch.stepmeter import StepMeter
    from netopt.torch.trainbench import build_model

    torch = import_torch()
    torch.set_num_threads(max(1, args.threads))
    dist = torch.distributed
    host, _, port = args.master.rpartition(":")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout_s),
    )
    try:
        shape = ModelShape(args.dim, args.layers, args.heads, args.seq)
        model = build_model(torch, shape, args.seed)
        bucketing = (
            {}
            if args.bucket_cap_mb is None
            else {"bucket_cap_mb": args.bucket_cap_mb, "gradient_as_bucket_view": True}
        )
        if args.no_broadcast_buffers:  # DDP would broadcast them from rank 0 every forward
            bucketing["broadcast_buffers"] = False
        ddp = torch.nn.parallel.DistributedDataParallel(model, **bucketing)
        params = sum(p.numel() for p in model.parameters())
        meter = StepMeter(args.job, log_path=args.log, rank=args.rank)
        hook, note = _register_hook(torch, ddp, args, meter)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
        order = sample_order(args.shards, args.shard_bytes, args.seq, args.seed)
        needed = list(
            dict.fromkeys(
                order[i % len(order)][0]
                for step in range(args.steps)
                for i in batch_indices(step, args.rank, args.world, args.batch)
            )
        )
        get = (
            _http_source(args.data_url, args.timeout_s)
            if args.data_url
            else _cached_source(args.data_dir, needed)
        )
        losses: list[float] = []
        dist.barrier()
        _mark(args, "start")
        started = time.perf_counter()
        for inputs, targets in meter.batches(_batches(torch, get, args, order)):
            logits = ddp(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()))
        elapsed = time.perf_counter() - started
        _mark(args, "end")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    records = [
        {
            "step_s": r.step_s,
            "data_wait_s": r.data_wait_s,
            "comm_exposed_s": r.comm_exposed_s,
            "compute_s": r.compute_s,
            "comm_from_s": r.comm_from_s,
            "comm_to_s": r.comm_to_s,
        }
        for r in meter.records
    ]
    document = {
        "rank": args.rank,
        "params": params,
        "grad_bytes": 4 * params,
        "wire_bytes": _wire_bytes(model, args),
        "bucket_cap_mb": args.bucket_cap_mb,
        "broadcast_buffers": not args.no_broadcast_buffers,
        "hook": hook,
        "hook_note": note,
        "elapsed_s": elapsed,
        "losses": losses,
        "records": records,
    }
    sys.stdout.write(RESULT_PREFIX + json.dumps(document) + "\n")
    sys.stdout.flush()
    return 0 if all(math.isfinite(x) for x in losses) else 3


if __name__ == "__main__":
    exit_skipping_teardown(main())

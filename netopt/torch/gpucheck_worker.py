"""The one-rank part of ``scripts/gpu_check.sh``: ``python -m netopt.torch.gpucheck_worker``.

Runs in the environment the env file set (the caller sources it). One process, one rank:

- ``allreduce``: a ``torch.distributed`` group (NCCL on ``cuda:0``; Gloo on CPU with
  ``--cpu``) all-reduces a tensor and checks the sum.
- ``gloo``: a Gloo group beside it all-reduces too (it binds GLOO_SOCKET_IFNAME).
- ``hook:bf16_compress_hook`` and ``hook:powerSGD_hook``: the advised DDP comm hooks,
  registered through :func:`netopt.torch.apply_comm_hook` on a ~2.2M-parameter MLP split
  into several 1 MiB DDP buckets, run training steps; the proof that each hook ran is in
  the gradients (bf16/fp16-representable after the compress hook, rank <= r after PowerSGD).

Each part prints one line ``NETOPT_GPUCHECK {json}`` with ``part``, ``ok`` and details or
``error``; a failed part does not stop the others. Exit code 0 when every part passed, 1
otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["MLP_WIDTHS", "RESULT_PREFIX", "main"]

RESULT_PREFIX = "NETOPT_GPUCHECK "
MLP_WIDTHS = (256, 768, 768, 768, 768, 256)
"""~2.2M parameters: each 768x768 weight (2.25 MiB) is a bucket of its own at 1 MiB."""
BUCKET_CAP_MB = 1
POWERSGD_RANK = 2
STEPS = 4


def _emit(part: str, ok: bool, **details: Any) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps({"part": part, "ok": ok, **details}) + "\n")
    sys.stdout.flush()


def _run_part(part: str, body: Callable[[], dict[str, Any]]) -> bool:
    try:
        details = body()
    except Exception as exc:  # any failure of a part is the report's, not a crash
        _emit(
            part, False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:]
        )
        return False
    ok = bool(details.pop("ok", True))
    _emit(part, ok, **details)
    return ok


def _mlp(torch: Any, device: str) -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for width_in, width_out in itertools.pairwise(MLP_WIDTHS):
        layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(device)


def _ddp(torch: Any, device: str, group: Any, bucket_cap_mb: float = BUCKET_CAP_MB) -> Any:
    ids = [torch.device(device).index] if device != "cpu" else None
    return torch.nn.parallel.DistributedDataParallel(
        _mlp(torch, device), device_ids=ids, process_group=group, bucket_cap_mb=bucket_cap_mb
    )


def _train(torch: Any, model: Any, device: str) -> None:
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator(device="cpu").manual_seed(1)
    for _ in range(STEPS):
        optimiser.zero_grad()
        batch = torch.randn(16, MLP_WIDTHS[0], generator=generator).to(device)
        model(batch).square().mean().backward()
        optimiser.step()
    if device != "cpu":
        torch.cuda.synchronize()


def _buckets(model: Any) -> int:
    sizes = str(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
    return len([s for s in sizes.split(",") if s.strip()])


def _compress_hook(torch: Any, device: str, group: Any) -> dict[str, Any]:
    from netopt.torch.hooks import apply_comm_hook

    model = _ddp(torch, device, group)
    applied = apply_comm_hook(model, "bf16_compress_hook", process_group=group)
    _train(torch, model, device)
    dtype = torch.bfloat16 if applied.name == "bf16_compress_hook" else torch.float16
    grads = [p.grad for p in model.parameters()]
    # One rank: the hook's all-reduce returns the gradient cast down and back up.
    exact = all(torch.equal(g, g.to(dtype).to(g.dtype)) for g in grads)
    buckets = _buckets(model)
    return {
        "ok": exact and buckets >= 2,
        "applied": applied.name,
        "note": applied.note,
        "buckets": buckets,
        "params": sum(p.numel() for p in model.parameters()),
        "grads_in_wire_dtype": exact,
    }


def _powersgd_hook(torch: Any, device: str, group: Any) -> dict[str, Any]:
    from netopt.torch.hooks import apply_comm_hook

    # On Gloo (CPU) apply_comm_hook registers netopt's lowrank_hook, which runs with
    # several buckets where PyTorch's powerSGD_hook aborts or hangs.
    model = _ddp(torch, device, group, BUCKET_CAP_MB)
    applied = apply_comm_hook(
        model,
        "powerSGD_hook",
        powersgd_rank=POWERSGD_RANK,
        process_group=group,
        start_powersgd_iter=2,
    )
    _train(torch, model, device)
    state = applied.state
    ranks = [
        int(torch.linalg.matrix_rank(p.grad.float())) for p in model.parameters() if p.ndim == 2
    ]
    buckets = _buckets(model)
    memory = state.q_memory if applied.name == "netopt_lowrank_hook" else state.p_memory_dict
    compressed = len(memory)
    return {
        "ok": buckets >= 2 and compressed == buckets and max(ranks) <= POWERSGD_RANK,
        "applied": applied.name,
        "buckets": buckets,
        "buckets_compressed": compressed,
        "iterations": int(state.iter),
        "grad_matrix_ranks": ranks,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="netopt.torch.gpucheck_worker")
    parser.add_argument("--port", type=int, required=True, help="TCP store port on 127.0.0.1")
    parser.add_argument("--cpu", action="store_true", help="Gloo on CPU instead of NCCL on CUDA")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the parts; see the module docstring."""
    args = _parse(argv)
    from netopt.torch.hooks import import_torch

    torch = import_torch()
    dist = torch.distributed
    device = "cpu" if args.cpu else "cuda:0"
    if not args.cpu:
        torch.cuda.set_device(0)
    dist.init_process_group(
        "gloo" if args.cpu else "nccl",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=args.timeout_s),
    )

    def allreduce() -> dict[str, Any]:
        tensor = torch.full((1 << 20,), 3.0, device=device)
        dist.all_reduce(tensor)
        if device != "cpu":
            torch.cuda.synchronize()
        value = float(tensor[0].item())
        return {"ok": value == 3.0, "backend": str(dist.get_backend()), "value": value}

    def gloo() -> dict[str, Any]:
        group = dist.new_group(backend="gloo")
        tensor = torch.full((1024,), 2.0)
        dist.all_reduce(tensor, group=group)
        return {"ok": float(tensor[0].item()) == 2.0}

    results = [
        _run_part("allreduce", allreduce),
        _run_part("gloo", gloo),
        _run_part("hook:bf16_compress_hook", lambda: _compress_hook(torch, device, None)),
        _run_part("hook:powerSGD_hook", lambda: _powersgd_hook(torch, device, None)),
    ]
    dist.destroy_process_group()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the multi-bucket comm-hook test: python ddp_buckets_worker.py RANK WORLD PORT.

For each advised hook, trains a 2.0 M-parameter MLP (six 576x576 layers, 8 MB of
fp32 gradients) under DDP with 1 MB buckets (6 buckets) over Gloo on loopback,
fitting a fixed batch per rank to a linear teacher with Adam. Each step it also computes the exact
all-reduced mean gradient on a plain copy of the model and prints, as one JSON
line per hook, the per-step relative error of DDP's gradient against it, the
losses, the bucket count, a fingerprint of the final gradient (equal on every
rank) and the matrix ranks of the final weight gradients.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

from netopt.torch import apply_comm_hook, import_torch
from netopt.torch.procexit import exit_skipping_teardown

WIDTH, LAYERS, BATCH, STEPS, BUCKET_MB = 576, 6, 64, 5, 1
POWERSGD_RANK, START_ITER = 2, 2


def mlp(torch):
    layers = []
    for _ in range(LAYERS - 1):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, WIDTH))


def flat_grads(params, torch):
    return torch.cat([p.grad.reshape(-1) for p in params])


def run(torch, rank, world, hook):
    dist = torch.distributed
    torch.manual_seed(0)
    teacher = torch.randn(WIDTH, WIDTH) / WIDTH**0.5
    module = mlp(torch)
    reference = copy.deepcopy(module)
    model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB)
    if hook == "full_rank_lowrank":  # rank = width: low-rank maths must equal all-reduce
        from netopt.torch.lowrank import LowRankState, lowrank_hook

        state = LowRankState(torch, None, dist.new_group(), WIDTH, START_ITER, 0.0)
        model.register_comm_hook(state, lowrank_hook)
        applied_name, note = "netopt_lowrank_hook", ""
    else:
        applied = apply_comm_hook(
            model, hook, powersgd_rank=POWERSGD_RANK, start_powersgd_iter=START_ITER
        )
        applied_name, note = applied.name, applied.note
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(100 + rank))
    y = x @ teacher
    errors, losses = [], []
    for _ in range(STEPS):
        reference.load_state_dict(module.state_dict())
        reference.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        exact = flat_grads(reference.parameters(), torch)
        dist.all_reduce(exact)
        exact /= world
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        got = flat_grads(model.parameters(), torch)
        errors.append(float((got - exact).norm() / exact.norm()))
        losses.append(float(loss.detach()))
        optimiser.step()
    final = flat_grads(model.parameters(), torch).double()
    weights = [p for p in model.parameters() if p.ndim == 2]
    sizes = str(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
    return {
        "hook": hook,
        "rank": rank,
        "applied": applied_name,
        "note": note,
        "params": sum(p.numel() for p in model.parameters()),
        "buckets": len([s for s in sizes.split(",") if s.strip()]),
        "errors": errors,
        "losses": losses,
        "fingerprint": [float(final.sum()), float((final * final).sum())],
        "weight_grad_ranks": [int(torch.linalg.matrix_rank(p.grad)) for p in weights],
    }


def main() -> int:
    rank, world, port, hooks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = import_torch()
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=30),
    )  # fmt: skip
    for hook in hooks:
        print(json.dumps(run(torch, rank, world, hook)), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

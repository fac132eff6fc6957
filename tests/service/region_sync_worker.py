"""One rank of the region-sync tests: python region_sync_worker.py RANK WORLD PORT LAYOUT...

A 1.7 M-parameter model (6.8 MB of fp32 gradients, layers of different shapes,
so DDP's 1 MB buckets have uneven sizes) under DDP over Gloo on loopback.
LAYOUT is a comma-separated region list (the region of each rank). Parts, each
printed as JSON lines (one process start for all: torch's import dominates):

- ``hierarchical``, per layout: netopt's hierarchical all-reduce hook; each step
  the exact all-reduced mean gradient is computed on a plain copy of the model
  (the default group's ``all_reduce``): the largest absolute difference, the
  bucket sizes, the leader this rank reduced to;
- ``hierarchical_powersgd``, on the 3+1 layout: netopt's hierarchical PowerSGD hook
  at full rank with every matrix compressed (so the low-rank maths is exact), one
  warm-up step then low-rank steps: the relative error against the exact mean, and
  the same at rank 2 (compressed: the error is large but every rank agrees);
- ``accumulation``: K=3 micro-batches, ``DDP.no_sync()`` for the first 2; the
  gradient after the third against the all-reduced mean of the three summed;
- ``local_sgd``, on the last layout: netopt's ``apply_local_sgd``
  (post_localSGD_hook with the region as subgroup, PeriodicModelAverager) for
  LOCAL_STEPS steps; per step, every rank's parameter fingerprint (all_gather_object)
  and whether the averager averaged.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

from netopt.torch import apply_comm_hook, apply_local_sgd, import_torch
from netopt.torch.hierarchical import hierarchical_powersgd_state
from netopt.torch.lowrank import lowrank_hook
from netopt.torch.procexit import exit_skipping_teardown

SHAPES = ((512, 768), (768, 512), (512, 640), (640, 384), (384, 512), (512, 256), (256, 100))
BATCH, STEPS, BUCKET_MB = 4, 3, 1  # buckets are rebuilt after step 0
K, LOCAL_STEPS, WARMUP, PERIOD = 3, 7, 2, 3


def model(torch):
    layers = []
    for fan_in, fan_out in SHAPES:
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def run(torch, rank, world, layout):
    dist = torch.distributed
    regions = layout.split(",")
    torch.manual_seed(0)
    module = model(torch)
    reference = copy.deepcopy(module)
    ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB)
    applied = apply_comm_hook(ddp, "hierarchical_allreduce_hook", regions=regions)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=0.05)
    diffs = []
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(BATCH * (1 + rank), SHAPES[0][0], generator=generator)  # uneven data
        reference.load_state_dict(module.state_dict())
        reference.zero_grad()
        reference(x).pow(2).mean().backward()
        exact = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        dist.all_reduce(exact)
        exact /= world
        optimiser.zero_grad()
        ddp(x).pow(2).mean().backward()
        got = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
        diffs.append(
            {"max_abs": float((got - exact).abs().max()), "scale": float(exact.abs().max())}
        )
        optimiser.step()
    logged = ddp._get_ddp_logging_data()
    sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", ""))
    return {
        "part": "hierarchical",
        "layout": layout,
        "rank": rank,
        "applied": applied.name,
        "leader": applied.state.leader,
        "peer_leader": applied.state.peer_leader,
        "grad_bytes": 4 * sum(p.numel() for p in ddp.parameters()),
        "bucket_sizes": [int(s) for s in sizes.split(",") if s.strip()],
        "diffs": diffs,
    }


def hierarchical_powersgd(torch, rank, world, layout, psgd_rank):
    dist = torch.distributed
    torch.manual_seed(0)
    module = model(torch)
    reference = copy.deepcopy(module)
    ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB)
    state, groups = hierarchical_powersgd_state(torch, layout.split(","), psgd_rank, 1)
    state.min_compression_rate = 0.0  # every matrix through P and Q
    ddp.register_comm_hook(state, lowrank_hook)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=0.05)
    errors, prints = [], []
    for step in range(STEPS):
        x = batch(torch, rank, step)
        reference.load_state_dict(module.state_dict())
        reference.zero_grad()
        reference(x).pow(2).mean().backward()
        exact = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        dist.all_reduce(exact)
        exact /= world
        optimiser.zero_grad()
        ddp(x).pow(2).mean().backward()
        got = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
        errors.append(float((got - exact).norm() / exact.norm()))
        prints.append(float(got.double().sum()))
        optimiser.step()
    return {"part": "hierarchical_powersgd", "rank": rank, "psgd_rank": psgd_rank,
            "leader": groups.leader, "errors": errors, "fingerprints": prints}  # fmt: skip


def batch(torch, rank, step):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, SHAPES[0][0], generator=generator)


def accumulation(torch, rank, world):
    dist = torch.distributed
    torch.manual_seed(0)
    module = model(torch)
    reference = copy.deepcopy(module)
    ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1)
    micro = [batch(torch, rank, i) for i in range(K)]
    for i, x in enumerate(micro):
        if i < K - 1:
            with ddp.no_sync():
                (ddp(x).pow(2).mean() / K).backward()
        else:
            (ddp(x).pow(2).mean() / K).backward()
    for x in micro:
        (reference(x).pow(2).mean() / K).backward()
    exact = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    dist.all_reduce(exact)
    exact /= world
    got = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    return {
        "part": "accumulation",
        "rank": rank,
        "max_abs": float((got - exact).abs().max()),
        "scale": float(exact.abs().max()),
    }


def local_sgd(torch, rank, world, regions):
    dist = torch.distributed
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model(torch), bucket_cap_mb=1)
    local = apply_local_sgd(ddp, regions, period_steps=PERIOD, warmup_steps=WARMUP)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=0.5)
    steps = []
    for step in range(LOCAL_STEPS):
        optimiser.zero_grad()
        ddp(batch(torch, rank, step)).pow(2).mean().backward()
        optimiser.step()
        before = local.averager.step
        local.averager.average_parameters(ddp.parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).double()
        prints: list = [None] * world
        dist.all_gather_object(prints, [float(flat.sum()), float((flat * flat).sum())])
        averaged = before >= WARMUP and (before - WARMUP) % PERIOD == 0
        steps.append({"fingerprints": prints, "averaged": averaged})
    return {"part": "local_sgd", "rank": rank, "steps": steps}


def main() -> int:
    rank, world, port, layouts = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = import_torch()
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=30),
    )  # fmt: skip
    for layout in layouts:
        print(json.dumps(run(torch, rank, world, layout)), flush=True)
    for psgd_rank in (1024, 2):
        result = hierarchical_powersgd(torch, rank, world, "hk,hk,hk,us", psgd_rank)
        print(json.dumps(result), flush=True)
    print(json.dumps(accumulation(torch, rank, world)), flush=True)
    print(json.dumps(local_sgd(torch, rank, world, layouts[-1].split(","))), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

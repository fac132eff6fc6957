"""One rank of the hierarchical-hook test: python hierarchical_worker.py RANK WORLD PORT REGIONS...

REGIONS is one comma-separated region list per layout (the region of each rank).
For each layout: a 1.7 M-parameter model (6.8 MB of fp32 gradients, layers of
different shapes, so DDP's 1 MB buckets have uneven sizes) under DDP over Gloo
with netopt's hierarchical all-reduce hook. Each step it computes the exact
all-reduced mean gradient on a plain copy of the model (the default group's
``all_reduce``) and prints, per layout, one JSON line: the largest absolute
difference, the bucket sizes and the leader this rank reduced to.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

from netopt.torch import apply_comm_hook, import_torch

SHAPES = ((512, 768), (768, 512), (512, 640), (640, 384), (384, 512), (512, 256), (256, 100))
BATCH, STEPS, BUCKET_MB = 4, 3, 1  # buckets are rebuilt after step 0


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
        "layout": layout,
        "rank": rank,
        "applied": applied.name,
        "leader": applied.state.leader,
        "grad_bytes": 4 * sum(p.numel() for p in ddp.parameters()),
        "bucket_sizes": [int(s) for s in sizes.split(",") if s.strip()],
        "diffs": diffs,
    }


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
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # see nccl_ddp_worker.py: Gloo's threads may abort at teardown

"""One rank of scripts/bench_train_lab.py: a plain DDP job, metered by netopt's StepMeter.

python bench_train_worker.py RANK WORLD MASTER_ADDR:PORT IFNAME HOOK POWERSGD_RANK STEPS TIMEOUT_S

The issue's shape: a 2.0 M-parameter MLP (six 576x576 layers, 8 MB of fp32
gradients), Gloo on CPU, DDP's default buckets, a real DataLoader over
in-memory batches. HOOK is ``plain`` (no netopt: DDP's own all-reduce, timed)
or a hook name netopt advised, applied with ``apply_comm_hook``. Rank 0 prints
one JSON line: the per-step records and the wall time of the steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

from netopt.torch import StepMeter, apply_comm_hook, import_torch
from netopt.torch.procexit import exit_skipping_teardown

WIDTH, LAYERS, BATCH = 576, 6, 32


def main() -> int:
    rank, world, master, ifname = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    hook, powersgd_rank, steps = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    timeout_s = float(sys.argv[8])
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    torch = import_torch()
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))  # fmt: skip
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    meter = StepMeter(f"bench-{hook}", rank=rank)
    if hook == "plain":
        meter.watch(model)
        applied = "none"
    else:
        applied = apply_comm_hook(
            model, hook, powersgd_rank=powersgd_rank, start_powersgd_iter=1, meter=meter
        ).name
    generator = torch.Generator().manual_seed(rank)
    data = [torch.randn(BATCH, WIDTH, generator=generator) for _ in range(steps)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.barrier()
    started = time.perf_counter()
    for batch in meter.batches(loader):
        optimiser.zero_grad()
        model(batch).pow(2).mean().backward()
        optimiser.step()
    wall_s = time.perf_counter() - started
    if rank == 0:
        print(json.dumps({
            "hook": hook, "applied": applied, "wall_s": wall_s,
            "params": sum(p.numel() for p in model.parameters()),
            "records": [r.__dict__ for r in meter.records],
        }), flush=True)  # fmt: skip
    dist.barrier()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

"""One rank of the DDP comm-hook test: python nccl_ddp_worker.py RANK WORLD PORT HOOK...

For each hook, trains a fresh bias-free 8x8 linear layer for three steps over
Gloo on loopback with the hook netopt applies, then prints the final gradient
and facts about it as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

from netopt.torch import apply_comm_hook, import_torch
from netopt.torch.procexit import exit_skipping_teardown


def main() -> int:
    rank, world, port, hooks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = import_torch()
    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    for hook in hooks:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8, bias=False))
        applied = apply_comm_hook(model, hook, powersgd_rank=1, start_powersgd_iter=2)
        generator = torch.Generator().manual_seed(100 + rank)
        for _ in range(3):
            model.zero_grad()
            model(torch.randn(4, 8, generator=generator)).pow(2).sum().backward()
        grad = model.module.weight.grad.detach().clone()
        values = grad.flatten().tolist()
        print(json.dumps({
            "hook": hook,
            "rank": rank,
            "grad": values,
            "fp16_exact": all(v == float(torch.tensor(v).half().float()) for v in values),
            "applied": applied.name,
            "matrix_rank": int(torch.linalg.matrix_rank(grad)),
            "state": type(applied.state).__name__,
        }), flush=True)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

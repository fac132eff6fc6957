"""One rank of the alternating PowerSGD tests: python alternating_worker.py RANK WORLD PORT.

netopt's hierarchical PowerSGD hook with ``powersgd_alternate=True`` (after the
warm-up and a first low-rank step of P and Q, one border exchange per bucket and step:
P, Q, P, ...) on four Gloo ranks, regions 3+1, several DDP buckets. Parts, each one JSON line:

- ``square``: seven 512x512 layers (2 MB buckets: 2, 2, 2, 1 layers), full rank,
  every matrix compressed: both projections are the identity, so every step must
  equal the default group's ``all_reduce`` mean (relative error per step);
- ``bench``: the bench's 5.7 M-parameter transformer (``netopt bench train``'s
  default shape, 8 MB buckets), rank 4: per low-rank step the relative error against
  the exact mean, a fingerprint of the result (every rank must hold the same), and
  for every compressed matrix how far the result leaves the subspace the previous
  step's result spans (a Q step keeps the previous P's columns, a P step the
  previous Q's rows: 0 up to rounding), and its rank;
- ``bench_advised``: the same model at what ``nccl-env`` advises for the bench's lab
  (rank 8, twice PowerSGD's rank 4; 16 MB buckets: two), the same checks;
- ``bench_full``: the same model at rank 1024 (nothing passes the compression
  rate: every tensor averaged whole): equal to the mean.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

from netopt.torch import apply_comm_hook, import_torch
from netopt.torch.procexit import exit_skipping_teardown
from netopt.torch.trainbench import ModelShape, build_model

LAYOUT = ("hk", "hk", "hk", "us")
STEPS = 5  # one warm-up step, one of P and Q, then P, Q, P
BENCH = ModelShape(256, 7, 4, 128)


def square(torch):
    layers = []
    for _ in range(7):
        layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def inputs(torch, kind, rank, step):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    if kind == "square":
        return torch.randn(4 + rank, 512, generator=generator)  # uneven batches
    return torch.randint(0, 256, (2, BENCH.seq + 1), generator=generator)


def loss_of(torch, kind, module, x):
    if kind == "square":
        return module(x).pow(2).mean()
    logits = module(x[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))


def leaves(torch, matrix, basis, columns):
    """How far ``matrix`` leaves the span of ``basis`` (relative; columns or rows)."""
    kept = basis @ (basis.t() @ matrix) if columns else (matrix @ basis) @ basis.t()
    return float((matrix - kept).norm() / matrix.norm())


def run(torch, rank, world, part, kind, psgd_rank, cap_mb):
    dist = torch.distributed
    torch.manual_seed(0)
    module = square(torch) if kind == "square" else build_model(torch, BENCH, 0)
    reference = copy.deepcopy(module)
    ddp = torch.nn.parallel.DistributedDataParallel(
        module, bucket_cap_mb=cap_mb, broadcast_buffers=False
    )
    applied = apply_comm_hook(
        ddp, "hierarchical_powerSGD_hook", regions=LAYOUT, powersgd_rank=psgd_rank,
        start_powersgd_iter=1, powersgd_alternate=True,
    )  # fmt: skip
    state = applied.state
    if kind == "square":
        state.min_compression_rate = 0.0  # every matrix through the projections
    optimiser = torch.optim.SGD(ddp.parameters(), lr=0.05)
    errors, prints, subspace, ranks = [], [], [], []
    previous = None
    for step in range(STEPS):
        x = inputs(torch, kind, rank, step)
        reference.load_state_dict(module.state_dict())
        reference.zero_grad()
        loss_of(torch, kind, reference, x).backward()
        exact = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        dist.all_reduce(exact)
        exact /= world
        optimiser.zero_grad()
        loss_of(torch, kind, ddp, x).backward()
        grads = [p.grad.detach().clone() for p in ddp.parameters()]
        got = torch.cat([g.reshape(-1) for g in grads])
        errors.append(float((got - exact).norm() / exact.norm()))
        prints.append(float(got.double().sum()))
        compressed = [g for g in grads if g.dim() == 2 and state.compresses(tuple(g.shape))]
        if step >= 2 and previous is not None:
            q_step = step % 2 == 1  # step 1: P and Q (PowerSGD's), then 2: P, 3: Q, 4: P
            worst = 0.0
            for matrix, before in zip(compressed, previous, strict=True):
                u, _s, vh = torch.linalg.svd(before.double(), full_matrices=False)
                r = min(psgd_rank, *before.shape)
                basis = u[:, :r] if q_step else vh[:r].t()
                worst = max(worst, leaves(torch, matrix.double(), basis, q_step))
            subspace.append(worst)
        ranks.append(max((int(torch.linalg.matrix_rank(m)) for m in compressed), default=0))
        previous = compressed
        optimiser.step()
    sizes = str(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
    return {"part": part, "psgd_rank": psgd_rank, "rank": rank, "errors": errors,
            "fingerprints": prints, "subspace": subspace,
            "ranks": ranks, "compressed": len(previous or []),
            "applied": applied.name, "note": applied.note,
            "buckets": len(sizes.split(","))}  # fmt: skip


def main() -> int:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = import_torch()
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    parts = (("square", "square", 1024, 2), ("bench", "bench", 4, 8),
             ("bench_advised", "bench", 8, 16), ("bench_full", "bench", 1024, 8))  # fmt: skip
    for part, kind, psgd_rank, cap_mb in parts:
        print(json.dumps(run(torch, rank, world, part, kind, psgd_rank, cap_mb)), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

"""One rank of the step-meter test: python stepmeter_worker.py RANK WORLD PORT OUTDIR.

A 2.0 M-parameter MLP under DDP (1 MB buckets) over Gloo on loopback, fed by a
real DataLoader whose dataset sleeps DATA_SLEEP_S per batch. Two phases of
STEPS steps, each metered by netopt's StepMeter: ``plain`` (netopt's advised
'none', DDP's all-reduce, timed) and ``slow_comm`` (a hook whose last bucket's
future completes COMM_SLEEP_S late, as a slow link would). Rank 1 logs to a path
under a regular file, which cannot exist: the meter must warn and go on.
Prints one JSON line per phase: the meter's records and its Prometheus file, and
the worker's own timings of what the meter should see: each batch's read, and
(slow_comm) the last bucket's all-reduce (from the hook's call, the slower rank's
lateness included) and its sleep.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from netopt.torch import StepMeter, apply_comm_hook, import_torch
from netopt.torch.procexit import exit_skipping_teardown

WIDTH, LAYERS, BATCH, STEPS = 576, 6, 32, 6
DATA_SLEEP_S, COMM_SLEEP_S = 0.15, 0.2


def main() -> int:
    rank, world, port, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = import_torch()
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=30),
    )  # fmt: skip

    fetch_s: list[float] = []  # what each batch's read really took (a loaded machine oversleeps)
    last_bucket: list[dict[str, float]] = []  # the slow hook's last bucket, per step

    class SlowBatches(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return STEPS

        def __getitem__(self, index: int):
            start = time.perf_counter()
            time.sleep(DATA_SLEEP_S)  # a slow read, as from a far-away store
            generator = torch.Generator().manual_seed(1000 * rank + index)
            batch = torch.randn(BATCH, WIDTH, generator=generator)
            fetch_s.append(time.perf_counter() - start)
            return batch

    def slow_allreduce(state, bucket):
        called = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        last = bucket.is_last()

        def finish(f):
            if last:
                reduced = time.perf_counter()  # includes waiting for the slower rank
                time.sleep(COMM_SLEEP_S)  # the link's share the backward pass cannot hide
                slept = time.perf_counter() - reduced
                last_bucket.append({"allreduce_s": reduced - called, "sleep_s": slept})
            return f.value()[0].div_(world)

        return fut.then(finish)

    for phase in ("plain", "slow_comm"):
        fetch_s.clear()
        last_bucket.clear()
        torch.manual_seed(0)
        layers = []
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(*layers), bucket_cap_mb=1
        )
        log = outdir / f"{phase}-{rank}.jsonl" if rank == 0 else outdir / "file" / "x.jsonl"
        prom = outdir / f"{phase}-{rank}.prom"
        meter = StepMeter(f"test-{phase}", log_path=log, prom_path=prom, prom_every=3, rank=rank)
        if phase == "plain":
            apply_comm_hook(model, "none", meter=meter)
        else:
            meter.watch(model, hook=slow_allreduce)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(SlowBatches(), batch_size=None)
        for batch in meter.batches(loader):
            optimiser.zero_grad()
            model(batch).pow(2).mean().backward()
            optimiser.step()
        print(json.dumps({
            "phase": phase,
            "rank": rank,
            "params": sum(p.numel() for p in model.parameters()),
            "records": [r.__dict__ for r in meter.records],
            "fetch_s": fetch_s,
            "last_bucket": last_bucket,
            "prom": prom.read_text(),
        }), flush=True)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_skipping_teardown(main())

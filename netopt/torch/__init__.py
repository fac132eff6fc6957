"""PyTorch integration (the ``torch`` extra). Nothing here imports torch at import time.

- :func:`apply_comm_hook` / :func:`apply_advice`: register the DDP communication
  hook ``netopt nccl-env`` advised on a ``DistributedDataParallel`` model.
- :class:`CachedDataset` / :class:`CachedSampler`: a map-style dataset over a synced
  dataset's files that prefetches ahead of the sampler and feeds the cache's access
  statistics (works with DataLoader worker processes).
- :func:`apply_local_sgd`: local SGD over the regions (``post_localSGD_hook`` and
  periodic model averaging), as advised when even PowerSGD leaves a step
  communication-bound.
- :class:`StepMeter`: per step of the user's loop, the data wait, the gradient
  communication not overlapped and the compute; JSON lines and a Prometheus file.
- :mod:`netopt.torch.bench`: the all-reduce benchmark behind ``netopt bench allreduce``;
  :mod:`netopt.torch.trainbench` and :mod:`netopt.torch.train_worker`: ``netopt bench train``.
"""

from __future__ import annotations

from netopt.torch.dataset import CachedDataset, CachedSampler, JournalStats
from netopt.torch.hooks import HOOKS, AppliedHook, apply_advice, apply_comm_hook, import_torch
from netopt.torch.localsgd import LocalSgd, apply_local_sgd
from netopt.torch.stepmeter import StepMeter, StepRecord

__all__ = [
    "HOOKS",
    "AppliedHook",
    "CachedDataset",
    "CachedSampler",
    "JournalStats",
    "LocalSgd",
    "StepMeter",
    "StepRecord",
    "apply_advice",
    "apply_comm_hook",
    "apply_local_sgd",
    "import_torch",
]

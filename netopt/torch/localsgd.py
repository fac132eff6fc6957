"""Local SGD over netopt's regions: what ``nccl-env`` advises when even PowerSGD is too slow.

PyTorch ships the pieces (``post_localSGD_hook``, ``PeriodicModelAverager``);
this wires them to the regions: after ``warmup_steps`` synchronous steps the
gradients are all-reduced inside each region only, and every ``period_steps``
steps the models are averaged over all ranks, the one border crossing::

    local = apply_local_sgd(ddp_model, regions, period_steps=advice.averaging.period_steps)
    for batch in loader:
        ...; loss.backward(); optimiser.step()
        local.averager.average_parameters(ddp_model.parameters())

Between averages the regions' models differ (see ``Averaging.caveat``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netopt.errors import ValidationError
from netopt.nccl.fewer_syncs import LOCALSGD_WARMUP_STEPS
from netopt.torch.hierarchical import region_members

__all__ = ["LocalSgd", "apply_local_sgd"]

_ALGORITHMS = "torch.distributed.algorithms"


@dataclass(frozen=True)
class LocalSgd:
    """The registered hook's state, the averager to call after each optimizer step, the group."""

    state: Any
    averager: Any
    region_group: Any


def apply_local_sgd(
    model: Any,
    regions: Sequence[str],
    *,
    period_steps: int,
    warmup_steps: int = LOCALSGD_WARMUP_STEPS,
) -> LocalSgd:
    """Register ``post_localSGD_hook`` with this rank's region as its subgroup.

    Collective: every rank calls it at the same point with the same ``regions``
    (the region of each rank, in rank order); one group per region is created,
    single-rank regions included. Raises ValidationError for a period under 2,
    a negative warm-up or regions that do not name every rank.
    """
    from netopt.torch.hooks import import_torch

    torch = import_torch()
    dist = torch.distributed
    if period_steps < 2:
        raise ValidationError(f"an averaging period of {period_steps} steps is not local SGD")
    if warmup_steps < 0:
        raise ValidationError(f"warm-up steps {warmup_steps} must be >= 0")
    if len(regions) != dist.get_world_size():
        raise ValidationError(
            f"{len(regions)} regions given for a world of {dist.get_world_size()} ranks"
        )
    ranks = [list(members) for _name, members in region_members(regions)]
    region_group, _all = dist.new_subgroups_by_enumeration(ranks_per_subgroup_list=ranks)
    hooks = importlib.import_module(f"{_ALGORITHMS}.ddp_comm_hooks.post_localSGD_hook")
    averagers = importlib.import_module(f"{_ALGORITHMS}.model_averaging.averagers")
    state = hooks.PostLocalSGDState(
        process_group=None, subgroup=region_group, start_localSGD_iter=warmup_steps
    )
    model.register_comm_hook(state, hooks.post_localSGD_hook)
    averager = averagers.PeriodicModelAverager(period=period_steps, warmup_steps=warmup_steps)
    return LocalSgd(state, averager, region_group)

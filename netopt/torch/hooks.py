"""Apply the advised DDP communication hook to a ``DistributedDataParallel`` model."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from netopt.errors import DependencyError, ValidationError
from netopt.nccl.model import Advice
from netopt.torch.hierarchical import (
    HierarchicalState,
    hierarchical_hook,
    hierarchical_powersgd_state,
    region_groups,
)
from netopt.torch.lowrank import LowRankState, lowrank_hook
from netopt.torch.stepmeter import StepMeter

__all__ = ["HOOKS", "AppliedHook", "apply_advice", "apply_comm_hook", "import_torch"]

HOOKS = (
    "none",
    "bf16_compress_hook",
    "powerSGD_hook",
    "hierarchical_allreduce_hook",
    "hierarchical_powerSGD_hook",
)
_HOOKS_PKG = "torch.distributed.algorithms.ddp_comm_hooks"


@dataclass(frozen=True)
class AppliedHook:
    """What was registered: the hook's name, its state, and why if it differs from advice."""

    name: str
    state: Any = None
    note: str = ""


def import_torch() -> ModuleType:
    """Import torch, or raise DependencyError naming the extra to install.

    torch warns at import when numpy is missing; that warning is not ours to
    raise, so it is silenced here.
    """
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            torch = importlib.import_module("torch")
            importlib.import_module("torch.distributed")
    except ImportError as exc:
        raise DependencyError(f"PyTorch is needed: pip install 'netopt[torch]' ({exc})") from None
    return torch


def _backend(torch: ModuleType, process_group: Any) -> str:
    return str(torch.distributed.get_backend(process_group)).lower()


def _bf16_works(torch: ModuleType, process_group: Any) -> bool:
    """PyTorch's bf16 hook needs CUDA and NCCL (it refuses Gloo on CPU)."""
    return bool(torch.cuda.is_available()) and _backend(torch, process_group) == "nccl"


def _register(model: Any, state: Any, hook: Any, meter: StepMeter | None) -> None:
    model.register_comm_hook(state, hook if meter is None else meter.wrap_hook(hook))


def _apply_lowrank(
    torch: ModuleType,
    model: Any,
    process_group: Any,
    rank: int,
    start_iter: int,
    meter: StepMeter | None,
) -> AppliedHook:
    """netopt's PowerSGD-style hook, for backends where PyTorch's cannot run (Gloo).

    Creates a second group of the same ranks for the Q all-reduces, so every
    rank must call this at the same point (as it must register any hook).
    """
    dist = torch.distributed
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    q_group = dist.new_group(ranks=ranks, backend=_backend(torch, process_group))
    state = LowRankState(
        torch=torch,
        process_group=process_group,
        q_group=q_group,
        matrix_approximation_rank=rank,
        start_iter=start_iter,
    )
    _register(model, state, lowrank_hook, meter)
    note = (
        "PyTorch's powerSGD_hook aborts or hangs on Gloo with more than one DDP bucket "
        "(its callbacks issue all-reduces in a different order on each rank): "
        "netopt's lowrank_hook does the same maths with the order fixed"
    )
    return AppliedHook("netopt_lowrank_hook", state, note)


def apply_comm_hook(
    model: Any,
    hook: str,
    *,
    powersgd_rank: int | None = None,
    process_group: Any = None,
    start_powersgd_iter: int = 1000,
    meter: StepMeter | None = None,
    regions: Sequence[str] | None = None,
    powersgd_alternate: bool = False,
) -> AppliedHook:
    """Register ``hook`` (one of HOOKS) on ``model``, a DistributedDataParallel.

    ``bf16_compress_hook`` becomes ``fp16_compress_hook`` (the same bytes on the
    wire) where PyTorch cannot run bf16 (no CUDA or not NCCL); the note says so.
    ``powerSGD_hook`` is PyTorch's on NCCL; on other backends (Gloo), where
    PyTorch's aborts or hangs as soon as DDP has two buckets, it is netopt's
    :func:`~netopt.torch.lowrank.lowrank_hook` (same maths, the note says so).
    ``hierarchical_allreduce_hook`` is netopt's
    :func:`~netopt.torch.hierarchical.hierarchical_hook` over the region subgroups
    of ``regions`` (the region of each rank, e.g. from ``gather_regions``); every
    rank must call this at the same point (it creates process groups).
    ``hierarchical_powerSGD_hook`` is netopt's low-rank hook whose P and Q
    all-reduces run through that hierarchy: the border carries two small
    exchanges between the region leaders per bucket (``powersgd_rank`` needed);
    ``powersgd_alternate=True`` makes that one exchange, P or Q in turn (half a power
    iteration per step, see :mod:`netopt.torch.lowrank`; this hook only).
    With ``meter`` the hook's futures are timed for that :class:`StepMeter`.
    For PowerSGD keep ``AppliedHook.state`` (its error feedback) with checkpoints.
    Raises ValidationError for another model type, an unknown hook or a missing
    PowerSGD rank; DependencyError without torch (or numpy, which PowerSGD needs).
    """
    torch = import_torch()
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ValidationError(f"expected a DistributedDataParallel model, got {type(model)!r}")
    if hook not in HOOKS:
        raise ValidationError(
            f"unknown DDP comm hook {hook!r} (expected one of {', '.join(HOOKS)})"
        )
    if hook == "none":
        if meter is not None:  # DDP's own all-reduce, as a hook the meter can time
            meter.watch(model, process_group)
        return AppliedHook("none")
    if hook == "hierarchical_allreduce_hook":
        if regions is None:
            raise ValidationError("the hierarchical all-reduce needs the region of each rank")
        if process_group is not None:
            raise ValidationError("the hierarchical all-reduce runs on the default group only")
        groups = region_groups(torch, regions)
        _register(model, HierarchicalState(torch, groups), hierarchical_hook, meter)
        return AppliedHook(hook, groups)
    if hook == "hierarchical_powerSGD_hook":
        if regions is None or process_group is not None:
            raise ValidationError(
                "the hierarchical PowerSGD hook needs the region of each rank and runs on "
                "the default group only"
            )
        if powersgd_rank is None or powersgd_rank < 1:
            raise ValidationError(f"PowerSGD needs a rank >= 1, got {powersgd_rank}")
        state, groups = hierarchical_powersgd_state(
            torch, regions, powersgd_rank, start_powersgd_iter, alternate=powersgd_alternate
        )
        _register(model, state, lowrank_hook, meter)
        note = (
            "netopt's lowrank_hook (PowerSGD's maths, error feedback) with its P and Q "
            "all-reduces reduced inside each region, exchanged between the region leaders "
            "and broadcast back"
        )
        if powersgd_alternate:
            note += ": one of them per step, P and Q in turn (one border exchange a bucket)"
        return AppliedHook(hook, state, note)
    if powersgd_alternate:
        raise ValidationError("powersgd_alternate is for the hierarchical PowerSGD hook only")
    default_hooks = importlib.import_module(f"{_HOOKS_PKG}.default_hooks")
    if hook == "bf16_compress_hook":
        if _bf16_works(torch, process_group):
            _register(model, process_group, default_hooks.bf16_compress_hook, meter)
            return AppliedHook(hook, process_group)
        _register(model, process_group, default_hooks.fp16_compress_hook, meter)
        note = "bf16 needs CUDA and NCCL here: fp16_compress_hook sends the same bytes"
        return AppliedHook("fp16_compress_hook", process_group, note)
    if powersgd_rank is None or powersgd_rank < 1:
        raise ValidationError(f"PowerSGD needs a rank >= 1, got {powersgd_rank}")
    if _backend(torch, process_group) != "nccl":
        return _apply_lowrank(
            torch, model, process_group, powersgd_rank, start_powersgd_iter, meter
        )
    try:
        powersgd = importlib.import_module(f"{_HOOKS_PKG}.powerSGD_hook")
        state = powersgd.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=start_powersgd_iter,
        )
    except ImportError as exc:
        raise DependencyError(
            f"PowerSGD needs numpy: pip install 'netopt[torch]' ({exc})"
        ) from None
    _register(model, state, powersgd.powerSGD_hook, meter)
    return AppliedHook(hook, state)


def apply_advice(
    model: Any,
    advice: Advice,
    *,
    process_group: Any = None,
    start_powersgd_iter: int = 1000,
    meter: StepMeter | None = None,
    regions: Sequence[str] | None = None,
) -> AppliedHook:
    """Register the hook ``advice`` names (see :func:`apply_comm_hook`)."""
    return apply_comm_hook(
        model,
        advice.hook,
        powersgd_rank=advice.powersgd_rank,
        process_group=process_group,
        start_powersgd_iter=start_powersgd_iter,
        meter=meter,
        regions=regions,
        powersgd_alternate=advice.powersgd_alternate,
    )

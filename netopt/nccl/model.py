"""The data the NCCL tuner reads and writes: frozen dataclasses, no I/O.

Inputs are what netopt measured (``NodeInfo`` with its ``Nic`` list, ``LinkFigures``
per node pair) plus ``TuneOptions``; the output is ``NcclSettings``: environment
values shared by all nodes, values that differ per node (interface names), the
training ``Advice`` and the cost model's ``Prediction`` table. Every value carries
a one-line reason, which the env file prints as a comment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from netopt.errors import ValidationError
from netopt.nccl.fewer_syncs import Accumulation, Averaging
from netopt.nccl.rankorder import RankOrder
from netopt.wire.schema import Nic  # the one NIC type (re-exported: the tuner's input)

__all__ = [
    "DEFAULT_MESSAGE_SIZES_BYTES",
    "Advice",
    "EnvValue",
    "LinkFigures",
    "NcclSettings",
    "NcclVersion",
    "Nic",
    "NodeInfo",
    "Prediction",
    "TuneOptions",
    "TunerRow",
    "parse_version",
]

NcclVersion = tuple[int, int, int]
"""A library version as ``(major, minor, patch)``, for example ``(2, 21, 5)``."""

_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?(?:[-+.].*)?\s*$")

DEFAULT_MESSAGE_SIZES_BYTES: tuple[int, ...] = tuple(1024 * 4**i for i in range(10))
"""1 KiB, 4 KiB, ... 256 MiB: the sizes ``--explain`` and the bench report."""


def parse_version(text: str, what: str = "NCCL version") -> NcclVersion:
    """``"2.21.5"`` -> ``(2, 21, 5)``; ``"2.24"`` -> ``(2, 24, 0)``.

    Raises ValidationError for anything that is not ``MAJOR.MINOR[.PATCH]``.
    """
    match = _VERSION_RE.match(text)
    if not match:
        raise ValidationError(f"{what} {text!r} is not MAJOR.MINOR[.PATCH] (for example 2.21.5)")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


@dataclass(frozen=True)
class NodeInfo:
    """A node: its name, its region and its NICs."""

    name: str
    region: str
    nics: tuple[Nic, ...] = ()

    def nic(self, name: str) -> Nic | None:
        """The NIC called ``name`` (exact), or None."""
        return next((n for n in self.nics if n.name == name), None)


@dataclass(frozen=True)
class LinkFigures:
    """What was measured between two nodes (the same both ways).

    ``single_stream_mbps`` is the goodput of one TCP flow, ``link_mbps`` the
    bottleneck capacity (many flows or the NIC/contract rate), ``outages_s`` the
    lengths of the outages seen. ``interfaces`` names the NIC used at each end
    (``a`` then ``b``) when the measurement was bound to one; ``rdma`` says whether
    RDMA works end to end on this pair; ``congestion_control`` is what the hosts'
    TCP runs (the Mathis loss bound only holds for loss-based ones).
    """

    a: str
    b: str
    rtt_ms: float
    loss_ratio: float
    single_stream_mbps: float
    link_mbps: float
    outages_s: tuple[float, ...] = ()
    interfaces: tuple[str, str] | None = None
    rdma: bool = False
    congestion_control: str = "cubic"

    @property
    def loss_based(self) -> bool:
        """Whether the hosts' TCP backs off on loss (reno, cubic...): BBR does not."""
        return not self.congestion_control.startswith("bbr")

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.a, self.b))

    def nic_at(self, node: str) -> str | None:
        """The NIC this measurement used at ``node`` (None: not recorded)."""
        if self.interfaces is None:
            return None
        return self.interfaces[0] if node == self.a else self.interfaces[1]


@dataclass(frozen=True)
class TuneOptions:
    """Knobs of the tuner that are not measurements.

    ``params`` and ``step_compute_ms`` (both or neither) enable the DDP hook advice;
    ``grad_bytes_per_param`` is 4 for fp32 gradients; ``bucket_bytes`` is DDP's
    bucket size (the message size NCCL_ALGO is chosen for); ``torch_version``
    decides between TORCH_NCCL_ASYNC_ERROR_HANDLING and the older name.
    """

    mss_bytes: int = 1448
    params: int | None = None
    step_compute_ms: float | None = None
    grad_bytes_per_param: int = 4
    bucket_bytes: int = 25 * 1024 * 1024
    torch_version: NcclVersion = (2, 4, 0)
    max_buffsize_bytes: int = 32 * 1024 * 1024
    message_sizes_bytes: tuple[int, ...] = DEFAULT_MESSAGE_SIZES_BYTES
    layer_dim: int = 4096
    tuner_csv: bool = False
    backend: str = "nccl"
    """The process group's backend the hook and bucket advice is for: ``nccl`` or
    ``gloo`` (Gloo's messages wait for the receiver's ready notice, one flow a pair)."""
    grad_layout: tuple[tuple[int, int], ...] | None = None
    """Each parameter as (rows, columns) in definition order (a vector: (n, 1)), for
    the bucket and PowerSGD byte counts; None: ``params`` as ``layer_dim`` squares."""

    def __post_init__(self) -> None:
        if (self.params is None) != (self.step_compute_ms is None):
            raise ValidationError("give both the parameter count and the compute time per step")
        if self.params is not None and self.params <= 0:
            raise ValidationError(f"parameter count {self.params} must be positive")
        if self.step_compute_ms is not None and self.step_compute_ms <= 0:
            raise ValidationError(f"compute time per step {self.step_compute_ms} ms must be > 0")
        if self.backend not in ("nccl", "gloo"):
            raise ValidationError(f"backend {self.backend!r} is not one of nccl, gloo")
        if self.grad_layout is not None:
            if any(len(t) != 2 or min(t) < 1 for t in self.grad_layout):
                raise ValidationError("every gradient layout entry is (rows >= 1, columns >= 1)")
            total = sum(r * c for r, c in self.grad_layout)
            if total != self.params:
                raise ValidationError(
                    f"the gradient layout holds {total} parameters, not the {self.params} given"
                )
        if self.mss_bytes < 500 or self.mss_bytes > 65495:
            raise ValidationError(f"MSS {self.mss_bytes} bytes is outside 500..65495")


@dataclass(frozen=True)
class EnvValue:
    """One environment variable, its value and why."""

    key: str
    value: str
    reason: str


@dataclass(frozen=True)
class Prediction:
    """The cost model's all-reduce time for one algorithm and message size."""

    algorithm: str
    size_bytes: int
    time_s: float

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth as nccl-tests reports it: size / time, in GB/s."""
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class TunerRow:
    """One line of the example tuner plugin's CSV (ext-tuner/example, nccl_tuner.conf)."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int


@dataclass(frozen=True)
class Advice:
    """What to do in the training script, as data and as reasons."""

    timeout_s: int
    timeout_reason: str
    hook: str
    hook_reason: str
    powersgd_rank: int | None = None
    comm_share: float | None = None
    notes: tuple[str, ...] = ()
    accumulation: Accumulation | None = None
    """Gradient accumulation, when communication is over the target share."""
    averaging: Averaging | None = None
    """Local SGD over the regions, when even PowerSGD leaves it over the target."""
    bucket_cap_mb: int | None = None
    """DDP's ``bucket_cap_mb`` for overlap with the backward pass (None: no advice)."""
    bucket_reason: str = ""
    powersgd_alternate: bool = False
    """The hierarchical PowerSGD hook sends P or Q in turn, one exchange per step
    (``apply_comm_hook(..., powersgd_alternate=True)``)."""


@dataclass(frozen=True)
class NcclSettings:
    """The tuner's output: common values, per-node values, advice, predictions."""

    nccl_version: NcclVersion
    nodes: tuple[str, ...]
    common: tuple[EnvValue, ...]
    per_node: Mapping[str, tuple[EnvValue, ...]]
    advice: Advice
    predictions: tuple[Prediction, ...] = ()
    tuner_rows: tuple[TunerRow, ...] = ()
    warnings: tuple[str, ...] = ()
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    rank_order: RankOrder | None = None
    """The node order given and the region-contiguous one (see ``nccl.rankorder``)."""

    def env_for(self, node: str) -> dict[str, str]:
        """Every variable ``node`` must set (common first, then its own)."""
        values = {v.key: v.value for v in self.common}
        values.update({v.key: v.value for v in self.per_node.get(node, ())})
        return values

    def all_values(self) -> tuple[EnvValue, ...]:
        """Common values and every node's values, in order."""
        out = list(self.common)
        for node in self.nodes:
            out.extend(self.per_node.get(node, ()))
        return tuple(out)

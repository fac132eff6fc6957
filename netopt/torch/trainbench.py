"""``netopt bench train``: the parts that do not need a lab, nor torch at import time.

- Token shards from real text on the machine (:func:`make_shards`): the Python
  standard library's sources and ``/usr/share/doc``, read in path order, one token
  per byte (a byte-level tokenizer: vocabulary 256, no BPE), cut into files of
  ``shard_bytes``.
- The model (:func:`build_model`): a small causal transformer language model over
  those bytes, built from the seed.
- The data order (:func:`sample_order`, :func:`batch_indices`): every window of
  ``seq + 1`` bytes of every shard, shuffled by the seed; step ``s`` of rank ``r``
  takes ``batch`` of them. Both runs see the same samples at the same step.
- Running the ranks (:func:`run_train_ranks`) and summing up a run
  (:func:`summarize`), the cost model's step time (:func:`predicted_step_s`), the
  training goals (:func:`goals`), and the plot (:func:`write_svg`, without
  matplotlib).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netopt.errors import NetworkError, ValidationError
from netopt.nccl.costmodel import Fabric, gloo_hierarchical_allreduce_s, gloo_ring_allreduce_s
from netopt.tcpmath import idle_restart_s

__all__ = [
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "RESULT_PREFIX",
    "TRAIN_HOOKS",
    "ModelShape",
    "RunSummary",
    "batch_indices",
    "build_model",
    "exposed_after_backward_s",
    "goals",
    "idle_comm_s",
    "make_shards",
    "predicted_comm_s",
    "predicted_step_s",
    "run_train_ranks",
    "sample_order",
    "shard_name",
    "summarize",
    "text_sources",
    "write_svg",
]

RESULT_PREFIX = "NETOPT_TRAIN "
TRAIN_HOOKS = (
    "none", "fp16", "powersgd", "hierarchical", "hierarchical-fp16", "hierarchical-powersgd",
    "hierarchical-powersgd-alternating",
)  # fmt: skip
DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's default ``bucket_cap_mb`` (25 MiB)."""
DDP_FIRST_BUCKET_BYTES = 2**20
"""DDP's first bucket is capped at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``)."""
VOCAB = 256


@dataclass(frozen=True)
class ModelShape:
    """The language model: width, depth, attention heads, context length."""

    dim: int
    layers: int
    heads: int
    seq: int

    def __post_init__(self) -> None:
        if self.dim < 8 or self.layers < 1 or self.heads < 1 or self.seq < 2:
            raise ValidationError(f"model {self}: need dim >= 8, layers >= 1, heads >= 1, seq >= 2")
        if self.dim % self.heads:
            raise ValidationError(f"model dim {self.dim} is not a multiple of {self.heads} heads")

    @property
    def params(self) -> int:
        """Parameter count of :func:`build_model` (embeddings, layers, head)."""
        d = self.dim
        layer = (3 * d * d + 3 * d) + (d * d + d) + (8 * d * d + 5 * d) + 4 * d
        return VOCAB * d + self.seq * d + self.layers * layer + 2 * d + d * VOCAB + VOCAB

    def grad_layout(self) -> tuple[tuple[int, int], ...]:
        """Every parameter of :func:`build_model` as (rows, columns), in definition order
        (the order DDP's buckets are built from; a vector is (n, 1))."""
        d = self.dim
        block = ((3 * d, d), (3 * d, 1), (d, d), (d, 1), (4 * d, d), (4 * d, 1), (d, 4 * d),
                 (d, 1), (d, 1), (d, 1), (d, 1), (d, 1))  # fmt: skip
        return ((VOCAB, d), (self.seq, d), *block * self.layers, (d, 1), (d, 1), (VOCAB, d),
                (VOCAB, 1))  # fmt: skip


def build_model(torch: Any, shape: ModelShape, seed: int) -> Any:
    """A pre-norm causal transformer over bytes, its weights drawn from ``seed``."""
    nn = torch.nn
    torch.manual_seed(seed)

    class ByteLM(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, shape.dim)
            self.position = nn.Embedding(shape.seq, shape.dim)
            layer = nn.TransformerEncoderLayer(
                shape.dim, shape.heads, 4 * shape.dim, dropout=0.0, batch_first=True,
                norm_first=True,
            )  # fmt: skip
            self.blocks = nn.TransformerEncoder(layer, shape.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(shape.dim)
            self.head = nn.Linear(shape.dim, VOCAB)
            mask = torch.triu(torch.full((shape.seq, shape.seq), float("-inf")), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, tokens: Any) -> Any:
            n = tokens.shape[1]
            positions = torch.arange(n, device=tokens.device)
            x = self.embed(tokens) + self.position(positions)
            x = self.blocks(x, mask=self.mask[:n, :n], is_causal=True)
            return self.head(self.norm(x))

    return ByteLM()


def shard_name(index: int) -> str:
    """The file name of shard ``index``."""
    return f"shard-{index:05d}.bin"


def text_sources() -> tuple[Path, ...]:
    """The directories whose text the shards are made of: the standard library, docs."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return tuple(p for p in (stdlib, Path("/usr/share/doc")) if p.is_dir())


_TEXT_SUFFIXES = (".py", ".txt", ".rst", ".md", "copyright", "README", "changelog")


def _text_files(roots: Iterable[Path]) -> Iterable[Path]:
    """Text files under ``roots`` in path order, walked lazily (the caller stops early)."""
    for root in roots:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = Path(directory, name)
                if name.endswith(_TEXT_SUFFIXES) and path.is_file() and not path.is_symlink():
                    yield path


def make_shards(dest: Path, shards: int, shard_bytes: int, roots: Sequence[Path]) -> int:
    """Write ``shards`` files of ``shard_bytes`` bytes of text from ``roots`` into ``dest``.

    Files are read in path order (so the shards are the same on every run of one
    machine) until there is enough text. Returns the bytes written. Raises
    ValidationError for bad sizes or too little text.
    """
    if shards < 1 or shard_bytes < 1024:
        raise ValidationError(f"need shards >= 1 and shard bytes >= 1024 ({shards}, {shard_bytes})")
    wanted = shards * shard_bytes
    parts: list[bytes] = []
    have = 0
    for path in _text_files(roots):
        with contextlib.suppress(OSError):
            data = path.read_bytes()[: wanted - have]
            parts.append(data)
            have += len(data)
        if have >= wanted:
            break
    if have < wanted:
        raise ValidationError(f"only {have} bytes of text under {', '.join(map(str, roots))}")
    text = b"".join(parts)
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        (dest / shard_name(i)).write_bytes(text[i * shard_bytes : (i + 1) * shard_bytes])
    return wanted


def sample_order(shards: int, shard_bytes: int, seq: int, seed: int) -> list[tuple[int, int]]:
    """Every (shard, offset) window of ``seq + 1`` bytes, shuffled by ``seed``."""
    per_shard = shard_bytes // (seq + 1)
    if per_shard < 1:
        raise ValidationError(f"shards of {shard_bytes} bytes hold no window of {seq + 1}")
    order = [(s, w * (seq + 1)) for s in range(shards) for w in range(per_shard)]
    random.Random(seed).shuffle(order)
    return order


def batch_indices(step: int, rank: int, world: int, batch: int) -> range:
    """The positions in :func:`sample_order` that rank ``rank`` trains on at ``step``."""
    start = (step * world + rank) * batch
    return range(start, start + batch)


def run_train_ranks(
    start_rank: Callable[[int, list[str]], Any],
    argv_for: Callable[[int], list[str]],
    ranks: int,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Start every rank with ``start_rank(rank, argv)``; every rank's result, by rank.

    Every process is waited for and killed past ``timeout_s``. Raises NetworkError
    when a rank fails, runs over or prints no result.
    """
    procs = [start_rank(rank, argv_for(rank)) for rank in range(ranks)]
    deadline = time.monotonic() + timeout_s
    outputs: list[tuple[str, str]] = [("", "")] * ranks
    readers = [_Reader(proc) for proc in procs]
    try:
        while any(proc.poll() is None for proc in procs):
            failed = [r for r, proc in enumerate(procs) if proc.poll() not in (None, 0)]
            if failed:  # the others would wait for it until their timeout: stop them now
                break
            if time.monotonic() > deadline:
                raise NetworkError(f"training ran over {timeout_s:g} s")
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        outputs = [reader.join() for reader in readers]
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        first = min(failed, key=lambda r: (procs[r].returncode < 0, r))  # the one that failed
        raise NetworkError(
            f"train rank {first} exited {procs[first].returncode}: "
            f"{outputs[first][1].strip()[-1500:]}"
        )
    documents = []
    for rank, (out, _err) in enumerate(outputs):
        lines = [x for x in out.splitlines() if x.startswith(RESULT_PREFIX)]
        if not lines:
            raise NetworkError(f"train rank {rank} printed no result")
        documents.append(json.loads(lines[-1][len(RESULT_PREFIX) :]))
    return documents


class _Reader:
    """Drains a process's stdout and stderr on two threads (a full pipe would block it)."""

    def __init__(self, proc: Any) -> None:
        self.parts = ["", ""]
        self.threads = [
            threading.Thread(target=self._drain, args=(i, stream), daemon=True)
            for i, stream in enumerate((proc.stdout, proc.stderr))
        ]
        for thread in self.threads:
            thread.start()

    def _drain(self, index: int, stream: Any) -> None:
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.parts[index] = stream.read()
                stream.close()

    def join(self) -> tuple[str, str]:
        for thread in self.threads:
            thread.join(timeout=10)
        return self.parts[0] or "", self.parts[1] or ""


@dataclass
class RunSummary:
    """One run (defaults or netopt): times, the step's parts, losses, border bytes."""

    name: str
    nodes: tuple[str, ...]
    hook: str
    hook_note: str
    steps: int
    time_to_n_s: float
    setup_s: float
    """Time spent before the first step on the data (netopt: the region-shared sync)."""
    step_s: float
    data_wait_s: float
    comm_exposed_s: float
    compute_s: float
    losses: list[float]
    per_step: list[dict[str, float]]
    grad_bytes: int
    wire_bytes: int
    """S: the gradient bytes one all-reduce puts on the wire (fp16: half)."""
    predicted_step_s: float | None = None
    predicted_comm_s: float | None = None
    border_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes that crossed the border per direction ("hk->us") during the steps."""
    settings: dict[str, Any] = field(default_factory=dict)
    critical_comm_exposed_s: float = 0.0
    """The median over steps 1.. of the exposed communication of the step's busiest rank
    (the most data wait and compute): what no rank spent computing, the time the step
    would lose if communication were free. A less busy rank's exposed time also holds
    its wait for the busiest one's backward pass (``comm_exposed_s`` counts that)."""
    per_rank: list[dict[str, float]] = field(default_factory=list)
    """Each rank's medians over steps 1.. (step, data wait, exposed, compute)."""
    idle_comm_s: float = 0.0
    """The median over steps 1.. of the time no rank computed: from the last rank's last
    hook call (every backward pass done) to the first rank's last future (one rank goes
    on computing). The ranks' clocks are one machine's monotonic clock. Reported beside
    the goal."""
    comm_exposed_after_backward_s: float = 0.0
    """The goal's measure: the median over steps 1.. of
    :func:`exposed_after_backward_s`, the longest any rank's backward pass waited on
    gradient communication once every rank's backward pass was done. ``comm_exposed_s``
    (the slowest step's rank, its own hook futures) also counts a rank's wait for a
    peer still computing, which on this bench is four ranks sharing one machine's
    cores: it is reported beside the goal."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        out = dict(vars(self))
        out["nodes"] = list(self.nodes)
        out["exposed_comm_share"] = self.comm_exposed_s / self.step_s if self.step_s else 0.0
        out["critical_exposed_share"] = (
            self.critical_comm_exposed_s / self.step_s if self.step_s else 0.0
        )
        out["idle_comm_share"] = self.idle_comm_s / self.step_s if self.step_s else 0.0
        out["exposed_after_backward_share"] = (
            self.comm_exposed_after_backward_s / self.step_s if self.step_s else 0.0
        )
        out["final_loss"] = self.final_loss
        out["border_bytes_per_step"] = {k: v / self.steps for k, v in self.border_bytes.items()}
        return out

    @property
    def final_loss(self) -> float:
        """The mean of the last up-to-three steps' losses (one step is noisy)."""
        tail = self.losses[-3:]
        return sum(tail) / len(tail) if tail else math.nan


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def summarize(
    name: str,
    nodes: Sequence[str],
    documents: Sequence[dict[str, Any]],
    *,
    setup_s: float = 0.0,
    settings: dict[str, Any] | None = None,
) -> RunSummary:
    """One run from its ranks' documents: losses averaged over ranks, step parts the
    median over steps 1.. of the slowest rank's step (step 0 warms up connections);
    beside them the busiest rank's exposed time and each rank's medians."""
    steps = min(len(d["losses"]) for d in documents)
    losses = [sum(d["losses"][i] for d in documents) / len(documents) for i in range(steps)]
    per_step, critical, idle, after = [], [], [], []
    for i in range(steps):
        records = [d["records"][i] for d in documents]
        slowest = max(records, key=lambda r: r["step_s"])
        per_step.append({k: float(v) for k, v in slowest.items() if k in _PARTS})
        busiest = max(records, key=lambda r: r["compute_s"] + r["data_wait_s"])
        critical.append(float(busiest["comm_exposed_s"]))
        idle.append(idle_comm_s(records))
        after.append(exposed_after_backward_s(records))
    timed = per_step[1:] or per_step
    parts = _PARTS
    per_rank = [
        {"rank": float(d.get("rank", r)),
         **{k: _median([float(x[k]) for x in d["records"][1:steps] or d["records"]])
            for k in parts}}
        for r, d in enumerate(documents)
    ]  # fmt: skip
    first = documents[0]
    hook = str(first["hook"])
    wire = int(first.get("wire_bytes") or int(first["grad_bytes"]) // (2 if "fp16" in hook else 1))
    return RunSummary(
        name=name,
        nodes=tuple(nodes),
        hook=hook,
        hook_note=str(first.get("hook_note", "")),
        steps=steps,
        time_to_n_s=max(float(d["elapsed_s"]) for d in documents),
        setup_s=setup_s,
        step_s=_median([r["step_s"] for r in timed]),
        data_wait_s=_median([r["data_wait_s"] for r in timed]),
        comm_exposed_s=_median([r["comm_exposed_s"] for r in timed]),
        compute_s=_median([r["compute_s"] for r in timed]),
        losses=losses,
        per_step=per_step,
        grad_bytes=int(first["grad_bytes"]),
        wire_bytes=wire,
        settings=dict(settings or {}),
        critical_comm_exposed_s=_median(critical[1:] or critical),
        per_rank=per_rank,
        idle_comm_s=_median(idle[1:] or idle),
        comm_exposed_after_backward_s=_median(after[1:] or after),
    )


_PARTS = ("step_s", "data_wait_s", "comm_exposed_s", "compute_s")


def idle_comm_s(records: Sequence[dict[str, Any]]) -> float:
    """One step's time no rank computed, from every rank's record of it (pure): the last
    ``comm_from_s`` (the last backward pass done) to the first ``comm_to_s`` (the first
    rank free to compute again); 0 where a rank has no hook call to time."""
    froms = [r.get("comm_from_s") for r in records]
    tos = [r.get("comm_to_s") for r in records]
    if not records or None in froms or None in tos:
        return 0.0
    return max(0.0, min(float(t or 0) for t in tos) - max(float(f or 0) for f in froms))


def exposed_after_backward_s(records: Sequence[dict[str, Any]]) -> float:
    """One step's exposed communication, from every rank's record of it (pure): for each
    rank, from the last ``comm_from_s`` over all ranks (every backward pass done: no
    gradient can be complete before) to its own ``comm_to_s``, at most its own
    ``comm_exposed_s``; the largest over the ranks. A rank's own meter also counts the
    time before that, spent waiting for a peer's backward pass (no communication can
    finish before the last gradient exists). Without the ranks' times (a rank with no
    hook call), the slowest step's rank's own ``comm_exposed_s``."""
    froms = [r.get("comm_from_s") for r in records]
    if not records or None in froms or any(r.get("comm_to_s") is None for r in records):
        slowest = max(records, key=lambda r: r["step_s"], default=None)
        return 0.0 if slowest is None else float(slowest["comm_exposed_s"])
    last_backward = max(float(f or 0) for f in froms)
    return max(
        min(float(r["comm_exposed_s"]), max(0.0, float(r["comm_to_s"]) - last_backward))
        for r in records
    )


def _buckets(
    grad_bytes: int, bucket_bytes: int = DDP_BUCKET_BYTES, first_bytes: int = DDP_FIRST_BUCKET_BYTES
) -> list[int]:
    first = min(grad_bytes, first_bytes)
    rest = grad_bytes - first
    full, tail = divmod(rest, bucket_bytes)
    return [first] + [bucket_bytes] * full + ([tail] if tail else [])


def predicted_comm_s(
    fabric: Fabric, grad_bytes: int, hook: str, *, layer_dim: int = 256, powersgd_rank: int = 4,
    bucket_bytes: int = DDP_BUCKET_BYTES, first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
    idle_restart: bool = False,
) -> float:  # fmt: skip
    """The cost model's gradient communication of one step, bucket after bucket (Gloo).

    Gloo's flat ring per bucket for ``none``/``fp16``/``powersgd`` (PowerSGD: two
    all-reduces, P then Q, of ``rank / layer_dim`` of each bucket each); for the hierarchical
    hooks a reduce and a broadcast inside the largest region (each one pass of the
    bucket over the local hop) and the region leaders' exchange over the border
    (``hierarchical-powersgd``: two of them, of PowerSGD's P and Q;
    ``hierarchical-powersgd-alternating``: one, P or Q in turn). Every Gloo
    message waits for its receiver's ready notice: see
    :func:`~netopt.nccl.costmodel.gloo_ring_allreduce_s`. DDP's first bucket is
    ``first_bucket_bytes`` (1 MiB where ``bucket_cap_mb`` is left at its default;
    torch 2.13 makes it a full bucket where the cap is given).

    ``idle_restart``: the hosts restart idle connections from the initial window
    (``tcp_slow_start_after_idle=1``); the step's first message over the border, after
    the compute's idle, pays the ramp (:func:`netopt.tcpmath.idle_restart_s`).
    """
    factor = 0.5 if "fp16" in hook else 1.0
    total = 0.0
    first_message = 0.0
    ring = fabric.ring
    for index, size in enumerate(_buckets(grad_bytes, bucket_bytes, first_bucket_bytes)):
        s = size * factor
        part = s * min(1.0, 2 * powersgd_rank / layer_dim)  # PowerSGD's P and Q together
        two_level = None
        exchanges = 1 if hook.endswith("-alternating") else 2  # P and Q, or P or Q in turn
        if hook.startswith("hierarchical-powersgd"):
            two_level = gloo_hierarchical_allreduce_s(fabric, part / 2)
            if two_level is not None:
                total += exchanges * two_level
                message = part / 2
        elif hook.startswith("hierarchical"):
            two_level = gloo_hierarchical_allreduce_s(fabric, s)
            if two_level is not None:
                total += two_level
                message = s
        if two_level is None and "powersgd" in hook:  # flat (one region: the ring is all)
            total += 2 * gloo_ring_allreduce_s(
                fabric.n, part / 2, ring.alpha_s, ring.rate_bps, ring.loss_ratio
            )
            message = part / 2 / fabric.n
        elif two_level is None:
            total += gloo_ring_allreduce_s(
                fabric.n, s, ring.alpha_s, ring.rate_bps, ring.loss_ratio
            )
            message = s / fabric.n
        if index == 0:
            first_message = message
    if idle_restart:
        border = fabric.wan or fabric.ring
        total += idle_restart_s(first_message, 2 * border.alpha_s, border.rate_bps)
    return total


def predicted_step_s(compute_s: float, comm_s: float) -> float:
    """The predicted step: ``compute_s`` (the run's own, measured by its StepMeter) plus
    the cost model's communication, none of it overlapped (the advice's assumption)."""
    return compute_s + comm_s


def goals(defaults: RunSummary, netopt: RunSummary, cc: str) -> dict[str, Any]:
    """The training goals, each with its measured value and whether it is met."""
    ratio = netopt.time_to_n_s / defaults.time_to_n_s if defaults.time_to_n_s else math.nan
    total_ratio = (
        (netopt.time_to_n_s + netopt.setup_s) / (defaults.time_to_n_s + defaults.setup_s)
        if defaults.time_to_n_s
        else math.nan
    )
    limit = 0.4 if cc == "bbr" else 0.1
    share = netopt.comm_exposed_after_backward_s / netopt.step_s if netopt.step_s else math.nan
    own = netopt.comm_exposed_s / netopt.step_s if netopt.step_s else math.nan
    loss_gap = abs(netopt.final_loss - defaults.final_loss) / defaults.final_loss
    critical = netopt.critical_comm_exposed_s / netopt.step_s if netopt.step_s else math.nan
    idle = netopt.idle_comm_s / netopt.step_s if netopt.step_s else math.nan
    out: dict[str, Any] = {
        "time_ratio": _goal(ratio, limit),
        "time_ratio_with_setup": _goal(total_ratio, limit),
        # the goal: from every rank's backward pass done to a rank's last hook future
        "exposed_comm_share": _goal(share, 0.25),
        # beside it, not the goal: the slowest step's rank's own meter (its wait for a
        # peer's backward pass included), the busiest rank's, the time no rank computed
        "exposed_comm_share_own_meter": _goal(own, 0.25, beside=True),
        "exposed_comm_share_busiest_rank": _goal(critical, 0.25, beside=True),
        "exposed_comm_share_no_rank_computing": _goal(idle, 0.25, beside=True),
        "loss_gap": _goal(loss_gap, 0.03),
    }
    for run in (defaults, netopt):
        if run.predicted_step_s is not None and run.step_s > 0:
            err = run.predicted_step_s / run.step_s - 1
            out[f"prediction_error_{run.name}"] = _goal(err, 0.25, absolute=True)
    if netopt.hook.startswith("hierarchical") and netopt.border_bytes:
        worst = max(netopt.border_bytes.values()) / netopt.steps / netopt.wire_bytes
        out["border_bytes_per_step_over_S"] = _goal(worst, 1.1)
    return out


def _goal(
    value: float, limit: float, *, absolute: bool = False, beside: bool = False
) -> dict[str, Any]:
    """``beside``: another measure of a goal's quantity, reported next to it (not the goal)."""
    met = (abs(value) if absolute else value) <= limit
    out: dict[str, Any] = {"value": value, "limit": limit, "met": bool(met)}
    if beside:
        out["beside_the_goal"] = True
    return out


def write_svg(path: Path, runs: Sequence[RunSummary], title: str) -> None:
    """Stacked bars of the median step (data wait, exposed comm, compute) per run, and
    the loss curves, as one SVG (no plotting library needed)."""
    colors = {"data_wait_s": "#e4572e", "comm_exposed_s": "#f3a712", "compute_s": "#29335c"}
    width, height, pad = 900, 360, 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{pad}" y="20" font-size="14">{_xml(title)}</text>',
    ]
    top = max((r.step_s for r in runs), default=1.0) or 1.0
    base, bar_h = height - pad, height - 2 * pad - 20
    for i, run in enumerate(runs):
        x, y = pad + i * 120, base
        for part, color in colors.items():
            h = bar_h * getattr(run, part) / top
            y -= h
            out.append(f'<rect x="{x}" y="{y:.1f}" width="80" height="{h:.1f}" fill="{color}"/>')
        out.append(f'<text x="{x}" y="{base + 15}">{_xml(run.name)} {run.step_s:.2f}s</text>')
    for j, (part, color) in enumerate(colors.items()):
        out.append(f'<rect x="{pad}" y="{30 + 14 * j}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{pad + 14}" y="{39 + 14 * j}">{part[:-2].replace("_", " ")}</text>')
    lx, lw = 420, width - 420 - pad
    losses = [x for r in runs for x in r.losses if math.isfinite(x)]
    lo, hi = (min(losses), max(losses)) if losses else (0.0, 1.0)
    span = (hi - lo) or 1.0
    out.append(f'<text x="{lx}" y="40">loss per step ({lo:.2f} .. {hi:.2f})</text>')
    for run, color in zip(runs, ("#e4572e", "#29335c", "#76b041", "#888"), strict=False):
        n = max(1, len(run.losses) - 1)
        points = " ".join(
            f"{lx + lw * i / n:.1f},{base - bar_h * (v - lo) / span:.1f}"
            for i, v in enumerate(run.losses)
            if math.isfinite(v)
        )
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        out.append(f'<text x="{lx + lw - 80}" y="{60 + 14 * runs.index(run)}" fill="{color}">'
                   f"{_xml(run.name)}</text>")  # fmt: skip
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def worker_argv(rank: int, world: int, master: str, options: dict[str, Any]) -> list[str]:
    """The command line of one train rank (``options``: the worker's flags, by name)."""
    argv = [sys.executable, "-m", "netopt.torch.train_worker", "--rank", str(rank),
            "--world", str(world), "--master", master]  # fmt: skip
    for key, value in options.items():
        if value is None or value is False:
            continue
        argv.append("--" + key.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv

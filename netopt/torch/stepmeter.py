"""Where a training step's time goes: data wait, exposed communication, compute.

Adopt it in the user's own loop with three lines::

    meter = StepMeter("my-job", log_path="steps.jsonl", prom_path="/var/lib/node/netopt.prom")
    meter.watch(ddp_model)                       # or apply_comm_hook(..., meter=meter)
    for batch in meter.batches(loader): ...      # the loop body is one step

Per step (from one batch handed out to the next being asked for):

- ``data_wait_s``: time blocked in the loader's ``next()``;
- ``comm_exposed_s``: gradient communication the backward pass did not overlap,
  timed from the DDP comm hook's futures: from the last bucket's hook call (the
  backward pass's compute is done by then) to the last future completed;
- ``compute_s``: the rest of the step (``step_s - comm_exposed_s``).

One rank's meter sees one rank: where a peer's backward pass ends later (a slower
node, or ranks sharing cores), ``comm_exposed_s`` also holds the wait for it, since no
bucket's collective can finish before every rank has its gradients. ``comm_from_s`` and
``comm_to_s`` (one clock for every rank of one machine) let a bench separate the two
(``netopt.torch.trainbench.exposed_after_backward_s``).

``meter.records`` keeps the last ``keep_records`` steps (10,000: memory stays bounded
over a long run), ``meter.steps`` counts them all. Each step is one JSON line in
``log_path`` (kept open, one write per step); ``prom_path`` gets a Prometheus text
file (node_exporter's textfile format, base units: ``_seconds_total``,
``_steps_total``) rewritten atomically once ``prom_every`` steps and
``flush_every_s`` seconds (5) have passed since the last time, and at the loop's end
(a rename a few times a second would cost a fast step more than 1%); ``agent_dir``
(the node agent's ``train_dir``) gets the same totals as a small JSON file,
``<job>.<rank>.json``, which the agent exports at ``/metrics`` and ``/v1/train``
(``netopt.agent.trainjobs``). A failing log or export (bad path, full disk,
read-only directory) warns once and is switched off: the meter never stops
training. A job name that is not one (``names.JOB_NAME_RULE``) fails at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from netopt.agent.trainjobs import PART_HELP, STEPS_HELP, train_document, train_file_name
from netopt.errors import ValidationError
from netopt.names import JOB_NAME_RULE, is_job_name

__all__ = ["StepMeter", "StepRecord", "exposed_comm_s", "render_prometheus"]

T = TypeVar("T")


@dataclass(frozen=True)
class StepRecord:
    """One step's breakdown (seconds); ``step_s = data_wait_s + comm_exposed_s + compute_s``."""

    job: str
    step: int
    step_s: float
    data_wait_s: float
    comm_exposed_s: float
    compute_s: float
    hook_calls: int
    comm_from_s: float | None = None
    """The meter's clock at the step's last hook call (the backward pass's compute done);
    None without hook calls. With ``comm_to_s``, for comparing ranks on one machine."""
    comm_to_s: float | None = None
    """The meter's clock when the step's last future completed (at most the step's end)."""


def exposed_comm_s(call_times_s: list[float], done_times_s: list[float], end_s: float) -> float:
    """Communication not hidden behind the backward pass, from the hooks' call/done times.

    After the last bucket's hook is called the backward pass has nothing left to
    compute, so what remains until the last future completes was waited for.
    Clipped to ``[0, end_s - last call]``.
    """
    if not call_times_s or not done_times_s:
        return 0.0
    last_call = max(call_times_s)
    return max(0.0, min(max(done_times_s), end_s) - last_call)


def render_prometheus(job: str, rank: int, totals: dict[str, float], steps: int) -> str:
    """Exposition text of the meter's totals (``totals``: seconds by part)."""
    labels = f'job="{_label(job)}",rank="{rank}"'
    lines = [
        f"# HELP netopt_train_steps_total {STEPS_HELP}.",
        "# TYPE netopt_train_steps_total counter",
        f"netopt_train_steps_total{{{labels}}} {steps}",
    ]
    for part, help_text in PART_HELP.items():
        name = f"netopt_train_{part}_seconds_total"
        lines += [
            f"# HELP {name} {help_text}.",
            f"# TYPE {name} counter",
            f"{name}{{{labels}}} {totals[part]!r}",
        ]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Output:
    """One file the meter writes; the first OSError warns and turns it off."""

    def __init__(self, path: Path | None, what: str) -> None:
        self.path, self.what, self.broken = path, what, path is None
        self._handle: TextIO | None = None

    def run(self, action: Callable[[Path], None]) -> None:
        if self.broken or self.path is None:
            return
        try:
            action(self.path)
        except OSError as exc:
            self._fail(exc)

    def append(self, line: str) -> None:
        """Append ``line`` and hand it to the kernel (one write: the log stays current)."""
        if self.broken or self.path is None:
            return
        try:
            if self._handle is None:
                self._handle = self.path.open("a", encoding="utf-8")
            self._handle.write(line)
            self._handle.flush()
        except OSError as exc:
            self._fail(exc)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.close()
            except OSError as exc:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.broken = True
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()  # the buffer's rest cannot be written either
        warnings.warn(
            f"netopt step meter: cannot write the {self.what} {self.path} ({exc}); "
            "training goes on without it",
            RuntimeWarning,
            stacklevel=4,
        )


class StepMeter:
    """Times each step of a loop; see the module docstring."""

    def __init__(
        self,
        job: str,
        *,
        log_path: str | os.PathLike[str] | None = None,
        prom_path: str | os.PathLike[str] | None = None,
        prom_every: int = 10,
        rank: int = 0,
        agent_dir: str | os.PathLike[str] | None = None,
        keep_records: int = 10_000,
        flush_every_s: float = 5.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not is_job_name(job):
            raise ValidationError(f"job name {job!r} is not allowed: {JOB_NAME_RULE}")
        if type(rank) is not int or not 0 <= rank <= 65535:
            raise ValidationError(f"rank {rank!r} is not an integer in 0..65535")
        self.job, self.rank, self.prom_every, self._clock = job, rank, max(1, prom_every), clock
        self._log = _Output(Path(log_path) if log_path is not None else None, "step log")
        self._prom = _Output(Path(prom_path) if prom_path is not None else None, "metrics file")
        agent_file = None if agent_dir is None else Path(agent_dir) / train_file_name(job, rank)
        self._agent = _Output(agent_file, "agent's train file")
        self._lock = threading.Lock()
        self._calls: list[float] = []
        self._dones: list[float] = []
        self.records: deque[StepRecord] = deque(maxlen=max(1, keep_records))
        self.steps = 0
        self.flush_every_s = flush_every_s
        self._flushed_steps, self._flushed_at_s = 0, clock()
        self.totals = {"step": 0.0, "data_wait": 0.0, "comm_exposed": 0.0, "compute": 0.0}

    def wrap_hook(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``hook`` with its calls and its futures' completions timed."""

        def timed(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            with self._lock:
                self._calls.append(self._clock())
            # Chained, not a done-callback: DDP waits on the chained future, so the
            # time is recorded before the step can end (a callback may run after).
            return hook(state, bucket).then(self._done)

        return timed

    def _done(self, future: Any) -> Any:
        with self._lock:
            self._dones.append(self._clock())
        return future.value()

    def watch(
        self, model: Any, state: Any = None, hook: Callable[[Any, Any], Any] | None = None
    ) -> None:
        """Register ``hook`` (default: DDP's plain all-reduce) on ``model``, timed."""
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.allreduce_hook
        model.register_comm_hook(state, self.wrap_hook(hook))

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """Yield ``loader``'s batches; the time between two is one step."""
        iterator = iter(loader)
        try:
            while True:
                asked = self._clock()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                got = self._clock()
                with self._lock:
                    self._calls.clear()
                    self._dones.clear()
                yield batch
                self._record(got - asked, got, self._clock())
        finally:  # the loop's end (or its generator dropped): final totals, log closed
            self.close()  # the log is reopened by the next ``batches`` (append)

    def close(self) -> None:
        """Write the totals and close the log (``batches`` does this at its end)."""
        self.flush()
        self._log.close()

    def _record(self, data_wait_s: float, start_s: float, end_s: float) -> None:
        with self._lock:
            calls, dones = list(self._calls), list(self._dones)
        body_s = end_s - start_s
        comm_s = min(exposed_comm_s(calls, dones, end_s), body_s)
        step_s, compute_s = data_wait_s + body_s, body_s - comm_s
        comm_from = max(calls) if calls and dones else None
        comm_to = None if comm_from is None else max(comm_from, min(max(dones), end_s))
        record = StepRecord(
            self.job, self.steps, step_s, data_wait_s, comm_s, compute_s, len(calls),
            comm_from, comm_to,
        )  # fmt: skip
        self.records.append(record)
        self.steps += 1
        totals = self.totals
        totals["step"] += step_s
        totals["data_wait"] += data_wait_s
        totals["comm_exposed"] += comm_s
        totals["compute"] += compute_s
        if not self._log.broken:
            self._log.append(_json_line(record, self.rank))
        if (
            self.steps - self._flushed_steps >= self.prom_every
            and end_s - self._flushed_at_s >= self.flush_every_s
        ):
            self.flush()

    def flush(self) -> None:
        """Rewrite the Prometheus and agent files now (done after ``prom_every`` steps and
        ``flush_every_s`` seconds since the last, and when ``batches`` ends)."""
        steps = self.steps
        self._flushed_steps, self._flushed_at_s = steps, self._clock()
        if not self._prom.broken:
            text = render_prometheus(self.job, self.rank, self.totals, steps)
            self._prom.run(lambda path: _replace(path, text))
        if not self._agent.broken:
            summary = train_document(self.job, self.rank, self.totals, steps)
            self._agent.run(lambda path: _replace(path, summary))


def _json_line(record: StepRecord, rank: int) -> str:
    return (
        json.dumps(
            {
                "job": record.job,
                "step": record.step,
                "step_s": record.step_s,
                "data_wait_s": record.data_wait_s,
                "comm_exposed_s": record.comm_exposed_s,
                "compute_s": record.compute_s,
                "hook_calls": record.hook_calls,
                "rank": rank,
            }
        )
        + "\n"
    )


def _replace(path: Path, text: str) -> None:
    """Whole-file replace by rename, without fsync: these files are rewritten every few
    steps, a crash leaves the previous or an empty one (which the agent refuses), and an
    fsync (milliseconds on a busy disk) on the training thread is more than the meter's
    whole budget."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

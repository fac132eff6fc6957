"""Training jobs' step-meter totals, read from the node's train directory and exported.

A :class:`~netopt.torch.StepMeter` with ``agent_dir`` writes one small JSON
file per job and rank (``<job>.<rank>.json``, replaced atomically); the agent
reads that directory when scraped. No socket and no token between the two:
a training loop never waits on the agent, and an agent that is down or
restarting loses nothing (the totals are cumulative).

Files are local but written by any job on the node, so they are checked as
hostile input: at most ``MAX_FILES`` files (in name order), each at most
``MAX_FILE_BYTES``, regular files only (no symlinks, no FIFOs), the name must
match the job and rank inside, numbers finite and within bounds. Anything else
is counted as rejected and skipped.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netopt.names import is_job_name

__all__ = [
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "PARTS",
    "PART_HELP",
    "STEPS_HELP",
    "TrainJob",
    "TrainJobsCollector",
    "parse_train_file",
    "read_train_jobs",
    "train_document",
    "train_file_name",
]

MAX_FILES = 256
MAX_FILE_BYTES = 4096
MAX_RANK = 65535
MAX_SECONDS = 1e10
MAX_STEPS = 10**12
PARTS = ("step", "data_wait", "comm_exposed", "compute")
"""The step's parts, each ``<part>_s`` in a file and ``netopt_train_<part>_seconds_total``."""
PART_HELP = {
    "step": "Time in training steps",
    "data_wait": "Time a step waited for its batch",
    "comm_exposed": "Gradient communication a step waited for (not overlapped)",
    "compute": "Time in steps neither waiting for data nor for communication",
}
STEPS_HELP = "Training steps measured by netopt's step meter"
_FILE_RE = re.compile(r"(?P<job>.+)\.(?P<rank>[0-9]{1,5})\.json\Z")


@dataclass(frozen=True)
class TrainJob:
    """One job's rank: steps and cumulative seconds per part (``PARTS``)."""

    job: str
    rank: int
    steps: int
    seconds: dict[str, float]

    def share(self, part: str) -> float:
        """The part's share of step time (0 before the first step)."""
        total = self.seconds["step"]
        return self.seconds[part] / total if total > 0 else 0.0


def train_document(job: str, rank: int, totals: dict[str, float], steps: int) -> str:
    """What a step meter writes (``totals``: seconds by part): the file's one format."""
    doc: dict[str, object] = {"job": job, "rank": rank, "steps": steps}
    doc.update({f"{part}_s": totals[part] for part in PARTS})
    return json.dumps(doc)


def train_file_name(job: str, rank: int) -> str:
    """The file a job's rank writes in the train directory."""
    return f"{job}.{rank}.json"


def parse_train_file(name: str, data: bytes) -> TrainJob | None:
    """The file's job, or None when anything in it or its name is out of bounds."""
    found = _FILE_RE.fullmatch(name)
    if found is None or len(data) > MAX_FILE_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    job, rank, steps = doc.get("job"), doc.get("rank"), doc.get("steps")
    if not is_job_name(job) or job != found["job"]:
        return None
    if type(rank) is not int or not 0 <= rank <= MAX_RANK or str(rank) != found["rank"]:
        return None
    if type(steps) is not int or not 0 <= steps <= MAX_STEPS:
        return None
    seconds = {part: _seconds(doc.get(f"{part}_s")) for part in PARTS}
    if any(value is None for value in seconds.values()):
        return None
    return TrainJob(job, rank, steps, {k: v for k, v in seconds.items() if v is not None})


def _seconds(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= MAX_SECONDS else None


def _read_bounded(path: Path) -> bytes | None:
    """The file's bytes if it is a regular file (not followed if a link) within the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= MAX_FILE_BYTES else None


def read_train_jobs(directory: Path) -> tuple[tuple[TrainJob, ...], int]:
    """The jobs in ``directory`` and the number of entries rejected (a missing dir: none)."""
    try:
        names = sorted(
            entry.name for entry in os.scandir(directory) if not entry.name.startswith(".")
        )
    except OSError:
        return (), 0
    jobs, rejected = [], max(0, len(names) - MAX_FILES)
    for name in names[:MAX_FILES]:
        data = _read_bounded(directory / name)
        job = None if data is None else parse_train_file(name, data)
        if job is None:
            rejected += 1
        else:
            jobs.append(job)
    return tuple(jobs), rejected


class TrainJobsCollector(Collector):
    """Exports the train directory's jobs at each scrape (``netopt_train_*``, labels job, rank)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        jobs, rejected = read_train_jobs(self.directory)
        steps = CounterMetricFamily("netopt_train_steps", STEPS_HELP, labels=["job", "rank"])
        for job in jobs:
            steps.add_metric([job.job, str(job.rank)], job.steps)
        yield steps
        for part, text in PART_HELP.items():
            family = CounterMetricFamily(
                f"netopt_train_{part}_seconds", text, labels=["job", "rank"]
            )
            for job in jobs:
                family.add_metric([job.job, str(job.rank)], job.seconds[part])
            yield family
        yield GaugeMetricFamily(
            "netopt_agent_train_files_rejected",
            "Entries of the train directory not exported at the last scrape (bad or over bounds)",
            value=rejected,
        )

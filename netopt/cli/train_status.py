"""``netopt status --agent URL``: the node's training jobs and their shares of step time."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from netopt.agent.trainjobs import MAX_FILES, PARTS, TrainJob, parse_train_file, train_file_name
from netopt.dataplane.limits import read_up_to
from netopt.errors import NetworkError, ProtocolError, ValidationError
from netopt.webshell import parse_json_document

__all__ = ["fetch_train_jobs", "train_rows"]

MAX_BODY_BYTES = MAX_FILES * 1024


async def _get(url: str, timeout_s: float) -> bytes:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + "/v1/train") as response,
        ):
            if response.status != 200:
                raise ProtocolError(f"agent {url} answered HTTP {response.status} for /v1/train")
            body = await read_up_to(response.content.read, MAX_BODY_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise NetworkError(f"cannot reach the agent at {url}: {exc}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(f"agent {url}'s /v1/train is over {MAX_BODY_BYTES} bytes")
    return body


def _parse(url: str, body: bytes) -> tuple[TrainJob, ...]:
    """The answer checked by the same rules as the agent's own files (a peer is hostile)."""
    try:
        doc = parse_json_document(body)
    except ValidationError as exc:
        raise ProtocolError(f"agent {url}'s /v1/train is not JSON: {exc}") from None
    entries = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_FILES:
        raise ProtocolError(f"agent {url}'s /v1/train has no list of at most {MAX_FILES} jobs")
    jobs = []
    for entry in entries:
        seconds = entry.get("seconds") if isinstance(entry, dict) else None
        if not isinstance(seconds, dict):
            raise ProtocolError(f"agent {url}'s /v1/train has a malformed job")
        job, rank = entry.get("job"), entry.get("rank")
        flat = {"job": job, "rank": rank, "steps": entry.get("steps")}
        flat.update({f"{part}_s": seconds.get(part) for part in PARTS})
        parsed = parse_train_file(
            train_file_name(str(job), rank) if isinstance(rank, int) else "",
            json.dumps(flat).encode(),
        )
        if parsed is None:
            raise ProtocolError(f"agent {url}'s /v1/train has a malformed job")
        jobs.append(parsed)
    return tuple(jobs)


def fetch_train_jobs(url: str, timeout_s: float = 5.0) -> tuple[TrainJob, ...]:
    """The jobs the agent at ``url`` exports. NetworkError / ProtocolError on failure."""
    return _parse(url, asyncio.run(_get(url, timeout_s)))


def train_rows(jobs: tuple[TrainJob, ...]) -> list[list[object]]:
    """Table rows: job, rank, steps, mean step seconds, and each part's share (percent)."""
    return [
        [
            job.job,
            job.rank,
            job.steps,
            round(job.seconds["step"] / job.steps, 4) if job.steps else None,
            *(f"{job.share(part):.0%}" for part in ("data_wait", "comm_exposed", "compute")),
        ]
        for job in jobs
    ]

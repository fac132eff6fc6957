"""The agent's reader of training jobs' files: hostile input is skipped and counted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netopt.agent.trainjobs import (
    MAX_FILE_BYTES,
    MAX_FILES,
    parse_train_file,
    read_train_jobs,
    train_document,
    train_file_name,
)

TOTALS = {"step": 10.0, "data_wait": 2.0, "comm_exposed": 3.0, "compute": 5.0}


def good(job: str = "lm-7", rank: int = 3, **changes: object) -> bytes:
    doc = json.loads(train_document(job, rank, TOTALS, 40))
    doc.update(changes)
    return json.dumps(doc).encode()


def test_the_meters_summary_parses_with_its_shares() -> None:
    job = parse_train_file(train_file_name("lm-7", 3), good())
    assert job is not None
    assert (job.job, job.rank, job.steps) == ("lm-7", 3, 40)
    assert job.share("comm_exposed") == pytest.approx(0.3)
    assert job.share("data_wait") == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("lm-7.4.json", good()),  # the name's rank is not the file's
        ("other.3.json", good()),  # nor its job
        ("lm-7.3.json.tmp", good()),
        ("lm-7.3.json", good(steps=-1)),
        ("lm-7.3.json", good(steps=True)),
        ("lm-7.3.json", good(rank="3")),
        ("lm-7.3.json", good(step_s=1e300)),
        ("lm-7.3.json", good(compute_s=-0.5)),
        ("lm-7.3.json", good(comm_exposed_s="NaN")),
        ("lm-7.3.json", b'{"job": "lm-7", "rank": 3, "steps": 1, "step_s": NaN}'),
        ("lm-7.3.json", good(data_wait_s=None)),
        ("lm-7.3.json", b"[1, 2]"),
        ("lm-7.3.json", b"{" * 5000),
        ("lm-7.3.json", good()[:-1] + b', "pad": "' + b"x" * MAX_FILE_BYTES + b'"}'),
        ("bad job.3.json", good(job="bad job")),
        ("..3.json", good(job=".")),
        ("x" * 70 + ".3.json", good(job="x" * 70)),
    ],
)
def test_hostile_files_are_refused(name: str, data: bytes) -> None:
    assert parse_train_file(name, data) is None


def test_directory_reader_bounds_files_and_skips_links_and_fifos(tmp_path: Path) -> None:
    (tmp_path / train_file_name("lm-7", 3)).write_bytes(good())
    (tmp_path / "secret").write_text(json.dumps({"job": "lm-7"}))
    os.symlink(tmp_path / train_file_name("lm-7", 3), tmp_path / train_file_name("lm-7", 4))
    os.mkfifo(tmp_path / train_file_name("lm-7", 5))  # a reader that opened it would block
    (tmp_path / "huge.1.json").write_bytes(b" " * (10 * MAX_FILE_BYTES))
    (tmp_path / ".lm-7.3.json.123.tmp").write_bytes(good())  # a meter's write in progress
    jobs, rejected = read_train_jobs(tmp_path)
    assert [(j.job, j.rank) for j in jobs] == [("lm-7", 3)]
    assert rejected == 4  # the link, the FIFO, the huge file, the stray file
    assert read_train_jobs(tmp_path / "missing") == ((), 0)


def test_directory_reader_reads_at_most_max_files(tmp_path: Path) -> None:
    for rank in range(MAX_FILES + 5):
        (tmp_path / train_file_name("j", rank)).write_bytes(good("j", rank))
    jobs, rejected = read_train_jobs(tmp_path)
    assert len(jobs) == MAX_FILES
    assert rejected == 5

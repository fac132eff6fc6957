"""The one atomic write (fsutil.atomic_write_bytes), on real files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from netopt.errors import StorageError
from netopt.fsutil import atomic_write_bytes
from netopt.lab.state import LabState, read_state, write_state


def test_writes_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "d"
    (target / "inner").mkdir(parents=True)  # a non-empty directory cannot be replaced
    with pytest.raises(StorageError, match="cannot write"):
        atomic_write_bytes(target, b"x")
    assert (target / "inner").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    with pytest.raises(StorageError):
        atomic_write_bytes(tmp_path / "missing" / "f", b"x")


def test_lab_state_goes_through_it(tmp_path: Path) -> None:
    state = LabState(
        prefix="t1",
        name="n",
        topology={},
        owner_pid=1,
        detached=False,
        namespaces=(),
        created_at_s=0.0,
    )
    directory = write_state(state, tmp_path)
    assert read_state(directory).prefix == "t1"
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]

"""The sync's file writer process (`netopt.dataplane.writerproc`), a real child process
writing real files: modes and mtimes as the sync's own writes set them, files in place
only after a flush, its first error (a refused directory, a full disk) a clear
StorageError and nothing half-written, a dead helper an error rather than a hang, a
helper that does not outlive the sync, and a queue that waits for a stalled helper
instead of growing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netopt.dataplane import writerproc
from netopt.dataplane.writerproc import WriteItem, WriterProcess
from netopt.errors import StorageError
from tests.service.cache_helpers import mount_tmpfs, umount

MTIME_NS = 1_600_000_000_123_456_789


def _helper() -> WriterProcess:
    helper = WriterProcess.start()
    assert helper is not None
    return helper


def _item(
    dest: Path, name: str, data: bytes, mode: int = 0o644, umask: int | None = 0o022
) -> WriteItem:
    return (str(dest / f".{name}.x.netopt-tmp"), str(dest / name), data, mode, MTIME_NS, umask,
            os.stat(dest).st_dev)  # fmt: skip


def _submit_and_flush(helper: WriterProcess, items: list[WriteItem]) -> None:
    for item in items:
        helper.submit([item])
    helper.flush()


def _gone(pid: int, within_s: float) -> bool:
    deadline_s = time.monotonic() + within_s
    while time.monotonic() < deadline_s:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_files_are_written_whole_with_their_modes_and_mtimes(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old").write_bytes(b"the previous version")
    files = {f"f{i}": os.urandom(100 + 37 * i) for i in range(300)}
    modes = {"f0": 0o400, "f1": 0o755, "f2": 0o600, "old": 0o640}
    files["old"] = b"the new version"
    files["empty"] = b""
    helper = _helper()
    try:
        for name, data in files.items():
            # umask None: unknown, so every mode is set explicitly (as for an odd process)
            helper.submit(
                [_item(dest, name, data, modes.get(name, 0o644), None if name == "f1" else 0o022)]
            )
        helper.flush()
        assert helper.files == len(files)
        for name, data in files.items():
            st = os.stat(dest / name)
            assert (dest / name).read_bytes() == data, name
            assert st.st_mode & 0o7777 == modes.get(name, 0o644), name
            assert st.st_mtime_ns == MTIME_NS, name
        assert sorted(p.name for p in dest.iterdir()) == sorted(files)  # no temporary left
    finally:
        helper.close()
    helper.close()  # a second close is only the (absent) error
    assert helper._proc.returncode == 0


def test_a_refused_directory_is_a_clear_error_and_writes_nothing_after_it(tmp_path: Path) -> None:
    good, gone = tmp_path / "good", tmp_path / "gone"
    good.mkdir()
    gone.mkdir()
    dev = os.stat(good).st_dev
    helper = _helper()
    try:
        helper.submit([_item(good, "a", b"first")])
        helper.flush()
        gone.rmdir()  # the next file's directory vanished under the sync
        lost: WriteItem = (str(gone / ".b.x.netopt-tmp"), str(gone / "b"), b"second", 0o644,
                           MTIME_NS, 0o022, dev)  # fmt: skip
        helper.submit([lost, _item(good, "c", b"third")])
        with pytest.raises(StorageError, match=r"cannot write .*gone/b: .*No such file"):
            helper.flush()
        with pytest.raises(StorageError, match="cannot write"):  # and every later call
            helper.submit([_item(good, "d", b"fourth")])
    finally:
        with pytest.raises(StorageError):
            helper.close()
    assert (good / "a").read_bytes() == b"first"
    assert sorted(p.name for p in good.iterdir()) == ["a"]  # nothing after the error


def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    try:
        helper = _helper()
        blobs = [os.urandom(100_000) for _ in range(20)]  # 2 MB into 1 MB
        try:
            with pytest.raises(StorageError, match=r"cannot write .*: .*No space left"):
                _submit_and_flush(helper, [_item(mnt, f"f{i:02d}", b) for i, b in enumerate(blobs)])
        finally:
            with pytest.raises(StorageError):
                helper.close()
        names = sorted(p.name for p in mnt.iterdir())
        assert names, "some files fit before the disk filled"
        assert not any(name.endswith(".netopt-tmp") for name in names)
        for name in names:  # whole, or not there
            assert (mnt / name).read_bytes() == blobs[int(name[1:])], name
    finally:
        umount(mnt)


def test_a_dead_helper_is_an_error_not_a_hang(tmp_path: Path) -> None:
    helper = _helper()
    helper.submit([_item(tmp_path, "a", b"x")])
    helper.flush()
    helper._proc.kill()
    helper._proc.wait()
    started_s = time.monotonic()
    with pytest.raises(StorageError, match="file writer process"):
        _submit_and_flush(helper, [_item(tmp_path, "b", b"y")])
    assert time.monotonic() - started_s < 5
    with pytest.raises(StorageError):
        helper.close()


_PARENT = """
import sys, time
from netopt.dataplane.writerproc import WriterProcess
helper = WriterProcess.start()
print(helper._proc.pid, flush=True)
time.sleep(60)
"""


def test_the_helper_dies_with_the_process_that_started_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert not _gone(pid, 0.3)  # it runs while its parent does
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone(pid, 5)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_stalled_helper_makes_submit_wait_instead_of_queueing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writerproc, "PENDING_MAX_FILES", 4)
    helper = _helper()
    blobs = [os.urandom(200_000) for _ in range(12)]  # each more than the pipe holds
    done: list[int] = []
    try:
        os.kill(helper._proc.pid, signal.SIGSTOP)

        def submit_all() -> None:
            for i, blob in enumerate(blobs):
                helper.submit([_item(tmp_path, f"f{i:02d}", blob)])
                done.append(i)

        thread = threading.Thread(target=submit_all)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive()
        assert len(done) < len(blobs)  # waiting: at most the queue, a message and the pipe
        assert len(helper._pending) <= 4
        os.kill(helper._proc.pid, signal.SIGCONT)
        thread.join(timeout=20)
        assert not thread.is_alive()
        helper.flush()
        for i, blob in enumerate(blobs):
            assert (tmp_path / f"f{i:02d}").read_bytes() == blob
    finally:
        os.kill(helper._proc.pid, signal.SIGCONT)
        helper.close()


def test_thousands_of_copies_of_one_tiny_file_with_long_names_are_written(tmp_path: Path) -> None:
    """Names, not bytes, make such a message: it is cut by its names too (a message over
    the helper's bound used to end it)."""
    dest = tmp_path / ("d" * 200)
    dest.mkdir()
    data = b"1"
    items = [_item(dest, f"{'n' * 180}{i:05d}", data) for i in range(15_000)]
    helper = _helper()
    try:
        helper.submit(items)  # one call, as a chunk's many files come
        helper.flush()
    finally:
        helper.close()
    assert helper._proc.returncode == 0
    names = os.listdir(dest)
    assert len(names) == len(items)
    assert all(not name.endswith(".netopt-tmp") for name in names)
    assert (dest / f"{'n' * 180}14999").read_bytes() == data


def test_a_helper_that_cannot_start_says_so_and_is_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # starts, exits at once
    helper = WriterProcess.start()
    assert helper is not None
    assert helper.ready(wait_s=5) is False
    assert helper._proc.returncode is not None
    with pytest.raises(StorageError):
        helper.submit([_item(tmp_path, "a", b"x")])


def test_a_forked_child_holding_the_pipe_does_not_hold_up_close(tmp_path: Path) -> None:
    """A process forked without exec (a data loader's worker) keeps a copy of the pipe to
    the helper: the helper is told to quit, it does not wait for the pipe's end."""
    dest = tmp_path / "dest"
    dest.mkdir()
    helper = _helper()
    assert helper.ready()
    _submit_and_flush(helper, [_item(dest, "a", b"alpha")])
    child = os.fork()
    if child == 0:  # the copy: holds every descriptor, does nothing
        time.sleep(60)
        os._exit(0)
    try:
        started_s = time.monotonic()
        helper.close()
        assert time.monotonic() - started_s < 5.0
        assert (dest / "a").read_bytes() == b"alpha"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)

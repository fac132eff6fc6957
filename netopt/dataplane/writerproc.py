"""A helper process that writes a tree's small files, so the sync's event loop does not.

A small file made of one chunk is written whole from the chunk's verified bytes
(`netopt.dataplane.assemble.write_claimed`): create, write, set mode and mtime, close,
then a rename once durable: five system calls a file, on the event loop (a pool thread
held the interpreter lock anyway and paid a lock hand-off per call). For a tree of
100,000 files of 1-4 KB that was a third of the loop's time, and the destination
flusher's 100,000 renames each handed the lock back and forth with the loop once more.
With a `WriterProcess` the loop only queues ``(temporary name, target, bytes, mode,
mtime)``; a sender thread pickles what queued meanwhile into one pipe message; the
helper (``python -m netopt.dataplane.writerproc``, standard library and
`netopt.durable` only) makes the same calls (`netopt.dataplane.filewrite.create_whole`)
and hands each file to a `netopt.durable.BatchFlusher` of its own, so the files go into
place exactly as the sync's own flusher puts them: whole, durable, then renamed.

Failures: the helper keeps its first error (a full disk, a refused directory), writes
nothing after it and reports it; the sync's next `WriterProcess.submit`, and its final
`WriterProcess.flush`, raise it as StorageError, so a sync never reports success with a
file missing, and whatever the helper placed stays (the chunks are in the cache: a re-run
writes the rest). A helper that dies is the same error. The helper dies with the sync's
process (``PR_SET_PDEATHSIG``) and ignores SIGINT (the sync closes it in order): a kill
leaves at most temporary files, which the next run removes as it does its own.

Bounded: at most `PENDING_MAX_FILES` files or `PENDING_MAX_BYTES` queued and not yet
sent (`submit` waits, as the flusher's `add` does), one message at most
`MESSAGE_MAX_BYTES`; the pipe itself holds what the helper has not read.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

from netopt.durable import backlog_full
from netopt.errors import StorageError

__all__ = [
    "MESSAGE_MAX_BYTES",
    "PENDING_MAX_BYTES",
    "PENDING_MAX_FILES",
    "WriteItem",
    "WriterProcess",
    "main",
]

log = logging.getLogger(__name__)

WriteItem = tuple[str, str, bytes, int, int, int | None, int]
"""One small file for the helper: (temporary name, target, bytes, mode, mtime in ns,
the process umask when the sync began or None, the device of its directory)."""

PENDING_MAX_FILES = 8192
PENDING_MAX_BYTES = 32 * 1024 * 1024
"""Files (bytes) queued for the helper and not yet sent beyond which `submit` waits."""
MESSAGE_MAX_BYTES = 4 * 1024 * 1024
"""The most bytes (the files' and their names') one pipe message carries, unless one file
alone is larger (at most `netopt.dataplane.assemble.WHOLE_FILE_BYTES`, 1 MiB)."""
MESSAGE_MAX_FILES = 4096
"""The most files one pipe message carries (a tree may hold thousands of copies of one
tiny file: their names, not their bytes, make the message)."""
_ITEM_OVERHEAD_BYTES = 64
"""What an item costs in a message besides its bytes and names (pickle's framing, its
numbers), counted generously."""
READY_WAIT_S = 10.0
"""How long `WriterProcess.start` waits for the helper to say it is ready."""

_HEADER = struct.Struct("<cI")
"""A message: its kind (``W`` writes, ``F`` flush, ``Q`` quit; back: ``R`` ready, ``E``
error, ``F`` flushed) and its body's length."""
_BODY_MAX_BYTES = 2 * MESSAGE_MAX_BYTES
"""The longest body either side accepts: a message of `MESSAGE_MAX_BYTES`, or one file
over it with its names (paths are at most 4 KiB each)."""
_PR_SET_PDEATHSIG = 1


def _read_exact(fd: int, n: int) -> bytes:
    """``n`` bytes from ``fd``; EOFError when it ends first."""
    parts: list[bytes] = []
    while n:
        block = os.read(fd, min(n, 1 << 20))
        if not block:
            raise EOFError
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def _send(fd: int, kind: bytes, body: bytes) -> None:
    view = memoryview(_HEADER.pack(kind, len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


class _TooLong(Exception):
    """A message longer than `_BODY_MAX_BYTES`: not one of ours."""


def _receive(fd: int) -> tuple[bytes, bytes]:
    """The next message; EOFError at the end of input, _TooLong for a body over the bound."""
    kind, length = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if length > _BODY_MAX_BYTES:
        raise _TooLong(f"a message of {length} bytes (at most {_BODY_MAX_BYTES})")
    return kind, _read_exact(fd, length)


def _message_bytes(item: WriteItem) -> int:
    return len(item[0]) + len(item[1]) + len(item[2]) + _ITEM_OVERHEAD_BYTES


class WriterProcess:
    """The sync's side of the helper (module doc). Thread-safe."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc = proc
        self._to = proc.stdin.fileno()
        self._from = proc.stdout.fileno()
        self._cond = threading.Condition()
        self._pending: list[WriteItem] = []
        self._pending_bytes = 0
        self._ready = False
        self._flush_asked: list[int] = []
        """Flushes to send once what was queued before them is sent (the sender alone
        writes to the pipe)."""
        self._closing = False
        self._error: str | None = None
        self._flushed: dict[int, str] = {}
        self._flush_serial = 0
        self.files = 0
        """Files submitted (for tests and traces)."""
        self._sender = threading.Thread(
            target=self._send_loop, name="netopt-writer-send", daemon=True
        )
        self._reader = threading.Thread(
            target=self._read_loop, name="netopt-writer-read", daemon=True
        )
        self._sender.start()
        self._reader.start()

    @classmethod
    def start(cls) -> WriterProcess | None:
        """A running helper, or None where one cannot be started (the sync then writes
        its files itself)."""
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "netopt.dataplane.writerproc", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, close_fds=True,
            )  # fmt: skip
        except (OSError, ValueError) as exc:
            log.debug("no file writer process (%s): the sync writes its files itself", exc)
            return None
        return cls(proc)

    def ready(self, wait_s: float = READY_WAIT_S) -> bool:
        """Wait until the helper says it is ready (imports done) or `wait_s` passed; False
        (and the helper ended) when it is not: the sync then writes its files itself."""
        if self._await_ready(wait_s):
            return True
        log.debug("the file writer process did not start: the sync writes its files itself")
        with contextlib.suppress(StorageError):
            self.close()
        return False

    def _await_ready(self, wait_s: float) -> bool:
        """`ready`'s wait; a helper not ready by then is killed (its reader then notes it).
        One that failed after it started is left to place what it was handed."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._error is not None, wait_s)
            started, ok = self._ready, self._ready and self._error is None
        if not started:
            self._proc.kill()
        return ok

    def submit(self, items: Sequence[WriteItem]) -> None:
        """Queue ``items`` for the helper; waits while the queue is full. StorageError once
        the helper failed (its first error)."""
        size_bytes = sum(len(item[2]) for item in items)
        with self._cond:
            while self._error is None and backlog_full(
                len(self._pending), self._pending_bytes, size_bytes,
                PENDING_MAX_FILES, PENDING_MAX_BYTES,
            ):  # fmt: skip
                self._cond.wait()
            self._raise_error()
            if self._closing:
                raise StorageError("the file writer process is closed")
            self._pending.extend(items)
            self._pending_bytes += size_bytes
            self.files += len(items)
            if len(self._pending) == len(items):  # the sender waits for a first item only
                self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every file submitted so far is in place and durable; StorageError
        with the helper's first error. After `close` (which flushed) only the error."""
        with self._cond:
            self._raise_error()
            if self._closing:
                return
            self._flush_serial += 1
            serial = self._flush_serial
            self._flush_asked.append(serial)
            self._cond.notify_all()
            while serial not in self._flushed and self._error is None:
                self._cond.wait()
            reason = self._flushed.pop(serial, "")
            if reason:
                self._error = self._error or reason
            self._raise_error()

    def close(self) -> None:
        """`flush`, then end the helper (it is ended even when `flush` raises); again:
        only the error, if any."""
        with self._cond:
            closed = self._closing
        if closed:
            self.flush()
            return
        try:
            self._await_ready(READY_WAIT_S)  # a helper that never started fails the flush
            self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._sender.join()
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    # "Quit", then the end of input: a process forked from this one
                    # (without exec) holds the pipe open, and the helper would never
                    # see its end.
                    _send(self._proc.stdin.fileno(), b"Q", b"")
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()  # the helper's end of input: it flushes, exits
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._reader.join()
            if self._proc.stdout is not None:
                self._proc.stdout.close()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise StorageError(self._error)

    def _fail(self, reason: str) -> None:
        with self._cond:
            self._error = self._error or reason
            self._cond.notify_all()

    def _take(self) -> tuple[bytes, bytes | list[WriteItem]] | None:
        """The next message (None: closing with nothing left), under the lock: the files
        queued, at most `MESSAGE_MAX_BYTES` of them, else a flush asked for."""
        while not self._pending and not self._flush_asked and not self._closing:
            self._cond.wait()
        if not self._pending:
            if self._flush_asked:
                return b"F", struct.pack("<Q", self._flush_asked.pop(0))
            return None
        taken, message_bytes, size_bytes = 0, 0, 0
        for item in self._pending:
            more_bytes = _message_bytes(item)
            if taken and (
                taken >= MESSAGE_MAX_FILES or message_bytes + more_bytes > MESSAGE_MAX_BYTES
            ):
                break
            taken += 1
            message_bytes += more_bytes
            size_bytes += len(item[2])
        batch = self._pending[:taken]
        del self._pending[:taken]
        self._pending_bytes -= size_bytes
        self._cond.notify_all()  # room for a waiting submit
        return b"W", batch

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                message = self._take()
            if message is None:
                return
            kind, body = message
            try:
                if self._error is None:
                    if not isinstance(body, bytes):  # pickled here, not under the lock
                        body = pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
                    _send(self._to, kind, body)
            except OSError as exc:
                self._fail(f"the file writer process is gone ({exc.strerror})")
            except Exception as exc:  # a bug: an error, never a flush waiting forever
                log.exception("file writer process: sending failed")
                self._fail(f"the file writer process could not be sent its files ({exc})")

    def _read_loop(self) -> None:
        while True:
            try:
                kind, body = _receive(self._from)
            except (EOFError, OSError, _TooLong):
                with self._cond:
                    closing = self._closing
                if not closing:
                    try:
                        code: int | None = self._proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        code = None
                    self._fail(f"the file writer process exited (status {code})")
                with self._cond:
                    self._cond.notify_all()
                return
            with self._cond:
                if kind == b"R":
                    self._ready = True
                elif kind == b"E":
                    self._error = self._error or body.decode("utf-8", "replace")
                elif kind == b"F" and len(body) >= 8:
                    (serial,) = struct.unpack("<Q", body[:8])
                    self._flushed[serial] = body[8:].decode("utf-8", "replace")
                self._cond.notify_all()


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this helper when the process that started it ends (Linux), however it ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent ended before the call above
        os._exit(1)


def _helper(fd_in: int, fd_out: int) -> int:
    """The helper's loop: write each message's files, answer each flush; returns at the
    end of its input (the sync closed it), once its files are in place."""
    from netopt.dataplane.filewrite import create_whole
    from netopt.durable import BatchFlusher

    flusher = BatchFlusher("netopt-writer-flush")
    error: str | None = None

    def fail(reason: str) -> None:
        nonlocal error
        if error is None:
            error = reason
            _send(fd_out, b"E", reason.encode("utf-8", "replace"))

    _send(fd_out, b"R", b"")
    try:
        while True:
            try:
                kind, body = _receive(fd_in)
            except EOFError:
                return 0
            except _TooLong as exc:
                fail(f"the file writer process refused {exc}")
                return 2
            if kind == b"Q":
                return 0
            if kind == b"W":
                # From the process that started this one, over a pipe only they share.
                items: list[WriteItem] = pickle.loads(body)  # noqa: S301
                for tmp, target, data, mode, mtime_ns, umask, dev in items:
                    if error is not None:
                        break
                    try:
                        left_mode, left_mtime_ns = create_whole(tmp, (data,), mode, mtime_ns, umask)
                    except OSError as exc:
                        fail(f"cannot write {target}: {exc}")
                        break
                    try:
                        flusher.add(
                            tmp, target, len(data), dev, mode=left_mode, mtime_ns=left_mtime_ns
                        )
                    except StorageError as exc:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(tmp)
                        fail(str(exc))
            elif kind == b"F":
                reason = error or ""
                try:
                    flusher.flush()
                except StorageError as exc:
                    fail(str(exc))
                    reason = str(exc)
                _send(fd_out, b"F", body[:8] + reason.encode("utf-8", "replace"))
            else:
                return 2
    finally:
        with contextlib.suppress(StorageError):
            flusher.close()


def main() -> int:
    """``python -m netopt.dataplane.writerproc``: the helper, on stdin and stdout."""
    parent_pid = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else os.getppid()
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _helper(sys.stdin.fileno(), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())

"""Noticing that a served directory changed: inotify where the kernel has it, else stat.

`TreeWatcher.changed()` answers "may anything under the root have changed since the
last call?" without walking the tree when inotify watches every directory: the
kernel queues an event for each write, rename, create, delete and attribute change
at the moment of the system call, so a change made before a request arrives is
already queued when the request is answered. Without inotify (another OS, the
watch limit ``fs.inotify.max_user_watches`` reached, a queue overflow) it answers
True and the caller compares a stat walk (`stat_tree`) with the last one, which
costs a few microseconds per file.

What neither sees: writes through a shared ``mmap`` (no event, and mtime may lag),
and changes on network filesystems made by another host (NFS sends no events).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import stat
from pathlib import Path

from netopt.transfer.manifest import STATE_DIR_NAME

__all__ = ["FileStamp", "TreeWatcher", "stat_tree"]

log = logging.getLogger(__name__)

FileStamp = tuple[int, int, int, int]
"""What a stat walk compares per regular file: size, mtime_ns, ctime_ns, inode."""

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_ONLYDIR = 0x01000000
_WATCH_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
_READ_BYTES = 64 * 1024


def stat_tree(root: Path) -> tuple[dict[str, FileStamp], list[Path]]:
    """Each regular file's stamp by relative POSIX path, and every directory walked.

    Symlinks and special files are skipped as `build_manifest` skips them; the
    sync state directory at the top is not served and not walked.
    """
    files: dict[str, FileStamp] = {}
    dirs: list[Path] = []
    pending = [(root, "")]
    while pending:
        here, prefix = pending.pop()
        dirs.append(here)
        try:
            entries = list(os.scandir(here))
        except FileNotFoundError:
            continue  # removed while walking: the next walk sees the new state
        for entry in entries:
            if not prefix and entry.name == STATE_DIR_NAME:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = prefix + entry.name
            if stat.S_ISDIR(st.st_mode):
                pending.append((Path(entry.path), rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                files[rel] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return files, dirs


class TreeWatcher:
    """inotify watches on every directory of a tree; `changed` drains their events.

    Falls back to "always maybe changed" (callers then stat-walk) when inotify is
    missing or cannot watch the whole tree. Not thread-safe: one caller at a time.
    """

    def __init__(self) -> None:
        self._fd = -1
        self._libc: ctypes.CDLL | None = None
        self._watched: set[str] = set()
        self.reason: str | None = None
        """Why the watcher is not in use (None while inotify covers the tree)."""
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError) as exc:
            self.reason = f"no inotify: {exc}"
            return
        if fd < 0:
            self.reason = f"inotify_init1: {os.strerror(ctypes.get_errno())}"
            return
        self._fd, self._libc = fd, libc

    @property
    def active(self) -> bool:
        """Whether events cover the tree (so `changed` is exact without a walk)."""
        return self._fd >= 0 and self.reason is None

    def watch(self, dirs: list[Path]) -> None:
        """Watch ``dirs`` too (directories already watched are skipped)."""
        if self._libc is None or self.reason is not None:
            return
        for directory in dirs:
            key = os.fsencode(directory)
            if directory.as_posix() in self._watched:
                continue
            wd = self._libc.inotify_add_watch(self._fd, key, _WATCH_MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err in (errno.ENOENT, errno.ENOTDIR):
                    continue  # gone since the walk; its parent's event marks the change
                self.reason = f"inotify_add_watch {directory}: {os.strerror(err)}"
                log.warning("watching the served directory by stat walks: %s", self.reason)
                return
            self._watched.add(directory.as_posix())

    def changed(self) -> bool:
        """True when an event arrived since the last call, or when not `active`."""
        if self._fd < 0:
            return True
        seen = False
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                self.reason = f"inotify read: {exc}"
                return True
            if not data:
                break
            seen = True
            if len(data) < _READ_BYTES:
                break
        # A removed or renamed directory drops its watch: forget them all and let the
        # next walk watch what exists (inotify_add_watch on a watched one is cheap).
        if seen:
            self._watched.clear()
        return seen or self.reason is not None

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

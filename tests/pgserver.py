"""A throwaway PostgreSQL server for the tests: Debian's initdb/pg_ctl in a temporary
directory on a free loopback port, password (SCRAM) authentication over TCP.

Started once per test session (``postgres_server`` in ``tests/conftest.py``); each
test that needs a database gets a fresh one (:meth:`PgServer.new_database`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "netopt"
PASSWORD = "pg-test-password-0123"


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin holding initdb, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def why_unavailable() -> str | None:
    """A reason the server cannot be started here, or None."""
    if postgres_bin() is None:
        return "PostgreSQL binaries missing (apt-get install postgresql; scripts/setup.sh --dev)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgServer:
    port: int
    bin_dir: Path
    data_dir: Path
    _as_user: list[str]
    _count: int = 0

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` (no password: give it as ``password`` or PGPASSWORD)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` through psql on the local socket; returns its output."""
        out = subprocess.run(
            [*self._as_user, str(self.bin_dir / "psql"), "-h", str(self.data_dir), "-p",
             str(self.port), "-U", USER, "-d", database, "-v", "ON_ERROR_STOP=1", "-Atc", sql],
            check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return out.stdout

    def new_database(self) -> str:
        """Create an empty database; returns its URL."""
        self._count += 1
        name = f"t{self._count}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def ctl(self, *args: str) -> None:
        """``pg_ctl ARGS`` on this server (``stop -m immediate``, ``start``...)."""
        # -F (no fsync) is safe for tests: a killed server loses nothing the kernel holds.
        # Commits stay synchronous, so `stop -m immediate` loses no acknowledged row.
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data_dir}"
            " -F -c full_page_writes=off -c max_connections=60"
        )
        subprocess.run(
            [*self._as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir / "db"),
             "-l", str(self.data_dir / "server.log"), "-o", opts, "-w", "-t", "30", *args],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    """initdb + pg_ctl start in a temporary directory; stopped and removed after."""
    bin_dir = postgres_bin()
    assert bin_dir is not None
    root = Path(tempfile.mkdtemp(prefix="netopt-pg-"))
    as_user: list[str] = []
    try:
        if os.geteuid() == 0:  # the server refuses to run as root
            entry = pwd.getpwnam("postgres")
            os.chown(root, entry.pw_uid, entry.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if as_user:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        subprocess.run(
            [*as_user, str(bin_dir / "initdb"), "-D", str(root / "db"), "-U", USER,
             f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
             "--no-sync", "-E", "UTF8", "--locale=C"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        server = PgServer(_free_port(), bin_dir, root, as_user)
        server.ctl("start")
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                server.ctl("stop", "-m", "immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)

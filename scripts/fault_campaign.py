#!/usr/bin/env python3
"""The fault campaign: every failure a border, a disk or a hostile peer can produce, as trials.

    sudo .venv/bin/python scripts/fault_campaign.py                 # everything
    .venv/bin/python scripts/fault_campaign.py --only client-kill --runs 5
    sudo .venv/bin/python scripts/fault_campaign.py --json fault.json

Each trial runs the real commands (`netopt serve`, `netopt sync`, `netopt cache`,
`netopt coordinator`, `netopt agent`) as processes on loopback, or across the lab's
border (network namespaces, 198.18.0.0/15) for the link cuts, and checks what a
user would: the sync's exit code, DEST byte for byte against the origin, that no
file outside DEST appeared, the client's peak RSS, that no request got a 5xx and
no unauthenticated one a 2xx. It prints one table (trial, runs, failures, what
failed) and writes JSON. Trials that need root (disk full on a tmpfs, the lab)
are reported as skipped without it.

The data is real files, not a generator's: a copy of installed Python packages
(the venv's site-packages, .py/.so/data files), capped at ``--data-mb``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from netopt.dataplane.limits import MAX_MANIFEST_ENTRIES

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TOKEN = "campaign-token-0123456789abcdef"  # noqa: S105 (a test token for local servers)


@dataclass
class Trial:
    name: str
    runs: int = 0
    failures: int = 0
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> bool:
        self.runs += 1
        if not ok:
            self.failures += 1
            self.notes.append(what)
        return ok


# ------------------------------------------------------------------ helpers


def real_tree(dest: Path, cap_bytes: int, max_files: int | None = None) -> int:
    """Copy installed packages' files into ``dest`` up to ``cap_bytes``; the bytes copied."""
    site = Path(sysconfig.get_paths()["purelib"])
    total = files = 0
    for path in sorted(site.rglob("*")):
        if not path.is_file() or path.is_symlink() or "__pycache__" in path.parts:
            continue
        size = path.stat().st_size
        if max_files is not None and files >= max_files:
            break
        if total + size > cap_bytes:
            continue  # too big for what is left: smaller files may still fit
        target = dest / path.relative_to(site)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        total += size
        files += 1
    return total


def tree_digest(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".netopt-sync" not in p.parts
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(work: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(work / "xdg"), "NETOPT_TOKEN": TOKEN}


@contextlib.contextmanager
def serve(root: Path, port: int, work: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = start_serve(root, port, work, *extra)
    try:
        yield proc
    finally:
        stop(proc)


def start_serve(root: Path, port: int, work: Path, *extra: str) -> subprocess.Popen[str]:
    log = (work / f"serve-{port}.log").open("a")
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "netopt",
            "serve",
            str(root),
            "--name",
            "ds",
            "--bind",
            f"127.0.0.1:{port}",
            "--chunk-size",
            str(256 * 1024),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env_for(work),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if "serving" in line:
            return proc
        if not line and proc.poll() is not None:
            tail = (work / f"serve-{port}.log").read_text()[-400:]
            raise RuntimeError(f"serve exited {proc.returncode}: {tail}")
    stop(proc)
    raise RuntimeError("serve did not start")


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
    for pipe in (proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


@dataclass
class Ran:
    rc: int
    stdout: str
    stderr: str
    peak_rss_mb: float
    seconds: float


def run_measured(
    argv: list[str],
    env: dict[str, str],
    timeout_s: float,
    preexec: Callable[[], None] | None = None,
) -> Ran:
    """Run ``argv``, sampling its peak RSS (VmHWM) until it exits or times out (then killed)."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, preexec_fn=preexec)
        peak_kb = 0
        while proc.poll() is None:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak_kb = max(peak_kb, int(line.split()[1]))
            if time.monotonic() - started > timeout_s:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return Ran(
            proc.returncode,
            out.read(),
            err.read()[-3000:],
            peak_kb / 1024,
            time.monotonic() - started,
        )


def sync_argv(url: str, dest: Path, cache: Path, *extra: str) -> list[str]:
    return [PY, "-m", "netopt", "sync", url, str(dest), "--cache-dir", str(cache), "--json", *extra]


# ------------------------------------------------------------------ trials


def trial_client_kill(work: Path, runs: int, data_mb: int) -> Trial:
    """kill -9 of the client at random points; the re-run resumes to exact bytes."""
    t = Trial("client kill -9, re-run")
    src = work / "src"
    real_tree(src, data_mb << 20)
    want = tree_digest(src)
    port = free_port()
    rng = random.Random(1)
    with serve(src, port, work):
        url = f"netopt://127.0.0.1:{port}/ds"
        for i in range(runs):
            dest, cache = work / f"dest{i}", work / f"cache{i}"
            # 40 Mbit/s: the transfer lasts a few seconds, so the kill lands mid-way.
            argv = sync_argv(url, dest, cache, "--rate-limit-mbps", "40")
            proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(work)
            )
            time.sleep(rng.uniform(0.3, 3.0))
            proc.kill()
            proc.wait()
            # Nothing under a final name may differ from the origin.
            partial = (
                [
                    rel
                    for rel, data in tree_digest(dest).items()
                    if rel in want and want[rel] != data
                ]
                if dest.exists()
                else []
            )
            ran = run_measured(argv[:-2], env_for(work), 300)
            ok = not partial and ran.rc == 0 and tree_digest(dest) == want
            t.check(ok, f"run {i}: rc {ran.rc}, {len(partial)} partial files {ran.stderr[-200:]}")
    return t


def trial_server_kill(work: Path, runs: int, data_mb: int) -> Trial:
    """kill -9 of the server mid-sync, restarted on the same port 3 s later."""
    t = Trial("server kill -9, restart after 3 s")
    src = work / "src"
    real_tree(src, data_mb << 20)
    want = tree_digest(src)
    for i in range(runs):
        port = free_port()
        server = start_serve(src, port, work)
        dest, cache = work / f"dest{i}", work / f"cache{i}"
        argv = sync_argv(f"netopt://127.0.0.1:{port}/ds", dest, cache, "--rate-limit-mbps", "40")
        client = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_for(work), text=True
        )
        time.sleep(1.0)
        stop(server, signal.SIGKILL)
        time.sleep(3.0)
        server = start_serve(src, port, work)
        try:
            _, err = client.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            client.kill()
            _, err = client.communicate()
        stop(server)
        ok = client.returncode == 0 and tree_digest(dest) == want
        t.check(ok, f"run {i}: rc {client.returncode} {err[-300:]}")
    return t


def trial_disk_full(work: Path) -> Trial:
    """A sync into a full filesystem: a clear error, a consistent cache, then a resume."""
    t = Trial("disk full, then room again")
    if os.geteuid() != 0:
        t.skipped = "needs root (mounts a small tmpfs)"
        return t
    src = work / "src"
    size = real_tree(src, 24 << 20)
    want = tree_digest(src)
    mnt = work / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size * 2 // 3}", "tmpfs", str(mnt)], check=True
    )
    try:
        port = free_port()
        with serve(src, port, work):
            argv = sync_argv(f"netopt://127.0.0.1:{port}/ds", mnt / "dest", mnt / "cache")
            first = run_measured(argv, env_for(work), 300)
            said = (first.stdout + first.stderr).lower()
            t.check(
                first.rc != 0 and ("space" in said or "full" in said),
                f"full disk: rc {first.rc}, {said[-300:]!r}",
            )
            verify = run_measured(
                [
                    PY,
                    "-m",
                    "netopt",
                    "cache",
                    "verify",
                    "--cache-dir",
                    str(mnt / "cache"),
                    "--json",
                ],
                env_for(work),
                120,
            )
            t.check(verify.rc == 0, f"cache verify after full disk: rc {verify.rc} {verify.stderr}")
            subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(mnt)], check=True)
            again = run_measured(argv, env_for(work), 300)
            t.check(
                again.rc == 0 and tree_digest(mnt / "dest") == want,
                f"after room: rc {again.rc} {again.stderr[-200:]}",
            )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    return t


def trial_fd_limit(work: Path, files: int) -> Trial:
    """A tree of many small files synced under ``ulimit -n 256``."""
    t = Trial(f"{files} files at ulimit -n 256")
    import resource

    src = work / "src"
    rng = random.Random(2)
    for i in range(files):
        path = src / f"d{i % 97:02d}" / f"f{i:06d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1024, 4096)))
    want = tree_digest(src)
    port = free_port()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with serve(src, port, work):
        argv = sync_argv(f"netopt://127.0.0.1:{port}/ds", work / "dest", work / "cache")
        ran = run_measured(argv, env_for(work), 900, preexec=limit)
        t.figures["seconds"] = round(ran.seconds, 1)
        t.check(
            ran.rc == 0 and tree_digest(work / "dest") == want, f"rc {ran.rc} {ran.stderr[-300:]}"
        )
    return t


def trial_corrupt_cache(work: Path) -> Trial:
    """Cached chunks corrupted on disk: found, refetched, DEST exact."""
    t = Trial("corrupt chunks in the cache")
    src = work / "src"
    real_tree(src, 8 << 20)
    want = tree_digest(src)
    port = free_port()
    with serve(src, port, work):
        url = f"netopt://127.0.0.1:{port}/ds"
        cache = work / "cache"
        first = run_measured(sync_argv(url, work / "d1", cache), env_for(work), 300)
        t.check(first.rc == 0, f"first sync rc {first.rc}")
        chunks = sorted(p for p in cache.rglob("*") if p.is_file() and len(p.name) >= 64)
        for path in random.Random(3).sample(chunks, min(20, len(chunks))):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        again = run_measured(sync_argv(url, work / "d2", cache), env_for(work), 300)
        t.check(
            again.rc == 0 and tree_digest(work / "d2") == want,
            f"sync over a corrupt cache: rc {again.rc} {again.stderr[-200:]}",
        )
    return t


# A hostile data-plane server: the real app with one answer replaced.


class Hostile:
    """The real data-plane app for ``root`` with middlewares that lie; in a thread."""

    def __init__(self, root: Path, attack: str) -> None:
        self.root, self.attack = root, attack
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Hostile:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("hostile server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=20)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        from aiohttp import web

        from netopt.dataplane.server import ServeSettings, create_app, load_dataset
        from netopt.transfer.manifest import manifest_to_dict
        from netopt.transfer.profile import load_cpu_profile

        dataset = load_dataset(self.root, "ds", 64 * 1024)
        real = manifest_to_dict(dataset.manifest)
        attack = self.attack

        @web.middleware
        async def lie(request: web.Request, handler: Any) -> web.StreamResponse:
            path = request.path
            if attack == "hang":
                await asyncio.sleep(3600)
            if path.endswith("/manifest"):
                if attack == "name-is-a-path":
                    return web.json_response({**real, "name": str(self.root.parent / "victim")})
                if attack == "entry-escapes":
                    files = [{**real["files"][0], "path": "../escaped.txt"}, *real["files"][1:]]
                    return web.json_response({**real, "files": files})
                if attack == "padded-manifest":
                    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
                    resp.content_length = 1536 << 20
                    await resp.prepare(request)
                    await resp.write(json.dumps(real).encode()[:-1])
                    pad = b" " * (1 << 20)
                    with contextlib.suppress(ConnectionError):  # the client left: refused
                        for _ in range(1536):
                            await resp.write(pad)
                    return resp
                if attack == "entries-over-cap":
                    count = MAX_MANIFEST_ENTRIES + 1
                    one = {"path": "", "size_bytes": 0, "mode": 420, "mtime_ns": 0, "chunks": []}
                    files = [{**one, "path": f"f{i:07d}"} for i in range(count)]
                    return web.json_response({**real, "files": files})
                if attack == "giant-chunk":
                    first = real["files"][0]
                    big = {**first, "size_bytes": 1 << 30, "chunks": [["a" * 64, 1 << 30]]}
                    return web.json_response({**real, "files": [big]})
            if attack == "giant-chunk" and (
                "/chunks/" in path or path.endswith(("/batch", "/stream"))
            ):
                resp = web.StreamResponse()
                resp.content_length = 1 << 30
                await resp.prepare(request)
                with contextlib.suppress(ConnectionError):  # the client left: refused
                    for _ in range(1024):
                        await resp.write(b"\0" * (1 << 20))
                return resp
            return await handler(request)

        class Flipped:
            """A dataset that serves every chunk with one byte flipped."""

            manifest, index, sample = dataset.manifest, dataset.index, dataset.sample

            def read_chunk(self, chunk_id: str) -> bytes:
                data = bytearray(dataset.read_chunk(chunk_id))
                data[0] ^= 0x01
                return bytes(data)

        served: Any = Flipped() if attack == "corrupt-payload" else dataset
        app = create_app(
            ServeSettings(token=TOKEN, worker_threads=2), {"ds": served}, load_cpu_profile()
        )
        app.middlewares.append(lie)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()


ATTACKS = (
    "name-is-a-path",
    "entry-escapes",
    "padded-manifest",
    "entries-over-cap",
    "giant-chunk",
    "corrupt-payload",
    "hang",
)


def trial_hostile_server(work: Path) -> Trial:
    """A server that lies: the sync fails clearly, writes nothing outside, stays bounded."""
    t = Trial("malicious server")
    src = work / "src"
    real_tree(src, 4 << 20)
    for attack in ATTACKS:
        run_dir = work / attack
        run_dir.mkdir()
        before = set(p for p in work.rglob("*"))
        with Hostile(src, attack) as hostile:
            argv = sync_argv(
                f"netopt://127.0.0.1:{hostile.port}/ds", run_dir / "dest", run_dir / "cache"
            )
            ran = run_measured(argv, env_for(work), 150)
        outside = [
            p
            for p in set(work.rglob("*")) - before
            if run_dir not in p.parents
            and p != run_dir
            and "xdg" not in p.parts
            and not p.name.startswith("serve-")
        ]
        wrong = []
        if (run_dir / "dest").exists():
            got = tree_digest(run_dir / "dest")
            wrong = [rel for rel, data in got.items() if (src / rel).read_bytes() != data]
        t.figures[f"{attack} peak RSS MB"] = round(ran.peak_rss_mb, 1)
        t.figures[f"{attack} seconds"] = round(ran.seconds, 1)
        ok = ran.rc not in (0, -9) and not outside and not wrong and ran.peak_rss_mb < 600
        t.check(
            ok,
            f"{attack}: rc {ran.rc}, {len(outside)} files outside, {len(wrong)} wrong, "
            f"{ran.peak_rss_mb:.0f} MB, {ran.seconds:.0f} s: {ran.stderr[-160:]!r}",
        )
    return t


# Floods against each listener.


def _coordinator(work: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    token = work / "token"
    token.write_text(TOKEN)
    cfg = work / "coordinator.yaml"
    cfg.write_text(
        f"kind: coordinator\nlisten:\n  host: 127.0.0.1\n  port: {port}\n"
        f"token_file: {token}\ndatabase: {work / 'coord.db'}\n"
    )
    return _daemon("coordinator", cfg, port, work), port


def _daemon(kind: str, cfg: Path, port: int, work: Path) -> subprocess.Popen[str]:
    """``netopt KIND --config CFG``, logging to WORK/KIND.log, once it listens on ``port``."""
    log = (work / f"{kind}.log").open("a")
    proc = subprocess.Popen(
        [PY, "-m", "netopt", kind, "--config", str(cfg)],
        stdout=log,
        stderr=log,
        text=True,
        env=env_for(work),
    )
    wait_port(port)
    return proc


def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


FLOOD_ADDR = "127.0.0.2"

MALFORMED = (
    b'{"n": ' + b"9" * 4301 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"chunks": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b"\xff\xfe not json",
    b'{"a": "' + b"x" * (3 << 20) + b'"}',
)


def _post_statuses(port: int, paths: list[str], auth: bool) -> list[int]:
    import urllib.error
    import urllib.request

    out = []
    for path in paths:
        for body in MALFORMED:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
            req.add_header("Content-Type", "application/json")
            if auth:
                req.add_header("Authorization", f"Bearer {TOKEN}")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (http, loopback)
                    out.append(resp.status)
            except urllib.error.HTTPError as exc:
                out.append(exc.code)
            except OSError:
                out.append(0)  # connection closed: not a 5xx, not an answer either
    return out


def _slowloris(port: int, connections: int, hold_s: float) -> tuple[int, float]:
    """Hold ``connections`` half-sent requests for ``hold_s``; then how many the server
    closed on its own and the seconds a real request took meanwhile."""
    socks = []
    try:
        for _ in range(connections):
            try:
                # From another address than the real request's: the per-address cap is
                # what keeps the attacker's connections from crowding users out.
                s = socket.create_connection(
                    ("127.0.0.1", port), timeout=2, source_address=(FLOOD_ADDR, 0)
                )
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            except OSError:
                break
        time.sleep(hold_s)
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                s.recv(100)
            served_s = time.monotonic() - started
        except OSError:
            served_s = float("inf")
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return closed, served_s
    finally:
        for s in socks:
            s.close()


def trial_floods(work: Path) -> Trial:
    """Malformed JSON, unauthenticated requests and slowloris against every listener."""
    import resource

    t = Trial("floods: malformed, unauthenticated, slowloris")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    src = work / "src"
    real_tree(src, 1 << 20)
    serve_port = free_port()
    coord, coord_port = _coordinator(work)
    agent, agent_port = _agent(work, coord_port)
    dataplane = ["/v1/datasets/ds/batch", "/v1/datasets/ds/stream"]
    listeners = {
        "serve": (serve_port, dataplane, work / f"serve-{serve_port}.log"),
        "coordinator": (coord_port, _coordinator_posts(), work / "coordinator.log"),
        "agent": (agent_port, dataplane, work / "agent.log"),
    }
    try:
        with serve(src, serve_port, work):
            for name, (port, posts, log) in listeners.items():
                statuses = _post_statuses(port, posts, auth=True)
                fives = [s for s in statuses if s >= 500]
                t.check(not fives, f"{name} malformed bodies: {len(fives)} 5xx of {len(statuses)}")
                unauth = _post_statuses(port, posts, auth=False)
                t.check(
                    all(s in (0, 401) for s in unauth),
                    f"{name} unauthenticated: statuses {sorted(set(unauth))}",
                )
                size_before = log.stat().st_size if log.exists() else 0
                closed, served_s = _slowloris(port, 1100, 12.0)
                grown = (log.stat().st_size if log.exists() else 0) - size_before
                t.figures[f"{name} slowloris closed by server"] = closed
                t.figures[f"{name} request under flood s"] = round(served_s, 2)
                t.figures[f"{name} log growth KB"] = round(grown / 1024, 1)
                t.check(
                    served_s < 5 and grown < 256 * 1024,
                    f"{name} slowloris: a request took {served_s:.1f} s, log +{grown} B",
                )
    finally:
        stop(agent)
        stop(coord)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return t


def _coordinator_posts() -> list[str]:
    """Every POST route of the coordinator, from its own route table."""
    from netopt.coordinator.app import ROUTES

    fill = {"{node}": "hk-1", "{dataset}": "ds", "{manifest_id}": "0" * 64}
    paths = []
    for method, path, _ in ROUTES:
        if method == "POST":
            for key, value in fill.items():
                path = path.replace(key, value)
            paths.append(path)
    return paths


def _agent(work: Path, coord_port: int) -> tuple[subprocess.Popen[str], int]:
    port, probe = free_port(), free_port()
    cfg = work / "agent.yaml"
    cfg.write_text(
        f"kind: agent\nnode: hk-1\nregion: hk\ncoordinator_url: http://127.0.0.1:{coord_port}\n"
        f"token_file: {work / 'token'}\nlisten:\n  host: 127.0.0.1\n  port: {port}\n"
        f"probe:\n  port: {probe}\nspool:\n  dir: {work / 'spool'}\n"
        f"cache:\n  dir: {work / 'agent-cache'}\n"
    )
    return _daemon("agent", cfg, port, work), port


def trial_link_cuts(work: Path, cuts_s: tuple[float, ...], data_mb: int) -> Trial:
    """Cut the lab's border link mid-sync; the sync finishes, data flowing soon after."""
    t = Trial("border link cuts " + "/".join(f"{c:g}" for c in cuts_s) + " s")
    if os.geteuid() != 0:
        t.skipped = "needs root (network namespaces)"
        return t
    from netopt.lab import Lab
    from netopt.tlsca import issue_server_files

    src = work / "src"
    real_tree(src, data_mb << 20)
    want = tree_digest(src)
    with Lab.start(REPO / "configs" / "lab" / "two-region.yaml") as lab:
        addr = {n.name: n.address for n in lab.plan.nodes}
        # Across the border as users run it: TLS (a throwaway CA) and a token.
        tls = issue_server_files(work / "tls", "us-1", ips=[addr["us-1"]])
        server = lab.popen(
            "us-1",
            [
                PY,
                "-m",
                "netopt",
                "serve",
                str(src),
                "--name",
                "ds",
                "--bind",
                f"{addr['us-1']}:7470",
                "--tls-cert",
                str(tls.cert),
                "--tls-key",
                str(tls.key),
                "--tls-ca",
                str(tls.ca_cert),
            ],
            env=env_for(work),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)
        try:
            for i, cut_s in enumerate(cuts_s):
                dest = work / f"cut{i}"
                # 40 Mbit/s: the sync is mid-transfer when the link is cut.
                argv = sync_argv(
                    f"netopt://{addr['us-1']}:7470/ds",
                    dest,
                    work / f"cc{i}",
                    "--rate-limit-mbps",
                    "40",
                    "--tls-ca",
                    str(tls.ca_cert),
                )
                # Cut once 1 MiB crossed (the sync's data is moving, most of it left):
                # a fixed delay alone cut a fast machine's sync with under 1 MB to go.
                _cut_mid_sync(lab, t, cut_s, argv, (dest, want), env_for(work), 1 << 20)
        finally:
            stop(server)
    return t


def _cut_mid_sync(
    lab: Any,
    t: Trial,
    cut_s: float,
    argv: list[str],
    want: tuple[Path, dict[str, bytes]],
    env: dict[str, str],
    cut_after_bytes: int = 0,
) -> None:
    """Run ``argv`` (a sync on hk-1 into ``want``'s directory), cut the border link 0.5 s
    in (and once ``cut_after_bytes`` crossed us -> hk) for ``cut_s``; check that data
    flows again within `FLOWING_GOAL_S` of the restore and that the sync ends with
    ``want``'s tree."""
    dest, tree = want
    started = time.monotonic()
    crossed = _us_to_hk_bytes(lab) + cut_after_bytes
    client = lab.popen("hk-1", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env)  # fmt: skip
    time.sleep(0.5)
    while _us_to_hk_bytes(lab) < crossed and client.poll() is None:
        if time.monotonic() - started > CUT_WAIT_S:
            t.check(False, f"cut {cut_s} s: {cut_after_bytes} B had not crossed in {CUT_WAIT_S} s")
            break
        time.sleep(0.02)
    lab.set_link("hk", "us", up=False)
    time.sleep(cut_s)
    lab.set_link("hk", "us", up=True)
    restored = time.monotonic()
    first_s, flowing_s = _seconds_until_flowing(lab, restored, client)
    t.figures[f"cut {cut_s:g} s: first byte after restore s"] = round(first_s, 2)
    t.figures[f"cut {cut_s:g} s: data flowing after restore s"] = round(flowing_s, 2)
    t.check(
        flowing_s <= FLOWING_GOAL_S,
        f"cut {cut_s} s: data flowed after {flowing_s:.1f} s (goal {FLOWING_GOAL_S} s)",
    )
    try:
        _, err = client.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        client.kill()
        _, err = client.communicate()
    ended = time.monotonic()
    t.figures[f"cut {cut_s:g} s: total s"] = round(ended - started, 1)
    t.figures[f"cut {cut_s:g} s: after restore s"] = round(ended - restored, 1)
    t.check(
        client.returncode == 0 and tree_digest(dest) == tree,
        f"cut {cut_s} s: rc {client.returncode} {err[-200:]}",
    )


def trial_web_link_cuts(work: Path, cuts_s: tuple[float, ...], data_mb: int) -> Trial:
    """Cut the lab's border link mid-sync from a web origin (nginx, ranges and ETags, on
    us-1): the sync finishes, data flowing soon after. Plain HTTP: nginx as many
    dataset mirrors serve it; the web engine has no rate limit, so the tree is twice
    the size to be mid-transfer at the cut."""
    t = Trial("web origin: border link cuts " + "/".join(f"{c:g}" for c in cuts_s) + " s")
    if os.geteuid() != 0:
        t.skipped = "needs root (network namespaces)"
        return t
    if shutil.which("nginx") is None:
        t.skipped = "needs nginx"
        return t
    from bench_transfer import nginx_conf

    from netopt.lab import Lab

    src = work / "src"
    real_tree(src, 2 * data_mb << 20)
    # nginx's listing leaves out names that start with a dot: no client of it sees them.
    want = {rel: data for rel, data in tree_digest(src).items()
            if not any(part.startswith(".") for part in rel.split("/"))}  # fmt: skip
    with Lab.start(REPO / "configs" / "lab" / "two-region.yaml") as lab:
        addr = {n.name: n.address for n in lab.plan.nodes}
        conf = nginx_conf(work / "nginx", src, addr["us-1"], 8080)
        server = lab.popen("us-1", ["nginx", "-c", str(conf), "-p", str(work / "nginx")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(1)
        try:
            for i, cut_s in enumerate(cuts_s):
                dest = work / f"cut{i}"
                argv = sync_argv(f"http://{addr['us-1']}:8080/", dest, work / f"cc{i}",
                                 "--name", "ds")  # fmt: skip
                # Once its files move (a quarter of the tree crossed), not while its
                # listing is read: 1 MB of listing pages takes ~1.5 s with no cut at all.
                _cut_mid_sync(lab, t, cut_s, argv, (dest, want), env_for(work),
                              cut_after_bytes=data_mb << 19)  # fmt: skip
        finally:
            stop(server)
    return t


CUT_WAIT_S = 60.0
"""How long a trial waits for the bytes it cuts after."""
FLOWING_GOAL_S = 2.0
"""The goal: data flowing again within 2 s of the link's return."""
FLOWING_BYTES = 1_000_000
"""Bytes delivered us -> hk after the restore that count as "data flowing"."""


def _us_to_hk_bytes(lab: Any) -> int:
    link = lab.counters().links[0]
    return int(link.b_to_a.bytes if link.a == "hk" else link.a_to_b.bytes)


def _seconds_until_flowing(
    lab: Any, restored_s: float, client: subprocess.Popen[str]
) -> tuple[float, float]:
    """Seconds from ``restored_s`` until a first byte and until FLOWING_BYTES more crossed
    us -> hk (inf if never, within 60 s); stops early when the client has exited."""
    start = _us_to_hk_bytes(lab)
    first_s = float("inf")
    while time.monotonic() - restored_s < 60:
        crossed = _us_to_hk_bytes(lab) - start
        if crossed and first_s == float("inf"):
            first_s = time.monotonic() - restored_s
        if crossed >= FLOWING_BYTES:
            return first_s, time.monotonic() - restored_s
        if client.poll() is not None:
            break
        time.sleep(0.01)
    return first_s, float("inf")


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only trials whose key has this")
    parser.add_argument("--runs", type=int, default=20, help="client kills (default 20)")
    parser.add_argument("--server-runs", type=int, default=5, help="server kills (default 5)")
    parser.add_argument("--data-mb", type=int, default=24, help="real data per sync (MB)")
    parser.add_argument("--files", type=int, default=100_000, help="files for the fd trial")
    parser.add_argument("--cuts", default="3,10,30", help="link cuts in seconds")
    parser.add_argument("--json", default="fault-campaign.json", help="where to write JSON")
    args = parser.parse_args()
    cuts = tuple(float(c) for c in args.cuts.split(","))
    trials: dict[str, Callable[[Path], Trial]] = {
        "client-kill": lambda w: trial_client_kill(w, args.runs, args.data_mb),
        "server-kill": lambda w: trial_server_kill(w, args.server_runs, args.data_mb),
        "link-cut": lambda w: trial_link_cuts(w, cuts, args.data_mb),
        "web-link-cut": lambda w: trial_web_link_cuts(w, cuts, args.data_mb),
        "disk-full": trial_disk_full,
        "fd-limit": lambda w: trial_fd_limit(w, args.files),
        "corrupt-cache": trial_corrupt_cache,
        "malicious-server": trial_hostile_server,
        "floods": trial_floods,
    }
    results: list[Trial] = []
    for key, run in trials.items():
        if args.only and not any(o in key for o in args.only):
            continue
        work = Path(tempfile.mkdtemp(prefix=f"netopt-fault-{key}-"))
        started = time.monotonic()
        print(f"== {key}", flush=True)
        try:
            result = run(work)
        except Exception as exc:  # a trial that crashed is a failed trial, with why
            result = Trial(key, runs=1, failures=1, notes=[f"crashed: {exc!r}"])
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result.figures["trial seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
        print(
            f"   {result.runs} runs, {result.failures} failures {result.skipped or ''}", flush=True
        )
    print(f"\n{'trial':45} {'runs':>5} {'failures':>9}  notes")
    for r in results:
        notes = r.skipped or "; ".join(r.notes)[:200]
        print(f"{r.name:45} {r.runs:5d} {r.failures:9d}  {notes}")
        for k, v in r.figures.items():
            print(f"{'':45}   {k}: {v}")
    Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.failures for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m netopt.torch.gpucheck``: the steps behind ``scripts/gpu_check.sh``.

1. ``probe``: torch, CUDA, the GPU count and the NCCL version torch ships.
2. ``nccl_env``: ``netopt nccl-env`` for this machine's own interfaces (see
   :mod:`netopt.torch.gpucheck_report` for the links file), loaded with
   ``set -a; . ./nccl.env; set +a`` in bash; the variables it set are what is checked.
3. ``rank1``: in that environment, with ``NCCL_DEBUG=INFO``, one rank all-reduces over
   NCCL, a Gloo group beside it too, and the advised DDP comm hooks run training steps
   (:mod:`netopt.torch.gpucheck_worker`).
4. ``env_log``: NCCL's log judged per variable (:mod:`netopt.torch.nccllog`).
5. ``busbw``: with two or more GPUs, a 2-rank all-reduce bus bandwidth without and with
   the env file (intra-node, for the record), and a 2-rank run over NCCL's socket
   transport (P2P and SHM off) whose log confirms the socket variables one rank never reads.
6. ``doctor``: ``netopt doctor --json`` finds the GPU through nvidia-smi.

Every step is bounded (its own timeout, and the whole run by ``--budget-s``), and the
report is always written. ``--cpu`` runs the same path on Gloo/CPU (for the tests).
Exit codes: 0 pass, 1 a check failed, 2 bad arguments, 3 passed with variables NCCL's
log could not confirm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from netopt.agent.host import local_nics
from netopt.errors import NetoptError
from netopt.fsutil import atomic_write_bytes
from netopt.torch.gpucheck_report import (
    TWIN_NODE,
    StepResult,
    WanFigures,
    exit_code,
    local_links_document,
    node_name,
    report_document,
    write_report,
)
from netopt.torch.gpucheck_worker import RESULT_PREFIX
from netopt.torch.nccllog import EnvCheck, check_env_log, loaded_variables, merge_checks, parse_env0
from netopt.torch.rendezvous import rendezvous_port

__all__ = ["CheckRun", "load_env_file", "main", "run_check"]

ENV_FILE = "nccl.env"
_LOAD = 'set -a; . ./{file} || exit 97; set +a; exec "$@"'
_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}
_PROBE = """
import json, torch
cuda = torch.cuda.is_available()
gpus = torch.cuda.device_count() if cuda else 0
nccl = torch.cuda.nccl.version() if cuda else None
if isinstance(nccl, int):  # before torch 1.x-2.0 it was one integer, 2708 for 2.7.8
    nccl = (nccl // 1000, nccl % 1000 // 100, nccl % 100)
print(json.dumps({
    "torch": torch.__version__, "cuda": cuda, "cuda_version": torch.version.cuda, "gpus": gpus,
    "names": [torch.cuda.get_device_name(i) for i in range(gpus)],
    "nccl": ".".join(map(str, nccl)) if nccl else None,
}))
"""
CPU_NCCL_VERSION = "2.21.5"
"""``--cpu``: torch has no NCCL, so the env file is written for nccl-env's default."""


@dataclass
class CheckRun:
    """One run's state: options, the deadline, and what earlier steps found."""

    out_dir: Path
    cpu: bool
    deadline_s: float
    figures: WanFigures = field(default_factory=WanFigures)
    steps: list[StepResult] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    env_check: EnvCheck | None = None

    def left_s(self) -> float:
        """Seconds left in the budget."""
        return self.deadline_s - time.monotonic()


def _run(
    argv: Sequence[str], timeout_s: float, *, cwd: Path, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """(exit code, stdout+stderr) of ``argv``; its whole process group is killed past the
    timeout (rc 124). Raises nothing for a failing command; OSError becomes rc 127."""
    try:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env) if env is not None else None, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc}"
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, (out or "") + f"\n(killed after {timeout_s:.0f} s)"


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def load_env_file(directory: Path, name: str = ENV_FILE, timeout_s: float = 10.0) -> dict[str, str]:
    """The variables ``set -a; . ./name; set +a`` defines in bash, run in ``directory``.

    Raises NetoptError when bash fails to source the file.
    """
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(directory)}
    before_rc, before = _run(["bash", "-c", "env -0"], timeout_s, cwd=directory, env=base_env)
    load = _LOAD.format(file=name)
    rc, after = _run(
        ["bash", "-c", load, "bash", "env", "-0"], timeout_s, cwd=directory, env=base_env
    )
    if before_rc or rc:
        raise NetoptError(f"bash could not load {name} with set -a: {_tail(after)}")
    return loaded_variables(parse_env0(before.encode()), parse_env0(after.encode()))


def _step(run: CheckRun, name: str, timeout_s: float, body: Callable[[float], StepResult]) -> None:
    budget = min(timeout_s, run.left_s() - 2)
    if budget < 5:
        run.steps.append(
            StepResult(name, "fail", f"no time left in the budget (needs {timeout_s:.0f} s)")
        )
        return
    started = time.monotonic()
    try:
        result = body(budget)
    except NetoptError as exc:
        result = StepResult(name, "fail", str(exc))
    except Exception as exc:  # a bug in a step must still leave a report
        result = StepResult(name, "fail", f"{type(exc).__name__}: {exc}")
    run.steps.append(StepResult(result.name, result.status, result.reason,
                                round(time.monotonic() - started, 2), result.details))  # fmt: skip


def _probe(run: CheckRun, timeout_s: float) -> StepResult:
    rc, out = _run([sys.executable, "-c", _PROBE], timeout_s, cwd=run.out_dir)
    if rc != 0:
        return StepResult("probe", "fail", f"torch could not be imported (rc {rc}): {_tail(out)}")
    run.probe = json.loads(out.strip().splitlines()[-1])
    if not run.cpu and not run.probe["cuda"]:
        return StepResult("probe", "fail", "torch sees no CUDA device", details=run.probe)
    return StepResult("probe", "pass", details=run.probe)


def _nccl_env(run: CheckRun, timeout_s: float) -> StepResult:
    node = node_name(socket.gethostname())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    links = run.out_dir / "local-links.yaml"
    document = local_links_document(node, local_nics(), run.figures, when)
    atomic_write_bytes(links, yaml.safe_dump(document, sort_keys=False).encode())
    nccl = run.probe.get("nccl") or CPU_NCCL_VERSION
    torch_version = str(run.probe.get("torch", "2.4")).split("+")[0]
    argv = [sys.executable, "-m", "netopt", "nccl-env", "--links", str(links),
            "--nodes", f"{node},{TWIN_NODE}",
            "--nccl-version", nccl, "--torch-version", torch_version, "-o", ENV_FILE]  # fmt: skip
    rc, out = _run(argv, timeout_s, cwd=run.out_dir)
    if rc != 0:
        return StepResult("nccl_env", "fail", f"netopt nccl-env exited {rc}: {_tail(out)}")
    run.env = load_env_file(run.out_dir)
    if not run.env:
        return StepResult("nccl_env", "fail", f"{ENV_FILE} set no variables")
    details = {"node": node, "nccl_version": nccl, "torch_version": torch_version,
               "env_file": str(run.out_dir / ENV_FILE), "variables": run.env}  # fmt: skip
    return StepResult("nccl_env", "pass", details=details)


def _parts(output: str) -> dict[str, dict[str, Any]]:
    parts: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            item = json.loads(line[len(RESULT_PREFIX) :])
            parts[str(item["part"])] = item
    return parts


def _loaded_argv(argv: Sequence[str], with_env: bool) -> list[str]:
    """``argv`` run by bash after it loads the env file (or directly, without it)."""
    return ["bash", "-c", _LOAD.format(file=ENV_FILE), "bash", *argv] if with_env else list(argv)


def _rank1(run: CheckRun, timeout_s: float) -> list[StepResult]:
    worker_timeout_s = str(int(max(10, timeout_s - 10)))
    argv = [sys.executable, "-m", "netopt.torch.gpucheck_worker", "--port", str(rendezvous_port()),
            "--timeout-s", worker_timeout_s, *(["--cpu"] if run.cpu else [])]  # fmt: skip
    env = {**os.environ, **_DEBUG_ENV}
    rc, out = _run(_loaded_argv(argv, True), timeout_s, cwd=run.out_dir, env=env)
    atomic_write_bytes(run.out_dir / "rank1.log", out.encode())
    parts = _parts(out)
    results = []
    for step, names in (("allreduce_1rank", ("allreduce", "gloo")),
                        ("hooks", ("hook:bf16_compress_hook", "hook:powerSGD_hook"))):  # fmt: skip
        got = {n: parts.get(n) for n in names}
        missing = [n for n, p in got.items() if p is None]
        failed = [
            f"{n}: {p.get('error') or 'check failed'}" for n, p in got.items() if p and not p["ok"]
        ]
        if missing:
            why = f"worker exited {rc} before reporting {', '.join(missing)}: {_tail(out)}"
            results.append(
                StepResult(step, "fail", why, details={k: v for k, v in got.items() if v})
            )
        elif failed:
            results.append(StepResult(step, "fail", "; ".join(failed), details=got))
        else:
            results.append(StepResult(step, "pass", details=got))
    gloo = parts.get("gloo") or {}
    elsewhere = (
        {"GLOO_SOCKET_IFNAME": "a Gloo group formed on it and all-reduced"}
        if gloo.get("ok")
        else {}
    )
    run.env_check = check_env_log(run.env, out, elsewhere)
    return results


def _env_log_step(run: CheckRun) -> StepResult:
    check = run.env_check
    if check is None:
        return StepResult("env_log", "fail", "no log to check (an earlier step failed)")
    rejected = [v for v in check.verdicts if v.status == "rejected"]
    details = {
        "accepted": check.named("accepted"),
        "rejected": check.named("rejected"),
        "not_echoed": check.named("not_echoed"),
        "log": str(run.out_dir / "rank1.log"),
    }
    if rejected:
        reason = "; ".join(f"{v.name}={v.value}: {v.evidence}" for v in rejected)
        return StepResult("env_log", "fail", reason, details=details)
    unconfirmed = check.named("not_echoed")
    note = (
        f"not echoed by NCCL (cannot be confirmed from the log): {', '.join(unconfirmed)}"
        if unconfirmed
        else ""
    )
    return StepResult("env_log", "pass", note, details=details)


def _busbw_row(item: Mapping[str, Any]) -> dict[str, Any]:
    from netopt.torch.bench import bus_bandwidth_gbps

    size, time_s = int(item["size_bytes"]), float(item["time_s"])
    algbw_gbps = size / time_s / 1e9 if time_s > 0 else 0.0
    return {
        "size_bytes": size,
        "time_s": time_s,
        "busbw_gbps": round(bus_bandwidth_gbps(algbw_gbps, 2), 3),
    }


def _busbw(run: CheckRun, timeout_s: float) -> StepResult:
    from netopt.torch import bench

    gpus = int(run.probe.get("gpus") or 0)
    if not run.env:
        return StepResult(
            "busbw", "fail", f"no {ENV_FILE} to compare with (an earlier step failed)"
        )
    if not run.cpu and gpus < 2:
        return StepResult("busbw", "skipped", f"{gpus} GPU: a 2-rank all-reduce needs two")
    backend = "gloo" if run.cpu else "nccl"
    sizes = (1 << 20,) if run.cpu else bench.size_ladder(1 << 20, 256 << 20)
    details: dict[str, Any] = {
        "backend": backend,
        "note": "intra-node, for the record: not a WAN figure",
    }
    runs: list[tuple[str, bool, dict[str, str]]] = [
        ("without_env", False, {}),
        ("with_env", True, {}),
    ]
    if not run.cpu:
        runs.append(
            (
                "socket_transport",
                True,
                {**_DEBUG_ENV, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
            )
        )
    per_run_s = timeout_s / len(runs)
    for label, with_env, extra in runs:
        master = f"127.0.0.1:{rendezvous_port()}"
        logs = [run.out_dir / f"busbw-{label}.rank{r}.log" for r in range(2)]

        def argv_for(rank: int, master: str = master, with_env: bool = with_env) -> list[str]:
            ifname = "lo" if run.cpu and not with_env else None
            iters = 2 if run.cpu else 5
            argv = bench.worker_argv(
                rank, 2, master, sizes, iters=iters, warmup=1,
                backend=backend, ifname=ifname, timeout_s=per_run_s,
            )  # fmt: skip
            return _loaded_argv(argv, with_env)

        def start(rank: int, argv: list[str], extra: Mapping[str, str] = extra,
                  logs: list[Path] = logs) -> subprocess.Popen[str]:  # fmt: skip
            with logs[rank].open("w") as log:
                return subprocess.Popen(argv, cwd=run.out_dir, env={**os.environ, **extra},
                                        stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip

        document = bench.run_allreduce(start, argv_for, 2, per_run_s)
        details[label] = [_busbw_row(item) for item in document["results"]]
        if label == "socket_transport" and run.env_check is not None:
            text = "\n".join(p.read_text(errors="replace") for p in logs)
            run.env_check = merge_checks(run.env_check, check_env_log(run.env, text))
    return StepResult("busbw", "pass", details=details)


def _doctor(run: CheckRun, timeout_s: float) -> StepResult:
    argv = [sys.executable, "-m", "netopt", "doctor", "--json", "--no-mtu"]
    rc, out = _run(argv, timeout_s, cwd=run.out_dir)
    start = out.find("{")
    if start < 0:
        return StepResult("doctor", "fail", f"netopt doctor exited {rc} without JSON: {_tail(out)}")
    document = json.loads(out[start:])
    gpus = document.get("facts", {}).get("host", {}).get("gpus", [])
    skipped = [s["reason"] for s in document.get("not_checked", []) if s.get("check") == "gpu"]
    findings = [
        f for f in document.get("findings", []) if str(f.get("check", "")).startswith("gpu")
    ]
    details = {"gpus": gpus, "gpu_findings": findings}
    if skipped or not gpus:
        return StepResult(
            "doctor", "fail", "; ".join(skipped) or "no GPU reported", details=details
        )
    blank = [
        f"gpu{g['index']}"
        for g in gpus
        if g.get("utilization_pct") is None or g.get("pcie_width") is None
    ]
    if blank:
        why = f"nvidia-smi gave no utilisation or PCIe width for {', '.join(blank)}"
        return StepResult("doctor", "fail", why, details=details)
    return StepResult("doctor", "pass", details=details)


def _rank1_steps(run: CheckRun) -> list[StepResult]:
    names = ("allreduce_1rank", "hooks")
    budget = min(120, run.left_s() - 2)
    if not run.env or budget < 5:
        why = "not run: no env file" if not run.env else "no time left in the budget"
        return [StepResult(name, "fail", why) for name in names]
    started = time.monotonic()
    try:
        results = _rank1(run, budget)
    except Exception as exc:  # a bug in a step must still leave a report
        results = [StepResult(name, "fail", f"{type(exc).__name__}: {exc}") for name in names]
    elapsed_s = round(time.monotonic() - started, 2)
    return [replace(r, elapsed_s=elapsed_s) for r in results]


def run_check(run: CheckRun) -> dict[str, Any]:
    """Run every step (later ones that need an earlier one fail with the reason)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _step(run, "probe", 90, lambda t: _probe(run, t))
    if run.steps[-1].status == "pass":
        _step(run, "nccl_env", 60, lambda t: _nccl_env(run, t))
    run.steps += _rank1_steps(run)
    _step(run, "busbw", 150, lambda t: _busbw(run, t))
    run.steps.append(_env_log_step(run))
    _step(run, "doctor", 60, lambda t: _doctor(run, t))
    meta = {
        "mode": "cpu" if run.cpu else "cuda",
        "host": socket.gethostname(),
        "started_at": started,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "probe": run.probe,
    }
    return report_document(meta, run.steps, run.env_check)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="netopt.torch.gpucheck", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="Directory for nccl.env, logs and report.json")
    parser.add_argument("--cpu", action="store_true", help="Gloo on CPU (the test suite's path)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="Bound on the whole run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the check, write ``OUT/report.json``, print a summary; see the module docstring."""
    args = _parse(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = CheckRun(out, args.cpu, time.monotonic() + args.budget_s)
    document = run_check(run)
    write_report(str(out / "report.json"), document)
    for step in document["steps"]:
        print(f"{step['status']:>7}  {step['name']:<16} {step['reason'][:300]}")
    for item in document["variables"]:
        if item["status"] != "accepted":
            print(f"{item['status']:>11}  {item['name']}={item['value']}: {item['evidence'][:200]}")
    print(f"verdict: {document['verdict']}  (report: {out / 'report.json'})")
    return exit_code(document["verdict"])


if __name__ == "__main__":
    sys.exit(main())

"""GPU utilisation and PCIe link width from ``nvidia-smi`` (where it exists; never guessed).

:func:`query_gpus` runs ``nvidia-smi`` (bounded); :func:`parse_gpus` and
:func:`check_gpus` are pure.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from netopt.doctor.findings import Finding, Skipped

__all__ = ["QUERY_FIELDS", "GpuFacts", "check_gpus", "parse_gpus", "query_gpus"]

QUERY_FIELDS = (
    "index",
    "name",
    "utilization.gpu",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
)
_TIMEOUT_S = 10.0
LOW_UTILISATION_PCT = 50.0


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as nvidia-smi reports it (None where it says N/A)."""

    index: int
    name: str
    utilization_pct: float | None
    pcie_width: int | None
    pcie_width_max: int | None
    pcie_gen: int | None
    pcie_gen_max: int | None


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str) -> int | None:
    value = _num(text)
    return int(value) if value is not None else None


def parse_gpus(csv_text: str) -> tuple[GpuFacts, ...]:
    """Parse ``nvidia-smi --query-gpu=QUERY_FIELDS --format=csv,noheader,nounits`` output."""
    gpus = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS) or not cells[0].isdigit():
            continue
        gpus.append(
            GpuFacts(
                index=int(cells[0]),
                name=cells[1],
                utilization_pct=_num(cells[2]),
                pcie_width=_int(cells[3]),
                pcie_width_max=_int(cells[4]),
                pcie_gen=_int(cells[5]),
                pcie_gen_max=_int(cells[6]),
            )
        )
    return tuple(gpus)


def query_gpus() -> tuple[tuple[GpuFacts, ...] | None, str | None]:
    """``(gpus, None)``, or ``(None, why not)`` when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no nvidia-smi: GPU not checked"
    argv = [exe, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed ({exc}): GPU not checked"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"nvidia-smi exited {proc.returncode} ({detail[0]}): GPU not checked"
    return parse_gpus(proc.stdout), None


def check_gpus(gpus: Sequence[GpuFacts]) -> tuple[list[Finding], list[Skipped]]:
    """PCIe links below their maximum width, and GPUs mostly idle at the time of the check."""
    findings: list[Finding] = []
    if not gpus:
        return findings, [Skipped("gpu", "nvidia-smi lists no GPUs: GPU not checked")]
    for gpu in gpus:
        if gpu.pcie_width and gpu.pcie_width_max and gpu.pcie_width < gpu.pcie_width_max:
            findings.append(
                Finding(
                    check="gpu.pcie",
                    impact=40 * (1 - gpu.pcie_width / gpu.pcie_width_max) + 10,
                    title=f"GPU {gpu.index} PCIe link runs narrower than it can",
                    subject=f"gpu{gpu.index}",
                    evidence=f"{gpu.name}: PCIe x{gpu.pcie_width} of x{gpu.pcie_width_max} "
                    f"(gen {gpu.pcie_gen} of {gpu.pcie_gen_max})",
                    fix="reseat the card or move it to a full-width slot; check the BIOS "
                    "bifurcation setting (lspci -vv shows LnkSta)",
                )
            )
    busy = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
    if busy and max(busy) < LOW_UTILISATION_PCT:
        findings.append(
            Finding(
                check="gpu.utilisation",
                impact=10,
                title="GPUs mostly idle during the check",
                evidence="utilisation "
                + ", ".join(
                    f"gpu{g.index} {g.utilization_pct:g}%"
                    for g in gpus
                    if g.utilization_pct is not None
                )
                + " (run the doctor while "
                "training to judge whether input or network starves them)",
                fix="if training was running: raise DataLoader workers/prefetch, check the "
                "network findings above",
            )
        )
    return findings, []

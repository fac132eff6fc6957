"""What the doctor reports: findings, the checks it could not run, and their ranking.

A :class:`Finding` is one diagnosed problem: the check that found it, an
expected-impact score (0-100: roughly the share of training throughput at
stake), the evidence, the exact fix and whether ``netopt doctor --apply`` can
apply it (``sysctls``: the safe settings it would write on this node). A
:class:`Skipped` records a check that could not run and why ("no nvidia-smi:
GPU not checked"), so the report never passes silence off as health.

Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DoctorReport",
    "Finding",
    "Severity",
    "Skipped",
    "rank_findings",
    "severity_of",
]

Severity = Literal["critical", "warning", "info"]
CRITICAL_IMPACT = 60.0
WARNING_IMPACT = 25.0


def severity_of(impact: float) -> Severity:
    """``critical`` from 60, ``warning`` from 25, else ``info`` (impact on a 0-100 scale)."""
    if impact >= CRITICAL_IMPACT:
        return "critical"
    if impact >= WARNING_IMPACT:
        return "warning"
    return "info"


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem and how to fix it.

    ``impact`` is clamped to 0-100. ``sysctls`` lists ``(name, value)`` pairs that
    ``--apply`` may write on this node; a finding with any is ``auto_fixable``.
    """

    check: str
    impact: float
    title: str
    evidence: str
    fix: str
    sysctls: tuple[tuple[str, str], ...] = ()
    subject: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "impact", round(min(100.0, max(0.0, self.impact)), 1))

    @property
    def severity(self) -> Severity:
        """The impact as a word."""
        return severity_of(self.impact)

    @property
    def auto_fixable(self) -> bool:
        """Whether ``netopt doctor --apply`` can apply the fix on this node."""
        return bool(self.sysctls)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``--json``)."""
        return {
            "check": self.check,
            "severity": self.severity,
            "impact": self.impact,
            "title": self.title,
            "subject": self.subject,
            "evidence": self.evidence,
            "fix": self.fix,
            "auto_fixable": self.auto_fixable,
            "sysctls": {name: value for name, value in self.sysctls},
        }


@dataclass(frozen=True)
class Skipped:
    """A check that could not run, and why (``no nvidia-smi: GPU not checked``)."""

    check: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """JSON-able form."""
        return {"check": self.check, "reason": self.reason}


def rank_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Highest expected impact first; ties by check, subject and title (deterministic)."""
    return tuple(sorted(findings, key=lambda f: (-f.impact, f.check, f.subject, f.title)))


@dataclass(frozen=True)
class DoctorReport:
    """A whole diagnosis: ranked findings, skipped checks, the checks that ran."""

    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...] = ()
    checks_run: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        findings: Iterable[Finding],
        skipped: Iterable[Skipped] = (),
        checks_run: Iterable[str] = (),
        facts: dict[str, Any] | None = None,
    ) -> DoctorReport:
        """A report with the findings ranked and the lists de-duplicated in order."""
        return cls(
            findings=rank_findings(findings),
            skipped=tuple(dict.fromkeys(skipped)),
            checks_run=tuple(dict.fromkeys(checks_run)),
            facts=dict(facts or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``netopt doctor --json``)."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "not_checked": [s.to_dict() for s in self.skipped],
            "checks_run": list(self.checks_run),
            "facts": self.facts,
        }

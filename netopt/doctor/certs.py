"""Certificates that expire soon: ``netopt doctor`` warns 30 days ahead (pure)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from netopt.doctor.findings import Finding

__all__ = ["WARN_DAYS", "check_certs"]

WARN_DAYS = 30.0
"""A certificate expiring within this many days is a finding."""


def check_certs(
    expiries: Sequence[tuple[str, dt.datetime]], now: dt.datetime, warn_days: float = WARN_DAYS
) -> list[Finding]:
    """A finding per certificate (path, notAfter) that has expired or expires within
    ``warn_days`` of ``now``; the sooner, the higher the impact."""
    findings = []
    for path, not_after in expiries:
        days_left = (not_after - now).total_seconds() / 86400
        if days_left > warn_days:
            continue
        if days_left <= 0:
            title, impact = f"TLS certificate {path} has expired", 90.0
        else:
            title = f"TLS certificate {path} expires in {days_left:.1f} days"
            impact = 70.0 if days_left <= 7 else 40.0
        findings.append(
            Finding(
                check="tls",
                impact=impact,
                title=title,
                evidence=f"notAfter {not_after.isoformat()}",
                fix="renew it: netopt tls renew NODE --dir CA_DIR --dns ... --ip ... "
                "(the CA itself: netopt tls init --force, then re-issue every node)",
                subject=path,
            )
        )
    return findings

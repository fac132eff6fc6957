"""``netopt doctor``: diagnose what slows a training cluster down, and how to fix it.

Checks are pure functions over gathered facts (:mod:`.host`, :mod:`.gpu`,
:mod:`.tcp`, :mod:`.ports`, :mod:`.mtu`, :mod:`.clock`); :mod:`.findings`
ranks what they find; :mod:`.apply` applies and undoes the safe sysctl fixes;
:func:`run_doctor` runs everything this node can.
"""

from __future__ import annotations

from netopt.doctor.findings import DoctorReport, Finding, Skipped, rank_findings
from netopt.doctor.run import DoctorOptions, run_doctor

__all__ = ["DoctorOptions", "DoctorReport", "Finding", "Skipped", "rank_findings", "run_doctor"]

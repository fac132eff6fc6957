"""Residency rules, pure: may a dataset be placed in a region?"""

from __future__ import annotations

from netopt.config.datasets import DatasetSpec, DatasetsSettings
from netopt.errors import ResidencyError

__all__ = ["check_residency", "find_spec", "residency_violation"]


def find_spec(
    catalogue: DatasetsSettings, name: str, source: str | None = None
) -> DatasetSpec | None:
    """The catalogue entry for dataset ``name`` (or whose origin is ``source``), or None."""
    spec = catalogue.get(name)
    if spec is None and source is not None:
        spec = next(
            (d for d in catalogue.datasets if d.origin.rstrip("/") == source.rstrip("/")), None
        )
    return spec


def residency_violation(spec: DatasetSpec | None, region: str | None) -> str | None:
    """Why placing ``spec``'s data in ``region`` is forbidden, or None when it is allowed.

    A dataset without a rule may go anywhere. A dataset with a rule needs a known
    region inside it (an unknown region is refused: the rule cannot be checked).
    """
    if spec is None or spec.residency is None:
        return None
    allowed = ", ".join(spec.residency)
    rule = f"dataset {spec.name!r} has residency: [{allowed}]"
    if region is None:
        return f"{rule}, and this node's region is unknown (give --region or an agent config)"
    if region not in spec.residency:
        return f"{rule}; region {region!r} is outside it"
    return None


def check_residency(spec: DatasetSpec | None, region: str | None) -> None:
    """Raise ResidencyError (naming the rule) when ``region`` may not hold ``spec``'s data."""
    reason = residency_violation(spec, region)
    if reason is not None:
        raise ResidencyError(f"refused: {reason}")

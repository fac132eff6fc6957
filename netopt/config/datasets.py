"""The dataset catalogue file (``configs/datasets.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from netopt.config.common import check_dataset_name, check_name
from netopt.config.loader import Invalid

__all__ = ["ORIGIN_SCHEMES", "DatasetSpec", "DatasetsSettings"]

ORIGIN_SCHEMES = ("file", "http", "https", "s3", "netopt")


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: where it comes from and where it may live."""

    name: str
    origin: str
    residency: tuple[str, ...] | None = None
    pin: bool = False
    description: str | None = None

    def __post_init__(self) -> None:
        check_dataset_name("name", self.name)
        scheme = self.origin.split("://", 1)[0] if "://" in self.origin else "file"
        if scheme not in ORIGIN_SCHEMES:
            raise Invalid(
                "origin",
                f"has unknown scheme {scheme!r}",
                "a path or a URL with one of " + ", ".join(ORIGIN_SCHEMES),
            )
        if self.residency is not None:
            if not self.residency:
                raise Invalid("residency", "is an empty list", "at least one region")
            for i, region in enumerate(self.residency):
                check_name(f"residency[{i}]", region, "region name")


@dataclass(frozen=True)
class DatasetsSettings:
    """The whole catalogue file."""

    datasets: tuple[DatasetSpec, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, spec in enumerate(self.datasets):
            if spec.name in seen:
                raise Invalid(f"datasets[{i}].name", f"{spec.name!r} is defined twice", "unique")
            seen.add(spec.name)

    def get(self, name: str) -> DatasetSpec | None:
        """The dataset called ``name``, or None."""
        return next((d for d in self.datasets if d.name == name), None)

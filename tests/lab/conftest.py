"""Fixtures for lab tests: real network namespaces, so they need root (CAP_NET_ADMIN).

Use them from any lab test::

    @pytest.mark.lab
    def test_something(two_region_lab: Lab) -> None:
        lab.exec("hk-1", ["ping", "-c", "1", "us-1"])

``two_region_lab`` is ``configs/lab/two-region.yaml`` (hk <-> us: 100 Mbit/s,
40 ms one-way, 0.5% loss per direction), built once per session. Tests that
cut links must restore them. ``make_lab`` builds a lab of your own (from a
path, a LabTopology or YAML text) and tears it down after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from netopt.config import LabTopology, parse_settings
from netopt.lab import Lab
from netopt.lab.netns import has_net_admin

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NEEDS_ROOT = "lab tests need CAP_NET_ADMIN (root) to create network namespaces"

MakeLab = Callable[[LabTopology | Path | str], Lab]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip every lab-marked test, with the reason, when not root."""
    if has_net_admin():
        return
    skip = pytest.mark.skip(reason=NEEDS_ROOT)
    for item in items:
        if item.get_closest_marker("lab"):
            item.add_marker(skip)


def topology_from_yaml(text: str) -> LabTopology:
    """A LabTopology from YAML text (for tests that describe their own lab)."""
    topology = parse_settings(text, "<test topology>", "lab", env={})
    assert isinstance(topology, LabTopology)
    return topology


@pytest.fixture(scope="session")
def two_region_lab() -> Iterator[Lab]:
    """configs/lab/two-region.yaml, up for the whole session (read-only use, please)."""
    if not has_net_admin():
        pytest.skip(NEEDS_ROOT)
    with Lab.start(CONFIGS / "lab" / "two-region.yaml") as lab:
        yield lab


@pytest.fixture
def make_lab() -> Iterator[MakeLab]:
    """Build labs inside a test; all are torn down when it ends."""
    if not has_net_admin():
        pytest.skip(NEEDS_ROOT)
    labs: list[Lab] = []

    def make(topology: LabTopology | Path | str) -> Lab:
        if isinstance(topology, str) and "\n" in topology:
            topology = topology_from_yaml(topology)
        lab = Lab.start(topology)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.close()

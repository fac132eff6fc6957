"""Lab topology files: the examples load, bad files get errors naming key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from netopt.config import LabTopology, load_settings, parse_settings
from netopt.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "lab"

GOOD = """\
kind: lab
regions:
  hk: {nodes: [hk-1, hk-2]}
  us: {nodes: [us-1]}
links:
  - between: [hk, us]
    rate_mbps: 100
    delay_ms: 40
"""


def load(text: str) -> LabTopology:
    result = parse_settings(text, "lab.yaml", "lab", env={})
    assert isinstance(result, LabTopology)
    return result


def test_examples_hold_the_issue_figures() -> None:
    two = load_settings(CONFIGS / "two-region.yaml", "lab", env={})
    link = two.link_between("hk", "us")
    assert link is not None
    assert (link.rate_mbps, link.delay_ms, link.loss_ratio) == (100, 40, 0.005)
    assert len(two.nodes) == 4
    three = load_settings(CONFIGS / "three-region.yaml", "lab", env={})
    assert set(three.regions) == {"hk", "sh", "sg"}
    figures = {(lk.rate_mbps, lk.delay_ms, lk.loss_ratio) for lk in three.links}
    assert len(figures) == 3  # different figures per pair


def test_defaults() -> None:
    topo = load(GOOD)
    assert topo.emulator == "auto"
    assert topo.intra_shape("hk").rate_mbps == 1000
    assert topo.intra_shape("hk").delay_ms == 0


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (
            GOOD.replace("between: [hk, us]", "between: [hk, eu]"),
            "links[0].between[1]",
            "unknown region 'eu'",
        ),
        (
            GOOD.replace("us: {nodes: [us-1]}", "us: {nodes: [hk-1]}"),
            "regions.us.nodes[0]",
            "already in region 'hk'",
        ),
        (GOOD.replace("rate_mbps: 100", "rate_mbps: -5"), "links[0].rate_mbps", "-5"),
        (GOOD.replace("rate_mbps: 100", "rate_mbps: 0"), "links[0].rate_mbps", "is 0"),
        (GOOD + "    loss_ratio: 1.0\n", "links[0].loss_ratio", "1.0"),
        (GOOD + "    loss_ratio: -0.1\n", "links[0].loss_ratio", "-0.1"),
        (GOOD.replace("delay_ms: 40", "delay_ms: 5000"), "links[0].delay_ms", "5000"),
        (GOOD.replace("delay_ms: 40", "delay_ms: -1"), "links[0].delay_ms", "-1"),
        (GOOD + "    jitter_ms: 50\n", "links[0].jitter_ms", "larger than delay_ms"),
        (GOOD + "  - between: [us, hk]\n", "links[1].between", "repeats a region pair"),
        (
            GOOD.replace("between: [hk, us]", "between: [hk, hk]"),
            "links[0].between",
            "one region twice",
        ),
        (GOOD + "emulator: magic\n", "emulator", "'magic'"),
        (GOOD + "subnet: 10.0.0.0/16\n", "subnet", "outside the lab range"),
        (GOOD.replace("hk-2]", "Bad_Name]"), "regions.hk.nodes[1]", "not allowed"),
        (
            GOOD.replace("rate_mbps: 100", "rate_mbps: 100\n    speed: 3"),
            "links[0].speed",
            "not a known key",
        ),
    ],
)
def test_bad_topologies(text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(text)
    assert info.value.key_path == key
    assert message in str(info.value)
    assert info.value.file == "lab.yaml"
    assert info.value.line is not None


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml", "lab", env={})

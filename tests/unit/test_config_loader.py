"""The config loader on good and bad files: every error names file, key, expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from netopt.config import (
    AgentSettings,
    CoordinatorSettings,
    DatasetsSettings,
    LabTopology,
    load_settings,
    parse_settings,
    resolve_token,
)
from netopt.config.loader import parse_byte_size
from netopt.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXAMPLES = sorted(CONFIGS.rglob("*.yaml"))


def test_there_are_examples() -> None:
    kinds = {p.parent.name if p.parent.name == "lab" else p.stem for p in EXAMPLES}
    assert {"agent", "coordinator", "datasets", "lab"} <= kinds


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_example_loads(path: Path) -> None:
    import yaml

    from netopt.config import LinksSettings

    kinds = {"agent": AgentSettings, "coordinator": CoordinatorSettings, "lab": LabTopology,
             "datasets": DatasetsSettings, "links": LinksSettings}  # fmt: skip
    settings = load_settings(path, env={})
    assert isinstance(settings, kinds[yaml.safe_load(path.read_text())["kind"]])


def test_two_region_example_holds_the_issue_figures() -> None:
    lab = load_settings(CONFIGS / "lab" / "two-region.yaml", "lab", env={})
    assert isinstance(lab, LabTopology)
    assert lab.nodes == ("hk-1", "hk-2", "us-1", "us-2")
    link = lab.link_between("us", "hk")
    assert link is not None
    assert (link.rate_mbps, link.delay_ms, link.loss_ratio) == (100.0, 40.0, 0.005)
    assert lab.region_of("us-2") == "us"


def test_agent_defaults_listen_on_loopback() -> None:
    agent = parse_settings("node: a1\nregion: hk\n", "a.yaml", "agent", env={})
    assert isinstance(agent, AgentSettings)
    assert agent.listen.host == "127.0.0.1"
    assert agent.probe.rate_pps == 30.0


def test_byte_sizes() -> None:
    assert parse_byte_size("64MiB") == 64 * 1024**2
    assert parse_byte_size("1.5GB") == 1_500_000_000
    assert parse_byte_size(4096) == 4096
    with pytest.raises(ValueError, match="not a size"):
        parse_byte_size("three MiB")
    with pytest.raises(ValueError, match="unknown unit"):
        parse_byte_size("3 parsecs")
    with pytest.raises(ValueError, match="unknown unit"):
        parse_byte_size("3 KiiB")
    with pytest.raises(ValueError, match="negative"):
        parse_byte_size(-1)


def _error(text: str, kind: str | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_settings(text, "bad.yaml", kind, env={})  # type: ignore[arg-type]
    return info.value


LAB = "regions:\n  hk:\n    nodes: [hk-1, hk-2]\n  us:\n    nodes: [us-1]\n"

LINK = "links:\n  - between: [hk, us]\n"

BAD_FILES = [
    # (yaml, kind, key path, words in the expectation, line)
    (LAB + "links:\n  - between: [hk, eu]\n", None, "links[0].between[1]", "one of hk, us", 7),
    (
        LAB + LINK + "    rate_mbps: -5\n",
        None,
        "links[0].rate_mbps",
        "> 0",
        8,
    ),
    (
        LAB + LINK + "    loss_ratio: 1.0\n",
        None,
        "links[0].loss_ratio",
        "< 1",
        8,
    ),
    (
        LAB + LINK + "    delay_ms: 5000\n",
        None,
        "links[0].delay_ms",
        "<= 2000",
        8,
    ),
    (
        LAB + LINK + "    rate_mbps: fast\n",
        None,
        "links[0].rate_mbps",
        "a number",
        8,
    ),
    (LAB + "  eu:\n    nodes: [hk-2]\n", None, "regions.eu.nodes[0]", "each node name once", 7),
    (LAB + "colour: blue\n", None, "colour", "one of", 6),
    (LAB + "subnet: 10.0.0.0/16\n", None, "subnet", "inside 198.18.0.0/15", 6),
    ("regions:\n  hk:\n    nodes: [Bad_Name]\n", None, "regions.hk.nodes[0]", "lowercase", 3),
    ("node: a\n", "agent", "region", "a string", 1),
    ("node: a\nregion: hk\nprobe:\n  spacing: random\n", None, "probe.spacing", "'poisson'", 4),
    ("node: a\nregion: hk\nspool:\n  max_bytes: lots\n", None, "spool.max_bytes", "byte size", 4),
    ("node: a\nregion: hk\nlisten:\n  host: example.com\n", None, "listen.host", "IPv6 address", 4),
    ("node: a\nregion: hk\ntoken: short\n", None, "token", "16+ characters", 3),
    ("database: x.db\nlisten:\n  port: 70000\n", None, "listen.port", "<= 65535", 3),
    (
        "datasets:\n  - name: ../etc\n    origin: /data\n",
        None,
        "datasets[0].name",
        "no '..'",
        2,
    ),
    (
        "datasets:\n  - name: d\n    origin: ftp://x/y\n",
        None,
        "datasets[0].origin",
        "s3",
        3,
    ),
    (
        "datasets:\n  - name: d\n    origin: /a\n  - name: d\n    origin: /b\n",
        None,
        "datasets[1].name",
        "unique",
        4,
    ),
    ("node: a\nregion: hk\nnode: b\n", None, "node", "each key once", 3),
]


@pytest.mark.parametrize(("text", "kind", "key", "expected", "line"), BAD_FILES)
def test_bad_files_name_file_key_expectation_and_line(
    text: str, kind: str | None, key: str, expected: str, line: int
) -> None:
    err = _error(text, kind)
    assert err.file == "bad.yaml"
    assert err.key_path == key
    assert err.expected is not None
    assert expected in err.expected
    assert err.line == line
    message = str(err)
    assert message.startswith(f"bad.yaml:{line}:")
    assert key in message


def test_yaml_syntax_error_has_line() -> None:
    err = _error("node: a\nregion: [hk\n")
    assert err.line is not None
    assert "not valid YAML" in str(err)


def test_unknown_kind_is_an_error() -> None:
    err = _error("whatever: 1\n")
    assert "--kind" in (err.expected or "")


def test_declared_kind_must_match() -> None:
    err = _error("kind: agent\nregions: {}\n", "lab")
    assert err.key_path == "kind"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_environment_overrides_apply_and_are_typed() -> None:
    env = {
        "NETOPT_AGENT__PROBE__RATE_PPS": "50",
        "NETOPT_AGENT__LISTEN__HOST": "198.18.0.10",
        "NETOPT_COORDINATOR__STALE_AFTER_S": "5",
        "NETOPT_TOKEN": "0123456789abcdef-secret",
    }
    agent = parse_settings("node: a1\nregion: hk\ntoken_file: /x\n", "a.yaml", "agent", env)
    assert isinstance(agent, AgentSettings)
    assert agent.probe.rate_pps == 50.0
    assert agent.listen.host == "198.18.0.10"
    assert agent.token == "0123456789abcdef-secret"
    assert agent.token_file is None
    coord = parse_settings("database: c.db\n", "c.yaml", "coordinator", env)
    assert isinstance(coord, CoordinatorSettings)
    assert coord.stale_after_s == 5.0


def test_bad_environment_override_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(
            "node: a1\nregion: hk\n", "a.yaml", "agent", {"NETOPT_AGENT__PROBE__RATE_PPS": "-1"}
        )
    assert info.value.key_path == "probe.rate_pps"


def test_resolve_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("a-long-enough-secret\n")
    assert resolve_token(None, str(token_file)) == "a-long-enough-secret"
    token_file.write_text("short")
    with pytest.raises(ConfigError, match="fewer than 16"):
        resolve_token(None, str(token_file))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_token(None, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no shared token"):
        resolve_token(None, None)


def test_settings_are_frozen() -> None:
    datasets = parse_settings(
        "datasets:\n  - name: d\n    origin: /a\n    residency: [hk]\n", "d.yaml", env={}
    )
    assert isinstance(datasets, DatasetsSettings)
    spec = datasets.get("d")
    assert spec is not None
    assert spec.residency == ("hk",)
    with pytest.raises(AttributeError):
        spec.name = "e"  # type: ignore[misc]

"""The configuration reference and the settings agree, and every key is read by something.

The README's agent and coordinator tables are parsed and compared with the settings
dataclasses both ways: a key documented but not accepted, or accepted but not documented,
fails. Then each setting must be read outside `netopt/config/` (an attribute access of its
name in the code that runs the service): `cache.rate_limit_mbps` and
`cache.max_parallel_streams` were accepted and read by nothing until this check's time.
The read check is static: it proves a key reaches code, and the service tests show what
that code does with it.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from netopt.config.services import AgentSettings, CoordinatorSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TABLE_HEADINGS = {
    "agent": "### Agent (`configs/agent.yaml`)",
    "coordinator": "### Coordinator (`configs/coordinator.yaml`)",
}
SETTINGS: dict[str, type[Any]] = {"agent": AgentSettings, "coordinator": CoordinatorSettings}


def documented_keys(kind: str) -> set[str]:
    """The dotted keys of the README table under the kind's heading."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEADINGS[kind])
    keys: set[str] = set()
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        keys.update(re.findall(r"`([a-z_][a-z0-9_.]*)`", first_cell))
    return keys


def setting_keys(settings: type[Any], prefix: str = "") -> set[str]:
    """Every leaf key a settings dataclass accepts, dotted through nested dataclasses."""
    keys: set[str] = set()
    hints = get_type_hints(settings, include_extras=True)
    for field in dataclasses.fields(settings):
        kind = hints[field.name]
        inner = getattr(kind, "__origin__", kind)
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            keys |= setting_keys(inner, f"{prefix}{field.name}.")
        else:
            keys.add(f"{prefix}{field.name}")
    return keys


def attributes_read_outside_config() -> set[str]:
    """Names read as attributes (``x.name``) anywhere in netopt/ but its config package."""
    names: set[str] = set()
    for path in (ROOT / "netopt").rglob("*.py"):
        if "config" in path.relative_to(ROOT / "netopt").parts[:1]:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
    return names


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_the_reference_documents_exactly_the_accepted_keys(kind: str) -> None:
    documented = documented_keys(kind)
    accepted = setting_keys(SETTINGS[kind])
    assert documented, f"no table found under {TABLE_HEADINGS[kind]!r}"
    assert sorted(documented - accepted) == [], "documented but not accepted"
    assert sorted(accepted - documented) == [], "accepted but not documented"


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_every_key_is_read_by_the_code_that_runs_the_service(kind: str) -> None:
    read = attributes_read_outside_config()
    unread = [key for key in sorted(setting_keys(SETTINGS[kind])) if key.split(".")[-1] not in read]
    assert unread == [], f"{kind} keys that nothing outside netopt/config reads"


def test_the_read_check_sees_a_key_nothing_reads() -> None:
    """The check can fail: a name no code reads is reported."""
    assert "rate_limit_mbps_never_read_anywhere" not in attributes_read_outside_config()
    assert "rate_limit_mbps" in attributes_read_outside_config()

"""Print pip constraints that pin every dependency pyproject.toml declares to its minimum.

`scripts/test_min_versions.sh` installs netopt with these constraints into a venv of its own
and runs the suite there, so a declared minimum (``aiohttp>=3.11``) is one the project has
really been tested with. Lint and type-check tools (ruff, mypy, stubs, import-linter) are
left out: they do not run in users' installs. torch is left out: its minimum is not
installable from the package registry this project's CI uses (a CPU build of one version only).

    python scripts/min_versions.py > /tmp/min.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"ruff", "mypy", "types-pyyaml", "import-linter", "torch", "netopt"}
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)\s*$")


def minimums(pyproject: dict[str, object]) -> dict[str, str]:
    """Name -> minimum version of every ``name>=version`` requirement, core and extras."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    requirements: list[str] = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    found: dict[str, str] = {}
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        if match is None:
            continue
        name = match.group(1).lower().replace("_", "-")
        if name in SKIP:
            continue
        version = match.group(3)
        if name in found and found[name] != version:
            raise SystemExit(
                f"pyproject.toml: {name} has two minimums, {found[name]} and {version}"
            )
        found[name] = version
    return found


def main() -> int:
    with open(ROOT / "pyproject.toml", "rb") as f:
        pins = minimums(tomllib.load(f))
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

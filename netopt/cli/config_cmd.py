"""``netopt config check|show``: validate a netopt YAML file like ``nginx -t``."""

from __future__ import annotations

from typing import Any, cast

import click

from netopt.cli.output import console, print_json
from netopt.config import (
    KINDS,
    AgentSettings,
    CoordinatorSettings,
    DatasetsSettings,
    Kind,
    LabTopology,
    LinksSettings,
    Settings,
    detect_kind,
    load_settings,
    settings_to_dict,
)

__all__ = ["config_group", "describe_settings"]

_kind_option = click.option(
    "--kind",
    type=click.Choice(sorted(KINDS)),
    default=None,
    help="What the file is; guessed from its keys when omitted.",
)


@click.group("config")
def config_group() -> None:
    """Validate and inspect netopt configuration files."""


@config_group.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_kind_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check(files: tuple[str, ...], kind: str | None, as_json: bool) -> int:
    """Validate FILES; print what each holds, or the first error (exit 2)."""
    results: list[dict[str, Any]] = []
    for file in files:
        settings = load_settings(file, cast(Kind | None, kind))
        found = kind or _kind_of(settings)
        results.append(
            {"file": file, "ok": True, "kind": found, "summary": describe_settings(settings)}
        )
    if as_json:
        print_json(results if len(results) > 1 else results[0])
    else:
        for result in results:
            console.print(f"{result['file']}: ok ({result['kind']}: {result['summary']})")
    return 0


@config_group.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@_kind_option
def show(file: str, kind: str | None) -> int:
    """Print FILE's settings as JSON, with defaults and environment overrides applied."""
    settings = load_settings(file, cast(Kind | None, kind))
    print_json(settings_to_dict(settings))
    return 0


def _kind_of(settings: Settings) -> str:
    for name, cls in KINDS.items():
        if isinstance(settings, cls):
            return name
    return detect_kind({}, "")  # pragma: no cover - every settings class is in KINDS


def describe_settings(settings: Settings) -> str:
    """One line saying what a settings object holds."""
    if isinstance(settings, LabTopology):
        return (
            f"{len(settings.regions)} regions, {len(settings.nodes)} nodes, "
            f"{len(settings.links)} inter-region links"
        )
    if isinstance(settings, LinksSettings):
        regions = {spec.region for spec in settings.nodes.values()}
        return (
            f"{len(settings.nodes)} nodes in {len(regions)} regions, "
            f"{len(settings.links)} measured links"
        )
    if isinstance(settings, DatasetsSettings):
        return f"{len(settings.datasets)} datasets"
    if isinstance(settings, AgentSettings):
        return (
            f"node {settings.node} in region {settings.region}, "
            f"reports to {settings.coordinator_url}"
        )
    if isinstance(settings, CoordinatorSettings):
        listen = settings.listen
        return f"listens on {listen.url_host}:{listen.port}, database {settings.database}"
    raise TypeError(type(settings))  # pragma: no cover

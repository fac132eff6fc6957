"""``netopt agent --config FILE``: the per-node daemon."""

from __future__ import annotations

import click

from netopt.config import load_settings, resolve_token

__all__ = ["agent_command"]


@click.command("agent")
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="Agent YAML file (see configs/agent.yaml).",
)
def agent_command(config_file: str) -> int:
    """Run the agent until SIGTERM or SIGINT: answer probes, measure peers, report."""
    from netopt.agent.daemon import run_agent

    settings = load_settings(config_file, "agent")
    token = resolve_token(settings.token, settings.token_file, config_file)
    return run_agent(settings, token)

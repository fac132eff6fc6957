"""``netopt agent --config FILE``: the per-node daemon."""

from __future__ import annotations

import click

from netopt.cli.tls_opts import service_tls_options, with_tls_options
from netopt.config import load_settings, resolve_token

__all__ = ["agent_command"]


@click.command("agent")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Agent YAML file (see configs/agent.yaml) [default: /etc/netopt/agent.yaml, "
    "else $XDG_CONFIG_HOME/netopt/agent.yaml].",
)
@service_tls_options
def agent_command(
    config_file: str | None, tls_cert: str | None, tls_key: str | None, tls_ca: str | None
) -> int:
    """Run the agent until SIGTERM or SIGINT: answer probes, measure peers, report."""
    from netopt.agent.daemon import run_agent
    from netopt.config.discovery import find_config

    config_file = find_config("agent", config_file)

    settings = with_tls_options(load_settings(config_file, "agent"), tls_cert, tls_key, tls_ca)
    token = resolve_token(settings.token, settings.token_file, config_file)
    return run_agent(settings, token)

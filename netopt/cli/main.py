"""The ``netopt`` command line: parse arguments, call ``run_*`` functions, report.

Exit codes: 0 ok, 1 failure, 2 usage or bad input (see ``netopt.errors``).
Each command group lives in its own module under ``netopt/cli/`` and is added
to the group below.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import threading
from typing import Any, cast

import click

from netopt import __version__
from netopt.errors import EXIT_FAILURE, EXIT_USAGE, NetoptError
from netopt.logfmt import LOG_FORMATS, LogFormat, formatter

__all__ = ["cli", "main", "run"]

LOG_LEVELS = ("debug", "info", "warning", "error")


# Command name -> "module:attribute". Modules are imported only when their command
# runs (or help lists it): importing all of them costs most of a second per call.
COMMANDS = {
    "agent": "netopt.cli.agent_cmd:agent_command",
    "bench": "netopt.cli.bench_cmd:bench_group",
    "cache": "netopt.cli.cache_cmd:cache_group",
    "config": "netopt.cli.config_cmd:config_group",
    "coordinator": "netopt.cli.coordinator_cmd:coordinator_command",
    "demo": "netopt.cli.demo_cmd:demo",
    "doctor": "netopt.cli.doctor_cmd:doctor_command",
    "lab": "netopt.cli.lab_cmd:lab_group",
    "nccl-env": "netopt.cli.nccl_cmd:nccl_env",
    "plan": "netopt.cli.plan_cmd:plan_command",
    "probe": "netopt.cli.probe_cmd:probe_group",
    "serve": "netopt.cli.serve_cmd:serve_command",
    "status": "netopt.cli.coordinator_cmd:status_command",
    "sync": "netopt.cli.sync_cmd:sync_command",
    "tls": "netopt.cli.tls_cmd:tls_group",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netopt")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    envvar="NETOPT_LOG_LEVEL",
    help="Logging verbosity (also NETOPT_LOG_LEVEL).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="NETOPT_LOG_FORMAT",
    help="Log lines as text, or one JSON object per line (also NETOPT_LOG_FORMAT).",
)
def cli(log_level: str, log_format: str) -> None:
    """netopt: measure cross-region links, tune NCCL, move datasets once per region."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(cast(LogFormat, log_format)))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn netopt errors into messages and exit codes."""
    try:
        result: Any = cli.main(args=argv, prog_name="netopt", standalone_mode=False)
    except NetoptError as exc:
        _report(exc, argv)
        return exc.exit_code
    except click.exceptions.Abort:
        _say("aborted")
        return EXIT_FAILURE
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE if exc.exit_code == 2 else exc.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    return result if isinstance(result, int) else 0


def run() -> None:
    """The process entry point (the ``netopt`` script, ``python -m netopt``): `main`, then
    a quick exit.

    Tearing down an interpreter that held a few hundred MiB of buffers and a few hundred
    modules takes 0.1-0.3 s, which a short ``netopt sync`` pays on every call. Once the
    command has returned, nothing is left to finish: output is flushed, the atexit
    handlers (logging, traces) run, and the process ends. When a non-daemon thread is
    still alive, the normal exit joins it instead.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)  # stdout closed or broken: let the interpreter report it as usual
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()
    os._exit(code)


def _say(message: str) -> None:
    from netopt.cli.output import err_console  # rich: imported when there is something to say

    err_console.print(message)


def _report(exc: NetoptError, argv: list[str] | None) -> None:
    from rich.markup import escape

    from netopt.cli.output import err_console, print_json

    args = sys.argv[1:] if argv is None else argv
    if "--json" in args:
        print_json(exc.to_dict())
    else:
        # The message is text, not markup: "pip install 'netopt[demo]'" must keep its [demo].
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, soft_wrap=True)

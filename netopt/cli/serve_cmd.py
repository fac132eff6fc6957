"""``netopt serve``: serve a directory as a dataset at netopt://HOST:PORT/NAME.

The server's life (load, start, precompress, stop) is `netopt.dataplane.lifecycle`;
this module parses the options and calls it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import click

from netopt.cli.options import CC_CHOICES, congestion_control
from netopt.cli.output import console, err_console
from netopt.cli.tls_opts import serve_tls_options
from netopt.config import TlsSettings, cli_token
from netopt.errors import ValidationError

__all__ = ["DEFAULT_SERVE_PORT", "parse_bind", "serve_command"]

DEFAULT_SERVE_PORT = 7470


def parse_bind(bind: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[v6]:PORT`` too) -> (host, port); ValidationError otherwise."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValidationError(f"--bind {bind!r}: expected ADDR:PORT, e.g. 127.0.0.1:7470")
    return host.strip("[]") or "127.0.0.1", int(port)


@click.command("serve")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--name", default=None, help="Dataset name (default: the directory's name).")
@click.option(
    "--bind",
    default=f"127.0.0.1:{DEFAULT_SERVE_PORT}",
    show_default=True,
    help="ADDR:PORT to listen on (port 0: any free port).",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
@click.option("--no-auth", is_flag=True, help="Serve without a token (trusted networks only).")
@click.option(
    "--cc",
    type=click.Choice(CC_CHOICES),
    default="bbr",
    show_default=True,
    help="TCP congestion control of the server's (sending) sockets.",
)
@click.option(
    "--chunk-size",
    "chunk_size_bytes",
    type=click.IntRange(64 * 1024, 64 * 1024**2),
    default=1024 * 1024,
    show_default=True,
    help="Average chunk size in bytes.",
)
@click.option(
    "--codec-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="Codec speed cache (default ~/.cache/netopt/codec.json).",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=None,
    help="Threads for reading and compressing chunks (default: the CPU count).",
)
@click.option(
    "--precompress",
    "precompress_level",
    type=click.IntRange(1, 19),
    default=None,
    help="Compress every chunk once at this zstd level (e.g. 19) and serve the stored "
    "frames; clients plan with that level once all are done.",
)
@click.option(
    "--frames-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where precompressed frames are kept (default ~/.cache/netopt/frames).",
)
@serve_tls_options
def serve_command(
    directory: str,
    name: str | None,
    bind: str,
    token_file: str | None,
    no_auth: bool,
    cc: str,
    chunk_size_bytes: int,
    codec_cache: str | None,
    threads: int | None,
    precompress_level: int | None,
    frames_dir: str | None,
    tls: TlsSettings,
) -> int:
    """Serve DIRECTORY as a dataset at netopt://HOST:PORT/NAME.

    A token is required: from --token-file or NETOPT_TOKEN; when neither is set a
    random token is generated and printed (pass it to clients as NETOPT_TOKEN).
    """
    host, port = parse_bind(bind)
    from netopt.tlsconf import listener_context

    ssl_context = listener_context(tls, host, "netopt serve")
    dataset_name = name or Path(directory).resolve().name
    token = None if no_auth else cli_token(token_file, required=False)
    if token is None and not no_auth:
        token = secrets.token_urlsafe(24)
        err_console.print(f"generated token (give clients NETOPT_TOKEN={token})")
    # Imported here: aiohttp.web and the server are not needed to print --help.
    from netopt.dataplane.handlers import ServeSettings
    from netopt.dataplane.lifecycle import run_serve

    settings = ServeSettings(
        token=token,
        congestion_control=congestion_control(cc),
        worker_threads=threads or os.cpu_count() or 1,
    )
    return asyncio.run(
        run_serve(
            directory, dataset_name, host, port, settings, chunk_size_bytes, codec_cache,
            precompress_level, frames_dir, ssl_context, tls, say=console.print,
            note=err_console.print,
        )
    )  # fmt: skip

"""``netopt tls init|issue|renew|show``: the cluster CA and its node certificates."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from netopt.cli.output import console, print_json

__all__ = ["tls_group"]

_DIR = click.Path(file_okay=False)


@click.group("tls")
def tls_group() -> None:
    """Make the cluster CA and node certificates (ECDSA P-256, files mode 0600)."""


@tls_group.command("init")
@click.option(
    "--dir",
    "directory",
    type=_DIR,
    default="tls",
    show_default=True,
    help="Where ca.pem and ca-key.pem are written.",
)
@click.option("--name", default="netopt cluster CA", show_default=True, help="The CA's name.")
@click.option(
    "--days",
    type=click.IntRange(1, 36500),
    default=3650,
    show_default=True,
    help="How long the CA is valid.",
)
@click.option("--force", is_flag=True, help="Replace an existing CA (every node needs new certs).")
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
def init_command(directory: str, name: str, days: int, force: bool, as_json: bool) -> int:
    """Make the cluster CA in DIR: ca.pem goes to every node, ca-key.pem stays safe."""
    from netopt.tlsca import CA_CERT, CA_KEY, make_ca, write_files

    root = Path(directory)
    pair = make_ca(name, dt.datetime.now(dt.UTC), days)
    write_files({root / CA_CERT: pair.cert_pem, root / CA_KEY: pair.key_pem}, force=force)
    return _written(as_json, {"ca": str(root / CA_CERT), "ca_key": str(root / CA_KEY)})


def _issue(
    node: str,
    directory: str,
    dns: tuple[str, ...],
    ips: tuple[str, ...],
    days: int,
    force: bool,
    out: str | None = None,
) -> dict[str, str]:
    from netopt.tlsca import CA_CERT, CA_KEY, issue_cert, node_files, read_pair, write_files

    root = Path(directory)
    ca = read_pair(root / CA_CERT, root / CA_KEY)
    pair = issue_cert(ca, node, dt.datetime.now(dt.UTC), dns=dns, ips=ips, days=days)
    if out is None:
        cert_file, key_file = node_files(root, node)
        write_files({cert_file: pair.cert_pem, key_file: pair.key_pem}, force=force)
        return {"cert": str(cert_file), "key": str(key_file), "ca": str(root / CA_CERT)}
    # Everything the node needs in a directory of its own (the CA's certificate, never
    # its key): a Kubernetes init container writes it for the agent beside it.
    cert_file, key_file = node_files(Path(out), node)
    ca_copy = Path(out) / CA_CERT
    write_files({cert_file: pair.cert_pem, key_file: pair.key_pem, ca_copy: ca.cert_pem},
                force=force)  # fmt: skip
    return {"cert": str(cert_file), "key": str(key_file), "ca": str(ca_copy)}


def _issue_options(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed([
        click.argument("node"),
        click.option("--dir", "directory", type=_DIR, default="tls", show_default=True,
                     help="The CA's directory; NODE.pem and NODE-key.pem are written there."),
        click.option("--dns", multiple=True, help="A DNS name the node is reached by (repeat)."),
        click.option("--ip", "ips", multiple=True,
                     help="An IP address the node is reached by (repeat), e.g. its "
                     "advertised address."),
        click.option("--days", type=click.IntRange(1, 3650), default=365, show_default=True,
                     help="How long the certificate is valid."),
        click.option("--out", type=_DIR, default=None,
                     help="Write NODE.pem, NODE-key.pem and a copy of ca.pem here instead "
                     "of the CA's directory (ca-key.pem is never copied)."),
        click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON."),
    ]):  # fmt: skip
        func = option(func)
    return func


@tls_group.command("issue")
@_issue_options
@click.option("--force", is_flag=True, help="Replace NODE's existing certificate and key.")
def issue_command(
    node: str,
    directory: str,
    dns: tuple[str, ...],
    ips: tuple[str, ...],
    days: int,
    out: str | None,
    as_json: bool,
    force: bool,
) -> int:
    """Issue NODE's certificate (server and client use) naming NODE, --dns and --ip."""
    return _written(as_json, _issue(node, directory, dns, ips, days, force, out))


@tls_group.command("renew")
@_issue_options
def renew_command(
    node: str,
    directory: str,
    dns: tuple[str, ...],
    ips: tuple[str, ...],
    days: int,
    out: str | None,
    as_json: bool,
) -> int:
    """Re-issue NODE's certificate (a new key and validity; same names: give them again).

    Clients use the new files at their next connection, running servers within 30 s."""
    return _written(as_json, _issue(node, directory, dns, ips, days, True, out))


@tls_group.command("show")
@click.argument("cert", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the expiry as JSON.")
def show_command(cert: str, as_json: bool) -> int:
    """Print a certificate's expiry (notAfter, UTC) and the days left."""
    from netopt.tlsca import read_expiry

    expires = read_expiry(cert)
    days_left = (expires - dt.datetime.now(dt.UTC)).total_seconds() / 86400
    if as_json:
        print_json({"cert": cert, "not_after": expires.isoformat(), "days_left": days_left})
    else:
        console.print(f"{cert}: expires {expires.isoformat()} ({days_left:.1f} days left)")
    return 0


def _written(as_json: bool, files: dict[str, str]) -> int:
    # Paths only: a key's content is never printed.
    if as_json:
        print_json(files)
    else:
        for what, path in files.items():
            console.print(f"{what}: {path}")
    return 0

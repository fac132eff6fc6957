"""The TLS options every listening or connecting command shares, in one place.

``@client_tls_options()`` adds ``--tls-ca/--tls-cert/--tls-key/--insecure`` to a client
command and sets the process's `netopt.tlsconf.ClientTls` before the command runs; with
``agent_config="config_file"`` a command's ``--config AGENT.yaml`` supplies its ``tls:``
section when no ``--tls-*`` option is given. ``@serve_tls_options`` adds those and
``--require-client-cert/--allow-plaintext`` to ``netopt serve`` as one ``tls`` argument.
``@service_tls_options`` adds
``--tls-cert/--tls-key/--tls-ca`` to ``netopt agent`` and ``netopt coordinator``, which
override the config file's ``tls:`` section (`with_tls_options`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from netopt.errors import UsageError
from netopt.tlsconf import ClientTls, section_client_tls, use_client_tls

# The config loader (YAML, every settings class) is imported where a command's options
# need it, not here: ``netopt sync`` starts its first requests before that import.

__all__ = [
    "client_tls_options",
    "serve_tls_options",
    "service_tls_options",
    "tls_file_options",
    "with_tls_options",
]

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(dir_okay=False)


def tls_file_options(func: F) -> F:
    """``--tls-cert``, ``--tls-key`` and ``--tls-ca`` (also NETOPT_TLS_CERT/_KEY/_CA)."""
    for option in reversed([
        click.option("--tls-cert", type=_FILE, envvar="NETOPT_TLS_CERT",
                     help="This node's certificate (netopt tls issue) [env NETOPT_TLS_CERT]."),
        click.option("--tls-key", type=_FILE, envvar="NETOPT_TLS_KEY",
                     help="The certificate's private key [env NETOPT_TLS_KEY]."),
        click.option("--tls-ca", type=_FILE, envvar="NETOPT_TLS_CA",
                     help="The cluster CA (netopt tls init): peers are verified against it; "
                     "netopt:// then speaks TLS [env NETOPT_TLS_CA]."),
    ]):  # fmt: skip
        func = option(func)
    return func


def client_tls_options(agent_config: str | None = None) -> Callable[[F], F]:
    """Add the client TLS options to a command; they are consumed here, not passed on."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(
            *args: Any,
            tls_cert: str | None,
            tls_key: str | None,
            tls_ca: str | None,
            insecure: bool,
            **kwargs: Any,
        ) -> Any:
            tls = ClientTls(
                tls_ca, tls_cert, tls_key, insecure, where="--tls-ca/--tls-cert/--tls-key"
            )
            config_file = kwargs.get(agent_config) if agent_config else None
            if config_file and not (tls_ca or tls_cert or tls_key):
                from netopt.config.node import agent_settings

                section = agent_settings(config_file).tls
                tls = section_client_tls(section, f"{config_file}: tls")
                tls = dataclasses.replace(tls, insecure=tls.insecure or insecure)
            use_client_tls(tls)
            return func(*args, **kwargs)

        decorated = click.option(
            "--insecure",
            is_flag=True,
            help="Allow sending the token over plain HTTP to a non-loopback host (warned).",
        )(wrapper)
        return tls_file_options(decorated)  # type: ignore[return-value]

    return decorate


def service_tls_options(func: F) -> F:
    """``--tls-cert/--tls-key/--tls-ca`` for a service; passed on as ``tls_*`` arguments."""
    return tls_file_options(func)


def with_tls_options(settings: Any, cert: str | None, key: str | None, ca: str | None) -> Any:
    """``settings`` with its ``tls:`` section overridden by the options that were given."""
    from netopt.config.loader import Invalid

    given = {k: v for k, v in (("cert", cert), ("key", key), ("ca", ca)) if v is not None}
    if not given:
        return settings
    try:
        tls = dataclasses.replace(settings.tls, **given)
    except Invalid as exc:
        raise UsageError(f"--tls-{exc.key}: {exc.message} (expected {exc.expected})") from None
    return dataclasses.replace(settings, tls=tls)


def serve_tls_options(func: F) -> F:
    """``netopt serve``'s TLS options, handed on as one ``tls`` argument (a ``tls:`` section)."""

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        tls_cert: str | None,
        tls_key: str | None,
        tls_ca: str | None,
        require_client_cert: bool,
        allow_plaintext: bool,
        **kwargs: Any,
    ) -> Any:
        from netopt.config import TlsSettings
        from netopt.config.loader import Invalid

        try:
            tls = TlsSettings(tls_cert, tls_key, tls_ca, require_client_cert, allow_plaintext)
        except Invalid as exc:
            option = "--require-client-cert" if exc.key == "require_client_cert" else "--tls-cert"
            raise UsageError(f"{option}: {exc.message} (expected {exc.expected})") from None
        return func(*args, tls=tls, **kwargs)

    decorated = click.option(
        "--require-client-cert",
        is_flag=True,
        help="Mutual TLS: clients must present a certificate the --tls-ca signed.",
    )(wrapper)
    decorated = click.option(
        "--allow-plaintext",
        is_flag=True,
        help="Listen without TLS on a non-loopback address (a network you trust only).",
    )(decorated)
    return tls_file_options(decorated)  # type: ignore[return-value]

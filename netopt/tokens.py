"""The shared token of netopt's services and command-line clients: one home.

Kept apart from `netopt.config` (which re-exports it), so that ``netopt sync`` reads
its token without importing the YAML loader and every settings class: the sync's first
requests (`netopt.dataplane.prefetch`) start before those imports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, overload

from netopt.errors import ConfigError

__all__ = ["TOKEN_ENV", "cli_token", "resolve_token"]

TOKEN_ENV = "NETOPT_TOKEN"  # noqa: S105 - the variable's name, not a secret
"""The environment variable holding the shared token."""


def resolve_token(token: str | None, token_file: str | None, file: str | None = None) -> str:
    """The shared secret of a service, from the settings or its token file.

    Raises ConfigError when neither is set or the file is unreadable or too short.
    """
    if token:
        return token
    if token_file is None:
        raise ConfigError(
            "no shared token is configured",
            file=file,
            key_path="token_file",
            expected=f"token_file, token, or the {TOKEN_ENV} environment variable",
        )
    try:
        secret = Path(token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {token_file}: {exc.strerror}",
            file=file,
            key_path="token_file",
            expected="a readable file holding the token",
        ) from None
    if len(secret) < 16:
        raise ConfigError(
            f"{token_file} holds fewer than 16 characters",
            file=file,
            key_path="token_file",
            expected="a random secret of 16+ characters",
        )
    return secret


@overload
def cli_token(token_file: str | None, *, required: Literal[True] = True) -> str: ...
@overload
def cli_token(token_file: str | None, *, required: bool) -> str | None: ...
def cli_token(token_file: str | None, *, required: bool = True) -> str | None:
    """The shared token for a command-line client: ``--token-file`` if given (it beats
    the environment), else ``NETOPT_TOKEN``.

    Raises ConfigError when the file is unreadable or short, or when neither is given
    and ``required``; otherwise returns None then.
    """
    if token_file is not None:
        return resolve_token(None, token_file)
    value = os.environ.get(TOKEN_ENV, "").strip()
    if value:
        return value
    if required:
        raise ConfigError(
            "no token given", key_path="token", expected=f"{TOKEN_ENV} or --token-file FILE"
        )
    return None

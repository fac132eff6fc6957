"""Where a command finds its config file and its coordinator when not told.

- A config of kind ``agent`` or ``coordinator``: ``--config FILE`` if given, else
  ``/etc/netopt/<kind>.yaml``, else ``$XDG_CONFIG_HOME/netopt/<kind>.yaml`` (default
  ``~/.config``): the first that exists.
- The coordinator: ``--coordinator URL`` if given, else ``NETOPT_COORDINATOR``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from netopt.errors import UsageError

__all__ = ["SYSTEM_CONFIG_DIR", "config_candidates", "coordinator_url", "find_config"]

SYSTEM_CONFIG_DIR = Path("/etc/netopt")
COORDINATOR_ENV = "NETOPT_COORDINATOR"


def config_candidates(
    kind: str, env: Mapping[str, str], system_dir: Path = SYSTEM_CONFIG_DIR
) -> Sequence[Path]:
    """The paths tried, in order, for ``kind``'s config."""
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return (system_dir / f"{kind}.yaml", Path(xdg) / "netopt" / f"{kind}.yaml")


def find_config(
    kind: str,
    given: str | None,
    env: Mapping[str, str] | None = None,
    system_dir: Path = SYSTEM_CONFIG_DIR,
) -> str:
    """``given``, else the first existing candidate; UsageError naming every path tried."""
    if given is not None:
        return given
    candidates = config_candidates(kind, os.environ if env is None else env, system_dir)
    for path in candidates:
        if path.is_file():
            return str(path)
    tried = ", ".join(map(str, candidates))
    raise UsageError(f"no {kind} config: give --config FILE (tried {tried})")


def coordinator_url(given: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """``given``, else ``NETOPT_COORDINATOR`` (empty counts as unset), else None."""
    if given:
        return given
    return (os.environ if env is None else env).get(COORDINATOR_ENV) or None

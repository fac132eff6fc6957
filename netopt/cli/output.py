"""How CLI commands report: a rich table for people, JSON for programs.

rich is imported when ``console`` or ``err_console`` is first used, not with this
module: ``netopt sync --json`` prints with `print_json` and never loads it (30-40 ms
of a short sync's start-up).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "err_console", "print_json", "print_table"]

console: Console  # stdout; declared, not bound: made by `__getattr__` on first use
err_console: Console  # stderr, likewise


def __getattr__(name: str) -> Console:
    """``console`` (stdout) and ``err_console`` (stderr), made on first use."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _made(name)


def _made(name: str) -> Console:
    """The console ``name``, made now unless it was already."""
    if name in globals():
        return globals()[name]  # type: ignore[no-any-return]
    from rich.console import Console

    if name == "err_console":
        made = Console(stderr=True, highlight=False)
    else:
        made = Console(highlight=False, soft_wrap=True)
    globals()[name] = made  # later lookups find it without calling this again
    return made


def print_json(data: Any) -> None:
    """Write ``data`` as one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a table (numbers right-aligned)."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    first = rows[0] if rows else []
    for i, name in enumerate(columns):
        numeric = i < len(first) and isinstance(first[i], int | float)
        table.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    _made("console").print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)

"""How CLI commands report: a rich table for people, JSON for programs."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["console", "err_console", "print_json", "print_table"]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Write ``data`` as one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a table (numbers right-aligned)."""
    table = Table(title=title, show_lines=False)
    first = rows[0] if rows else []
    for i, name in enumerate(columns):
        numeric = i < len(first) and isinstance(first[i], int | float)
        table.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)

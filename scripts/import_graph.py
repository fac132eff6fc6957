#!/usr/bin/env python3
"""The package import graph of netopt, read from the source with ``ast``.

    .venv/bin/python scripts/import_graph.py          # edges, then the cycles
    .venv/bin/python scripts/import_graph.py --json   # the same, as JSON

A "package" is a subpackage (``netopt.cache``) or a top-level module
(``netopt.names``). Every ``import netopt.X...`` / ``from netopt.X... import``
counts, lazy ones inside functions and ``TYPE_CHECKING`` blocks too (they still
say which layer a module leans on). The cycles are the strongly connected
components with more than one package (Tarjan's algorithm). Exit status 0.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "netopt"


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(tree: ast.AST) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{package: packages it imports}`` over every .py file under ``root``."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        source = _package(".".join(parts))
        if source == "__init__":
            continue  # netopt/__init__.py
        targets = graph.setdefault(source, set())
        for name in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if name.startswith("netopt."):
                target = _package(name)
                if target != source:
                    targets.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    graph = package_graph()
    found = cycles(graph)
    if args.json:
        edges = {k: sorted(v) for k, v in sorted(graph.items())}
        print(json.dumps({"edges": edges, "cycles": found}, indent=2))
        return 0
    for package in sorted(graph):
        print(f"{package} -> {' '.join(sorted(graph[package])) or '(nothing)'}")
    print(f"cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    return 0


if __name__ == "__main__":
    sys.exit(main())

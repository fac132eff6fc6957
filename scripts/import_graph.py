#!/usr/bin/env python3
"""The package import graph of netopt, read from the source with ``ast``.

    .venv/bin/python scripts/import_graph.py          # edges, cycles, edges against the layers
    .venv/bin/python scripts/import_graph.py --json   # the same, as JSON
    .venv/bin/python scripts/import_graph.py --check  # exit 1 on a cycle or a new upward edge

A "package" is a subpackage (``netopt.cache``) or a top-level module
(``netopt.names``). Every ``import netopt.X...`` / ``from netopt.X... import``
counts, lazy ones inside functions and ``TYPE_CHECKING`` blocks too (they still
say which layer a module leans on). The cycles are the strongly connected
components with more than one package (Tarjan's algorithm). `LAYERS` is the layer
order of docs/architecture.md: a package imports from its own layer or those below,
never above; `KNOWN_UPWARD` lists the edges against it that are known and explained
there. Exit status 0 (with ``--check``: 1 when there is a cycle or another upward edge).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "netopt"

LAYERS: tuple[frozenset[str], ...] = (
    # 1. leaves: the error tree and the homes of shared rules
    frozenset({"errors", "names", "tcpmath", "tcpinfo", "percentile", "fsutil", "durable",
               "chunking", "webshell", "logfmt", "tlsconf", "tlsca", "cachepaths",
               "tokens"}),
    # 2. the wire contract and configuration
    frozenset({"wire", "config"}),
    # 3. decisions and measurement
    frozenset({"measure", "nccl", "transfer", "doctor"}),
    # 4. the data plane: serving and the sync engine (a sync's sources and sinks plug in)
    frozenset({"dataplane"}),
    # 5. services built on it: the node's cache and a sync's sources, coordinator, agent
    frozenset({"cache", "coordinator", "agent", "lab"}),
    # 6. integrations and entry points
    frozenset({"torch", "demo", "cli", "__main__"}),
)  # fmt: skip
KNOWN_UPWARD = frozenset({("measure", "dataplane")})
"""``measure.bandwidth`` uses ``dataplane.sockets`` (which imports only the error tree),
the one home of setting a socket's congestion control."""


def layer_of(package: str) -> int:
    """The 1-based layer of ``package``; KeyError for a package no layer names."""
    for number, members in enumerate(LAYERS, start=1):
        if package in members:
            return number
    raise KeyError(f"{package} is in no layer: add it to LAYERS (and docs/architecture.md)")


def upward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every edge from a package to one in a higher layer, sorted."""
    return sorted(
        (source, target)
        for source, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(source)
    )


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
    parser.add_argument(
        "--check", action="store_true", help="exit 1 on a cycle or an unknown upward edge"
    )
    args = parser.parse_args(argv)
    graph = package_graph()
    found = cycles(graph)
    upward = upward_edges(graph)
    unknown = [edge for edge in upward if edge not in KNOWN_UPWARD]
    if args.json:
        edges = {k: sorted(v) for k, v in sorted(graph.items())}
        print(json.dumps({"edges": edges, "cycles": found, "upward": upward}, indent=2))
    else:
        for package in sorted(graph):
            print(f"{package} -> {' '.join(sorted(graph[package])) or '(nothing)'}")
        print(f"cycles: {len(found)}")
        for component in found:
            print("  " + " <-> ".join(component))
        print(f"edges against the layers: {len(upward)} ({len(unknown)} not known)")
        for source, target in upward:
            known = " (known)" if (source, target) in KNOWN_UPWARD else ""
            print(f"  {source} (layer {layer_of(source)}) -> {target} "
                  f"(layer {layer_of(target)}){known}")  # fmt: skip
    return 1 if args.check and (found or unknown) else 0


if __name__ == "__main__":
    sys.exit(main())

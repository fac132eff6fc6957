"""scripts/import_graph.py on the real tree: the homes of shared rules stay leaves, no
cycle, and the layer order of docs/architecture.md holds (CI runs this)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from import_graph import KNOWN_UPWARD, LAYERS, cycles, layer_of, main, package_graph, upward_edges


def test_cycles_are_the_strongly_connected_components() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_homes_of_shared_rules_import_at_most_the_error_tree() -> None:
    graph = package_graph()
    for leaf in ("errors", "tcpmath", "percentile", "names", "fsutil", "webshell", "tlsconf"):
        assert graph[leaf] <= {"errors"}, (leaf, graph[leaf])
    for name, imported in graph.items():
        assert name == "__main__" or "cli" not in imported  # only `python -m netopt`


def test_the_package_graph_has_no_cycle() -> None:
    assert cycles(package_graph()) == []


def test_the_wire_contract_and_config_import_only_leaves() -> None:
    graph = package_graph()
    assert graph["wire"] <= {"errors", "names", "webshell", "tlsconf"}, graph["wire"]
    # below nccl, wire; the default cache directory's home and the token's are leaves
    assert graph["config"] <= {"errors", "names", "cachepaths", "tokens"}, graph["config"]
    for name in ("agent", "cache", "nccl", "transfer", "doctor", "torch", "demo"):
        assert "coordinator" not in graph[name], name  # clients reach the service via wire


def test_every_package_has_a_layer_and_no_edge_points_up_but_the_known_one() -> None:
    graph = package_graph()
    for package in graph:
        layer_of(package)  # KeyError names a package no layer holds
    assert sum(len(layer) for layer in LAYERS) == len(set().union(*LAYERS))  # one layer each
    assert set(upward_edges(graph)) == KNOWN_UPWARD  # a fixed one leaves the list too
    assert main(["--check"]) == 0


def test_the_data_plane_never_imports_the_cache_above_it() -> None:
    graph = package_graph()
    assert layer_of("dataplane") < layer_of("cache")
    assert "cache" not in graph["dataplane"], graph["dataplane"]


def test_an_upward_edge_is_found() -> None:
    graph = {"errors": set(), "config": {"errors", "cache"}, "cache": {"config"}}
    assert upward_edges(graph) == [("config", "cache")]


def test_the_import_linter_contracts_hold_the_same_layers() -> None:
    """pyproject.toml's layers contract (what `lint-imports` checks in CI) and LAYERS agree,
    and its one ignored import is the one known upward edge."""
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    assert layers["containers"] == ["netopt"]
    assert layers["exhaustive"] is True
    from_toml = [frozenset(re.split(r"\s*[:|]\s*", line)) for line in layers["layers"]]
    assert from_toml == list(reversed(LAYERS))  # import-linter lists the top layer first
    ignored = {
        tuple(module.split(".")[1] for module in line.split(" -> "))
        for line in layers["ignore_imports"]
    }
    assert ignored == KNOWN_UPWARD
    (acyclic,) = [c for c in config["contracts"] if c["type"] == "acyclic_siblings"]
    assert (acyclic["ancestors"], acyclic["depth"]) == (["netopt"], 0)

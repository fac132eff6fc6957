"""``netopt cache ls|pin|unpin|evict|gc|verify``: look after the node's chunk cache."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from netopt.cache.sources import SourceOptions
from netopt.cache.store import Cache
from netopt.cache.verify import verify_cache
from netopt.cli.output import console, err_console, print_json, print_table
from netopt.cli.tls_opts import client_tls_options
from netopt.config import cli_token
from netopt.config.node import resolve_node
from netopt.errors import EXIT_FAILURE, StorageError

__all__ = ["cache_group", "cache_listing"]

F = TypeVar("F", bound=Callable[..., Any])


def _common(func: F) -> F:
    func = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Agent config whose cache.dir / cache.capacity_bytes to use.",
    )(func)
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Cache directory (default: from --config, else ~/.cache/netopt/cache).",
    )(func)


def _open(cache_dir: str | None, config_file: str | None, capacity: str | None = None) -> Cache:
    here = resolve_node(config_file, cache_dir=cache_dir, capacity=capacity)
    return Cache.open(here.cache_dir, here.capacity_bytes)


def cache_listing(cache: Cache) -> dict[str, Any]:
    """The cache's datasets and usage as JSON-able data."""
    datasets = []
    for name, mid in sorted(cache.datasets.items()):
        chunks = cache.manifest(name, mid).unique_chunks()
        held = [c for c in chunks if cache.has(c)]
        datasets.append(
            {
                "name": name,
                "manifest_id": mid,
                "versions": len(cache.versions(name)),
                "pinned": name in cache.pins,
                "chunks": len(chunks),
                "chunks_cached": len(held),
                "bytes": sum(chunks.values()),
                "bytes_cached": sum(chunks[c] for c in held),
            }
        )
    return {
        "cache_dir": str(cache.root),
        "capacity_bytes": cache.capacity_bytes,
        "used_bytes": cache.used_bytes,
        "chunks": len(cache.sizes_bytes),
        "datasets": datasets,
    }


@click.group("cache")
def cache_group() -> None:
    """Inspect and look after the node's chunk cache."""


@cache_group.command("ls")
@_common
def ls_command(cache_dir: str | None, config_file: str | None, as_json: bool) -> int:
    """List cached datasets: version, pin, bytes cached of total."""
    with _open(cache_dir, config_file) as cache:
        data = cache_listing(cache)
    if as_json:
        print_json(data)
        return 0
    console.print(
        f"{data['cache_dir']}: {data['used_bytes']} of {data['capacity_bytes']} bytes, "
        f"{data['chunks']} chunks"
    )
    rows = [
        [d["name"], d["manifest_id"][:12], d["pinned"], d["bytes_cached"], d["bytes"]]
        for d in data["datasets"]
    ]
    print_table(None, ["dataset", "version", "pinned", "cached bytes", "bytes"], rows)
    return 0


def _pin(name: str, cache_dir: str | None, config_file: str | None, as_json: bool, on: bool) -> int:
    with _open(cache_dir, config_file) as cache:
        if on:
            cache.pin(name)
        else:
            cache.unpin(name)
    if as_json:
        print_json({"dataset": name, "pinned": on})
    else:
        console.print(f"{name}: {'pinned' if on else 'unpinned'}")
    return 0


@cache_group.command("pin")
@click.argument("name")
@_common
def pin_command(name: str, cache_dir: str | None, config_file: str | None, as_json: bool) -> int:
    """Keep dataset NAME's current version from eviction."""
    return _pin(name, cache_dir, config_file, as_json, True)


@cache_group.command("unpin")
@click.argument("name")
@_common
def unpin_command(name: str, cache_dir: str | None, config_file: str | None, as_json: bool) -> int:
    """Let dataset NAME be evicted again."""
    return _pin(name, cache_dir, config_file, as_json, False)


@cache_group.command("evict")
@click.option("--to", "target", default=None, help="Evict down to this size (e.g. 10GiB).")
@click.option("--capacity", default=None, help="Set the cache's capacity first (e.g. 50GiB).")
@_common
def evict_command(
    target: str | None,
    capacity: str | None,
    cache_dir: str | None,
    config_file: str | None,
    as_json: bool,
) -> int:
    """Evict chunks (least read first, never pinned ones) down to the capacity or --to."""
    target_bytes = resolve_node(None, capacity=target).capacity_bytes if target else None
    with _open(cache_dir, config_file, capacity) as cache:
        before = cache.used_bytes
        victims = cache.evict_to(target_bytes)
        data = {"evicted_chunks": len(victims), "freed_bytes": before - cache.used_bytes}
        data["used_bytes"] = cache.used_bytes
    if as_json:
        print_json(data)
    else:
        console.print(f"evicted {data['evicted_chunks']} chunks, {data['freed_bytes']} bytes")
    return 0


@cache_group.command("gc")
@_common
def gc_command(cache_dir: str | None, config_file: str | None, as_json: bool) -> int:
    """Drop old dataset versions and chunks no current version uses."""
    with _open(cache_dir, config_file) as cache:
        removed, freed = cache.gc()
    if as_json:
        print_json({"removed_chunks": removed, "freed_bytes": freed})
    else:
        console.print(f"removed {removed} chunks, {freed} bytes")
    return 0


@cache_group.command("verify")
@click.option("--source", default=None, help="Fetch corrupt or missing chunks again from here.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="Token for --source.")
@_common
@client_tls_options(agent_config="config_file")
def verify_command(
    source: str | None,
    token_file: str | None,
    cache_dir: str | None,
    config_file: str | None,
    as_json: bool,
) -> int:
    """Re-hash every chunk; remove corrupt ones and, with --source, fetch them again.

    Exit code 1 when a chunk a dataset needs is corrupt or missing and was not repaired,
    or when a full disk stopped a repair or the index write (the report says what was found).
    """
    from netopt.dataplane.httpsource import ClientOptions

    opts = SourceOptions(client=ClientOptions(token=cli_token(token_file, required=False)))
    cache = _open(cache_dir, config_file)
    try:
        report = asyncio.run(verify_cache(cache, source, opts))
    except BaseException:
        with contextlib.suppress(StorageError):
            cache.close()
        raise
    try:
        cache.close()
    except StorageError as exc:
        # What verify found stands (corrupt chunks are gone); only the index is stale,
        # and the next open checks it against the chunk files.
        report = replace(report, errors=(*report.errors, f"cannot save the index: {exc}"))
    if as_json:
        print_json(report.to_dict())
    else:
        console.print(
            f"checked {report.checked} chunks: {len(report.corrupt)} corrupt, "
            f"{len(report.missing)} missing, {len(report.repaired)} repaired, "
            f"{len(report.unrepaired)} still bad"
        )
        for error in report.errors:
            err_console.print(f"error: {error}")
    return EXIT_FAILURE if report.unrepaired or report.errors else 0

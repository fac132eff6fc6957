"""A running coordinator's links as :class:`LinksSettings`, for ``nccl-env`` and ``doctor``.

One fetch of ``/api/v1/nodes`` and ``/api/v1/links``, turned into the links
document a ``--links`` file holds (``nccl.from_coordinator``) and checked by the
same loader as a file, without a detour through YAML text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netopt.config import LinksSettings, settings_from_data
from netopt.config.loader import SourceMap

__all__ = ["CoordinatorLinks", "fetch_coordinator_links"]


@dataclass(frozen=True)
class CoordinatorLinks:
    """The links settings, the ``/api/v1/nodes`` answer they came from, and notes on
    pairs left out (no figures yet)."""

    settings: LinksSettings
    nodes_answer: Mapping[str, Any]
    notes: tuple[str, ...]


def fetch_coordinator_links(
    url: str, token: str, window_s: float | None = None
) -> CoordinatorLinks:
    """GET the nodes and links of the coordinator at ``url``; ``window_s`` is the
    links' window (the coordinator's default when None)."""
    from netopt.nccl.from_coordinator import links_from_coordinator
    from netopt.wire.client import CoordinatorClient

    async def fetch() -> tuple[dict[str, Any], dict[str, Any]]:
        query = {} if window_s is None else {"window_s": window_s}
        async with CoordinatorClient(url, token) as client:
            return await client.get("/api/v1/nodes"), await client.get("/api/v1/links", **query)

    nodes, links = asyncio.run(fetch())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document, notes = links_from_coordinator(nodes, links, when)
    source = SourceMap(f"coordinator {url}", {})
    parsed = settings_from_data(document, source, "links")
    assert isinstance(parsed, LinksSettings)
    return CoordinatorLinks(parsed, nodes, tuple(notes))

"""A running coordinator's links as :class:`LinksSettings`, for ``nccl-env`` and ``doctor``.

One fetch of ``/api/v1/nodes`` and ``/api/v1/links`` (typed and checked:
`netopt.wire.answers`), turned into the links
document a ``--links`` file holds (``nccl.from_coordinator``) and checked by the
same loader as a file, without a detour through YAML text.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from netopt.config import LinksSettings, settings_from_data
from netopt.config.loader import SourceMap
from netopt.wire.answers import LinksAnswer, NodesAnswer

__all__ = ["CoordinatorLinks", "fetch_coordinator_links"]


@dataclass(frozen=True)
class CoordinatorLinks:
    """The links settings, the ``/api/v1/nodes`` answer they came from, and notes on
    pairs left out (no figures yet)."""

    settings: LinksSettings
    nodes_answer: NodesAnswer
    notes: tuple[str, ...]


def fetch_coordinator_links(
    url: str, token: str, window_s: float | None = None
) -> CoordinatorLinks:
    """GET the nodes and links of the coordinator at ``url``; ``window_s`` is the
    links' window (the coordinator's default when None)."""
    from netopt.nccl.from_coordinator import links_from_coordinator
    from netopt.wire.client import CoordinatorClient

    async def fetch() -> tuple[NodesAnswer, LinksAnswer]:
        async with CoordinatorClient(url, token) as client:
            return await client.nodes(), await client.links(window_s)

    nodes, links = asyncio.run(fetch())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document, notes = links_from_coordinator(nodes, links, when)
    source = SourceMap(f"coordinator {url}", {})
    parsed = settings_from_data(document, source, "links")
    assert isinstance(parsed, LinksSettings)
    return CoordinatorLinks(parsed, nodes, tuple(notes))

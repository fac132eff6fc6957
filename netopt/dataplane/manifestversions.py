"""The versions of a dataset a client holds, named when it asks for the manifest.

A client that holds versions of the dataset in its cache names them in the manifest
request's ``If-None-Match`` (`if_none_match`, at most `KNOWN_VERSIONS_MAX`). When one
of them is the current version the server answers 304 with that version's ``ETag``
(`netopt.dataplane.handlers.dataset_manifest`), and the client reads the manifest back
from its cache (`KnownManifests`, checked against the version's name) instead of
fetching it again: a re-sync of a 100,000-file tree that has not changed no longer
moves its 4.8 MB manifest across the link. A 304 naming a version the client did not
offer is a ProtocolError (`not_modified_id`).

Stdlib only: the start-up prefetch (`netopt.dataplane.prefetch`) names the versions
before anything else is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netopt.errors import ProtocolError
from netopt.names import is_hash_id

if TYPE_CHECKING:
    from netopt.transfer.manifest import Manifest

__all__ = [
    "KNOWN_VERSIONS_MAX",
    "KnownManifests",
    "NotModified",
    "if_none_match",
    "not_modified_id",
]

KNOWN_VERSIONS_MAX = 8
"""Versions a client names in ``If-None-Match`` at most (its cache's newest): 536
bytes of header. A dataset's current version is normally the newest one synced."""


@dataclass(frozen=True)
class KnownManifests:
    """The versions of a dataset this client holds (newest first, at most
    `KNOWN_VERSIONS_MAX`) and how to read one back: ``load(manifest_id)`` gives the
    stored manifest, checked against its name, or None when it is gone or does not
    check (blocking: run it off the event loop)."""

    ids: tuple[str, ...]
    load: Callable[[str], Manifest | None]


@dataclass(frozen=True)
class NotModified:
    """A manifest answered 304: the current version is ``manifest_id``, one the client
    named as held."""

    manifest_id: str


def if_none_match(ids: Sequence[str]) -> str | None:
    """The ``If-None-Match`` value naming ``ids`` (the well-formed ones among the first
    `KNOWN_VERSIONS_MAX`); None when there are none."""
    named = [f'"{i}"' for i in ids[:KNOWN_VERSIONS_MAX] if is_hash_id(i)]
    return ", ".join(named) or None


def not_modified_id(etag: str | None, ids: Sequence[str]) -> str:
    """The version a 304's ``ETag`` names; ProtocolError unless it is one of the
    versions the request named (the well-formed ones among the first
    `KNOWN_VERSIONS_MAX` of ``ids``): a server may not send the client to a version
    it did not say it holds."""
    value = (etag or "").strip()
    if value.startswith("W/"):
        value = value[2:]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        named = value[1:-1]
        if is_hash_id(named) and named in ids[:KNOWN_VERSIONS_MAX]:
            return named
    raise ProtocolError(
        f"the manifest was answered 304 naming {value[:80]!r}, not a version this client holds"
    )

"""Names that become parts of local paths: each checked here, once, with ``fullmatch``.

A dataset name names a directory (the cache's ``manifests/NAME/``, a served
dataset, a catalogue entry); a chunk or manifest id names a file. Both come
from peers and users, so neither may hold a ``/``, a ``..``, a NUL or a
trailing newline (``re.match`` with ``$`` lets ``"name\\n"`` through;
``fullmatch`` and ``\\Z`` do not).
"""

from __future__ import annotations

import re

from netopt.errors import PathTraversalError

__all__ = [
    "DATASET_NAME_RE",
    "DATASET_NAME_RULE",
    "HASH_ID_RE",
    "is_dataset_name",
    "is_hash_id",
    "validate_dataset_name",
    "validate_hash_id",
]

DATASET_NAME_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""Dataset names: letters, digits, '.', '_', '-'; no '/', no leading dot, no '..', at most 128."""

HASH_ID_RE = re.compile(r"[0-9a-f]{64}\Z")
"""Chunk and manifest ids: a BLAKE3 digest as 64 lowercase hex digits."""

DATASET_NAME_RULE = "letters, digits, '.', '_' and '-' (no '/', no '..'), at most 128 characters"


def is_dataset_name(value: object) -> bool:
    """True when ``value`` is a dataset name (so never a path)."""
    return isinstance(value, str) and DATASET_NAME_RE.fullmatch(value) is not None


def validate_dataset_name(value: object, what: str = "dataset name") -> str:
    """Return ``value`` if it is a dataset name; PathTraversalError (exit 2) otherwise."""
    if not is_dataset_name(value):
        raise PathTraversalError(f"{what} {value!r} is not allowed: {DATASET_NAME_RULE}")
    assert isinstance(value, str)
    return value


def is_hash_id(value: object) -> bool:
    """True when ``value`` is 64 lowercase hex digits (a chunk or manifest id)."""
    return isinstance(value, str) and HASH_ID_RE.fullmatch(value) is not None


def validate_hash_id(value: object, what: str = "chunk name") -> str:
    """Return ``value`` if it is a BLAKE3 hex id; PathTraversalError otherwise."""
    if not is_hash_id(value):
        raise PathTraversalError(f"{what} {value!r} is not 64 lowercase hex digits")
    assert isinstance(value, str)
    return value

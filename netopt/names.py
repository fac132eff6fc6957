"""Names that become parts of local paths: each checked here, once, with ``fullmatch``.

A dataset name names a directory (the cache's ``manifests/NAME/``, a served
dataset, a catalogue entry); a chunk or manifest id names a file. Both come
from peers and users, so neither may hold a ``/``, a ``..``, a NUL or a
trailing newline (``re.match`` with ``$`` lets ``"name\\n"`` through;
``fullmatch`` and ``\\Z`` do not).
"""

from __future__ import annotations

import re
from typing import TypeGuard

from netopt.errors import PathTraversalError

__all__ = [
    "DATASET_NAME_RE",
    "DATASET_NAME_RULE",
    "HASH_ID_RE",
    "IFNAME_RE",
    "JOB_NAME_RE",
    "JOB_NAME_RULE",
    "NODE_NAME_RE",
    "NODE_NAME_RULE",
    "is_dataset_name",
    "is_hash_id",
    "is_ifname",
    "is_job_name",
    "is_node_name",
    "validate_dataset_name",
    "validate_hash_id",
]

DATASET_NAME_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""Dataset names: letters, digits, '.', '_', '-'; no '/', no leading dot, no '..', at most 128."""

HASH_ID_RE = re.compile(r"[0-9a-f]{64}\Z")
"""Chunk and manifest ids: a BLAKE3 digest as 64 lowercase hex digits."""

DATASET_NAME_RULE = "letters, digits, '.', '_' and '-' (no '/', no '..'), at most 128 characters"

NODE_NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?\Z")
"""Node and region names: lowercase host names (letters, digits, '-', '.'), at most 63."""

NODE_NAME_RULE = "lowercase letters, digits, '-' and '.', at most 63 characters"

JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
"""Training job names (the step meter's ``job`` label, a file name in the agent's train dir)."""

JOB_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64"

IFNAME_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}\Z")
"""Network interface names: at most 15 characters (IFNAMSIZ is 16 with the NUL)."""


def is_dataset_name(value: object) -> TypeGuard[str]:
    """True when ``value`` is a dataset name (so never a path)."""
    return isinstance(value, str) and DATASET_NAME_RE.fullmatch(value) is not None


def validate_dataset_name(value: object, what: str = "dataset name") -> str:
    """Return ``value`` if it is a dataset name; PathTraversalError (exit 2) otherwise."""
    if not is_dataset_name(value):
        raise PathTraversalError(f"{what} {value!r} is not allowed: {DATASET_NAME_RULE}")
    return value


def is_node_name(value: object) -> TypeGuard[str]:
    """True when ``value`` is a node or region name (a lowercase host name)."""
    return isinstance(value, str) and NODE_NAME_RE.fullmatch(value) is not None


def is_job_name(value: object) -> TypeGuard[str]:
    """True when ``value`` is a training job name (so never a path)."""
    return isinstance(value, str) and JOB_NAME_RE.fullmatch(value) is not None


def is_ifname(value: object) -> TypeGuard[str]:
    """True when ``value`` is a network interface name (1-15 characters, no '/')."""
    return isinstance(value, str) and IFNAME_RE.fullmatch(value) is not None


def is_hash_id(value: object) -> TypeGuard[str]:
    """True when ``value`` is 64 lowercase hex digits (a chunk or manifest id)."""
    return isinstance(value, str) and HASH_ID_RE.fullmatch(value) is not None


def validate_hash_id(value: object, what: str = "chunk name") -> str:
    """Return ``value`` if it is a BLAKE3 hex id; PathTraversalError otherwise."""
    if not is_hash_id(value):
        raise PathTraversalError(f"{what} {value!r} is not 64 lowercase hex digits")
    return value

"""Options that several commands share, and how their values are read."""

from __future__ import annotations

__all__ = ["CC_CHOICES", "congestion_control"]

CC_CHOICES = ("bbr", "cubic", "reno", "default")
"""``--cc`` of ``serve`` and ``sync``: ``default`` keeps the node's own choice."""


def congestion_control(value: str) -> str | None:
    """A ``--cc`` value as the sockets take it: None for ``default`` (left as it is)."""
    return None if value == "default" else value

"""The coordinator: agent registry, link-summary ingest, probe plans, link matrix.

Agent-facing pieces to import:

- ``netopt.coordinator.schema``: wire types (``Registration``, ``Nic``,
  ``Heartbeat``, ``LinkSummary``, ``RttFigures``, ``OutageRecord``,
  ``SummaryBatch``) with ``to_dict()``/``from_dict()`` and their size limits.
- ``netopt.coordinator.client``: ``CoordinatorClient`` (async) and its errors.
- ``netopt.coordinator.plan``: the pure ``make_plan`` and the plan types.

Service pieces: ``netopt.coordinator.app.create_app`` and
``netopt.coordinator.server.run_coordinator``.
"""

from __future__ import annotations

__all__: list[str] = []

"""The coordinator: agent registry, link-summary ingest, probe plans, link matrix.

The wire contract it serves (request types, their readers, the client) lives
apart, in ``netopt.wire``; agents import that, never this package. The probe
plan is decided by the pure ``netopt.coordinator.plan.make_plan``.

Service pieces: ``netopt.coordinator.app.create_app`` and
``netopt.coordinator.server.run_coordinator``.
"""

from __future__ import annotations

__all__: list[str] = []

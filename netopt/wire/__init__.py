"""The coordinator's wire contract, shared by the service and every client.

- ``netopt.wire.fields``: strict readers for JSON bodies (``Reader``,
  ``RequestInvalid``); every refusal names the field path.
- ``netopt.wire.schema``: the wire types (``Registration``, ``Nic``,
  ``Heartbeat``, ``LinkSummary``, ``RttFigures``, ``OutageRecord``,
  ``SummaryBatch``) with ``to_dict()``/``from_dict()`` and their size limits.
- ``netopt.wire.client``: ``CoordinatorClient`` (async) and its errors.

This package is low in the layer order: it imports only leaf modules
(``netopt.errors``, ``netopt.names``, ``netopt.webshell``), so the coordinator
service, the agent, nccl, transfer, cache and the CLI can all import it without
importing one another.
"""

from __future__ import annotations

__all__: list[str] = []

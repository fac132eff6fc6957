"""Shared test helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer, running_server, why_unavailable

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole session (skipped, saying why, where it cannot run)."""
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with running_server() as server:
        yield server

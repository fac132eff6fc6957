"""Shared test helpers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer, running_server, why_unavailable

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


@pytest.fixture(scope="session", autouse=True)
def _session_speed_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The codec speeds and per-file costs the suite measures (`NETOPT_CODEC_CACHE`, and
    ``filecost.json`` beside it) go to a directory of this session's, not the user's
    ``~/.cache`` (subprocesses inherit it); a test may still point them elsewhere."""
    before = os.environ.get("NETOPT_CODEC_CACHE")
    os.environ["NETOPT_CODEC_CACHE"] = str(tmp_path_factory.mktemp("speed") / "codec.json")
    yield
    if before is None:
        os.environ.pop("NETOPT_CODEC_CACHE", None)
    else:
        os.environ["NETOPT_CODEC_CACHE"] = before


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

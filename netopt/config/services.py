"""Settings of the long-running services: the agent daemon and the coordinator."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Annotated, Literal

from netopt.config.common import ListenAddress, TlsSettings, check_name
from netopt.config.loader import BYTES, URL_LIST, Invalid, bounded

__all__ = [
    "AgentSettings",
    "CacheSettings",
    "CoordinatorSettings",
    "ProbePlanSettings",
    "ProbeSettings",
    "SpoolSettings",
]

DEFAULT_COORDINATOR_PORT = 7460
DEFAULT_AGENT_PORT = 7470
DEFAULT_PROBE_PORT = 7471


def _check_token(token: str | None, token_file: str | None) -> None:
    if token is not None and token_file is not None:
        raise Invalid("token", "is given together with token_file", "only one of the two")
    if token is not None and len(token) < 16:
        raise Invalid("token", "is shorter than 16 characters", "a random secret of 16+ characters")


@dataclass(frozen=True)
class ProbeSettings:
    """How the agent measures its peers."""

    port: int = bounded(DEFAULT_PROBE_PORT, ge=1, le=65535)
    rate_pps: float = bounded(30.0, gt=0, le=10_000)
    """30 per second: a 10 s window of 300 probes sees 1% loss 95% of the time (at 20, 87%)."""
    spacing: Literal["fixed", "poisson"] = "poisson"
    padding_bytes: int = bounded(0, ge=0, le=1400)
    timeout_s: float = bounded(2.0, gt=0, le=60)
    window_s: float = bounded(10.0, gt=0, le=3600)
    bandwidth_interval_s: float = bounded(600.0, ge=10)
    bandwidth_duration_s: float = bounded(5.0, gt=0, le=120)
    max_streams: int = bounded(16, ge=1, le=64)
    congestion_control: Literal["bbr", "cubic", "reno", "default"] = "bbr"
    # Timer grid for sending and reading probes. 200 ms: the wake-up per tick dominates
    # the CPU cost; RTTs use kernel timestamps, so only send times (and outage edges, to
    # ~0.2 s) are coarser. 0 wakes once per packet.
    batch_s: float = bounded(0.2, ge=0, le=1)


@dataclass(frozen=True)
class SpoolSettings:
    """Where summaries wait while the coordinator is unreachable."""

    dir: str = "/var/lib/netopt/spool"
    max_bytes: Annotated[int, BYTES] = 64 * 1024**2


@dataclass(frozen=True)
class CacheSettings:
    """The node's dataset cache."""

    dir: str = "/var/cache/netopt"
    capacity_bytes: Annotated[int, BYTES] = 100 * 1024**3
    max_parallel_streams: int = bounded(16, ge=1, le=64)
    congestion_control: Literal["bbr", "cubic", "reno", "default"] = "bbr"
    rate_limit_mbps: float | None = bounded(None, gt=0)


@dataclass(frozen=True)
class AgentSettings:
    """``netopt agent --config FILE``."""

    node: str
    region: str
    # One URL, or several (replicas; a YAML list or one comma-separated string): the
    # client moves on when one fails. Kept as the comma-separated string.
    coordinator_url: Annotated[str, URL_LIST] = f"http://127.0.0.1:{DEFAULT_COORDINATOR_PORT}"
    token: str | None = None
    token_file: str | None = None
    listen: ListenAddress = field(default_factory=lambda: ListenAddress(port=DEFAULT_AGENT_PORT))
    advertise_host: str | None = None
    heartbeat_interval_s: float = bounded(10.0, gt=0, le=3600)
    report_interval_s: float = bounded(10.0, gt=0, le=3600)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    train_dir: str = "/var/lib/netopt/train"
    """Where training jobs' step meters leave their totals (``StepMeter(agent_dir=...)``)."""

    def __post_init__(self) -> None:
        check_name("node", self.node, "node name")
        check_name("region", self.region, "region name")
        urls = [u.strip() for u in self.coordinator_url.split(",")]
        if not all(u.startswith(("http://", "https://")) for u in urls):
            raise Invalid(
                "coordinator_url", "is not an HTTP URL (or a list of them)",
                "http://HOST:PORT, a list [http://HOST1:PORT, http://HOST2:PORT]"
                " or one string http://HOST1:PORT,http://HOST2:PORT",
            )  # fmt: skip
        _check_token(self.token, self.token_file)


@dataclass(frozen=True)
class ProbePlanSettings:
    """How the coordinator decides who probes whom."""

    per_node_budget: int = bounded(32, ge=1, le=1024)
    representatives_per_region_pair: int = bounded(2, ge=1, le=16)
    bandwidth_interval_s: float = bounded(600.0, ge=10)
    bandwidth_slot_s: float = bounded(15.0, ge=2, le=600)
    bandwidth_tests: bool = True


@dataclass(frozen=True)
class CoordinatorSettings:
    """``netopt coordinator --config FILE``."""

    listen: ListenAddress = field(
        default_factory=lambda: ListenAddress(port=DEFAULT_COORDINATOR_PORT)
    )
    token: str | None = None
    token_file: str | None = None
    # A SQLite file path, or postgresql://USER@HOST:PORT/DB (several replicas may share it).
    database: str = "/var/lib/netopt/coordinator.db"
    # PostgreSQL's password (else libpq's PGPASSWORD): never in the URL.
    database_password_file: str | None = None
    retention_s: float = bounded(7 * 86400.0, gt=0)
    stale_after_s: float = bounded(30.0, gt=0)
    max_request_bytes: Annotated[int, BYTES] = 1024**2
    # "normal": WAL, fsync at checkpoints (an OS crash may lose the last ~2 s of
    # acknowledged batches; a killed process loses nothing). "full": fsync every commit.
    durability: Literal["normal", "full"] = "normal"
    # Group commit's linger: ingest waits up to this long (or until 4 batches wait) so
    # that batches share a write; 0 writes at once. Less CPU for more latency.
    ingest_linger_s: float = bounded(0.0, ge=0, le=1)
    probe_plan: ProbePlanSettings = field(default_factory=ProbePlanSettings)
    datasets_file: str | None = None
    tls: TlsSettings = field(default_factory=TlsSettings)

    def __post_init__(self) -> None:
        _check_token(self.token, self.token_file)
        _check_database(self.database, self.database_password_file)
        if self.tls.insecure:
            raise Invalid(
                "tls.insecure", "is set, but the coordinator sends no requests of its own",
                "no tls.insecure (tls.allow_plaintext is the listener's setting)",
            )  # fmt: skip


def _check_database(database: str, password_file: str | None) -> None:
    scheme = database.partition("://")[0].lower() if "://" in database else None
    if scheme is None:
        if password_file is not None:
            raise Invalid(
                "database_password_file", "is set but database is a SQLite path",
                "a postgresql:// database URL, or no database_password_file",
            )  # fmt: skip
        return
    expected = "postgresql://USER@HOST:PORT/DB or a SQLite file path"
    if scheme not in ("postgresql", "postgres"):
        raise Invalid("database", f"has the unknown scheme {scheme!r}", expected)
    try:
        parts = urllib.parse.urlsplit(database)
        has_password = parts.password is not None
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise Invalid("database", f"is not a valid URL ({exc})", expected) from None
    if has_password:
        raise Invalid(
            "database", "holds a password (configs are read by many and logged)",
            "the URL without it; the password in database_password_file or PGPASSWORD",
        )  # fmt: skip

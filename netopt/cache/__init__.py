"""The node's dataset cache: BLAKE3-named FastCDC chunks, manifests, eviction, residency."""

from netopt.cache.policy import ChunkAccess, evict, record_access
from netopt.cache.residency import check_residency, residency_violation
from netopt.cache.store import Cache
from netopt.cache.syncer import CacheSink, SyncPlan, SyncReport, SyncRequest, plan_sync, run_sync

__all__ = [
    "Cache",
    "CacheSink",
    "ChunkAccess",
    "SyncPlan",
    "SyncReport",
    "SyncRequest",
    "check_residency",
    "evict",
    "plan_sync",
    "record_access",
    "residency_violation",
    "run_sync",
]

"""Transfer planning: what to send how (codec, chunking, streams) and the dataset manifest."""

from netopt.transfer.manifest import (
    FileEntry,
    Manifest,
    build_manifest,
    manifest_from_dict,
    manifest_to_dict,
    validate_chunk_id,
    validate_rel_path,
)
from netopt.transfer.planner import (
    CpuProfile,
    LinkProfile,
    SampleProfile,
    TransferPlan,
    per_flow_ceiling_bps,
    plan_transfer,
)

__all__ = [
    "CpuProfile",
    "FileEntry",
    "LinkProfile",
    "Manifest",
    "SampleProfile",
    "TransferPlan",
    "build_manifest",
    "manifest_from_dict",
    "manifest_to_dict",
    "per_flow_ceiling_bps",
    "plan_transfer",
    "validate_chunk_id",
    "validate_rel_path",
]

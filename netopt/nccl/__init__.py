"""The NCCL tuner: measured links in, an NCCL/Gloo environment (with reasons) out.

``tune_nccl(nodes, links, nccl_version, options) -> NcclSettings`` is the pure
entry point; :mod:`netopt.nccl.render` writes the result as env / json / slurm /
k8s text, and :mod:`netopt.nccl.domains` holds the table of documented variables
that every emitted value is checked against.
"""

from __future__ import annotations

from netopt.nccl.model import (
    Advice,
    EnvValue,
    LinkFigures,
    NcclSettings,
    NcclVersion,
    Nic,
    NodeInfo,
    Prediction,
    TuneOptions,
    TunerRow,
    parse_version,
)
from netopt.nccl.tuner import tune_nccl

__all__ = [
    "Advice",
    "EnvValue",
    "LinkFigures",
    "NcclSettings",
    "NcclVersion",
    "Nic",
    "NodeInfo",
    "Prediction",
    "TuneOptions",
    "TunerRow",
    "parse_version",
    "tune_nccl",
]

"""A `LinkProfile` for ``netopt plan --to NODE`` from the coordinator's measured link matrix.

`link_profile_from_links` is pure: it reads one (src, dst) entry of the
``GET /api/v1/links`` answer (either direction; RTT and loss are round-trip
figures) and turns it into the planner's input. `fetch_link_profile` is the I/O
edge that asks a coordinator for that answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from netopt.errors import UsageError, ValidationError
from netopt.transfer.planner import HEADER_EFFICIENCY, CongestionControl, LinkProfile

__all__ = [
    "MissingLinkError",
    "fetch_link_profile",
    "link_profile_from_links",
    "local_node_name",
]


class MissingLinkError(ValidationError):
    """The coordinator has no usable figures for a node pair (exit code 2)."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def _entry(
    links: Sequence[Mapping[str, Any]], src: str, dst: str
) -> tuple[Mapping[str, Any], bool] | None:
    by_pair = {(str(e.get("src")), str(e.get("dst"))): e for e in links if isinstance(e, Mapping)}
    if (src, dst) in by_pair:
        return by_pair[(src, dst)], False
    if (dst, src) in by_pair:
        return by_pair[(dst, src)], True
    return None


def _rtt_ms(entry: Mapping[str, Any]) -> float | None:
    window = entry.get("window") or {}
    spread = window.get("rtt_p50_ms") if isinstance(window, Mapping) else None
    if isinstance(spread, Mapping) and _number(spread.get("p50")) is not None:
        return _number(spread.get("p50"))
    latest = entry.get("latest") or {}
    return _number(latest.get("rtt_p50_ms")) if isinstance(latest, Mapping) else None


def link_profile_from_links(
    links: Sequence[Mapping[str, Any]],
    src: str,
    dst: str,
    congestion_control: CongestionControl = "bbr",
) -> tuple[LinkProfile, tuple[str, ...]]:
    """The link ``src`` -> ``dst`` from the coordinator's ``links`` list, with one note per figure.

    RTT: the window's median of p50s (else the latest p50). Loss: the window's
    pooled loss ratio (0 when none was measured). Rate: the measured aggregate
    (else single-stream) bulk throughput, a goodput, scaled back to a line rate
    by `HEADER_EFFICIENCY`; a measured single-stream figure also caps each flow.
    The reverse pair stands in when only it was measured. Raises MissingLinkError,
    naming the pair, when neither direction has an RTT and a throughput figure.
    """
    found = _entry(links, src, dst)
    if found is None:
        raise MissingLinkError(
            f"the coordinator has no measurements for {src} -> {dst} (nor {dst} -> {src}); "
            "is the agent on both nodes running, and is the pair in the probe plan?"
        )
    entry, reversed_pair = found
    pair = f"{dst} -> {src}" if reversed_pair else f"{src} -> {dst}"
    rtt_ms = _rtt_ms(entry)
    bandwidth = entry.get("bandwidth") or {}
    aggregate_bps = _number(bandwidth.get("aggregate_bps"))
    single_bps = _number(bandwidth.get("single_stream_bps"))
    missing = [
        name
        for name, value in (("RTT", rtt_ms), ("bandwidth", aggregate_bps or single_bps))
        if value is None
    ]
    if missing or rtt_ms is None:
        raise MissingLinkError(
            f"the coordinator has no {' or '.join(missing)} figures for {pair} yet "
            "(bandwidth comes from the agents' bulk-TCP or iperf3 tests)"
        )
    window = entry.get("window") or {}
    loss = window.get("loss_ratio") if isinstance(window, Mapping) else None
    loss_ratio = min(float(loss), 0.5) if isinstance(loss, int | float) and loss > 0 else 0.0
    measured_bps = aggregate_bps or single_bps or 0.0
    link = LinkProfile(
        rate_bps=measured_bps / HEADER_EFFICIENCY,
        rtt_ms=rtt_ms,
        loss_ratio=loss_ratio,
        congestion_control=congestion_control,
        single_stream_bps=single_bps,
    )
    kind = "aggregate" if aggregate_bps else "single-stream"
    notes = (
        f"link {pair} from the coordinator: rtt p50 {rtt_ms:g} ms, loss {loss_ratio:g}, "
        f"{kind} {measured_bps / 1e6:.1f} Mbit/s measured",
    )
    return link, notes


async def fetch_link_profile(
    url: str,
    token: str,
    src: str,
    dst: str,
    *,
    window_s: float = 300.0,
    congestion_control: CongestionControl = "bbr",
) -> tuple[LinkProfile, tuple[str, ...]]:
    """Ask the coordinator at ``url`` for the ``src`` -> ``dst`` link over the last ``window_s``.

    Raises PeerUnreachableError / AuthenticationError from the client,
    MissingLinkError when the pair has no usable figures, ValidationError when
    ``dst`` is not a registered node.
    """
    # Imported here: the coordinator client pulls in aiohttp, which `plan` without
    # --coordinator does not need.
    from netopt.wire.client import CoordinatorClient

    async with CoordinatorClient(url, token) as client:
        nodes = await client.get("/api/v1/nodes")
        answer = await client.get("/api/v1/links", window_s=window_s)
    known = {str(n.get("node")) for n in nodes.get("nodes", []) if isinstance(n, Mapping)}
    for name in (src, dst):
        if known and name not in known:
            raise ValidationError(
                f"node {name!r} is not registered with the coordinator "
                f"(known: {', '.join(sorted(known))})"
            )
    links = answer.get("links", [])
    return link_profile_from_links(
        links if isinstance(links, list) else [], src, dst, congestion_control
    )


def local_node_name(from_node: str | None, config_path: str | None) -> str:
    """This node's name: ``from_node``, else ``node`` of the agent config at ``config_path``.

    Raises UsageError when neither is given, ConfigError for a bad config file.
    """
    if from_node:
        return from_node
    if config_path is None:
        raise UsageError("give --from NODE or --config AGENT_CONFIG (its `node` is this node)")
    from netopt.config import load_settings

    return load_settings(config_path, "agent").node

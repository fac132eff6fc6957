"""A `LinkProfile` for ``netopt plan --to NODE`` from the coordinator's measured link matrix.

`link_profile_from_links` is pure: it reads one (src, dst) entry of the
``GET /api/v1/links`` answer (either direction; RTT and loss are round-trip
figures) and turns it into the planner's input. `fetch_link_profile` is the I/O
edge that asks a coordinator for that answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from netopt.errors import UsageError, ValidationError
from netopt.transfer.planner import HEADER_EFFICIENCY, CongestionControl, LinkProfile

if TYPE_CHECKING:  # aiohttp (under netopt.wire): `plan` without --coordinator needs none
    from netopt.wire.answers import LinkView

__all__ = [
    "MissingLinkError",
    "fetch_link_profile",
    "link_profile_from_links",
    "local_node_name",
]


class MissingLinkError(ValidationError):
    """The coordinator has no usable figures for a node pair (exit code 2)."""


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _entry(links: Sequence[LinkView], src: str, dst: str) -> tuple[LinkView, bool] | None:
    by_pair = {(e.src, e.dst): e for e in links}
    if (src, dst) in by_pair:
        return by_pair[(src, dst)], False
    if (dst, src) in by_pair:
        return by_pair[(dst, src)], True
    return None


def _rtt_ms(entry: LinkView) -> float | None:
    spread = entry.window.rtt_p50_ms
    if spread is not None and _positive(spread.p50) is not None:
        return spread.p50
    return None if entry.latest is None else _positive(entry.latest.rtt_p50_ms)


def link_profile_from_links(
    links: Sequence[LinkView],
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
    aggregate_bps = _positive(entry.bandwidth.aggregate_bps)
    single_bps = _positive(entry.bandwidth.single_stream_bps)
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
    loss = entry.window.loss_ratio
    loss_ratio = min(loss, 0.5) if loss is not None and loss > 0 else 0.0
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

    Raises PeerUnreachableError / AuthenticationError / ProtocolError from the client,
    MissingLinkError when the pair has no usable figures, ValidationError when
    ``dst`` is not a registered node.
    """
    # Imported here: the coordinator client pulls in aiohttp, which `plan` without
    # --coordinator does not need.
    from netopt.wire.client import CoordinatorClient

    async with CoordinatorClient(url, token) as client:
        nodes = await client.nodes()
        answer = await client.links(window_s)
    known = {n.node for n in nodes.nodes}
    for name in (src, dst):
        if known and name not in known:
            raise ValidationError(
                f"node {name!r} is not registered with the coordinator "
                f"(known: {', '.join(sorted(known))})"
            )
    return link_profile_from_links(answer.links, src, dst, congestion_control)


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

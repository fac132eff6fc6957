"""``tune_nccl``: measured links -> NCCL/Gloo environment, each value with a reason.

NCCL's socket transport tells NCCL's own tuner nothing about latency and takes
link speed from the NIC, so an 80 ms cross-border link looks like a LAN to it.
This module supplies what NCCL cannot see. Pure: no I/O, no clock, no environment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import MappingProxyType

from netopt.errors import ValidationError
from netopt.nccl import domains
from netopt.nccl.advice import advise
from netopt.nccl.costmodel import (
    Fabric,
    best_link,
    fabric_from_links,
    flow_ceiling_bps,
    predict,
    predict_table,
)
from netopt.nccl.interfaces import choose_interfaces, nccl_ifname_value
from netopt.nccl.model import (
    Advice,
    EnvValue,
    LinkFigures,
    NcclSettings,
    NcclVersion,
    NodeInfo,
    TuneOptions,
    TunerRow,
)
from netopt.nccl.rankorder import rank_order

__all__ = ["DEFAULT_BUFFSIZE_BYTES", "MIN_NCCL_VERSION", "tune_nccl", "tuner_rows"]

Emit = Callable[..., None]

MIN_NCCL_VERSION: NcclVersion = (2, 4, 8)
DEFAULT_BUFFSIZE_BYTES = 4 * 1024 * 1024
"""NCCL's default NCCL_BUFFSIZE (4 MiB)."""
NCCL_STEPS = 8
"""Slots per connection buffer (NCCL_STEPS): each in-flight step holds BUFFSIZE/8."""
SOCKET_CHUNK_BYTES = 64 * 1024
"""net_socket MIN_CHUNKSIZE: a step is split over sockets in chunks of >= 64 KiB."""
DEFAULT_RETRY_CNT = 34
DEFAULT_RETRY_SLEEP_MSEC = 100
SOCKETS_PER_THREAD = 8
CSV_MAX_BYTES = 4294967295


def _fmt(version: NcclVersion) -> str:
    return ".".join(map(str, version))


def _check_inputs(
    nodes: Sequence[NodeInfo], links: Sequence[LinkFigures], version: NcclVersion
) -> None:
    if version < MIN_NCCL_VERSION:
        raise ValidationError(f"NCCL {_fmt(version)} is older than {_fmt(MIN_NCCL_VERSION)}")
    names = [n.name for n in nodes]
    if len(names) < 2:
        raise ValidationError("nccl-env needs at least two nodes")
    if len(set(names)) != len(names):
        raise ValidationError(f"a node is named twice in {', '.join(names)}")
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            best_link(links, a, b)  # raises naming the pair


def _window_s(count: int, sleep_ms: int) -> float:
    """NCCL sleeps i x RETRY_SLEEP_MSEC before retry i: the total over ``count`` retries."""
    return sleep_ms * count * (count + 1) / 2 / 1000


def tune_nccl(
    nodes: Sequence[NodeInfo],
    links: Sequence[LinkFigures],
    nccl_version: NcclVersion,
    options: TuneOptions | None = None,
) -> NcclSettings:
    """Environment for NCCL ``nccl_version`` (and Gloo) on ``nodes``, from ``links``.

    Raises ValidationError for fewer than two nodes, a pair without link figures
    (named), an NCCL older than 2.4.8, or NICs without a common address family.
    """
    options = options or TuneOptions()
    _check_inputs(nodes, links, nccl_version)
    names = {n.name for n in nodes}
    links = [link for link in links if link.a in names and link.b in names]
    torch_version = options.torch_version
    common: list[EnvValue] = []
    warnings: list[str] = []

    def emit(key: str, value: object, reason: str, into: list[EnvValue] = common) -> None:
        if domains.reads(key, nccl_version, torch_version):
            into.append(EnvValue(key, str(value), reason))

    per_node = _interfaces(nodes, links, nccl_version, warnings, emit)
    _transport(links, emit)
    sockets = _sockets(nodes, links, options, emit)
    channels = _buffers(nodes, links, options, sockets, nccl_version, emit, warnings)
    # Each channel has its own connection, so a hop carries channels x sockets flows.
    fabric = fabric_from_links(nodes, links, flows=sockets * channels, mss_bytes=options.mss_bytes)
    _algorithm(fabric, options, nccl_version, emit, warnings)
    window_s, outage_s = _retries(links, nccl_version, torch_version, emit, warnings)
    if torch_version >= (2, 2, 0):
        emit(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            1,
            "tear the process down on an NCCL error or "
            "timeout so torchrun restarts it, instead of hanging on a dead link",
        )
    else:
        emit(
            "NCCL_ASYNC_ERROR_HANDLING",
            1,
            "PyTorch < 2.2 reads this name: tear the process "
            "down on an NCCL error or timeout instead of hanging",
        )
    rows: tuple[TunerRow, ...] = ()
    if options.tuner_csv:
        rows = tuner_rows(fabric, options, len(nodes), channels)
    if options.backend == "gloo":  # Gloo opens one connection, one flow, per pair
        gloo = fabric_from_links(nodes, links, flows=1, mss_bytes=options.mss_bytes)
        advice = advise(gloo, options, window_s, outage_s)
    else:
        advice = advise(fabric, options, window_s, outage_s)
    two = predict(fabric, options.bucket_bytes)
    if "two-level" in two and two["two-level"] < min(two["ring"], two["tree"]):
        advice = _note_two_level(advice, two, options.bucket_bytes)
    order = rank_order([n.name for n in nodes], {n.name: n.region for n in nodes})
    if order.border_hops_advised < order.border_hops_given:
        by_name = {n.name: n for n in nodes}
        grouped = fabric_from_links(
            [by_name[name] for name in order.advised], links,
            flows=sockets * channels, mss_bytes=options.mss_bytes,
        )  # fmt: skip
        ring_given_ms = 1e3 * two["ring"]
        ring_advised_ms = 1e3 * predict(grouped, options.bucket_bytes)["ring"]
        if round(ring_advised_ms) < round(ring_given_ms):
            predicted = (
                f"ring all-reduce of one {options.bucket_bytes / 2**20:g} MiB bucket predicted "
                f"{ring_given_ms:.0f} -> {ring_advised_ms:.0f} ms"
            )
        else:
            predicted = (
                f"the cost model predicts {ring_given_ms:.0f} ms a bucket for both: it does not "
                "yet count ring hops that share one border link"
            )
        note = (
            f"rank order: --nodes crosses a region border {order.border_hops_given} times per "
            f"ring; {','.join(order.advised)} crosses it {order.border_hops_advised} times "
            f"({predicted}). Start the nodes in that order: "
            + ", ".join(
                f"{node}: torchrun --node-rank={i}" for node, i in order.node_rank().items()
            )
            + " (Slurm: list the nodes in that order with --nodelist and --distribution=arbitrary)"
        )
        advice = replace(advice, notes=(*advice.notes, note))
    return NcclSettings(
        nccl_version=nccl_version,
        nodes=tuple(n.name for n in nodes),
        common=tuple(common),
        per_node=MappingProxyType({k: tuple(v) for k, v in per_node.items()}),
        advice=advice,
        predictions=predict_table(fabric, options.message_sizes_bytes),
        tuner_rows=rows,
        warnings=tuple(warnings),
        extra=MappingProxyType({"sockets": sockets, "channels": channels}),
        rank_order=order,
    )


def _interfaces(
    nodes: Sequence[NodeInfo],
    links: Sequence[LinkFigures],
    nccl_version: NcclVersion,
    warnings: list[str],
    emit: Emit,
) -> dict[str, list[EnvValue]]:
    choice = choose_interfaces(nodes, links, nccl_version)
    warnings.extend(choice.warnings)
    per_node: dict[str, list[EnvValue]] = {n.name: [] for n in nodes}
    if choice.uniform:
        name = next(iter(choice.nics.values()))
        reason = "; ".join(choice.reasons.values())
        emit("NCCL_SOCKET_IFNAME", nccl_ifname_value(name, nccl_version), reason)
        emit("GLOO_SOCKET_IFNAME", name, "the same NIC for Gloo (exact names, no '=' syntax)")
    else:
        for node in nodes:
            name = choice.nics[node.name]
            into = per_node[node.name]
            emit(
                "NCCL_SOCKET_IFNAME",
                nccl_ifname_value(name, nccl_version),
                choice.reasons[node.name],
                into,
            )
            emit("GLOO_SOCKET_IFNAME", name, f"{node.name}: the same NIC for Gloo", into)
    family = "AF_INET" if choice.family == 4 else "AF_INET6"
    emit(
        "NCCL_SOCKET_FAMILY",
        family,
        f"every chosen NIC has IPv{choice.family}: pin it so "
        "no node takes another family's first address",
    )
    return per_node


def _transport(links: Sequence[LinkFigures], emit: Emit) -> None:
    rdma_pairs = {link.pair for link in links if link.rdma}
    without = sorted({f"{link.a}<->{link.b}" for link in links if link.pair not in rdma_pairs})
    if not without:
        return
    reason = f"RDMA is not reachable end to end ({', '.join(without[:3])}"
    reason += ", ...)" if len(without) > 3 else ")"
    emit("NCCL_IB_DISABLE", 1, reason + ": do not try InfiniBand/RoCE")
    emit("NCCL_NET", "Socket", "use NCCL's socket transport, never a half-working RDMA path")


def _sockets(
    nodes: Sequence[NodeInfo], links: Sequence[LinkFigures], options: TuneOptions, emit: Emit
) -> int:
    worst: tuple[int, str] = (1, "")
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            link = best_link(links, a.name, b.name)
            flow_bps = flow_ceiling_bps(link, options.mss_bytes)
            need = max(1, min(domains.MAX_SOCKETS, math.ceil(link.link_mbps * 1e6 / flow_bps)))
            if need > worst[0] or not worst[1]:
                worst = (
                    need,
                    f"{a.name}<->{b.name}: {link.link_mbps:g} Mbit/s link, "
                    f"{flow_bps / 1e6:.3g} Mbit/s per TCP flow ({_flow_why(link)}) "
                    f"-> {need} flows",
                )
    total, why = worst
    threads = max(1, min(domains.MAX_THREADS, math.ceil(total / SOCKETS_PER_THREAD)))
    per_thread = math.ceil(total / threads)
    emit("NCCL_SOCKET_NTHREADS", threads, f"{why} = {threads} threads x {per_thread} sockets")
    emit(
        "NCCL_NSOCKS_PERTHREAD",
        per_thread,
        f"{threads} x {per_thread} = "
        f"{threads * per_thread} sockets per connection (NCCL caps the product at 64)",
    )
    return threads * per_thread


def _flow_why(link: LinkFigures) -> str:
    if link.loss_based and link.loss_ratio > 0:
        return (
            f"min of single-stream {link.single_stream_mbps:g} and Mathis at "
            f"{link.rtt_ms:g} ms/{link.loss_ratio:g} loss, {link.congestion_control}"
        )
    return f"measured single-stream, {link.congestion_control}"


def _next_pow2(value: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, value))))


def _buffers(
    nodes: Sequence[NodeInfo],
    links: Sequence[LinkFigures],
    options: TuneOptions,
    sockets: int,
    nccl_version: NcclVersion,
    emit: Emit,
    warnings: list[str],
) -> int:
    bdp, where = 0.0, ""
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            link = best_link(links, a.name, b.name)
            this = link.link_mbps * 1e6 / 8 * link.rtt_ms / 1000
            if this > bdp:
                bdp, where = (
                    this,
                    f"{a.name}<->{b.name} BDP {link.link_mbps:g} Mbit/s x {link.rtt_ms:g} ms"
                    f" = {this / 2**20:.2f} MiB",
                )
    cap = options.max_buffsize_bytes
    channels = max(2, min(domains.MAX_CHANNELS, math.ceil(bdp / cap)))
    floor = max(DEFAULT_BUFFSIZE_BYTES, NCCL_STEPS * SOCKET_CHUNK_BYTES * sockets)
    buffsize = min(_next_pow2(cap), max(_next_pow2(floor), _next_pow2(bdp / channels)))
    emit(
        "NCCL_BUFFSIZE",
        buffsize,
        f"{where}; {channels} channels x {buffsize // 2**20} MiB "
        f"in flight cover it (power of two, >= 8 steps x {sockets} sockets x 64 KiB)",
    )
    reason = f"{channels} channels so that channels x NCCL_BUFFSIZE >= the BDP"
    if nccl_version >= (2, 17, 1):
        emit("NCCL_MIN_CTAS", channels, reason + " (NCCL_MIN_CTAS replaces MIN_NCHANNELS in 2.17+)")
    elif nccl_version >= (2, 5, 6):
        emit("NCCL_MIN_NCHANNELS", channels, reason)
    else:
        warnings.append(f"NCCL {_fmt(nccl_version)}: channel count not set (NCCL_MIN_NRINGS era)")
    if channels * buffsize < bdp:
        warnings.append(
            f"{where} exceeds {channels} x {buffsize // 2**20} MiB: the link stays underfilled"
        )
    return channels


def _algorithm(
    fabric: Fabric, options: TuneOptions, nccl_version: NcclVersion, emit: Emit, warnings: list[str]
) -> None:
    if options.tuner_csv:
        warnings.append("NCCL_ALGO not forced: the tuner plugin CSV chooses per message size")
        return
    times = predict(fabric, options.bucket_bytes)
    algo = min(("ring", "tree"), key=lambda a: times[a])
    other = "tree" if algo == "ring" else "ring"
    size = f"{options.bucket_bytes / 2**20:g} MiB"
    if nccl_version >= domains.PER_COLLECTIVE_ALGO_SINCE:
        emit(
            "NCCL_ALGO",
            f"allreduce:{algo}",
            f"model at DDP's {size} buckets: {algo} "
            f"{times[algo]:.3g}s vs {other} {times[other]:.3g}s (NCCL cannot see link latency)",
        )
    else:
        warnings.append(
            f"NCCL {_fmt(nccl_version)} has no per-collective NCCL_ALGO (2.24+): {algo} is "
            f"predicted best for all-reduce but forcing it would force every collective"
        )


def _retries(
    links: Sequence[LinkFigures],
    nccl_version: NcclVersion,
    torch_version: NcclVersion,
    emit: Emit,
    warnings: list[str],
) -> tuple[float, float]:
    outage_s = max((o for link in links for o in link.outages_s), default=0.0)
    default_s = _window_s(DEFAULT_RETRY_CNT, DEFAULT_RETRY_SLEEP_MSEC)
    target_s = max(default_s, 2 * outage_s)
    count = DEFAULT_RETRY_CNT
    while _window_s(count, DEFAULT_RETRY_SLEEP_MSEC) < target_s:
        count += 1
    window_s = _window_s(count, DEFAULT_RETRY_SLEEP_MSEC)
    if domains.reads("NCCL_SOCKET_RETRY_CNT", nccl_version, torch_version):
        reason = (
            f"longest outage seen {outage_s:g}s: {count} connect retries sleeping "
            f"1..{count} x 100 ms wait {window_s:.0f}s in all (>= 2 x outage, default 60s)"
        )
        emit("NCCL_SOCKET_RETRY_CNT", count, reason)
        emit("NCCL_SOCKET_RETRY_SLEEP_MSEC", DEFAULT_RETRY_SLEEP_MSEC, "retry i sleeps i x this")
        return window_s, outage_s
    if outage_s > 20:
        warnings.append(
            f"outages of {outage_s:g}s seen but NCCL {_fmt(nccl_version)} retries "
            "connects for a fixed ~20 s (NCCL_SOCKET_RETRY_CNT arrived in 2.24)"
        )
    return 20.0, outage_s


def _note_two_level(advice: Advice, times: dict[str, float], bucket_bytes: int) -> Advice:
    note = (
        f"two-level all-reduce (region-local, then cross-region) is predicted at "
        f"{times['two-level']:.3g}s vs ring {times['ring']:.3g}s for {bucket_bytes / 2**20:g} MiB; "
        f"NCCL has no region-aware socket all-reduce: netopt's DDP hook does it per bucket, "
        f"crossing the border once per region (apply_comm_hook(model, "
        f"'hierarchical_allreduce_hook', regions=...)), or use hierarchical process groups (HSDP)"
    )
    return replace(advice, notes=(*advice.notes, note))


def tuner_rows(
    fabric: Fabric, options: TuneOptions, n_nodes: int, channels: int
) -> tuple[TunerRow, ...]:
    """Rows for the example tuner plugin: the best of ring/tree per message-size range.

    Ranges end at each size of ``options.message_sizes_bytes`` (the last runs to
    4294967295); neighbouring ranges with the same algorithm are merged. The
    protocol column is required by the CSV; ``simple`` is the one NCCL uses for
    large transfers over the network.
    """
    sizes = sorted(options.message_sizes_bytes)
    rows: list[TunerRow] = []
    low = 0
    for i, size in enumerate(sizes):
        high = CSV_MAX_BYTES if i == len(sizes) - 1 else size
        times = predict(fabric, size)
        algo = min(("ring", "tree"), key=lambda a: times[a])
        if rows and rows[-1].algorithm == algo:
            rows[-1] = TunerRow(
                "allreduce", rows[-1].min_bytes, high, algo, "simple", channels, n_nodes, -1
            )
        else:
            rows.append(TunerRow("allreduce", low, high, algo, "simple", channels, n_nodes, -1))
        low = high + 1
    return tuple(rows)

"""A sync finds the measured link to the server's node through the coordinator.

A live coordinator knows hk-1 (127.0.0.1) and us-1 (127.0.0.2) and a measured link
between them; a sync from a server listening on 127.0.0.2 plans with that link's
rate and loss, named in ``link_figures``, without a flag naming either node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from coordinator_helpers import TOKEN, call, coordinator_process, registration, summary
from dataplane_helpers import CHUNK_BYTES, CPU, make_dataset

from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.server import ServeSettings, create_app, load_dataset, start_server
from netopt.transfer.linklookup import CoordinatorRef, node_for_address
from netopt.wire.answers import NodesAnswer


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with coordinator_process(tmp_path_factory.mktemp("coordinator")) as url:
        now = time.time()
        call(url + "/api/v1/agents/register", "POST", registration("hk-1", "hk", "127.0.0.1"))
        call(url + "/api/v1/agents/register", "POST", registration("us-1", "us", "127.0.0.2"))
        probes = summary("hk-1", "us-1", now - 5, rtt_ms=80.0, loss_ratio=0.01)
        bulk = {
            "src": "hk-1", "dst": "us-1", "taken_at_s": now - 2, "window_s": 5.0,
            "method": "bulk-tcp", "single_stream_bps": 60e6, "aggregate_bps": 85e6,
            "streams": 8, "congestion_control": "bbr",
        }  # fmt: skip
        call(url + "/api/v1/agents/hk-1/summaries", "POST",
             {"batch_id": "b1", "summaries": [probes, bulk]})  # fmt: skip
        yield url


def test_node_for_address_matches_hosts_and_nic_addresses() -> None:
    nodes = NodesAnswer.from_dict({"nodes": [
        {"node": "a", "region": "x", "state": "live", "host": "10.0.0.1",
         "nics": [{"name": "eth0", "addresses": ["192.168.1.5/24"]}]},
        {"node": "b", "region": "x", "state": "live", "host": "10.0.0.2"},
        {"node": "c", "region": "x", "state": "left"},
    ]}).nodes  # fmt: skip
    assert node_for_address(nodes, ["192.168.1.5"]) == "a"
    assert node_for_address(nodes, ["10.0.0.2"]) == "b"
    assert node_for_address(nodes, ["10.0.0.9", "not an address"]) is None
    assert node_for_address(nodes, ["10.0.0.1", "10.0.0.2"]) is None  # ambiguous


async def test_the_sync_plans_with_the_coordinators_link(tmp_path: Path, coordinator: str) -> None:
    make_dataset(tmp_path / "src")
    dataset = load_dataset(tmp_path / "src", "ds", CHUNK_BYTES)
    app = create_app(ServeSettings(token=None, worker_threads=2), {"ds": dataset}, CPU)
    runner, port = await start_server(app, "127.0.0.2", 0)
    try:
        report = await run_sync(
            SyncRequest(
                source=f"netopt://127.0.0.2:{port}/ds",
                dest=str(tmp_path / "dst"),
                cache_dir=str(tmp_path / "cache"),
                source_options=SourceOptions(
                    client_cpu=CPU, coordinator=CoordinatorRef(coordinator, TOKEN)
                ),
            )
        )
    finally:
        await runner.cleanup()
    figures = report.to_dict()["link_figures"]
    assert isinstance(figures, dict)
    assert "hk-1 -> us-1" in figures["rate_bps"]["source"], figures
    assert figures["rate_bps"]["value"] == pytest.approx(85e6 / 0.95, rel=1e-3)
    assert figures["loss_ratio"] == {"value": 0.01, "source": figures["rate_bps"]["source"]}
    assert figures["rtt_ms"]["value"] < 10  # this connection's own round trips: loopback

"""POST /api/v1/placements: the coordinator refuses placements the catalogue's residency forbids."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from coordinator_helpers import AUTH, make_settings, registration

from netopt.coordinator.app import create_app
from netopt.errors import ConfigError, ResidencyError
from netopt.wire.client import CoordinatorClient, CoordinatorRejected

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Awaitable[Client]]

CATALOGUE = """\
kind: datasets
datasets:
  - name: patient-scans
    origin: /mnt/secure/scans
    residency: [hk]
  - name: imagenet-1k
    origin: https://data.example.internal/imagenet-1k/
"""


@pytest.fixture
async def client(aiohttp_client: MakeClient, tmp_path: Path) -> Client:
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(CATALOGUE)
    app = create_app(make_settings(tmp_path, datasets_file=str(datasets)))
    client = await aiohttp_client(app)
    for node, region in (("hk-1", "hk"), ("us-1", "us")):
        response = await client.post(
            "/api/v1/agents/register", json=registration(node, region), headers=AUTH
        )
        assert response.status == 200
    return client


async def place(client: Client, body: object, status: int, auth: bool = True) -> Any:
    response = await client.post("/api/v1/placements", json=body, headers=AUTH if auth else {})
    data = await response.json()
    assert response.status == status, data
    return data


async def test_allowed_refused_naming_the_rule_and_unknown_dataset(client: Client) -> None:
    ok = await place(client, {"dataset": "patient-scans", "node": "hk-1"}, 200)
    assert ok["allowed"] is True
    assert ok["region"] == "hk"
    assert ok["residency"] == ["hk"]
    refused = await place(client, {"dataset": "patient-scans", "node": "us-1"}, 403)
    assert refused["error"] == "ResidencyError"
    assert "residency: [hk]" in refused["message"]
    assert "'us'" in refused["message"]
    assert (await place(client, {"dataset": "patient-scans", "region": "eu"}, 403))[
        "error"
    ] == "ResidencyError"
    free = await place(client, {"dataset": "imagenet-1k", "node": "us-1"}, 200)
    assert free == {
        "allowed": True, "dataset": "imagenet-1k", "region": "us", "node": "us-1",
        "residency": None,
    }  # fmt: skip
    unknown = await place(client, {"dataset": "not-catalogued", "region": "us"}, 200)
    assert unknown["allowed"] is True
    assert "not in the catalogue" in unknown["note"]


async def test_unknown_node_bad_body_and_no_token(client: Client) -> None:
    missing = await place(client, {"dataset": "patient-scans", "node": "eu-9"}, 404)
    assert "eu-9" in missing["message"]
    for body in (
        {"node": "hk-1"},
        {"dataset": "patient-scans"},
        {"dataset": "patient-scans", "node": "hk-1", "region": "hk"},
        {"dataset": "../etc", "node": "hk-1"},
        {"dataset": "patient-scans", "node": "hk-1", "extra": 1},
        ["patient-scans"],
    ):
        assert (await place(client, body, 400))["error"] == "RequestInvalid"
    denied = await place(client, {"dataset": "patient-scans", "node": "hk-1"}, 401, auth=False)
    assert denied["error"] == "AuthenticationError"
    doc = await (await client.get("/openapi.json")).json()
    assert "403" in doc["paths"]["/api/v1/placements"]["post"]["responses"]


def test_bad_catalogue_stops_the_coordinator_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "datasets.yaml"
    bad.write_text("kind: datasets\ndatasets:\n  - name: x\n    origin: ftp://x\n")
    with pytest.raises(ConfigError, match=r"datasets\.yaml"):
        create_app(make_settings(tmp_path, datasets_file=str(bad)))
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        create_app(make_settings(tmp_path, datasets_file=str(tmp_path / "missing.yaml")))


async def test_client_check_placement_raises_residency_error(client: Client) -> None:
    base = str(client.make_url("")).rstrip("/")
    async with CoordinatorClient(base, AUTH["Authorization"].split()[1]) as api:
        assert (await api.check_placement("patient-scans", "hk-1"))["allowed"] is True
        with pytest.raises(ResidencyError, match=r"residency: \[hk\]"):
            await api.check_placement("patient-scans", "us-1")
        with pytest.raises(CoordinatorRejected) as missing:
            await api.check_placement("patient-scans", "eu-9")
        assert missing.value.status == 404

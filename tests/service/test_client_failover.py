"""The coordinator client with several addresses: a 5xx or no answer moves it on (with
backoff and jitter), it stays with the one that answered, and fails only when all fail."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from netopt.config import parse_settings
from netopt.errors import ConfigError, PeerUnreachableError
from netopt.wire.client import FAILOVER_CAP_S, CoordinatorClient, failover_delay_s, split_urls


async def _server(status: int, seen: list[str], name: str) -> TestServer:
    async def answer(request: web.Request) -> web.Response:
        seen.append(name)
        return web.json_response({"from": name, "message": "down"}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def test_a_5xx_or_a_dead_address_moves_the_client_on() -> None:
    seen: list[str] = []
    sick = await _server(503, seen, "sick")
    well = await _server(200, seen, "well")
    dead = await _server(200, seen, "dead")
    dead_url = str(dead.make_url("")).rstrip("/")
    await dead.close()  # nothing listens there any more
    try:
        urls = [dead_url, str(sick.make_url("")), str(well.make_url(""))]
        async with CoordinatorClient(urls, "t" * 20, timeout_s=5) as client:
            answer: Any = await client.request("GET", "/api/v1/nodes")
            assert answer["from"] == "well"
            assert client.base_url == urls[2].rstrip("/")
            await client.request("GET", "/api/v1/nodes")  # stays with the one that answered
        assert seen == ["sick", "well", "well"]
        async with CoordinatorClient(f"{dead_url}, {sick.make_url('')}", "t" * 20) as client:
            with pytest.raises(PeerUnreachableError, match="answered 503"):
                await client.request("GET", "/api/v1/nodes")
    finally:
        await sick.close()
        await well.close()


def test_backoff_grows_is_capped_and_jittered() -> None:
    assert failover_delay_s(1, 0.5) == pytest.approx(0.05)
    assert failover_delay_s(2, 0.0) == pytest.approx(0.05)
    assert failover_delay_s(3, 0.999) < failover_delay_s(4, 0.999)
    assert failover_delay_s(40, 0.999) <= FAILOVER_CAP_S * 1.5
    assert split_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="no coordinator"):
        split_urls(" , ")


def test_agent_config_takes_several_coordinator_urls() -> None:
    text = "kind: agent\nnode: n1\nregion: r\ncoordinator_url: {}\n"
    ok = parse_settings(text.format("http://a:7460,http://b:7460"), "a.yaml")
    assert split_urls(ok.coordinator_url) == ("http://a:7460", "http://b:7460")
    with pytest.raises(ConfigError, match="coordinator_url"):
        parse_settings(text.format("http://a:7460,ftp://b"), "a.yaml")


def test_agent_config_takes_coordinator_urls_as_a_yaml_list() -> None:
    text = "kind: agent\nnode: n1\nregion: r\ncoordinator_url: {}\n"
    ok = parse_settings(text.format("[http://a:7460, 'https://b:7460']"), "a.yaml")
    assert ok.coordinator_url == "http://a:7460,https://b:7460"
    assert split_urls(ok.coordinator_url) == ("http://a:7460", "https://b:7460")
    block = parse_settings(text.format("\n  - http://a:7460\n  - http://b:7460"), "a.yaml")
    assert block.coordinator_url == ok.coordinator_url.replace("https", "http")
    for bad, where in (("[http://a:7460, 5]", r"coordinator_url\[1\]"),
                       ("[http://a:7460, 'http://b,http://c']", r"coordinator_url\[1\]"),
                       ("[]", "coordinator_url"), ("{a: 1}", "coordinator_url"),
                       ("[http://a:7460, ftp://b]", "coordinator_url")):  # fmt: skip
        with pytest.raises(ConfigError, match=where) as caught:
            parse_settings(text.format(bad), "a.yaml")
        message = str(caught.value)
        assert "a.yaml" in message
        assert "URL" in message

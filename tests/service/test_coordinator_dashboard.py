"""The dashboard in headless Chromium (Debian's ``chromium``) against a seeded coordinator."""

from __future__ import annotations

import asyncio
import re
import shutil
import struct
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from coordinator_helpers import AUTH, TOKEN, batch, make_settings, registration, summary

from netopt.coordinator.app import create_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)
Client = TestClient[web.Request, web.Application]


def chromium_args(profile: Path) -> list[str]:
    assert CHROMIUM is not None
    return [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        "--window-size=1200,900", "--virtual-time-budget=5000",
    ]  # fmt: skip


async def run_chromium(args: list[str]) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


def png_colours(data: bytes, step: int = 3) -> tuple[int, int, int]:
    """(width, height, distinct colours in every ``step``-th row) of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8, depth
    assert colour_type in (2, 6), colour_type
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    previous = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = row[i - bpp] if i >= bpp else 0
            up = previous[i]
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                corner = previous[i - bpp] if i >= bpp else 0
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                row[i] = (row[i] + pred) & 0xFF
        if y % step == 0:
            colours.update(bytes(row[i : i + 3]) for i in range(0, stride, bpp))
        previous = row
    return width, height, len(colours)


@pytest.fixture
async def seeded(aiohttp_client: Callable[..., Awaitable[Client]], tmp_path: Path) -> Client:
    client = await aiohttp_client(create_app(make_settings(tmp_path)))
    nodes = [("hk-1", "hk"), ("hk-2", "hk"), ("us-1", "us"), ("us-2", "us")]
    for name, region in nodes:
        response = await client.post(
            "/api/v1/agents/register", json=registration(name, region), headers=AUTH
        )
        assert response.status == 200
    rtt = {("hk-1", "hk-2"): 0.8, ("us-1", "us-2"): 1.5, ("hk-1", "us-1"): 160.0,
           ("hk-2", "us-2"): 175.0, ("hk-1", "us-2"): 168.0}  # fmt: skip
    now = time.time()
    for (src, dst), rtt_ms in rtt.items():
        items = [summary(src, dst, now - 10 * k, rtt_ms * (1 + 0.05 * (k % 4)),
                         loss_ratio=0.002 * k, loss_ratio_ci95=[0.0, 0.1])
                 for k in range(12)]  # fmt: skip
        items.append({"src": src, "dst": dst, "taken_at_s": now, "window_s": 5.0,
                      "method": "iperf3", "streams": 8,
                      "aggregate_bps": 9e8 if rtt_ms < 10 else 8e7})  # fmt: skip
        response = await client.post(
            f"/api/v1/agents/{src}/summaries", json=batch(f"{src}-{dst}", items), headers=AUTH
        )
        assert response.status == 200, await response.text()
    return client


async def test_dashboard_renders_nodes_heatmaps_and_history(seeded: Client, tmp_path: Path) -> None:
    url = str(seeded.make_url("/")) + f"#token={TOKEN}"
    dom = (await run_chromium([*chromium_args(tmp_path / "p1"), "--dump-dom", url])).decode()
    (tmp_path / "dom.html").write_text(dom)  # kept for a look when an assertion fails
    assert "4 nodes, 5 links" in dom, dom[-3000:]
    for name in ("hk-1", "hk-2", "us-1", "us-2"):
        assert f"<td>{name}</td>" in dom
    assert dom.count('class="live"') == 4
    backgrounds = set(re.findall(r'style="background: (rgb\([0-9, ]+\))', dom))
    assert len(backgrounds) >= 2, "heatmap cells are coloured by value (near green, far red)"
    assert "<path" in dom, "a link's history chart is drawn"
    assert "Link history hk-1" in dom
    assert TOKEN not in dom.split("<body>", 1)[1], "the token must not end up in the page"

    shot = tmp_path / "dashboard.png"
    await run_chromium([*chromium_args(tmp_path / "p2"), f"--screenshot={shot}", url])
    width, height, colours = png_colours(shot.read_bytes())
    assert (width, height) == (1200, 900)
    # A blank or error page has a handful of colours; the heatmaps, text and chart many.
    assert colours > 64, f"screenshot looks blank: {colours} colours"


async def test_dashboard_without_token_asks_for_it(seeded: Client, tmp_path: Path) -> None:
    url = str(seeded.make_url("/"))
    dom = (await run_chromium([*chromium_args(tmp_path / "p3"), "--dump-dom", url])).decode()
    assert "enter the token" in dom
    assert "<td>hk-1</td>" not in dom

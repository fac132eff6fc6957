"""A bucket's listing pages are read within a bound (`netopt.cache.s3bounded`): real
S3-shaped servers on loopback, one answering with an endless page, one behind TLS with a
private CA that botocore's configuration names."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from netopt.cache.s3 import S3Options
from netopt.cache.s3bounded import MAX_LISTING_PAGE_BYTES
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import run_sync
from netopt.errors import ProtocolError, TlsError
from tests.service.cache_helpers import CHUNK_BYTES, fake_aws_env, request, tree
from tests.service.tls_helpers import make_pki

pytest.importorskip("aiobotocore", reason="the s3 extra (aiobotocore) is not installed")

ENDLESS_BYTES = 8 * MAX_LISTING_PAGE_BYTES
"""What the lying server would send, were it read to the end."""

_HEAD = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>bkt</Name><Prefix>ds/</Prefix><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
)
_TAIL = b"</ListBucketResult>"
_OBJECT = b"0123456789 an object's bytes\n" * 100


def _contents(key: str, size: int) -> bytes:
    return (
        f"<Contents><Key>{key}</Key><LastModified>2026-01-02T03:04:05.000Z</LastModified>"
        f'<ETag>"e1"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>'
    ).encode()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_aws_env(monkeypatch, tmp_path)


@asynccontextmanager
async def _bucket(
    endless: bool, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """An S3-shaped server on 127.0.0.1: bucket ``bkt`` listing ``ds/a.bin`` (or, with
    ``endless``, a page that goes on for `ENDLESS_BYTES`); its URL and what it counted."""
    seen = {"listings": 0, "listing_bytes_sent": 0, "objects": 0}

    async def handle(req: web.Request) -> web.StreamResponse:
        if req.path.rstrip("/") == "/bkt" and req.query.get("list-type") == "2":
            seen["listings"] += 1
            resp = web.StreamResponse(headers={"Content-Type": "application/xml"})
            await resp.prepare(req)
            if not endless:
                await resp.write(_HEAD + _contents("ds/a.bin", len(_OBJECT)) + _TAIL)
                seen["listing_bytes_sent"] += len(_HEAD) + len(_TAIL)
                return resp
            await resp.write(_HEAD)
            page = b"".join(_contents(f"ds/f{i:07d}", 1) for i in range(500))
            try:
                while seen["listing_bytes_sent"] < ENDLESS_BYTES:
                    await resp.write(page)
                    seen["listing_bytes_sent"] += len(page)
            except (ConnectionError, RuntimeError):
                pass  # the client went away
            return resp
        if req.path == "/bkt/ds/a.bin":
            seen["objects"] += 1
            return web.Response(body=_OBJECT, headers={"ETag": '"e1"'})
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if ssl_context is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _options(endpoint: str) -> SourceOptions:
    s3 = S3Options(endpoint_url=endpoint, region="us-east-1", max_attempts=1)
    return SourceOptions(avg_chunk_bytes=CHUNK_BYTES, s3=s3)


async def test_an_endless_listing_page_is_refused_unread(tmp_path: Path) -> None:
    async with _bucket(endless=True) as (endpoint, seen):
        req = request("s3://bkt/ds", tmp_path / "dest", tmp_path / "cache",
                      source_options=_options(endpoint))  # fmt: skip
        with pytest.raises(ProtocolError, match=f"more than {MAX_LISTING_PAGE_BYTES} bytes"):
            await run_sync(req)
    assert seen["listings"] >= 1
    # The client stopped reading at the bound: the rest was never sent (socket buffers
    # took a few MB past it).
    assert seen["listing_bytes_sent"] < ENDLESS_BYTES // 2
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").iterdir())


async def test_a_bucket_behind_a_private_ca_lists_through_the_configured_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path / "pki")
    node = pki.issue("s3")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(node.cert, node.key)
    async with _bucket(endless=False, ssl_context=server_ctx) as (endpoint, seen):
        # Without the bundle: the certificate is refused, at once (not tried again for the
        # retry window: the same trust cannot succeed).
        req = request("s3://bkt/ds", tmp_path / "dest0", tmp_path / "cache0",
                      source_options=_options(endpoint))  # fmt: skip
        started_s = time.monotonic()
        with pytest.raises(TlsError, match="AWS_CA_BUNDLE"):
            await run_sync(req)
        assert time.monotonic() - started_s < 10
        assert seen["listings"] == 0
        monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
        req = request("s3://bkt/ds", tmp_path / "dest", tmp_path / "cache",
                      source_options=_options(endpoint))  # fmt: skip
        await run_sync(req)
    assert seen["listings"] == 1
    assert seen["objects"] == 1
    assert tree(tmp_path / "dest") == {"a.bin": _OBJECT}

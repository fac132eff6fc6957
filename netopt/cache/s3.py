"""An S3-compatible bucket prefix as a sync SOURCE: ``s3://BUCKET[/PREFIX]``.

Objects are listed with ListObjectsV2 (at most `MAX_FILES`; each page read within a
bound, `netopt.cache.s3bounded`), each key below the prefix becoming a relative path
(refused when it would escape DEST). Like a web
directory (`netopt.cache.httpdir`), a bucket has no manifest: an object is
downloaded once and chunked here, and its chunking is remembered with its size,
ETag and LastModified, so a re-sync downloads only changed objects and reads
the chunks it lacks with ranged GETs pinned to the listed ETag (If-Match).

The client is aiobotocore (the ``s3`` extra). Credentials come from botocore's
usual chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, a
named profile, or instance metadata; they never appear in messages. Every
request is bounded by the client's connect and read timeouts and a few retries.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from netopt.cache.remotefiles import (
    CONNECTIONS_AT_ONCE,
    MAX_FILES,
    BuiltEntries,
    RemoteDataset,
    RemoteFile,
    SpooledChunkSource,
    build_entries,
    file_mtime_ns,
    load_state,
    save_state,
)
from netopt.cache.s3bounded import BoundedListing
from netopt.cache.s3url import S3Options, S3Url, parse_s3_url
from netopt.cache.spool import content_range_start, open_spool
from netopt.dataplane import trace
from netopt.dataplane.chunkio import RawChunk
from netopt.dataplane.httpsource import ClientOptions
from netopt.dataplane.limits import read_up_to
from netopt.errors import (
    AuthenticationError,
    DependencyError,
    NetoptError,
    NetworkError,
    PathTraversalError,
    PeerUnreachableError,
    ProtocolError,
    StorageError,
    TlsError,
    ValidationError,
)
from netopt.transfer.manifest import Manifest, validate_rel_path

__all__ = [
    "S3Options",
    "S3Url",
    "object_rel_path",
    "open_s3",
    "parse_s3_url",
    "remote_from_listing",
    "s3_error",
]

_STATE_FILE = "s3.json"
_READ_PIECE_BYTES = 1 << 20
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "403",
    }
)


def object_rel_path(url: S3Url, key: str) -> str:
    """The relative path of object ``key`` under ``url``'s prefix.

    Raises PathTraversalError (naming the object) for keys that would escape
    DEST: ``..`` or empty components, absolute, NUL or control characters.
    """
    rel = key[len(url.prefix) :] if key.startswith(url.prefix) else key
    try:
        return validate_rel_path(rel)
    except PathTraversalError as exc:
        raise PathTraversalError(f"{url}: object key {key!r} refused: {exc}") from None


def remote_from_listing(url: S3Url, state_scope: str, obj: dict[str, Any]) -> RemoteFile | None:
    """A ListObjectsV2 ``Contents`` item as a RemoteFile; None for a ``dir/`` marker object.

    ``state_scope`` (the endpoint) keeps equal bucket names on different
    services apart in the state file. Raises PathTraversalError for unsafe keys.
    """
    key = str(obj["Key"])
    size_bytes = int(obj.get("Size", 0))
    if key.endswith("/") and size_bytes == 0:
        return None
    rel = object_rel_path(url, key)
    modified = obj.get("LastModified")
    stamp = modified.isoformat() if modified is not None else ""
    validator = f"{size_bytes}|{obj.get('ETag', '')}|{stamp}"
    mtime_ns = file_mtime_ns(int(modified.timestamp()) if modified is not None else None, validator)
    return RemoteFile(
        f"{state_scope}|s3://{url.bucket}/{key}", rel, size_bytes, validator, mtime_ns, True
    )


def _object_key(remote: RemoteFile) -> str:
    return remote.key.split("|", 1)[1].split("/", 3)[3]


def _etag(remote: RemoteFile) -> str:
    return remote.validator.split("|")[1]


def s3_error(exc: Exception, url: S3Url, endpoint: str) -> NetoptError:
    """A netopt error for a botocore/aiobotocore exception met while reading ``url``.

    NoSuchBucket -> ValidationError; AccessDenied, bad keys, missing credentials
    -> AuthenticationError; a certificate refused -> TlsError (not tried again);
    connection failures -> PeerUnreachableError; the
    rest -> NetworkError. Messages name the bucket, prefix and endpoint, never
    credentials.
    """
    from botocore import exceptions as bx

    where = f"{url} at {endpoint}"
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "?"))
        if code == "NoSuchBucket":
            return ValidationError(f"{where}: bucket {url.bucket!r} does not exist")
        if code in _AUTH_CODES:
            return AuthenticationError(f"{where}: access refused ({code}); check the credentials")
        if code in ("NoSuchKey", "404", "PreconditionFailed", "412"):
            return NetworkError(f"{where}: an object changed during the sync ({code}); re-run")
        return NetworkError(f"{where}: {code}: {error.get('Message', '')}")
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return AuthenticationError(
            f"{where}: no usable credentials (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or --s3-profile)"
        )
    if isinstance(exc, bx.ProfileNotFound):
        return ValidationError(f"{where}: {exc}")
    if isinstance(exc, bx.ParamValidationError):
        return ValidationError(f"{where}: {exc}")
    if isinstance(exc, bx.SSLError):
        # Final, as for any origin: trying again with the same trust cannot succeed.
        return TlsError(
            f"{where}: TLS refused ({exc}); behind a private CA, set AWS_CA_BUNDLE=ca.pem"
        )
    if isinstance(exc, bx.ConnectionError):
        return PeerUnreachableError(f"{where} is unreachable: {type(exc).__name__}")
    if isinstance(exc, bx.ReadTimeoutError | TimeoutError):
        return NetworkError(f"{where}: read timed out")
    if isinstance(exc, bx.BotoCoreError | aiohttp.ClientError):
        # An object's body is read by aiohttp itself: a cut mid-object arrives as
        # aiohttp's error (ClientPayloadError), a failure to reach, not an answer.
        return NetworkError(f"{where}: {type(exc).__name__}: {exc}")
    return ProtocolError(f"{where}: {type(exc).__name__}: {exc}")


def _boto_errors() -> tuple[type[Exception], ...]:
    from botocore import exceptions as bx

    return (bx.BotoCoreError, bx.ClientError, TimeoutError, aiohttp.ClientError)


class S3ChunkSource(SpooledChunkSource):
    """`ChunkSource` over S3 objects: spooled downloads first, else ranged GETs (If-Match)."""

    def __init__(
        self,
        client: Any,
        url: S3Url,
        endpoint: str,
        manifest: Manifest,
        built: BuiltEntries,
        release: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(manifest, built, self._read_range, release)
        self.client = client
        self.url = url
        self.endpoint = endpoint

    async def _read_range(self, remote: RemoteFile, offset: int, length: int) -> RawChunk:
        key = _object_key(remote)
        end = offset + length - 1
        try:
            resp = await self.client.get_object(
                Bucket=self.url.bucket,
                Key=key,
                Range=f"bytes={offset}-{end}",
                IfMatch=_etag(remote),
            )
            stream = resp["Body"]
            async with stream:  # read from the body itself (see `open_s3`'s download)
                # A service without range support sends the whole object: only what ends
                # at the range is read (and counted), so no answer is held past it.
                body = await read_up_to(stream.read, offset + length)
        except _boto_errors() as exc:
            raise s3_error(exc, self.url, self.endpoint) from exc
        data = body[offset : offset + length] if len(body) > length else body
        return RawChunk(data, "identity", len(body))


async def _list(client: Any, url: S3Url, scope: str) -> list[RemoteFile]:
    remotes: list[RemoteFile] = []
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=url.bucket, Prefix=url.prefix):
        for obj in page.get("Contents", []):
            remote = remote_from_listing(url, scope, obj)
            if remote is not None:
                remotes.append(remote)
        if len(remotes) > MAX_FILES:
            raise ProtocolError(f"{url}: more than {MAX_FILES} objects")
    return sorted(remotes, key=lambda r: r.path)


def _client_args(s3: S3Options, client: ClientOptions) -> dict[str, Any]:
    from aiobotocore.config import AioConfig

    config = AioConfig(
        connect_timeout=client.connect_timeout_s,
        read_timeout=client.read_timeout_s,
        retries={"max_attempts": s3.max_attempts, "mode": "standard"},
        # Objects and parts of large ones downloaded at once (the pool's default is 10).
        max_pool_connections=CONNECTIONS_AT_ONCE,
    )
    return {"endpoint_url": s3.endpoint_url, "region_name": s3.region, "config": config}


@asynccontextmanager
async def open_s3(
    url: S3Url,
    name: str,
    client: ClientOptions,
    s3: S3Options,
    avg_chunk_bytes: int,
    state_dir: str | None,
) -> AsyncIterator[RemoteDataset]:
    """Open the objects under ``url`` as dataset ``name``: listed, downloaded where their
    chunking is not remembered in ``state_dir``, chunked (the ``s3`` kind of
    `netopt.cache.sources` wraps it).

    Raises ValidationError (no such bucket, unknown profile, a bad endpoint URL),
    PathTraversalError (an unsafe key), AuthenticationError, PeerUnreachableError,
    NetworkError / ProtocolError, DependencyError without aiobotocore, and
    StorageError when downloads cannot be spooled.
    """
    try:
        from aiobotocore.session import AioSession
    except ImportError as exc:
        raise DependencyError("s3:// sources need aiobotocore: pip install 'netopt[s3]'") from exc
    endpoint = s3.endpoint_url or "the default AWS endpoint"
    scope = s3.endpoint_url or "aws"
    state_path = Path(state_dir) / _STATE_FILE if state_dir else None
    try:
        known = await load_state(state_path)
        async with open_spool(state_dir, "s3", f"{scope}/{url.bucket}/{url.prefix}") as spool:
            try:
                session = AioSession(profile=s3.profile)
                client_cm = session.create_client("s3", **_client_args(s3, client))
                ca_bundle = session.get_config_variable("ca_bundle")
            except ValueError as exc:  # a malformed endpoint URL
                raise ValidationError(f"--s3-endpoint-url {s3.endpoint_url!r}: {exc}") from exc
            except _boto_errors() as exc:
                raise s3_error(exc, url, endpoint) from exc
            try:
                s3_client = await client_cm.__aenter__()
            except _boto_errors() as exc:
                raise s3_error(exc, url, endpoint) from exc
            try:

                @asynccontextmanager
                async def get_from(
                    remote: RemoteFile, offset: int, end: int | None
                ) -> AsyncIterator[tuple[int, AsyncIterable[bytes]]]:
                    """`netopt.cache.spool.FetchFrom`: the object from ``offset`` (to
                    ``end``), only as listed (``IfMatch``: a changed object fails, and
                    is listed again)."""
                    last = "" if end is None else str(end - 1)
                    ranged = {"Range": f"bytes={offset}-{last}"} if offset or last else {}
                    resp = await s3_client.get_object(
                        Bucket=url.bucket, Key=_object_key(remote), IfMatch=_etag(remote),
                        **ranged,
                    )  # fmt: skip
                    start = content_range_start(resp.get("ContentRange")) if ranged else 0
                    body = resp["Body"]
                    # The body itself reads: what ``async with`` returns differs between
                    # aiobotocore releases (the raw aiohttp response before 3.x).
                    async with body:
                        yield start, body.iter_chunks(_READ_PIECE_BYTES)

                async def download(remote: RemoteFile) -> tuple[Path, int]:
                    return await spool.download(remote, get_from)

                try:
                    async with BoundedListing(client, ca_bundle) as listing:
                        listing.attach(s3_client)
                        remotes = await _list(s3_client, url, scope)
                        trace.mark("s3_listed")
                    built = await build_entries(remotes, known, avg_chunk_bytes, download)
                except _boto_errors() as exc:
                    raise s3_error(exc, url, endpoint) from exc
                manifest = Manifest(name, tuple(built.entries), avg_chunk_bytes)
                source = S3ChunkSource(s3_client, url, endpoint, manifest, built, spool.release)
                await save_state(state_path, known)
                yield RemoteDataset(manifest, source, built.wire_bytes)
            finally:
                await client_cm.__aexit__(None, None, None)
    except OSError as exc:
        raise StorageError(f"cannot spool downloads of {url}: {exc}") from exc

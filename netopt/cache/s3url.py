"""An ``s3://BUCKET[/PREFIX]`` SOURCE parsed, and how to reach its service: the light half
of `netopt.cache.s3`, imported by every sync (`netopt.cache.sources`) while the engine
(aiobotocore, the remote-file machinery) is imported only by a sync that opens a bucket."""

from __future__ import annotations

import re
from dataclasses import dataclass

from netopt.errors import ValidationError

__all__ = ["S3Options", "S3Url", "parse_s3_url"]

_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,254}")


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible service; None means botocore's default (env, profile)."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    max_attempts: int = 3


@dataclass(frozen=True)
class S3Url:
    """A parsed ``s3://`` SOURCE; ``prefix`` is empty or ends with ``/``."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_url(spec: str) -> S3Url:
    """``s3://BUCKET[/PREFIX]`` -> S3Url; ValidationError for a malformed URL or bucket name."""
    if not spec.startswith("s3://"):
        raise ValidationError(f"SOURCE {spec!r} is not an s3:// URL")
    bucket, _, prefix = spec[len("s3://") :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValidationError(f"SOURCE {spec!r}: {bucket!r} is not a valid bucket name")
    if any(ch in prefix for ch in "?#") or any(ord(ch) < 32 for ch in prefix):
        raise ValidationError(f"SOURCE {spec!r}: the prefix has a query, fragment or control char")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return S3Url(bucket, prefix)

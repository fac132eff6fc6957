"""Remote files (S3, web directories) get an mtime that tells versions apart within a
second: DEST's (size, mtime) quick check must not skip a same-size object overwritten in
the second its previous version was stored (S3's LastModified has whole seconds)."""

from __future__ import annotations

import datetime as dt

from netopt.cache.remotefiles import file_mtime_ns
from netopt.cache.s3 import remote_from_listing
from netopt.cache.s3url import S3Url

URL = S3Url("data", "ds/")
AT = dt.datetime(2026, 12, 1, 10, 0, 7, 250_000, tzinfo=dt.UTC)


def _listed(etag: str, modified: dt.datetime | None = AT, size: int = 40_000) -> int:
    obj = {"Key": "ds/shards/s007.bin", "Size": size, "ETag": etag}
    if modified is not None:
        obj["LastModified"] = modified
    remote = remote_from_listing(URL, "http://127.0.0.1:9", obj)
    assert remote is not None
    return remote.mtime_ns


def test_two_versions_in_one_second_get_different_mtimes_in_that_second() -> None:
    first, second = _listed('"etag-one"'), _listed('"etag-two"')
    assert first != second
    whole_s = int(AT.timestamp())
    for mtime_ns in (first, second):
        assert whole_s * 10**9 <= mtime_ns < (whole_s + 1) * 10**9


def test_the_same_version_always_gets_the_same_mtime() -> None:
    assert _listed('"etag-one"') == _listed('"etag-one"')
    assert file_mtime_ns(5, "v") == file_mtime_ns(5, "v")


def test_no_timestamp_still_tells_versions_apart_by_validator() -> None:
    assert _listed('"a"', modified=None) != _listed('"b"', modified=None)
    assert 0 <= _listed('"a"', modified=None) < 10**9

"""`parse_source`: every SOURCE string chooses its kind once, with host, port, dataset
name and bucket checked before anything is contacted; hostile strings are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netopt.cache.s3url import S3Url
from netopt.cache.sources import (
    ManifestUrlSource,
    NetoptSource,
    PathSource,
    S3Source,
    WebDirSource,
    parse_source,
)
from netopt.errors import ValidationError


def test_a_directory_is_a_path_source_named_after_its_last_part() -> None:
    source = parse_source("/data/imagenet/")
    assert isinstance(source, PathSource)
    assert (source.kind, source.name, source.text) == ("path", "imagenet", "/data/imagenet/")
    assert source.recut_on_open  # a repair re-cuts it with each dataset's chunk size
    assert parse_source("/").name == "dataset"
    assert parse_source("rel/ds.v1").name == "ds.v1"
    assert parse_source("/data/x", "given").name == "given"


def test_a_netopt_url_is_parsed_into_host_port_and_name() -> None:
    source = parse_source("netopt://198.18.1.2:7470/imagenet")
    assert isinstance(source, NetoptSource)
    assert not isinstance(source, ManifestUrlSource)
    assert (source.kind, source.name) == ("netopt", "imagenet")
    assert (source.url.host, source.url.port, source.url.name) == ("198.18.1.2", 7470, "imagenet")
    assert source.url.scheme is None  # TLS or not: the cluster's setting decides
    assert not source.recut_on_open
    ipv6 = parse_source("netopt://[2001:db8::1]:7470/ds")
    assert isinstance(ipv6, NetoptSource)
    assert ipv6.url.host == "2001:db8::1"
    assert ipv6.url.base.endswith("://[2001:db8::1]:7470")
    assert str(ipv6.url) == "netopt://[2001:db8::1]:7470/ds"
    # --name names the dataset in the cache; the server is still asked for its own.
    renamed = parse_source("netopt://h:7470/ds", "mine")
    assert isinstance(renamed, NetoptSource)
    assert (renamed.name, renamed.url.name) == ("mine", "ds")


@pytest.mark.parametrize(
    "text", ["https://h:7470/v1/datasets/ds", "https://h:7470/v1/datasets/ds/manifest/"]
)
def test_a_manifest_url_is_a_netopt_server_with_its_own_scheme(text: str) -> None:
    source = parse_source(text)
    assert isinstance(source, ManifestUrlSource)
    assert (source.kind, source.name, source.url.scheme) == ("http-manifest", "ds", "https")
    assert source.url.base == "https://h:7470"
    ipv6 = parse_source("http://[::1]:7470/v1/datasets/ds/manifest")
    assert isinstance(ipv6, ManifestUrlSource)
    assert (ipv6.url.host, ipv6.url.base) == ("::1", "http://[::1]:7470")


def test_other_http_urls_are_web_directories() -> None:
    source = parse_source("http://files.example/pub/ds/")
    assert isinstance(source, WebDirSource)
    assert (source.kind, source.name) == ("http-dir", "ds")
    assert isinstance(parse_source("http://[::1]:8000/pub/ds/"), WebDirSource)
    # No port: not the manifest URL of a netopt server, a listing on port 80.
    assert isinstance(parse_source("http://h/v1/datasets/ds"), WebDirSource)


def test_an_s3_url_is_parsed_into_bucket_and_prefix() -> None:
    source = parse_source("s3://bucket-1/train/shards")
    assert isinstance(source, S3Source)
    assert (source.kind, source.name) == ("s3", "shards")
    assert source.bucket == S3Url("bucket-1", "train/shards/")
    bare = parse_source("s3://bucket-1")
    assert isinstance(bare, S3Source)
    assert (bare.name, bare.bucket) == ("bucket-1", S3Url("bucket-1", ""))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("ftp://h/ds", "unknown scheme"),
        ("NETOPT://h:7470/ds", "unknown scheme"),
        ("file:///data/ds", "unknown scheme"),
        ("netopt://h:0/ds", "out of range"),
        ("netopt://h:65536/ds", "out of range"),
        ("netopt://h/ds", "not a dataset URL"),
        ("netopt://h:7470/a/b", "not a dataset URL"),
        ("netopt://h:7470/ds\n", "not allowed"),
        ("netopt://h:7470/..", "not allowed"),
        ("netopt://[::1:7470/ds", "not a dataset URL"),
        ("http://h:99999/v1/datasets/ds", "out of range"),
        # A trailing newline is no manifest URL (a regex's $ would have let it through).
        ("http://h:7470/v1/datasets/ds/manifest\n", "control character"),
        ("http://h:7470/v1/datasets/bad%0Aname", "not allowed"),
        ("http://h:99999/pub/ds/", "out of range"),
        ("http://h:port/pub/ds/", "SOURCE"),
        ("http://h:0/pub/ds/", "port 0"),
        ("http:///pub/ds/", "no host"),
        ("http://[::1/pub/ds/", "SOURCE"),
        ("http://h/pub/ds/\r\nX-Injected: 1", "control character"),
        ("s3://x", "not a valid bucket name"),
        ("s3://bkt\n", "not a valid bucket name"),
        ("s3://bkt/pre?x=1", "query"),
        ("/data/bad\nname", "not allowed"),
        ("/data/ds", "bad name"),
    ],
)
def test_hostile_sources_are_refused_before_any_contact(text: str, says: str) -> None:
    name = "bad name" if text == "/data/ds" else None
    with pytest.raises(ValidationError, match=says):
        parse_source(text, name)


def test_a_path_may_hold_what_its_file_system_allows_when_named() -> None:
    source = parse_source("/data/odd\nname", "ds")
    assert isinstance(source, PathSource)
    assert source.text == "/data/odd\nname"


def test_a_sync_imports_the_web_directory_s3_and_sharing_engines_only_when_used() -> None:
    code = (
        "import sys, netopt.cache.syncer\n"
        "from netopt.cache.sources import parse_source\n"
        "parse_source('s3://bucket/p'); parse_source('http://h/d/')\n"
        "print(sorted(m for m in ('netopt.cache.httpdir', 'netopt.cache.s3', "
        "'netopt.cache.remotefiles', 'netopt.cache.shared', 'netopt.dataplane.served') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"

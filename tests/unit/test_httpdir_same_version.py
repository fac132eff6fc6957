"""`_same_version`: a ranged answer is taken as the listed version only when its
Content-Range total, ETag and Last-Modified agree with the listing, each where both
give it (a server that ignores If-Range answers a changed file from its new version)."""

from __future__ import annotations

import pytest

from netopt.cache.httpdir import _same_version
from netopt.cache.remotefiles import RemoteFile

MODIFIED = "Mon, 30 Nov 2026 10:00:00 GMT"
LISTED = RemoteFile("u", "p", 1000, f'1000|"v1"|{MODIFIED}', 0, True)
RANGE = {"Content-Range": "bytes 10-999/1000"}


@pytest.mark.parametrize(
    ("headers", "same"),
    [
        (RANGE, True),  # nothing more said: the If-Range was honoured or not, unknown
        ({**RANGE, "ETag": '"v1"', "Last-Modified": MODIFIED}, True),
        ({**RANGE, "ETag": '"v2"'}, False),
        ({**RANGE, "Last-Modified": "Tue, 01 Dec 2026 10:00:00 GMT"}, False),
        ({"Content-Range": "bytes 10-1999/2000", "ETag": '"v1"'}, False),  # another size
        ({"Content-Range": "bytes 10-"}, False),  # malformed: asked for whole instead
        ({}, False),
    ],
)
def test_a_range_is_the_listed_version_only_where_nothing_says_otherwise(
    headers: dict[str, str], same: bool
) -> None:
    assert _same_version(LISTED, headers) is same


def test_a_listing_without_an_etag_or_a_date_is_judged_by_what_it_has() -> None:
    no_etag = RemoteFile("u", "p", 1000, f"1000||{MODIFIED}", 0, True)
    assert _same_version(no_etag, {**RANGE, "ETag": '"anything"'})
    assert not _same_version(no_etag, {**RANGE, "Last-Modified": "Tue, 01 Dec 2026 GMT"})

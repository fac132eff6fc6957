"""The spool's journal of listings (`LISTINGS_NAME`): the last line for a key holds, a
torn or foreign line is skipped (that download begins again), a download resumes only
under the listing it began with, and a journal of replaced lines is rewritten."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from netopt.cache.remotefiles import RemoteFile
from netopt.cache.spool import LISTINGS_NAME, Spool

CONTENT = {"a": b"A" * 10, "b": b"B" * 10, "c": b"C" * 10}


def _remote(key: str, validator: str) -> RemoteFile:
    return RemoteFile(key, key, len(CONTENT[key]), validator, 0)


def _line(remote: RemoteFile) -> bytes:
    return json.dumps(dataclasses.asdict(remote)).encode() + b"\n"


class Origin:
    def __init__(self) -> None:
        self.asked: dict[str, int] = {}

    @asynccontextmanager
    async def fetch_from(
        self, remote: RemoteFile, offset: int, end: int | None
    ) -> AsyncIterator[tuple[int, AsyncIterable[bytes]]]:
        self.asked[remote.key] = offset

        async def pieces() -> AsyncIterator[bytes]:
            yield CONTENT[remote.key][offset:end]

        yield offset, pieces()


async def test_a_download_resumes_under_the_last_listing_its_journal_holds(
    tmp_path: Path,
) -> None:
    journal = tmp_path / LISTINGS_NAME
    journal.write_bytes(
        _line(_remote("a", "v1"))
        + _line(_remote("c", "old"))
        + b'["not", "a", "listing"]\n'
        + _line(_remote("c", "v1"))
        + _line(_remote("b", "v1"))[:30]  # torn by a crash
    )
    spool = Spool.load(tmp_path)
    for key in CONTENT:
        spool._path(key).write_bytes(CONTENT[key][:4])
    origin = Origin()
    try:
        for key in CONTENT:
            path, _ = await spool.download(_remote(key, "v1"), origin.fetch_from)
            assert path.read_bytes() == CONTENT[key]
        # "a" and "c" (its last line) resume after their 4 bytes; "b" begins again.
        assert origin.asked == {"a": 4, "b": 0, "c": 4}
        # Another version of "a" begins again, and its listing is the one that holds now.
        await spool.download(_remote("a", "v2"), origin.fetch_from)
        assert origin.asked["a"] == 0
    finally:
        spool.close()
    again = Spool.load(tmp_path)
    try:
        assert again._kept("a") == (_remote("a", "v2"), 10)
        assert again._kept("b") == (_remote("b", "v1"), 10)
    finally:
        again.close()


def test_a_journal_of_replaced_lines_is_rewritten_with_the_last_of_each(
    tmp_path: Path,
) -> None:
    journal = tmp_path / LISTINGS_NAME
    journal.write_bytes(b"".join(_line(_remote("a", f"v{i}")) for i in range(1500)))
    spool = Spool.load(tmp_path)
    spool.close()
    assert journal.read_bytes() == _line(_remote("a", "v1499"))
    assert spool._kept("a") == (_remote("a", "v1499"), 0)

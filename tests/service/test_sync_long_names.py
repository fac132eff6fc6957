"""File names up to NAME_MAX (255 bytes) sync: a temporary name beside such a file would
exceed it (ENAMETOOLONG), so it carries a digest of the name instead; the leftovers of an
interrupted sync of such a file are still recognised and removed."""

from __future__ import annotations

from pathlib import Path

from dataplane_helpers import CPU, FAST, TOKEN, check_tree, start

from netopt.cache.syncer import scan_dest
from netopt.dataplane.assemble import TMP_SUFFIX, tmp_stem
from netopt.dataplane.client import ClientOptions, sync_url

NAMES = {
    "a" * 255: b"longest ascii name",
    "\u00e9" * 127: b"254 bytes of UTF-8",
    "d" * 100 + "/" + "b" * 240 + ".bin": b"long name in a directory" * 1000,
    "short.txt": b"short",
}


async def test_names_up_to_name_max_sync_and_their_leftovers_are_removed(
    tmp_path: Path,
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dst"
    for rel, data in NAMES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    runner, port, _, manifest = await start(src)
    try:
        await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, ClientOptions(token=TOKEN),
            client_cpu=CPU, sync_options=FAST, streams=2,
        )  # fmt: skip
    finally:
        await runner.cleanup()
    check_tree(dest, NAMES)
    assert not list(dest.rglob(f"*{TMP_SUFFIX}"))
    # An interrupted sync's leftovers beside the long names: recognised and removed.
    leftovers = []
    for rel in NAMES:
        target = dest / rel
        leftover = target.with_name(f".{tmp_stem(target.name)}.0badc0de1{TMP_SUFFIX}")
        leftover.write_bytes(b"partial")
        leftovers.append(leftover)
    unrelated = dest / f".someone-else.0badc0de1{TMP_SUFFIX}"
    unrelated.write_bytes(b"not ours")
    present = scan_dest(dest, manifest)
    assert set(present) == set(NAMES)
    assert not any(p.exists() for p in leftovers)
    assert unrelated.exists()  # not a temporary name of a manifest file: left alone

"""The benchmark corpus's pure parts (scripts/corpus.py): tokenizer, cutting, records, ratios."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import corpus

TEXT = 'def f(x):\n    """See https://example.org/a?b=1 for 42 héllo."""\n    return x  # ok\n'


def decode(ids: list[int], vocab: dict[str, int]) -> str:
    pieces = {v: k.encode() for k, v in vocab.items()}
    return b"".join(pieces.get(i, bytes([i]) if i < 256 else b"?") for i in ids).decode()


def test_pretokenize_covers_the_text_exactly() -> None:
    pieces = corpus.pretokenize(TEXT)
    assert "".join(pieces) == TEXT
    assert "def" in pieces
    assert " https" in pieces


def test_vocab_keeps_bytes_below_256_and_orders_by_count() -> None:
    counts = Counter({" the": 5, " a": 5, "x": 9, " zebra": 1})
    vocab = corpus.build_vocab(counts, size=258)
    assert vocab == {" a": 256, " the": 257}  # single bytes never take an id; ties by text


def test_encode_round_trips_and_falls_back_to_bytes() -> None:
    vocab = corpus.build_vocab(Counter(corpus.pretokenize(TEXT[:20])), size=300)
    ids = corpus.encode(corpus.pretokenize(TEXT), vocab)
    assert decode(ids, vocab) == TEXT
    assert max(ids) < 300
    assert any(i < 256 for i in ids)  # "héllo" was not in the vocabulary: its bytes


def test_cut_sizes_are_bounded_and_reproducible() -> None:
    sizes = corpus.cut_sizes(5000, 1024, 4096, seed=3)
    assert sizes == corpus.cut_sizes(5000, 1024, 4096, seed=3)
    assert min(sizes) >= 1024
    assert max(sizes) <= 4096
    assert sizes != corpus.cut_sizes(5000, 1024, 4096, seed=4)


def test_small_file_paths_are_distinct_and_grouped() -> None:
    paths = [corpus.small_file_relpath(i) for i in range(2500)]
    assert len(set(paths)) == 2500
    assert {p.split("/")[0] for p in paths} == {"d0000", "d0001", "d0002"}


def test_paragraphs_and_records() -> None:
    text = "first line\nsecond\n\n\nthird https://x.example/p here\n"
    assert list(corpus.paragraphs(text)) == [(1, "first line\nsecond"), (5, text.split("\n")[4])]
    recs = corpus.records("pkg/mod.py", text, first_id=10)
    assert [r["id"] for r in recs] == [10, 11]
    assert [r["line"] for r in recs] == [1, 5]
    assert {r["url"] for r in recs} == {"https://x.example/p"}
    assert recs[0]["lang"] == "py"
    assert recs[0]["uuid"] == corpus.records("pkg/mod.py", text, 0)[0]["uuid"]
    assert recs[0]["uuid"] != recs[1]["uuid"]
    no_url = corpus.records("numpy/core.txt", "plain\n", 0)
    assert no_url[0]["url"] == "https://pypi.org/project/numpy/"


@pytest.mark.parametrize(("total", "most", "stride"), [(1, 8, 1), (8, 8, 1), (9, 8, 2), (50, 8, 7)])
def test_sample_stride_spreads_at_most_max_pieces(total: int, most: int, stride: int) -> None:
    got = corpus.sample_stride(total, most)
    assert got == stride
    assert len(range(0, total, got)) <= most


def test_zstd_ratios_tell_text_from_random() -> None:
    text = (TEXT * 2000).encode()
    ratios = corpus.zstd_ratios([text], [1, 3])
    assert set(ratios) == {"1", "3"}
    assert ratios["1"] > 10
    noise = corpus.zstd_ratios([os.urandom(1 << 20)], [1, 19])
    assert all(r < corpus.INCOMPRESSIBLE_RATIO for r in noise.values())


def test_concatenated_pieces_cut_across_files(tmp_path: Path) -> None:
    sizes = [3, corpus.PIECE_BYTES + 5, 7]
    files = []
    for i, size in enumerate(sizes):
        files.append(tmp_path / f"{i}.bin")
        files[-1].write_bytes(bytes([i]) * size)
    pieces = list(corpus.concatenated_pieces(files))
    assert [len(p) for p in pieces] == [corpus.PIECE_BYTES, 15]
    assert b"".join(pieces) == b"".join(f.read_bytes() for f in files)


def test_kind_info_best_and_incompressible(tmp_path: Path) -> None:
    info = corpus.KindInfo("jsonl", tmp_path, 1, 10, {"1": 1.9, "3": 2.4, "19": 2.9})
    assert (info.best_ratio, info.best_level, info.incompressible) == (2.9, 19, False)
    flat = corpus.KindInfo("random", tmp_path, 1, 10, {"1": 1.0, "3": 1.0})
    assert flat.incompressible


def test_build_corpus_refuses_unknown_kinds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown corpus kinds"):
        corpus.build_corpus(tmp_path, ["jsonl", "videos"], 1)


def test_package_files_leave_out_pyc_and_files_over_the_cap(tmp_path: Path) -> None:
    sizes = {"a.py": 100, "b.so": 5000, "c.pyc": 10, "d.dat": 2048}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    kept, left_out = corpus.package_files(sorted(tmp_path.iterdir()), max_file_bytes=2048)
    assert [p.name for p in kept] == ["a.py", "d.dat"]
    assert left_out == 1


def test_packages_kind_is_a_tree_of_files_under_the_cap(tmp_path: Path) -> None:
    files, notes = corpus.build_packages(tmp_path, 3_000_000, max_file_bytes=64 * 1024)
    copied = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(copied) == files > 30
    assert max(p.stat().st_size for p in copied) <= 64 * 1024
    assert "64 KiB" in notes


def test_a_corpus_reused_while_another_kind_is_built_stays_reusable(tmp_path: Path) -> None:
    """Reusing a kind while building another rewrites corpus.json: the reused kind's entry
    must keep every field, or the next reuse cannot read it."""
    opts = {"levels": (1,), "smallfiles_count": 50}
    first = corpus.build_corpus(tmp_path, ["random"], 1, **opts)
    corpus.build_corpus(tmp_path, ["random", "smallfiles"], 1, **opts)
    again = corpus.build_corpus(tmp_path, ["random", "smallfiles"], 1, **opts)
    assert again["random"].size_bytes == first["random"].size_bytes
    assert again["random"].best_ratio == first["random"].best_ratio
    assert again["smallfiles"].files == 50

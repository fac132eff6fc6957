#!/usr/bin/env python3
"""The benchmark corpus: real data kinds made from real files on this machine.

    .venv/bin/python scripts/corpus.py /tmp/corpus --kinds packages,jsonl --size-mb 50

Kinds (each a directory under ROOT/KIND; ``--size-mb`` MB each unless said):

- ``packages``: installed packages copied from this venv's site-packages
  (.py, .so, data), in name order, until the size is reached, each without its
  files over ``--packages-max-file-kb`` (1 MiB): about 8,000 files for 100 MB,
  a tree like a real install rather than a few hundred huge libraries.
- ``images``: the real JPEG/PNG files found under /usr, site-packages and the
  standard library (deduplicated); when they hold fewer MB than asked, real
  images re-encoded with Pillow at other sizes and JPEG qualities make up the
  rest (the kind's notes say how many of each).
- ``parquet``: the ``jsonl`` records as a table (ids, uuids, paths, URLs, line
  numbers, timestamps, text) in Parquet shards with its own compression
  (snappy unless ``--parquet-compression``).
- ``tokens``: uint16 token ids of the real text (nanoGPT-style .bin shards); a
  byte-level vocabulary of the 65,280 most frequent GPT-2-style pre-tokens of
  that text plus the 256 bytes, built here (nothing fetched from a hub).
- ``jsonl``: one record per paragraph of real text (.py/.pyi/.txt/.md/.rst of
  the installed packages and the standard library): id, uuid, source path, line,
  the file's first URL, language, length and the text.
- ``random``: one file of random bytes (the incompressible reference).
- ``smallfiles``: ``--smallfiles-count`` files (100,000 by default) of
  1-4 KB cut from the real text, 1,000 per directory (the size does not apply).

Each kind's zstd ratio is measured on its data (4 MiB pieces of the files'
concatenation, like the data plane's chunks; up to 8 pieces spread over the
data) at levels 1, 3 and 19; ROOT/corpus.json records them and lets a later
run with the same kinds, size and count reuse the corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sys
import sysconfig
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zstandard

KINDS = ("packages", "images", "parquet", "tokens", "jsonl", "random", "smallfiles")
RATIO_LEVELS = (1, 3, 19)
INCOMPRESSIBLE_RATIO = 1.05
"""A best zstd ratio below this: the kind's limit is the link itself."""
PIECE_BYTES = 4 * 1024 * 1024
TEXT_SUFFIXES = (".py", ".pyi", ".txt", ".md", ".rst")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
VOCAB_SIZE = 65_536
PRETOKEN = re.compile(r" ?[A-Za-z_]+| ?\d{1,3}| ?[^\sA-Za-z_\d]+|\s+(?!\S)|\s+")
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#@!$&'*+,;=%-]+")
MANIFEST = "corpus.json"


@dataclass
class KindInfo:
    kind: str
    root: Path
    files: int
    size_bytes: int
    zstd_ratios: dict[str, float] = field(default_factory=dict)
    """zstd level (as a string, for JSON) -> ratio measured on the data."""
    single_file: str | None = None
    """The file's path under ``root`` when the kind is one file."""
    notes: str = ""
    build_s: float = 0.0

    @property
    def best_ratio(self) -> float:
        return max(self.zstd_ratios.values(), default=1.0)

    @property
    def best_level(self) -> int:
        return int(max(self.zstd_ratios, key=lambda k: self.zstd_ratios[k], default="0"))

    @property
    def incompressible(self) -> bool:
        return self.best_ratio < INCOMPRESSIBLE_RATIO

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "root": str(self.root), "best_ratio": self.best_ratio,
                "best_level": self.best_level, "incompressible": self.incompressible}  # fmt: skip


# ------------------------------------------------------------------ pure parts


def pretokenize(text: str) -> list[str]:
    """GPT-2-style pre-tokens: words with their leading space, digit runs, punctuation, space."""
    return PRETOKEN.findall(text)


def build_vocab(counts: Counter[str], size: int = VOCAB_SIZE) -> dict[str, int]:
    """Ids 0-255 are the bytes; then the most frequent multi-byte pieces (ties by text)."""
    multi = [(n, piece) for piece, n in counts.items() if len(piece.encode()) > 1]
    multi.sort(key=lambda np_: (-np_[0], np_[1]))
    return {piece: 256 + i for i, (_, piece) in enumerate(multi[: size - 256])}


def encode(pieces: Iterable[str], vocab: dict[str, int]) -> list[int]:
    """Token ids: a piece in ``vocab`` is one id, any other piece is its UTF-8 bytes."""
    ids: list[int] = []
    for piece in pieces:
        token = vocab.get(piece)
        if token is None:
            ids.extend(piece.encode())
        else:
            ids.append(token)
    return ids


def cut_sizes(count: int, low_bytes: int, high_bytes: int, seed: int) -> list[int]:
    """``count`` file sizes drawn uniformly from [low_bytes, high_bytes], reproducibly."""
    rng = random.Random(seed)
    return [rng.randint(low_bytes, high_bytes) for _ in range(count)]


def small_file_relpath(index: int, per_dir: int = 1000) -> str:
    return f"d{index // per_dir:04d}/f{index:06d}.txt"


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(1-based first line, text) of each run of non-blank lines."""
    start, block = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            yield start, "\n".join(block)
            block = []
    if block:
        yield start, "\n".join(block)


def records(source: str, text: str, first_id: int) -> list[dict[str, Any]]:
    """One JSON-able record per paragraph of ``text`` (read from ``source``)."""
    found = URL.search(text)
    url = found.group(0) if found else f"https://pypi.org/project/{source.split('/', 1)[0]}/"
    lang = source.rsplit(".", 1)[-1] if "." in source else "txt"
    return [
        {
            "id": first_id + i,
            "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{source}#{line}")),
            "source": source,
            "line": line,
            "url": url,
            "lang": lang,
            "n_chars": len(block),
            "text": block,
        }
        for i, (line, block) in enumerate(paragraphs(text))
    ]


def sample_stride(total_pieces: int, max_pieces: int) -> int:
    """Every how many pieces one is measured, so at most ``max_pieces`` spread over all."""
    return max(1, -(-total_pieces // max_pieces))


def zstd_ratios(pieces: Sequence[bytes], levels: Sequence[int]) -> dict[str, float]:
    raw = sum(len(p) for p in pieces)
    out: dict[str, float] = {}
    for level in levels:
        cctx = zstandard.ZstdCompressor(level=level)
        packed = sum(len(cctx.compress(p)) for p in pieces)
        out[str(level)] = round(raw / packed, 3) if packed else 1.0
    return out


# ------------------------------------------------------------------ real material


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def walk_files(roots: Sequence[Path], suffixes: tuple[str, ...]) -> Iterator[Path]:
    """Regular files under ``roots`` ending in ``suffixes``, in a stable order."""
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                path = Path(folder, name)
                if name.lower().endswith(suffixes) and path.is_file() and not path.is_symlink():
                    yield path


def text_sources() -> Iterator[tuple[str, str]]:
    """(label, text) of the real text files, cycling when a caller wants more."""
    roots = [site_packages(), Path(sysconfig.get_paths()["stdlib"])]
    found = True
    while found:
        found = False
        # Files in the order of a hash of their path: any prefix of the text spans all packages.
        for path in sorted(walk_files(roots, TEXT_SUFFIXES), key=_spread_key):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            found = True
            base = next((r for r in roots if path.is_relative_to(r)), path.parent)
            yield path.relative_to(base).as_posix(), text


def _spread_key(path: Path) -> bytes:
    return hashlib.blake2b(str(path).encode(), digest_size=8).digest()


def real_text(limit_bytes: int) -> Iterator[str]:
    total = 0
    for _, text in text_sources():
        if total >= limit_bytes:
            return
        total += len(text.encode())
        yield text


# ------------------------------------------------------------------ builders


PACKAGES_MAX_FILE_BYTES = 1 << 20
"""The packages kind leaves out files over this (a few huge shared libraries would otherwise
make 100 MB of a few hundred files, not a tree of thousands like a real install)."""


def package_files(parts: Sequence[Path], max_file_bytes: int) -> tuple[list[Path], int]:
    """The files of one package to copy (no .pyc, none over ``max_file_bytes``) and how
    many were left out for their size."""
    kept = [p for p in parts if not p.name.endswith(".pyc")]
    small = [p for p in kept if p.stat().st_size <= max_file_bytes]
    return small, len(kept) - len(small)


def build_packages(
    dest: Path, size_bytes: int, max_file_bytes: int = PACKAGES_MAX_FILE_BYTES
) -> tuple[int, str]:
    """Top-level entries of site-packages in name order while they fit, each without its
    files over ``max_file_bytes``."""
    site, total, files, taken, too_big = site_packages(), 0, 0, 0, 0
    for entry in sorted(site.iterdir()):
        if entry.name == "__pycache__" or entry.is_symlink() or total >= size_bytes:
            continue
        found = [entry] if entry.is_file() else list(walk_files([entry], ("",)))
        parts, left_out = package_files(found, max_file_bytes)
        size = sum(p.stat().st_size for p in parts)
        if not parts or total + size > size_bytes * 1.1:
            continue  # too big for what is left: a smaller package may fit
        for path in parts:
            target = dest / path.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        total, files, taken = total + size, files + len(parts), taken + 1
        too_big += left_out
    return files, (
        f"{taken} top-level entries of {site}, without their {too_big} files over "
        f"{max_file_bytes // 1024} KiB"
    )


def build_images(dest: Path, size_bytes: int) -> tuple[int, str]:
    from PIL import Image

    roots = [Path("/usr/share"), Path("/usr/lib"), site_packages()]
    seen: set[str] = set()
    sources: list[Path] = []
    total = 0
    for path in walk_files(roots, IMAGE_SUFFIXES):
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if len(data) < 1024 or digest in seen:
            continue
        seen.add(digest)
        sources.append(path)
        if total < size_bytes:
            (dest / "real").mkdir(parents=True, exist_ok=True)
            (dest / "real" / f"{len(sources):05d}{path.suffix.lower()}").write_bytes(data)
            total += len(data)
    real = len(list((dest / "real").iterdir())) if (dest / "real").exists() else 0
    real_bytes = total
    made, edge_px, quality = 0, (320, 512, 800, 1024), (70, 85, 95)
    usable = [p for p in sources if _pixels(p) >= 96 * 96]
    while total < size_bytes and usable:
        src = usable[made % len(usable)]
        with Image.open(src) as opened:
            img = opened.convert("RGBA")
        flat = Image.new("RGB", img.size, "white")
        flat.paste(img, mask=img.getchannel("A"))
        edge = edge_px[(made // len(usable)) % len(edge_px)]
        scale = edge / max(flat.size)
        flat = flat.resize((max(1, round(flat.width * scale)), max(1, round(flat.height * scale))))
        out = dest / "reencoded" / f"{made:05d}.{'png' if made % 5 == 4 else 'jpg'}"
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".png":
            flat.save(out, optimize=True)
        else:
            flat.save(out, quality=quality[made % len(quality)])
        total += out.stat().st_size
        made += 1
    note = f"{real} real images found on the machine ({real_bytes / 1e6:.1f} MB)"
    if made:
        note += (
            f", {made} re-encoded by Pillow from them ({(total - real_bytes) / 1e6:.1f} MB;"
            " longest side 320-1024 px, JPEG q 70-95, every 5th PNG)"
        )
    return real + made, note


def _pixels(path: Path) -> int:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return int(img.width * img.height)
    except (OSError, ValueError):
        return 0


def iter_records() -> Iterator[dict[str, Any]]:
    next_id = 0
    for source, text in text_sources():
        batch = records(source, text, next_id)
        next_id += len(batch)
        yield from batch


def build_jsonl(dest: Path, size_bytes: int) -> tuple[int, str]:
    total = 0
    with (dest / "data.jsonl").open("w", encoding="utf-8") as f:
        for record in iter_records():
            line = json.dumps(record, ensure_ascii=False) + "\n"
            f.write(line)
            total += len(line.encode())
            if total >= size_bytes:
                break
    return 1, "paragraphs of the installed packages' and stdlib's text files"


def build_parquet(dest: Path, size_bytes: int, compression: str) -> tuple[int, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, total, shards, per_shard = iter_records(), 0, 0, 20_000
    stamp_s = 1_700_000_000
    while total < size_bytes:
        batch = [next(rows) for _ in range(per_shard)]
        for record in batch:
            record["seen_at"] = stamp_s + record["id"] * 37
            record["score"] = hash_unit(record["uuid"])
        table = pa.Table.from_pylist(batch)
        table = table.set_column(
            table.schema.get_field_index("seen_at"), "seen_at",
            table.column("seen_at").cast(pa.timestamp("s")),
        )  # fmt: skip
        path = dest / f"part-{shards:05d}.parquet"
        pq.write_table(table, path, compression=compression, row_group_size=per_shard)
        size = path.stat().st_size
        total, shards = total + size, shards + 1
        # Aim at 32 MB shards (or a quarter of the kind), as datasets on a hub are cut.
        target = min(32_000_000, max(1_000_000, size_bytes // 4))
        per_shard = max(1000, int(per_shard * target / size))
    return shards, f"the jsonl records as a table, {compression} compression"


def hash_unit(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest()) / 2**32


def build_tokens(dest: Path, size_bytes: int) -> tuple[int, str]:
    import numpy as np

    counts: Counter[str] = Counter()
    for text in real_text(min(size_bytes * 2, 64_000_000)):
        counts.update(pretokenize(text))
    vocab = build_vocab(counts)
    shard_tokens = max(1, min(50_000_000, size_bytes // 2 // 4))
    buffer: list[int] = []
    shards = written = 0
    for text in real_text(2**62):
        buffer.extend(encode(pretokenize(text), vocab))
        while len(buffer) >= shard_tokens or (buffer and written + 2 * len(buffer) >= size_bytes):
            take = min(shard_tokens, (size_bytes - written + 1) // 2)
            arr = np.asarray(buffer[:take], dtype=np.uint16)
            arr.tofile(dest / f"shard_{shards:05d}.bin")
            del buffer[:take]
            shards, written = shards + 1, written + arr.nbytes
            if written >= size_bytes:
                return shards, f"uint16 ids, vocabulary of {len(vocab) + 256} built on the text"
    return shards, "uint16 ids"


def build_random(dest: Path, size_bytes: int) -> tuple[int, str]:
    with (dest / "data.bin").open("wb") as f:
        for start in range(0, size_bytes, 1_000_000):
            f.write(os.urandom(min(1_000_000, size_bytes - start)))
    return 1, "os.urandom"


def build_smallfiles(dest: Path, count: int) -> tuple[int, str]:
    sizes = cut_sizes(count, 1024, 4096, seed=14)
    stream = real_text(2**62)
    pending, offset = b"", 0
    for index, size in enumerate(sizes):
        while len(pending) - offset < size:
            pending, offset = pending[offset:] + next(stream).encode(), 0
        path = dest / small_file_relpath(index)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(pending[offset : offset + size])
        offset += size
    return count, f"{count} files of 1-4 KB cut from the real text"


def measure_ratios(root: Path, levels: Sequence[int], max_pieces: int = 8) -> dict[str, float]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    stride = sample_stride(-(-total // PIECE_BYTES), max_pieces)
    pieces = [p for i, p in enumerate(concatenated_pieces(files)) if i % stride == 0]
    return zstd_ratios(pieces, levels)


def concatenated_pieces(files: Iterable[Path]) -> Iterator[bytes]:
    """The files' concatenation in PIECE_BYTES pieces (the last one shorter)."""
    current = bytearray()
    for path in files:
        with path.open("rb") as f:
            while block := f.read(PIECE_BYTES - len(current)):
                current += block
                if len(current) == PIECE_BYTES:
                    yield bytes(current)
                    current.clear()
    if current:
        yield bytes(current)


# ------------------------------------------------------------------ the corpus


def build_kind(root: Path, kind: str, size_mb: int, options: dict[str, Any]) -> KindInfo:
    dest = root / kind
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    size = size_mb * 1_000_000
    start = time.monotonic()
    files, notes = {
        "packages": lambda: build_packages(dest, size, options["packages_max_file_kb"] * 1024),
        "images": lambda: build_images(dest, size),
        "parquet": lambda: build_parquet(dest, size, options["parquet_compression"]),
        "tokens": lambda: build_tokens(dest, size),
        "jsonl": lambda: build_jsonl(dest, size),
        "random": lambda: build_random(dest, size),
        "smallfiles": lambda: build_smallfiles(dest, options["smallfiles_count"]),
    }[kind]()
    built_s = time.monotonic() - start
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    single = next(iter(os.listdir(dest))) if kind in ("jsonl", "random") else None
    ratios = measure_ratios(dest, options["levels"])
    return KindInfo(kind, dest, files, total, ratios, single, notes, round(built_s, 1))


_DERIVED = ("best_ratio", "best_level", "incompressible")
"""`KindInfo.to_dict`'s computed fields, not constructor arguments."""


def build_corpus(
    root: Path,
    kinds: Sequence[str],
    size_mb: int,
    *,
    smallfiles_count: int = 100_000,
    packages_max_file_kb: int = PACKAGES_MAX_FILE_BYTES // 1024,
    levels: Sequence[int] = RATIO_LEVELS,
    parquet_compression: str = "snappy",
) -> dict[str, KindInfo]:
    """Build (or reuse, when ROOT/corpus.json says it matches) each kind under ``root``."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown corpus kinds {unknown}; known: {', '.join(KINDS)}")
    root.mkdir(parents=True, exist_ok=True)
    options = {"size_mb": size_mb, "smallfiles_count": smallfiles_count,
               "packages_max_file_kb": packages_max_file_kb,
               "levels": list(levels), "parquet_compression": parquet_compression}  # fmt: skip
    manifest_path = root / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("options") != options:
        manifest = {"options": options, "kinds": {}}
    out: dict[str, KindInfo] = {}
    for kind in kinds:
        known = manifest["kinds"].get(kind)
        if known and (root / kind).is_dir():
            # A copy: the manifest is written again as later kinds are built.
            fields = {k: v for k, v in known.items() if k not in _DERIVED}
            out[kind] = KindInfo(**{**fields, "root": root / kind})
            continue
        out[kind] = build_kind(root, kind, size_mb, options)
        manifest["kinds"][kind] = out[kind].to_dict()
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, manifest_path)
    return out


def print_kinds(infos: Iterable[KindInfo]) -> None:
    print("| kind | files | MB | zstd ratios (level: ratio) | best | built s | notes |")
    print("|---|---|---|---|---|---|---|")
    for info in infos:
        ratios = ", ".join(f"{k}: {v:.2f}" for k, v in info.zstd_ratios.items())
        print(
            f"| {info.kind} | {info.files} | {info.size_bytes / 1e6:.1f} | {ratios} "
            f"| {info.best_ratio:.2f} (L{info.best_level}) | {info.build_s:.0f} | {info.notes} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--smallfiles-count", type=int, default=100_000)
    parser.add_argument(
        "--packages-max-file-kb", type=int, default=PACKAGES_MAX_FILE_BYTES // 1024,
        help="the packages kind leaves out files over this many KiB",
    )  # fmt: skip
    parser.add_argument("--ratio-levels", default=",".join(map(str, RATIO_LEVELS)))
    parser.add_argument("--parquet-compression", default="snappy", choices=("snappy", "zstd"))
    args = parser.parse_args()
    try:
        infos = build_corpus(
            args.root, [k for k in args.kinds.split(",") if k], args.size_mb,
            smallfiles_count=args.smallfiles_count,
            packages_max_file_kb=args.packages_max_file_kb,
            levels=[int(x) for x in args.ratio_levels.split(",")],
            parquet_compression=args.parquet_compression,
        )  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    print_kinds(infos.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stable hashes, shards and weight fingerprints, written once, so every caller derives the same value.

Python's ``hash()`` is salted per process; these are not, so ids, shard assignments, seeds and cache keys are
the same on any machine and in any run. Parts are joined with the unit separator (\\x1f) so ("ab", "c") and
("a", "bc") differ. Every value computed here is on disk somewhere (ids in records, cache dir names, checkpoint
keys) or splits work between machines: tests/test_stable_values.py pins them; changing one is a format change.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _digest(parts: tuple, size: int) -> bytes:
    return hashlib.blake2b("\x1f".join(f"{p}" for p in parts).encode("utf-8"), digest_size=size).digest()


def stable_hex(*parts, size: int = 8) -> str:
    """Hex blake2b of the parts (``size`` bytes)."""
    return _digest(parts, size).hex()


def stable_int(*parts, size: int = 8) -> int:
    """Unsigned int from the blake2b of the parts (``size`` bytes): seeds and shard numbers."""
    return int.from_bytes(_digest(parts, size), "big")


def stable_rng(*parts) -> random.Random:
    """A random.Random seeded from the parts (e.g. run seed and record id): the same draws in any order."""
    return random.Random(stable_int(*parts))


def shard_of(key: str, shard_num: int) -> int:
    """Stable shard of a record id: the same on any machine, in any order."""
    return stable_int(key, size=8) % shard_num


def shard_ids(shard_id: int | range) -> range:
    """``--shard-id`` as a range of shard indexes: one shard (``3``) or several (``1-9``, range(1, 10))."""
    return range(shard_id, shard_id + 1) if isinstance(shard_id, int) else shard_id


def in_shard(key: str, shard_id: int | range, shard_num: int) -> bool:
    """Whether the record id ``key`` is in shard ``shard_id`` of ``shard_num`` (``--shard-id``/``--shard-num``),
    or in one of the shards of a range."""
    return shard_num == 1 or shard_of(key, shard_num) in shard_ids(shard_id)


def shard(recs: Iterable[dict], shard_id: int | range, shard_num: int, key: str) -> Iterator[dict]:
    """The records of one shard (or of a range of shards), by their ``key`` field."""
    if shard_num == 1:
        yield from recs
        return
    ids = shard_ids(shard_id)
    for r in recs:
        if shard_of(r[key], shard_num) in ids:
            yield r


def sample(recs: Iterable[dict], n: int, seed: int, key: str) -> Iterator[dict]:
    """The ``n`` records with the smallest stable hash of (seed, ``key`` field), in their input order: the same
    records whatever the input order, and a sample of a larger ``n`` holds every record of a smaller one. Holds
    ``n`` records at a time."""
    if n < 1:
        raise ValueError(f"a sample needs n >= 1, got {n}")
    heap: list[tuple[int, int, int, dict]] = []  # (-hash, -position, position, record): the n smallest hashes
    for i, rec in enumerate(recs):
        item = (-stable_int("sample", seed, rec[key]), -i, i, rec)
        if len(heap) < n:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    yield from (rec for _, _, _, rec in sorted(heap, key=lambda t: t[2]))


def json_lines_hex(values: Iterable, size: int = 16) -> str:
    """Hex blake2b of each value as one sorted-key JSON line (non-ASCII kept), streamed: what training fingerprints
    its groups and corpus with (a resume compares them)."""
    h = hashlib.blake2b(digest_size=size)
    for v in values:
        h.update(json.dumps(v, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def weight_files(root: str | os.PathLike) -> list[list]:
    """Weight files under a model dir, sorted: [relative path, size, mtime_ns] each."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def weights_hex(path: str | os.PathLike, size: int = 16) -> str:
    """Hex blake2b of a model's weights as stored: a model dir's config.json and every weight file under it (their
    relative names and bytes; optimizer checkpoints, ``.pt``, left out), or one weight file (an ONNX graph). Unlike
    ``weights_fingerprint`` it reads the bytes, so a model trained again into the same dir gets another value (what
    an index's manifest records: an update then sees the new weights)."""
    path = Path(path)
    h = hashlib.blake2b(digest_size=size)
    if path.is_file():
        files = [(path.name, path)]
    else:
        files = [("config.json", path / "config.json")] if (path / "config.json").is_file() else []
        files += [(name, path / name) for name, _, _ in weight_files(path)
                  if not name.endswith(".pt") and "checkpoints" not in Path(name).parts]
        files += [(p.name, p) for p in sorted(path.glob("*.onnx*")) if p.is_file()]
    for name, file in files:
        h.update(name.encode() + b"\x1f")
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def weights_fingerprint(root: str | os.PathLike) -> str:
    """What identifies a model dir's weights across machines (qgen/rerank manifests and checkpoints): config.json
    content plus the names and sizes (not mtimes: a copy is the same model) of its top-level weight files."""
    root = Path(root)
    h = hashlib.blake2b(digest_size=8)
    if (root / "config.json").exists():
        h.update((root / "config.json").read_bytes())
    for name, size, _ in weight_files(root):
        if Path(name).parent == Path(".") and not name.endswith(".pt"):
            h.update(f"{name}:{size}".encode())
    return h.hexdigest()

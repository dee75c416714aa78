"""``read(path, kind)``: the canonical records of one kind from any container, BEIR folder or '-'.

The entry point every stage reads through: containers and formats come from ``streams``, canonical names and
id checks from ``fields``, runs from ``trec``. Records stream; only ids are kept (to reject duplicates).
"""

from __future__ import annotations

from collections.abc import Iterator

from retrctl.errors import RecordError
from retrctl.records.fields import ID_FIELD, NORMALIZERS, resolve
from retrctl.records.streams import read_objects
from retrctl.records.trec import read_run


def read(path, kind: str, fmt: str | None = None, *, unique: bool = True, allow_empty: bool = False) -> Iterator[dict]:
    """Stream canonical records of ``kind`` from a file, BEIR folder or '-'.

    Only ids are kept in memory (to reject duplicates); records themselves stream.
    """
    if kind not in NORMALIZERS:
        raise ValueError(f"unknown record kind {kind!r}")
    if kind == "run":
        for qid, ranked in read_run(path, fmt).items():
            for rank, (docid, score) in enumerate(ranked, 1):
                yield {"query_id": qid, "doc_id": docid, "score": score, "rank": rank}
        return
    path = resolve(path, kind)
    normalize, id_field = NORMALIZERS[kind], ID_FIELD[kind]
    seen: set[str] = set()
    n = 0
    for line, obj in read_objects(path, fmt):
        rec = normalize(obj, path, line)
        if unique and kind in ("doc", "query"):
            rid = rec[id_field]
            if rid in seen:
                raise RecordError(path, line, id_field, f"duplicate {id_field} {rid!r}")
            seen.add(rid)
        n += 1
        yield rec
    if n == 0 and not allow_empty:
        raise RecordError(path, message=f"empty input: no {kind} records")


def read_corpus(path, fmt: str | None = None) -> dict[str, dict]:
    """docid -> {title, text}: for stages that look passages up by id (mine, train)."""
    return {d["docid"]: {"title": d["title"], "text": d["text"]} for d in read(path, "doc", fmt)}

"""Runs and qrels: TREC files, BEIR TSV qrels, and their JSONL/Parquet forms.

Runs are TREC 6-column by default, or JSONL/Parquet; qrels are TREC 4-column, BEIR TSV (header
``query-id corpus-id score``), JSONL or Parquet. A ranking is kept in trec_eval's order (``trec_order``), so a
run read back and one evaluated by trec_eval agree on ties.

A qrels line split on tabs is read cell by cell (BEIR TSV), so an id like ``q 1`` is reported, not mis-split;
a run with an id holding whitespace is refused rather than written as a TREC line that splits differently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from operator import itemgetter

from retrctl.errors import RecordError
from retrctl.records.containers import _lines, is_parquet, open_output
from retrctl.records.fields import _SPACE, _as_id, _normalize_row, resolve
from retrctl.records.streams import read_objects, write


def _is_trec_run_line(parts):
    return len(parts) == 6


def read_run(path, fmt: str | None = None) -> dict[str, list[tuple[str, float]]]:
    """query_id -> [(doc_id, score)] best first. A doc repeated within one query is an error.

    Order within a query is trec_eval's: score descending, then doc id descending.
    """
    path = str(path)
    run: dict[str, dict[str, float]] = {}

    def add(qid, docid, score, line):
        if score != score:  # NaN has no place in a ranking (trec_eval would order it arbitrarily)
            raise RecordError(path, line, "score", "NaN score")
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise RecordError(path, line, "doc_id", f"doc {docid!r} appears twice for query {qid!r}")
        docs[docid] = score

    if is_parquet(path, fmt) or fmt == "jsonl" or (fmt is None and _looks_jsonl(path)):
        for line, obj in read_objects(path, fmt):
            row = _normalize_row("run", obj, path, line)
            add(row["query_id"], row["doc_id"], float(row["score"]), line)
    else:
        for line, text in _lines(path):
            parts = text.split()
            if not _is_trec_run_line(parts):
                raise RecordError(path, line, None, f"expected 6 columns 'qid Q0 docid rank score tag', got {len(parts)}")
            try:
                score = float(parts[4])
            except ValueError:
                raise RecordError(path, line, "score", f"not a number: {parts[4]!r}") from None
            add(parts[0], parts[2], score, line)
    if not run:
        raise RecordError(path, message="empty input: no run rows")
    return {q: trec_order(d) for q, d in run.items()}


def trec_order(docs) -> list[tuple[str, float]]:
    """(doc_id, score) pairs in trec_eval's order: score descending, ties by doc id descending.

    trec_eval (form_res_rels.c, comp_sim_docno) breaks ties with strcmp on the docno, reversed; Python's
    str order is code-point order, which is the byte order of UTF-8. Two stable passes: doc id, then score.
    """
    items = sorted(docs.items() if isinstance(docs, dict) else docs, key=itemgetter(0), reverse=True)
    items.sort(key=itemgetter(1), reverse=True)
    return items


def _looks_jsonl(path) -> bool:
    name = str(path).lower()
    for ext in (".gz", ".zst", ".zstd"):
        name = name.removesuffix(ext)
    if name.endswith((".jsonl", ".json")):
        return True
    if name.endswith((".trec", ".run", ".txt", ".tsv")) or path == "-":
        return False
    with contextlib.suppress(Exception):
        for _, line in _lines(path):
            return line.lstrip().startswith("{")
    return False


def read_qrels(path, split: str | None = None) -> dict[str, dict[str, int]]:
    """query_id -> {doc_id: relevance} from TREC 4-column, BEIR TSV (with header), JSONL, Parquet, or a BEIR folder."""
    path = resolve(path, "qrels", split)
    qrels: dict[str, dict[str, int]] = {}

    def add(qid, docid, rel, line):
        if isinstance(rel, float):
            if not rel.is_integer():
                raise RecordError(path, line, "relevance", f"expected an integer grade, got {rel}")
            rel = int(rel)
        qrels.setdefault(qid, {})[docid] = rel

    if is_parquet(path) or (_looks_jsonl(path) and not path.lower().endswith(".tsv")):
        for line, obj in read_objects(path):
            row = _normalize_row("qrels", obj, path, line)
            add(row["query_id"], row["doc_id"], row["relevance"], line)
    else:
        tsv = False  # a tab-separated BEIR header makes every line TSV
        for line, text in _lines(path):
            parts = _qrels_cells(text, tsv)
            if line == 1 and [p.strip() for p in parts[:2]] == ["query-id", "corpus-id"]:
                tsv = "\t" in text
                continue  # BEIR header
            if len(parts) == 4:
                qid, _, docid, rel = parts
            elif len(parts) == 3:
                qid, docid, rel = parts
            else:
                raise RecordError(path, line, None, f"expected 'qid 0 docid rel' or 'query-id corpus-id score', got {len(parts)} columns")
            qid, docid = _as_id(path, line, "query_id", qid), _as_id(path, line, "doc_id", docid)
            try:
                add(qid, docid, int(rel), line)
            except ValueError:
                raise RecordError(path, line, "relevance", f"not an integer: {rel!r}") from None
    if not qrels:
        raise RecordError(path, message="empty input: no qrels rows")
    return qrels


def _qrels_cells(text: str, tsv: bool) -> list[str]:
    """Columns of a qrels line: split on tabs in a BEIR TSV file, and on any line whose tabs give 3 or 4
    columns (so 'q 1<TAB>d1<TAB>1' is query 'q 1', reported as an id with whitespace, never query 'q');
    otherwise on whitespace (TREC)."""
    line = text.rstrip("\r\n")
    if tsv or "\t" in line:
        cells = line.split("\t")
        if tsv or len(cells) in (3, 4):
            return cells  # cells are not stripped: an id with a stray space is reported, not silently changed
    return text.split()


# ---------------------------------------------------------------- writers


def run_rows(run: dict[str, list[tuple[str, float]]]) -> Iterator[dict]:
    for qid, ranked in run.items():
        for rank, (docid, score) in enumerate(ranked, 1):
            yield {"query_id": qid, "doc_id": docid, "score": float(score), "rank": rank}


def write_run(rows: Iterable[dict], path="-", fmt: str | None = None, tag: str = "retrctl") -> int:
    """Write run rows ({query_id, doc_id, score, rank}) as TREC (default), JSONL or Parquet."""
    if fmt in ("jsonl", "parquet") or is_parquet(path, fmt) or (fmt is None and _is_jsonl_name(path)):
        return write(rows, path, "parquet" if is_parquet(path, fmt) else "jsonl")
    if _SPACE.search(tag) or not tag:
        raise RecordError(path, None, "tag", f"run tag {tag!r} is empty or contains whitespace (TREC's sixth column)")
    n = 0
    with open_output(path) as f:
        for r in rows:
            if _SPACE.search(f"{r['query_id']}{r['doc_id']}"):  # e.g. an index built before ids were checked
                bad = r["query_id"] if _SPACE.search(str(r["query_id"])) else r["doc_id"]
                raise RecordError(path, n + 1, None, f"id {bad!r} contains whitespace, which a TREC run cannot carry: "
                                  "write --output-format jsonl")
            f.write(f"{r['query_id']} Q0 {r['doc_id']} {r['rank']} {r['score']:.6f} {tag}\n")
            n += 1
    return n


def _is_jsonl_name(path) -> bool:
    name = str(path).lower()
    for ext in (".gz", ".zst", ".zstd"):
        name = name.removesuffix(ext)
    return name.endswith(".jsonl")

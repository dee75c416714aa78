"""Record kinds, their canonical field names and the aliases accepted for them; ids; the BEIR folder layout.

Readers accept the aliases of BEIR, Tevatron, FlagEmbedding and Pyserini and always yield canonical names
(FORMATS.md); writers always write canonical names. Each ``normalize_*`` turns one input object into its
canonical record or raises RecordError naming file, line and field.

Ids never contain whitespace (space, tab, newline, no-break space, ...: any character Python's str.split()
splits on): TREC runs and qrels, trec_eval and Pyserini split lines on whitespace, so such an id would come back
as other ids or other columns. Readers reject it with file:line and the field, before any work is done.

A BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) is accepted where a corpus, queries or qrels is
expected: ``resolve`` maps it to the file that holds the kind.
"""

from __future__ import annotations

import os
import re

from retrctl.errors import RecordError
from retrctl.hashing import stable_hex

KINDS = ("doc", "query", "group", "run", "qrels")

# canonical name -> aliases accepted on input, in order of preference
ALIASES = {
    "doc": {"docid": ("docid", "_id", "id", "doc_id"), "title": ("title",), "text": ("text", "contents", "body")},
    "query": {"query_id": ("query_id", "_id", "qid", "id"), "query_text": ("query_text", "text", "query")},
    "run": {"query_id": ("query_id", "qid"), "doc_id": ("doc_id", "docid"), "score": ("score",), "rank": ("rank",)},
    "qrels": {
        "query_id": ("query_id", "qid", "query-id"),
        "doc_id": ("doc_id", "docid", "corpus-id", "source_docid"),
        "relevance": ("relevance", "rel", "score"),
    },
}
BEIR_FILES = {"doc": "corpus.jsonl", "query": "queries.jsonl"}


# ---------------------------------------------------------------- normalisation


def _pick(obj: dict, aliases: tuple[str, ...]):
    for name in aliases:
        if name in obj:
            return name, obj[name]
    return aliases[0], None


def _as_id(path, line, field, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RecordError(path, line, field, f"expected a string id, got {_typename(value)}")
    value = str(value)
    if not value.strip():
        raise RecordError(path, line, field, "empty id")
    if _SPACE.search(value):
        raise RecordError(path, line, field, f"id {value!r} contains whitespace, which TREC runs and qrels cannot carry: "
                          "rename it")
    return value


_SPACE = re.compile(r"\s")  # exactly the characters str.split() splits on


def _as_text(path, line, field, value, required=True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise RecordError(path, line, field, f"expected a string, got {_typename(value)}")
    return value


def _typename(value) -> str:
    return "null" if value is None else type(value).__name__


def _missing(path, line, kind, canonical):
    names = ALIASES[kind][canonical]
    also = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
    return RecordError(path, line, None, f'missing field "{canonical}"{also}')


def normalize_doc(obj, path="<input>", line=None) -> dict:
    al = ALIASES["doc"]
    id_name, docid = _pick(obj, al["docid"])
    if docid is None and id_name not in obj:  # present but null is a wrong type, reported by _as_id
        raise _missing(path, line, "doc", "docid")
    text_name, text = _pick(obj, al["text"])
    if text is None and text_name not in obj:
        raise _missing(path, line, "doc", "text")
    rec = {k: v for k, v in obj.items() if k not in al["docid"] + al["text"] + al["title"]}
    rec = {
        "docid": _as_id(path, line, id_name, docid),
        "title": _as_text(path, line, "title", obj.get("title"), required=False),
        "text": _as_text(path, line, text_name, text),
        **rec,
    }
    return rec


def normalize_query(obj, path="<input>", line=None) -> dict:
    al = ALIASES["query"]
    id_name, qid = _pick(obj, al["query_id"])
    if qid is None and id_name not in obj:
        raise _missing(path, line, "query", "query_id")
    text_name, text = _pick(obj, al["query_text"])
    if text is None and text_name not in obj:
        raise _missing(path, line, "query", "query_text")
    rest = {k: v for k, v in obj.items() if k not in al["query_id"] + al["query_text"]}
    rec = {"query_id": _as_id(path, line, id_name, qid), "query_text": _as_text(path, line, text_name, text), **rest}
    if "source_docid" in rec and rec["source_docid"] is not None:
        rec["source_docid"] = _as_id(path, line, "source_docid", rec["source_docid"])
    return rec


def passage_text(doc: dict) -> str:
    """The text a passage is encoded and trained from: title, a space, the text (BEIR/sentence-transformers)."""
    return ((doc.get("title") or "") + " " + doc["text"]).strip()


def text_id(text: str) -> str:
    """A stable id for a passage that arrives without one (FlagEmbedding groups)."""
    return "h" + stable_hex(text, size=8)


def content_hash(title: str, text: str) -> str:
    """Hash of a document's content: the key for incremental indexing and embedding caches."""
    return stable_hex(title, text, size=16)


def _id_list(path, line, field, value) -> list[str]:
    if not isinstance(value, list):
        raise RecordError(path, line, field, f"expected a list of ids, got {_typename(value)}")
    return [_as_id(path, line, field, v) for v in value]


def _score_list(path, line, field, value, n) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, (int, float)) for v in value):
        raise RecordError(path, line, field, f"expected a list of {n} numbers")
    return [float(v) for v in value]


def normalize_group(obj, path="<input>", line=None) -> dict:
    """Group in canonical form; legacy formats carry passage text in ``passages`` (docid -> {title, text})."""
    passages: dict[str, dict] = {}
    if "positive_passages" in obj or "negative_passages" in obj:  # Tevatron legacy
        qid = obj.get("query_id", obj.get("qid"))
        query = obj.get("query_text", obj.get("query"))
        ids = {}
        for side in ("positive", "negative"):
            field = f"{side}_passages"
            items = obj.get(field, [])
            if not isinstance(items, list):
                raise RecordError(path, line, field, f"expected a list, got {_typename(items)}")
            ids[side] = []
            for p in items:
                if not isinstance(p, dict):
                    raise RecordError(path, line, field, "expected objects with docid, title, text")
                d = normalize_doc(p, path, line)
                passages[d["docid"]] = {"title": d["title"], "text": d["text"]}
                ids[side].append(d["docid"])
        pos, neg = ids["positive"], ids["negative"]
        rec = {"query_id": qid, "query_text": query}
    elif "pos" in obj and "query" in obj and "positive_document_ids" not in obj:  # FlagEmbedding
        rec = {"query_id": obj.get("query_id", obj.get("qid")), "query_text": obj["query"]}
        sides = []
        for field in ("pos", "neg"):
            texts = obj.get(field, [])
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise RecordError(path, line, field, "expected a list of strings")
            sides.append([text_id(t) for t in texts])
            passages.update({text_id(t): {"title": "", "text": t} for t in texts})
        pos, neg = sides
        if rec["query_id"] is None:
            rec["query_id"] = text_id(rec["query_text"]) if isinstance(rec["query_text"], str) else None
    else:
        if "positive_document_ids" not in obj:
            raise RecordError(path, line, None, 'missing field "positive_document_ids"')
        rec = {"query_id": obj.get("query_id", obj.get("qid")), "query_text": obj.get("query_text", obj.get("query"))}
        pos = _id_list(path, line, "positive_document_ids", obj["positive_document_ids"])
        neg = _id_list(path, line, "negative_document_ids", obj.get("negative_document_ids", []))
    if rec["query_id"] is None:
        raise _missing(path, line, "query", "query_id")
    rec["query_id"] = _as_id(path, line, "query_id", rec["query_id"])
    rec["query_text"] = _as_text(path, line, "query_text", rec["query_text"])
    if not pos:
        raise RecordError(path, line, "positive_document_ids", "a group needs at least one positive")
    rec["positive_document_ids"], rec["negative_document_ids"] = pos, neg
    for side, ids in (("positive", pos), ("negative", neg)):
        scores = _score_list(path, line, f"{side}_scores", obj.get(f"{side}_scores"), len(ids))
        if scores is not None:
            rec[f"{side}_scores"] = scores
    if passages:
        rec["passages"] = passages
    return rec


def _normalize_row(kind, obj, path, line) -> dict:
    al = ALIASES[kind]
    if kind == "qrels" and obj.get("source_docid") is not None and not any(n in obj for n in al["relevance"]):
        obj = {**obj, "relevance": 1}  # a crop/qgen pseudo-query judges its source document relevant
    out = {}
    for canonical, names in al.items():
        name, value = _pick(obj, names)
        if value is None:
            if kind == "run" and canonical == "rank":
                continue
            if name in obj:
                raise RecordError(path, line, name, "expected a value, got null")
            raise _missing(path, line, kind, canonical)
        out[canonical] = value
    ids = ("query_id", "doc_id")
    for f in ids:
        out[f] = _as_id(path, line, f, out[f])
    num = "score" if kind == "run" else "relevance"
    if isinstance(out[num], bool) or not isinstance(out[num], (int, float)):
        raise RecordError(path, line, num, f"expected a number, got {_typename(out[num])}")
    return out


NORMALIZERS = {
    "doc": normalize_doc,
    "query": normalize_query,
    "group": normalize_group,
    "run": lambda o, p, n: _normalize_row("run", o, p, n),
    "qrels": lambda o, p, n: _normalize_row("qrels", o, p, n),
}
ID_FIELD = {"doc": "docid", "query": "query_id", "group": "query_id", "run": "query_id", "qrels": "query_id"}


# ---------------------------------------------------------------- BEIR folders


def resolve(path, kind: str, split: str | None = None) -> str:
    """Map a BEIR folder to the file that holds ``kind``; other paths pass through."""
    path = str(path)
    if path != "-" and os.path.isdir(path):
        if kind in BEIR_FILES:
            target = os.path.join(path, BEIR_FILES[kind])
        elif kind == "qrels":
            target = beir_qrels(path, split)
        else:
            raise RecordError(path, message=f"a folder is not a {kind} file")
        if not os.path.exists(target):
            raise RecordError(path, message=f"BEIR folder has no {os.path.relpath(target, path)}")
        return target
    return path


def beir_qrels(folder, split: str | None = None) -> str:
    qdir = os.path.join(folder, "qrels")
    if split:
        return os.path.join(qdir, f"{split}.tsv")
    for name in ("test.tsv", "dev.tsv"):
        if os.path.exists(os.path.join(qdir, name)):
            return os.path.join(qdir, name)
    found = sorted(os.listdir(qdir)) if os.path.isdir(qdir) else []
    return os.path.join(qdir, found[0]) if len(found) == 1 else os.path.join(qdir, "test.tsv")

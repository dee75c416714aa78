"""Record kinds, canonical field names, and their readers and writers.

Every stage reads and writes through this module, so one stage's output is the next stage's input
(see FORMATS.md). Readers accept the aliases of BEIR, Tevatron, FlagEmbedding and Pyserini and always
yield canonical names; writers always write canonical names. Bad input raises RecordError, which the CLI
turns into one line naming file, line and field, with exit status 2.

Containers: .jsonl (also .json lines), .jsonl.gz, .jsonl.zst, .parquet; '-' is stdin/stdout (JSONL).
A BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) is accepted where a corpus, queries or
qrels is expected. Runs are TREC 6-column by default, or JSONL/Parquet; qrels are TREC 4-column, BEIR TSV
(header ``query-id corpus-id score``), JSONL or Parquet.

Ids never contain whitespace (space, tab, newline, no-break space, ...: any character Python's str.split()
splits on): TREC runs and qrels, trec_eval and Pyserini split lines on whitespace, so such an id would come back
as other ids or other columns. Readers reject it with file:line and the field, before any work is done.
A qrels line split on tabs is read cell by cell (BEIR TSV), so an id like ``q 1`` is reported, not mis-split.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path

from retrctl.hashing import stable_hex

KINDS = ("doc", "query", "group", "run", "qrels")

# canonical name -> aliases accepted on input, in order of preference
ALIASES = {
    "doc": {"docid": ("docid", "_id", "id", "doc_id"), "title": ("title",), "text": ("text", "contents", "body")},
    "query": {"query_id": ("query_id", "_id", "qid", "id"), "query_text": ("query_text", "text", "query")},
    "run": {"query_id": ("query_id", "qid"), "doc_id": ("doc_id", "docid"), "score": ("score",), "rank": ("rank",)},
    "qrels": {
        "query_id": ("query_id", "qid", "query-id"),
        "doc_id": ("doc_id", "docid", "corpus-id"),
        "relevance": ("relevance", "rel", "score"),
    },
}
BEIR_FILES = {"doc": "corpus.jsonl", "query": "queries.jsonl"}


class RecordError(Exception):
    """Bad input: carries the file, the line (or Parquet row) and the field it concerns."""

    def __init__(self, path, line=None, field=None, message=""):
        self.path, self.line, self.field, self.message = str(path), line, field, message
        super().__init__(str(self))

    def __str__(self):
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        what = f"field '{self.field}': {self.message}" if self.field else self.message
        return f"{where}: {what}"


class BusyError(Exception):
    """An output another process is writing right now (its lock is held): try again later (exit 75, EX_TEMPFAIL)."""


# ---------------------------------------------------------------- raw text containers


def _compression(path: str) -> str | None:
    name = str(path).lower()
    if name.endswith(".gz"):
        return "gz"
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zst"
    return None


def is_parquet(path, fmt: str | None = None) -> bool:
    return fmt == "parquet" or (fmt is None and str(path).lower().endswith(".parquet"))


def open_text(path, mode: str = "r"):
    """Open a text stream, picking gzip/zstd from the extension; '-' is stdin/stdout."""
    path = str(path)
    if path == "-":
        stream = sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return io.TextIOWrapper(stream, encoding="utf-8", newline="\n", write_through=True)
    comp = _compression(path)
    if comp == "gz":
        return gzip.open(path, mode + "t", encoding="utf-8", newline="\n")
    if comp == "zst":
        import zstandard

        raw = open(path, mode + "b")
        if "r" in mode:
            stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        else:
            stream = zstandard.ZstdCompressor(level=10, write_checksum=True).stream_writer(raw, closefd=True)  # damage is detected
        return io.TextIOWrapper(stream, encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


class _ZstdReader(io.RawIOBase):
    """Raw zstd decompressing reader that notices a truncated stream (zstandard's stream_reader stays silent)."""

    def __init__(self, raw):
        import zstandard

        self._zstd, self._raw, self._pending = zstandard, raw, b""
        self._dobj, self._started = zstandard.ZstdDecompressor().decompressobj(), False

    def readable(self):
        return True

    def readinto(self, buf):
        while not self._pending:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._started and not self._dobj.eof:
                    raise EOFError("zstd stream ended before the end of its frame (truncated file?)")
                return 0
            self._started = True
            try:
                out = self._dobj.decompress(chunk)
                while self._dobj.eof and self._dobj.unused_data:  # concatenated frames
                    rest, self._dobj = self._dobj.unused_data, self._zstd.ZstdDecompressor().decompressobj()
                    out += self._dobj.decompress(rest)
            except self._zstd.ZstdError as e:
                raise OSError(str(e)) from None
            self._pending = out
        n = min(len(buf), len(self._pending))
        buf[:n], self._pending = self._pending[:n], self._pending[n:]
        return n

    def close(self):
        self._raw.close()
        super().close()


def _open_binary(path: str):
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer)  # never close the process's stdin
    comp = _compression(path)
    if comp == "gz":
        return gzip.open(path, "rb")
    if comp == "zst":
        return io.BufferedReader(_ZstdReader(open(path, "rb")), 1 << 16)
    return open(path, "rb")


def _lines(path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each non-blank line.

    Lines are decoded one at a time so that bytes that are not UTF-8 name their own line (a text wrapper
    decodes whole chunks and would blame an earlier line); truncated gzip/zstd streams name the line reached.
    """
    path = str(path)
    if path != "-" and not os.path.exists(path):
        raise RecordError(path, message="no such file")
    try:
        opened = _open_binary(path)
    except OSError as e:
        raise RecordError(path, message=f"cannot open: {e.strerror or e}") from None
    lineno = 0
    try:
        with opened as f:
            for raw in f:
                lineno += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise RecordError(path, lineno, None, f"not UTF-8 ({e.reason} at byte {e.start} of the line)") from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")  # UTF-8 byte order mark
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip/zstd (zlib.error: a bad block mid-stream)
        raise RecordError(path, lineno + 1, None, f"unreadable compressed stream: {e}") from None


def read_jsonl(path) -> Iterator[tuple[int, dict]]:
    for lineno, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(path, lineno, None, f"invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:  # a hostile '[[[[…' line
            raise RecordError(path, lineno, None, "JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise RecordError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def read_parquet(path, batch_size: int = 4096) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    if str(path) == "-":
        raise RecordError("-", message="Parquet cannot be read from stdin (stdin is JSONL): give the file's path")
    try:
        pf = pq.ParquetFile(str(path))
    except FileNotFoundError:
        raise RecordError(path, message="no such file") from None
    except Exception as e:
        raise RecordError(path, message=f"not a Parquet file ({e})") from None
    row = 0
    batches = pf.iter_batches(batch_size=batch_size)
    while True:
        try:  # a corrupt page or a truncated column chunk fails here, mid-file
            batch = next(batches, None)
            objs = [] if batch is None else batch.to_pylist()
        except Exception as e:
            raise RecordError(path, row + 1, None, f"unreadable Parquet data ({type(e).__name__}: {e})") from None
        if batch is None:
            return
        for obj in objs:
            row += 1
            yield row, obj


def read_objects(path, fmt: str | None = None) -> Iterator[tuple[int, dict]]:
    """(line or row, object) pairs from JSONL or Parquet."""
    return read_parquet(path) if is_parquet(path, fmt) else read_jsonl(path)


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


# ---------------------------------------------------------------- readers


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


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of at most ``n`` items from a stream (itertools.batched, which needs Python 3.12)."""
    buf = []
    for x in items:
        buf.append(x)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf


# ---------------------------------------------------------------- writers


def _flat(paths) -> list[str]:
    out = []
    for p in paths:
        if isinstance(p, (list, tuple)):
            out += _flat(p)
        elif isinstance(p, (str, os.PathLike)) and str(p) != "-":  # records given in memory are no paths
            out.append(str(p))
    return out


def check_outputs(outputs, inputs, *, dir_output: bool = False) -> None:
    """Refuse an output that is, is inside, or (a directory output) contains an input (real paths, symlinks
    resolved), before anything is read: writing it would destroy the input. '-' never clashes; inputs that do not exist cannot be
    lost (and are reported as missing by their reader). A file output that is an existing directory (or a
    directory output that is an existing file) is refused too, instead of failing after all the work."""
    ins = [(i, Path(os.path.realpath(i))) for i in _flat(inputs) if os.path.lexists(i)]
    for out in _flat(outputs):
        real = Path(os.path.realpath(out))
        for given, rin in ins:
            if real == rin:
                how = "is"
            elif real.is_relative_to(rin):
                how = "is inside"
            elif dir_output and rin.is_relative_to(real):  # a directory output replaces what is inside it
                how = "contains"
            else:
                continue
            raise RecordError(out, message=f"the output {how} the input {given}: writing it would destroy the input; "
                              "nothing written (choose another -o)")
        above = next((a for a in real.parents if a.exists()), real)  # '/' has no parents
        if not above.is_dir():
            raise RecordError(out, message=f"cannot be created: {above} is a file, not a directory")
        if dir_output and os.path.isfile(out):
            raise RecordError(out, message="is a file: -o needs a directory here")
        if not dir_output and os.path.isdir(out):
            raise RecordError(out, message="is a directory: -o needs a file path here")


@contextlib.contextmanager
def atomic_path(path, suffix: str = ""):
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + suffix, dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def versions() -> dict:
    """Installed versions of retrctl and the libraries that shape its outputs, for manifests (PEER 14, 39)."""
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for pkg in ("retrctl", "torch", "transformers", "tokenizers", "faiss-cpu", "faiss-gpu-cu12", "bm25s"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def write_manifest_beside(output, manifest: dict) -> None:
    """``<output>.manifest.json``, atomically: a run or query file's provenance (TREC and JSONL have no header).
    Nothing when the output is stdout."""
    if output in (None, "-"):
        return
    with atomic_path(f"{output}.manifest.json") as tmp:
        Path(tmp).write_text(json.dumps({**manifest, "versions": versions()}, indent=2, ensure_ascii=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(path):
    """Build a directory at ``<path>.partial`` and swap it into place on success.

    The partial directory is kept on failure so long stages can resume from it.
    """
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    yield partial
    swap_dir(partial, path)


def swap_dir(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst``, replacing what is there by renames only."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


@contextlib.contextmanager
def open_output(path, fmt: str | None = None):
    """A text stream for ``path`` ('-' = stdout), written atomically."""
    if str(path) == "-":
        stream = open_text("-", "w")
        try:
            yield stream
        finally:
            with contextlib.suppress(BrokenPipeError, ValueError):
                stream.flush()
            stream.detach()
        return
    comp = _compression(path)
    # the temp name keeps the compression extension so open_text picks the same codec
    with atomic_path(path, suffix={"gz": ".gz", "zst": ".zst"}.get(comp, "")) as tmp, open_text(tmp, "w") as f:
        yield f


def _json_default(o):
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def dumps(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, default=_json_default)


class _ParquetSink:
    """Batches of records into one Parquet file whose schema grows with them.

    A batch's columns are the union of its records' keys, each typed from all its values (pyarrow's from_pylist
    keeps only the first record's keys and truncates 1.5 to 1 in an int column). When a batch brings a new
    column or a wider type (null -> list, int -> float), the rows written so far are rewritten under the unified
    schema. Values no one type can hold (a string and a number in one column) are a RecordError, before the
    target is touched.
    """

    def __init__(self, tmp: str, target):
        self.tmp, self.target, self.writer = tmp, str(target), None

    def write(self, batch: list[dict], first_row: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = list(dict.fromkeys(k for rec in batch for k in rec))
        try:
            if batch and not keys:  # a table without columns has no rows either: the records would vanish
                raise pa.ArrowInvalid("records without fields")
            table = pa.table({k: pa.array([rec.get(k) for rec in batch]) for k in keys})
            schema = table.schema if self.writer is None else pa.unify_schemas([self.writer.schema, table.schema],
                                                                              promote_options="permissive")
            if self.writer is not None and schema != self.writer.schema:
                self._rewrite(schema)
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.tmp, schema)
            self.writer.write_table(_conform(table, schema))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            last = first_row + len(batch) - 1
            rows = f"records {first_row}-{last}" if last > first_row else f"record {first_row}"
            raise RecordError(self.target, None, None, f"{rows} cannot be written as Parquet ({e}); write JSONL "
                              "instead") from None

    def _rewrite(self, schema) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.writer.close()
        old = self.tmp + ".old"
        os.replace(self.tmp, old)
        try:
            self.writer = pq.ParquetWriter(self.tmp, schema)
            for b in pq.ParquetFile(old).iter_batches():
                self.writer.write_table(_conform(pa.Table.from_batches([b]), schema))
        finally:
            os.unlink(old)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _conform(table, schema):
    """``table`` with exactly ``schema``'s columns: missing ones null, others cast (safely: no lossy casts)."""
    import pyarrow as pa

    cols = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def write(records: Iterable[dict], path="-", fmt: str | None = None, batch_size: int = 10000) -> int:
    """Write records as JSONL (compressed by extension) or Parquet; atomic for files. Returns the count."""
    n = 0
    if is_parquet(path, fmt):
        if str(path) == "-":  # a usage error: exit 2
            raise RecordError("-", message="Parquet output needs a file, not stdout: use -o FILE.parquet")
        with atomic_path(path) as tmp:
            sink = _ParquetSink(tmp, path)
            try:
                batch: list[dict] = []
                for rec in records:
                    batch.append(rec)
                    n += 1
                    if len(batch) >= batch_size:
                        sink.write(batch, n - len(batch) + 1)
                        batch = []
                if batch or sink.writer is None:
                    sink.write(batch, n - len(batch) + 1)
            finally:
                sink.close()
        return n
    with open_output(path, fmt) as f:
        for rec in records:
            f.write(dumps(rec) + "\n")
            n += 1
    return n


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

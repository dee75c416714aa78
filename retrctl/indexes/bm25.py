"""BM25 index built and scored by bm25s (Lù 2024, arXiv:2407.03618).

BM25: Robertson & Zaragoza 2009; the default variant is Lucene's (Kamphuis et al. 2020, ECIR, "Which BM25
do you mean?"), with k1=0.9, b=0.4 — Pyserini's BEIR "flat" setting: one field, title + " " + text.
Tokens: bm25s's tokenizer (lower-case, ``\\w\\w+``), English stopwords by default, no stemming. This is the
setting of the reference in shared/data/README.md (SciFact nDCG@10 0.6569). The whole variant is written into
``index.json`` (BM25 numbers are only comparable with the variant named, beir#197, pyserini#1211).

Memory: docs are tokenized as they stream in (bm25s's ``Tokenizer.streaming_tokenize``) into one flat int32
array plus offsets — the JSON records are never held. The score matrix bm25s searches is then assembled
from that array in doc chunks with numpy (``score_matrix``: bm25s's own tf/idf functions, arrays identical
to ``BM25.index``'s), because bm25s's builder wants per-doc Python lists and sorts 36 bytes per posting; so
peak memory is the token array plus the matrix, growing with the index and not with the corpus text. The token arrays are saved too (``tokens.npy``, ``offsets.npy``): an update tokenizes only new or
changed docs and recomputes the statistics (idf, average length) from the stored tokens, so an updated
index is identical to a fresh build. The vocabulary is re-numbered in sorted word order at every build,
for the same reason.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.indexes import base, store

log = logging.getLogger("retrctl.index")
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _bm25s():
    """bm25s, imported on first use; it sets its logger to DEBUG at import, which we undo (stderr is for our logs)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(max(logging.getLogger().getEffectiveLevel(), logging.WARNING))
    return bm25s


def score_matrix(tokens: np.ndarray, offsets: np.ndarray, n_vocab: int, *, k1: float, b: float, method: str,
                 delta: float = 0.5, chunk_tokens: int = 1 << 18) -> tuple[dict, np.ndarray | None]:
    """bm25s's eager score matrix (CSC by term: data float32, indices int32 doc rows, indptr) from flat token ids.

    The same numbers as ``bm25s.BM25.index`` (its own tf and idf functions, the same float64-then-float32
    arithmetic, docs ascending within a term; a test checks the arrays are identical), computed in doc chunks
    with numpy instead of per-doc Python lists, in two passes (document frequencies, then scores placed
    straight into the final arrays): peak memory is the token array plus the matrix itself.
    Returns (scores dict for ``BM25.scores``, non-occurrence array for bm25l/bm25+ or None).
    """
    from bm25s.scoring import _build_nonoccurrence_array, _select_idf_scorer, _select_tfc_scorer

    n = len(offsets) - 1
    lens = np.diff(offsets)
    avg = lens.mean()
    bounds = [0]
    while bounds[-1] < n:  # doc ranges of about chunk_tokens tokens
        nxt = int(np.searchsorted(offsets, offsets[bounds[-1]] + chunk_tokens, side="right")) - 1
        bounds.append(min(n, max(nxt, bounds[-1] + 1)))

    def postings(lo: int, hi: int):
        """(doc, term, tf) of docs [lo, hi), ordered by doc then term."""
        t = tokens[offsets[lo] : offsets[hi]].astype(np.int64)
        d = np.repeat(np.arange(lo, hi, dtype=np.int64), lens[lo:hi])
        key, tf = np.unique(d * n_vocab + t, return_counts=True)
        return key // n_vocab, key % n_vocab, tf

    df = np.zeros(n_vocab, np.int64)
    for lo, hi in itertools.pairwise(bounds):
        df += np.bincount(postings(lo, hi)[1], minlength=n_vocab)
    idf_fn, tfc_fn = _select_idf_scorer(method), _select_tfc_scorer(method)
    idf = np.zeros(n_vocab, np.float32)
    for term in np.flatnonzero(df):
        idf[term] = idf_fn(int(df[term]), N=n)
    nonocc = None
    if method in ("bm25l", "bm25+"):
        nonocc = _build_nonoccurrence_array(dict(enumerate(df.tolist())), n, idf_fn, tfc_fn, avg, avg, k1, b, delta, "float32")
    indptr = np.zeros(n_vocab + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    data = np.empty(int(indptr[-1]), np.float32)
    indices = np.empty(int(indptr[-1]), np.int32)
    heads = indptr[:-1].copy()
    for lo, hi in itertools.pairwise(bounds):
        doc, term, tf = postings(lo, hi)
        score = idf[term] * tfc_fn(tf_array=tf.astype(np.float32), l_d=lens[doc], l_avg=avg, k1=k1, b=b, delta=delta)
        if nonocc is not None:
            score -= nonocc[term]
        order = np.argsort(term, kind="stable")  # by term, docs stay ascending within a term
        term = term[order]
        starts = np.flatnonzero(np.r_[True, term[1:] != term[:-1]])
        runs = np.diff(np.r_[starts, len(term)])
        pos = heads[term] + (np.arange(len(term)) - np.repeat(starts, runs))
        data[pos] = score[order]
        indices[pos] = doc[order]
        heads[term[starts]] += runs
    return {"data": data, "indices": indices, "indptr": indptr, "num_docs": n}, nonocc


@contextlib.contextmanager
def _naming_bad_file(where: Path):
    """bm25s names no file when an array is truncated: find the one that does not load."""
    try:
        yield
    except (ValueError, EOFError, OSError) as e:
        if getattr(e, "filename", None):
            raise
        for f in sorted(where.glob("*.npy")):
            try:
                np.load(f, mmap_mode="r")
            except (ValueError, EOFError, OSError) as bad:
                raise store.damaged(f, f"unreadable ({type(bad).__name__})") from None
        raise


class BM25Index(base.Index):
    name = "bm25"
    summary = "bm25s"
    flags = ("k1", "b", "stopwords", "bm25_method")
    index_flags = (
        base.Flag("k1", "BM25 term-frequency saturation.", float, default=0.9),
        base.Flag("b", "BM25 length normalization.", float, default=0.4),
        base.Flag("stopwords", "BM25 stopword list (bm25s: en, de, fr, …) or 'none'.", default="en"),
        base.Flag("bm25_method", "BM25 variant.", METHODS, default="lucene"),
    )

    def __init__(self, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en", method: str = "lucene"):
        if method not in METHODS:
            raise ValueError(f"BM25 method must be one of {', '.join(METHODS)}, got {method!r}")
        super().__init__()
        self.k1, self.b, self.stopwords, self.method = float(k1), float(b), stopwords or None, method
        self._dir: Path | None = None
        self._clear()

    def config(self) -> dict:
        return {"k1": self.k1, "b": self.b, "stopwords": self.stopwords, "method": self.method}

    @classmethod
    def create(cls, encoder=None, *, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en",
               bm25_method: str = "lucene") -> BM25Index:
        return cls(k1=k1, b=b, stopwords=None if stopwords in (None, "", "none") else stopwords, method=bm25_method)

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        s = manifest.get("settings", {})
        return f"bm25s-{s.get('method')}-k1={s.get('k1')}-b={s.get('b')}-sw={s.get('stopwords') or 'none'}"

    def describe(self) -> str:
        return f"{len(self)} docs, {self.variant()}"

    def variant(self) -> str:
        return (f"bm25s {self.method}, k1={self.k1}, b={self.b}; flat doc = title + ' ' + text; "
                f"lower-case \\w\\w+ tokens; stopwords {self.stopwords or 'none'}; no stemming")

    def _clear(self) -> None:
        bm25s = _bm25s()
        super()._clear()
        self._invalidate()
        self.tokenizer = bm25s.tokenization.Tokenizer(stopwords=self.stopwords or [], stemmer=None)
        self.tokenizer.word_to_id = {"": 0}
        self._tokens = np.zeros(0, np.int32)
        self._offsets = np.zeros(1, np.int64)
        self._new: list[tuple[np.ndarray, np.ndarray]] = []  # (flat tokens, lengths) of appended docs
        self.retriever = None
        self._dirty = False

    # ------------------------------------------------------------ tokens

    def _load_tokens(self) -> None:
        if self._dir is not None:  # opened from disk: token arrays are read only when an update needs them
            with base.reading(self._dir / "tokens.npy"):
                self._tokens = np.load(self._dir / "tokens.npy")
            with base.reading(self._dir / "offsets.npy"):
                self._offsets = np.load(self._dir / "offsets.npy")
            if len(self._offsets) != len(self.docids) + 1 or (len(self._offsets) and self._offsets[-1] != len(self._tokens)):
                raise store.damaged(self._dir / "tokens.npy", "token arrays do not match the doc ids")
            self._dir = None

    def _tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = list(self.tokenizer.streaming_tokenize(texts, update_vocab=True))
        lens = np.fromiter(map(len, ids), np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lens.sum()))
        return flat, lens

    def sync(self, docs: Iterable[dict], delete: bool = True) -> dict:
        self._load_tokens()
        stats, seen, dead = base.new_stats(), set(), []
        for chunk in records.batched(self._classify(docs, seen, stats), 4096):
            self._new.append(self._tokenize([records.passage_text(d) for d, _, _ in chunk]))
            dead += [pos for _, _, pos in chunk if pos is not None]  # a changed doc: old row out, new row appended
            self._append_ids([d["docid"] for d, _, _ in chunk], [h for _, h, _ in chunk])
            self._dirty = True
        removed = self._missing_rows(seen) if delete else []
        stats["removed"] = len(removed)
        if dead or removed or self._dirty:
            self._reindex(dead + removed)
        return stats

    def remove(self, docids: Iterable[str]) -> int:
        rows = sorted({self._pos[d] for d in docids if d in self._pos})
        if rows:
            self._load_tokens()
            self._reindex(rows)
        return len(rows)

    def _reindex(self, drop: list[int]) -> None:
        """Fold appended docs in, drop rows, renumber the vocabulary, and let bm25s build the score matrix."""
        bm25s = _bm25s()
        self._invalidate()
        lens = np.concatenate([np.diff(self._offsets), *(n for _, n in self._new)])
        tokens = np.concatenate([self._tokens, *(t for t, _ in self._new)]) if self._new else self._tokens
        self._new = []
        if drop:
            keep = np.ones(len(lens), dtype=bool)
            keep[drop] = False
            tokens = tokens[np.repeat(keep, lens)]
            lens = lens[keep]
            self._keep_rows(keep)
        # vocabulary: the words still used, numbered in sorted order (same ids however the index was built)
        id_to_word = np.empty(max(self.tokenizer.word_to_id.values(), default=0) + 1, dtype=object)
        for w, i in self.tokenizer.word_to_id.items():
            id_to_word[i] = w
        counts = np.bincount(tokens, minlength=len(id_to_word))
        counts[self.tokenizer.word_to_id[""]] += 1  # the empty token always stays (bm25s scores empty docs with it)
        used = np.flatnonzero(counts)
        words = id_to_word[used]
        order = np.argsort(words.astype(str), kind="stable")
        remap = np.full(len(id_to_word), -1, np.int32)
        remap[used[order]] = np.arange(len(used), dtype=np.int32)
        if tokens is self._tokens:
            tokens = tokens.copy()
        np.take(remap, tokens, out=tokens)  # in place: no second copy of the token array
        self._tokens = tokens
        self._offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        self.tokenizer.word_to_id = {str(w): i for i, w in enumerate(words[order])}
        self._dirty = False
        if len(self) == 0:
            self.retriever = None
            return
        retriever = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        retriever.scores, retriever.nonoccurrence_array = score_matrix(
            self._tokens, self._offsets, len(self.tokenizer.word_to_id), k1=self.k1, b=self.b, method=self.method, delta=retriever.delta)
        retriever.vocab_dict = dict(self.tokenizer.word_to_id)
        retriever.unique_token_ids_set = set(retriever.vocab_dict.values())
        self.retriever = retriever

    # ------------------------------------------------------------ search

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """Top k docs per query that match at least one query term (Lucene semantics), ties by docid."""
        if self._dirty:
            self._reindex([])
        out: dict[str, list[tuple[str, float]]] = {}
        key = self._order_key() if self.retriever is not None else None
        for q, scores in zip(queries, self._scores(queries), strict=True):
            if scores is None:
                out[q["query_id"]] = []
                continue
            rows = base.top_k(scores, key, k)
            rows = rows[scores[rows] > 0]
            out[q["query_id"]] = [(self.docids[r], float(scores[r])) for r in rows]
        return out

    def score(self, query: dict, docids: Iterable[str]) -> dict[str, float]:
        """The BM25 score search computes for each given doc: 0.0 where no query term occurs (search leaves
        those out); docs not in the index left out."""
        if self._dirty:
            self._reindex([])
        rows = {d: self._pos[d] for d in docids if d in self._pos}
        if not rows:
            return {}
        scores = next(self._scores([query]))
        return {d: 0.0 if scores is None else float(scores[r]) for d, r in rows.items()}

    def _scores(self, queries: list[dict]) -> Iterator[np.ndarray | None]:
        """Every row's score, one query at a time (bm25s's score of the query's known terms); None: no known term."""
        empty = self.tokenizer.word_to_id.get("")
        for ids in self.tokenizer.streaming_tokenize([q["query_text"] for q in queries], update_vocab=False):
            ids = [i for i in ids if i != empty]
            yield self.retriever.get_scores_from_ids(ids) if ids and self.retriever is not None else None

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        return {"backend": self.name, "settings": self.config(), "variant": self.variant(), "doc_count": len(self),
                "vocab_size": len(self.tokenizer.word_to_id),
                "files": {"bm25s": "bm25s", "tokens": "tokens.npy", "offsets": "offsets.npy", "docids": base.DOCIDS},
                **self.meta}

    def save(self, directory: str | Path, keep: int = base.KEEP) -> None:
        """Publish this index as a new version of ``directory`` (see retrctl.indexes.store)."""
        self._load_tokens()
        if self._dirty:
            self._reindex([])
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    def write_files(self, directory: Path) -> None:
        """Write the complete index files into the empty ``directory`` (one version)."""
        import json

        self._load_tokens()
        if self._dirty:
            self._reindex([])
        if self.retriever is not None:
            self.retriever.save(str(directory / "bm25s"), show_progress=False)
        else:
            (directory / "bm25s").mkdir()
            (directory / "bm25s" / "vocab.index.json").write_text(json.dumps(self.tokenizer.word_to_id))
        np.save(directory / "tokens.npy", self._tokens)
        np.save(directory / "offsets.npy", self._offsets)
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, self.manifest())

    @classmethod
    def load(cls, directory: str | Path, **_ignored) -> BM25Index:
        import json

        bm25s = _bm25s()
        version = store.resolved(directory)
        directory, manifest = version.path, version.manifest
        idx = cls(**manifest["settings"])
        idx.meta = {k: manifest[k] for k in ("source", "shard") if k in manifest}
        docids, hashes = base.read_docids(directory)
        idx._set_ids(docids, hashes)
        where = directory / "bm25s"
        if docids:
            with base.reading(where), _naming_bad_file(where):
                idx.retriever = bm25s.BM25.load(str(where), mmap=True, show_progress=False, verbosity=0)
            idx.tokenizer.word_to_id = dict(idx.retriever.vocab_dict)
            if idx.retriever.scores.get("num_docs") != len(docids):
                raise store.damaged(where, f"{idx.retriever.scores.get('num_docs')} docs but {base.DOCIDS} has {len(docids)} ids")
        else:
            with base.reading(where / "vocab.index.json"):
                idx.tokenizer.word_to_id = json.loads((where / "vocab.index.json").read_text())
        for name in ("tokens.npy", "offsets.npy"):  # read on an update only, but a missing one is damage now
            if not (directory / name).is_file():
                raise store.damaged(directory / name, "missing")
        idx._dir = directory
        idx.version = version
        return idx

    @classmethod
    def merge(cls, parts: list[BM25Index]) -> BM25Index:
        first = parts[0]
        if any(p.config() != first.config() for p in parts):
            raise ValueError("cannot merge BM25 indexes with different settings")
        out = cls(**first.config())
        vocab: dict[str, int] = {"": 0}
        docids, hashes, toks, lens = [], [], [], []
        for p in parts:
            p._load_tokens()
            if p._dirty:
                p._reindex([])
            remap = np.empty(max(p.tokenizer.word_to_id.values(), default=0) + 1, np.int32)
            for w, i in p.tokenizer.word_to_id.items():
                remap[i] = vocab.setdefault(w, len(vocab))
            toks.append(remap[p._tokens] if len(p._tokens) else p._tokens)
            lens.append(np.diff(p._offsets))
            docids += p.docids
            hashes += p._hash
        out._set_ids(docids, hashes)
        out.tokenizer.word_to_id = vocab
        out._tokens = np.concatenate(toks)
        out._offsets = np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int64)
        out._reindex([])
        return out

"""BM25's store: each doc's tokens, row-aligned with the owning index's docs, and bm25s's score matrix over them.

One store serves both places BM25 lives: the ``bm25`` backend (indexes/bm25.py, the store alone) and the ``bm25``
head of a multi-head dense index (indexes/heads/bm25.py, beside the faiss store), so a head built from the same docs
scores exactly as the backend does.

A row is a doc's token ids (bm25s's tokenizer: lower-case, split as ``settings["tokens"]`` says (bm25_tokens.py),
the stopword list, no stemming; a doc with no token gets bm25s's empty token) in this store's vocabulary. Rows are per-doc counts only; the statistics
that couple docs (document frequencies, N, the average length) are never stored per row: ``finish`` recomputes
them from the rows after any change (append, replace, remove, merge), renumbering the vocabulary in sorted word
order, so an updated or merged store is identical to one built fresh from the same docs.

Unlike the other stores, this one is fed the docs' texts (``reads_text``), not columns of the encoded row: the
tokens are cheap and deterministic, so a resumed build re-tokenizes a chunk whose encoder rows came from a
checkpoint, and a doc's row has no fixed width to pad. Rows from ``rows`` are valid until the next ``finish``.

Memory: docs are tokenized as they stream in (``Tokenizer.streaming_tokenize``) into one flat int32 array plus
offsets — the JSON records are never held. The score matrix bm25s searches is assembled from that array in doc
chunks with numpy (``score_matrix``: bm25s's own tf/idf functions, arrays identical to ``BM25.index``'s), because
bm25s's builder wants per-doc Python lists and sorts 36 bytes per posting; so peak memory is the token array plus
the matrix, growing with the index and not with the corpus text.

Files (in the directory ``write`` is given): ``bm25s/`` (bm25s's own save: the score matrix and vocabulary, read
memory-mapped), ``tokens.npy``/``offsets.npy`` (the rows, read only when the store changes).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from retrctl.indexes import base, bm25_tokens, store

log = logging.getLogger("retrctl.index")
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
FILES = {"bm25s": "bm25s", "tokens": "tokens.npy", "offsets": "offsets.npy"}


def _bm25s():
    """bm25s, imported on first use, without two of its import's effects: it sets its logger to DEBUG (stderr is for
    our logs), and where JAX is installed it imports JAX and runs a top-k with it, which on a GPU machine makes JAX
    take three quarters of the GPU's memory (its default preallocation) for a selection retrctl never calls: the
    store scores with ``get_scores_from_ids`` and selects with numpy. So bm25s is imported with ``jax`` blocked
    (its selection then falls back to numpy), unless JAX is loaded already; ``jax`` imports as before afterwards."""
    if "bm25s" not in sys.modules and "jax" not in sys.modules:
        sys.modules["jax"] = None  # `import jax` raises ImportError, which bm25s catches
        try:
            import bm25s
        finally:
            del sys.modules["jax"]
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
    _bm25s()
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


class BM25Store:
    """BM25 over the docs' token rows; ``settings`` (k1, b, stopwords, method, tokens) are the variant. ``tokens``
    defaults to ``words``, what a store written before the setting existed was split with."""

    reads_text = True  # fed the docs' texts, not columns of an encoded row (retrctl/indexes/encoded.py)
    width = 0
    knobs = ()

    def __init__(self, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en", method: str = "lucene",
                 tokens: str = "words"):
        if method not in METHODS:
            raise ValueError(f"BM25 method must be one of {', '.join(METHODS)}, got {method!r}")
        self.k1, self.b, self.stopwords, self.method = float(k1), float(b), stopwords or None, method
        self.tokens = tokens
        bm25s = _bm25s()
        self.tokenizer = bm25s.tokenization.Tokenizer(splitter=bm25_tokens.splitter(tokens),
                                                      stopwords=self.stopwords or [], stemmer=None)
        self.tokenizer.word_to_id = {"": 0}
        self._tokens = np.zeros(0, np.int32)
        self._offsets = np.zeros(1, np.int64)
        self._new: list[tuple[np.ndarray, np.ndarray]] = []  # (flat tokens, lengths) of appended docs
        self.retriever = None
        self._dirty = False
        self._dir: Path | None = None  # opened from disk: the token arrays are read only when the rows change
        self._dir_docs = 0

    def settings(self) -> dict:
        return {"k1": self.k1, "b": self.b, "stopwords": self.stopwords, "method": self.method, "tokens": self.tokens}

    def variant(self) -> str:
        split = ("" if self.tokens == "words" else
                 ", Brahmic vowel signs inside words, CJK, Thai, Lao, Myanmar and Khmer as character unigrams and bigrams")
        return (f"bm25s {self.method}, k1={self.k1}, b={self.b}; flat doc = title + ' ' + text; "
                f"lower-case \\w\\w+ tokens{split}; stopwords {self.stopwords or 'none'}; no stemming")

    # ------------------------------------------------------------ rows

    def rows(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids in this store's vocabulary (grown as needed)."""
        return [np.asarray(ids, np.int32) for ids in self.tokenizer.streaming_tokenize(texts, update_vocab=True)]

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' token ids as one flat array and the lengths: ``rows`` without a Python array per doc."""
        ids = list(self.tokenizer.streaming_tokenize(texts, update_vocab=True))
        lens = np.fromiter(map(len, ids), np.int64, count=len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lens.sum())), lens

    def append(self, rows: list[np.ndarray]) -> None:
        lens = np.fromiter(map(len, rows), np.int64, count=len(rows))
        self.append_flat(np.concatenate(rows) if rows else np.zeros(0, np.int32), lens)

    def append_flat(self, tokens: np.ndarray, lens: np.ndarray) -> None:
        self._new.append((tokens.astype(np.int32, copy=False), lens))
        self._dirty = True

    def apply(self, replaced: dict[int, np.ndarray], removed: list[int], n: int | None = None) -> None:
        """Replace the rows at ``replaced``'s positions and drop the ``removed`` ones (positions before either)."""
        if not replaced and not removed:
            return
        tokens, lens = self._folded()
        if replaced:
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
            extra = [np.asarray(r, np.int32) for r in replaced.values()]
            at = len(tokens) + np.concatenate([[0], np.cumsum([len(r) for r in extra])[:-1]]).astype(np.int64)
            pos = np.fromiter(replaced, np.int64, count=len(replaced))
            starts[pos] = at
            lens = lens.copy()
            lens[pos] = [len(r) for r in extra]
            tokens = _gather(np.concatenate([tokens, *extra]), starts, lens)
        if removed:
            keep = np.ones(len(lens), dtype=bool)
            keep[removed] = False
            tokens, lens = tokens[np.repeat(keep, lens)], lens[keep]
        self._tokens, self._offsets = tokens, _offsets(lens)
        self._dirty = True

    def finish(self) -> None:
        """Recompute the statistics and the score matrix from the rows, if they changed."""
        if self._dirty:
            self._reindex()

    def _load_tokens(self) -> None:
        if self._dir is None:
            return
        with base.reading(self._dir / FILES["tokens"]):
            self._tokens = np.load(self._dir / FILES["tokens"])
        with base.reading(self._dir / FILES["offsets"]):
            self._offsets = np.load(self._dir / FILES["offsets"])
        if len(self._offsets) != self._dir_docs + 1 or (len(self._offsets) and self._offsets[-1] != len(self._tokens)):
            raise store.damaged(self._dir / FILES["tokens"], "token arrays do not match the doc ids")
        self._dir = None

    def _folded(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row, appended ones folded in: (flat tokens, lengths)."""
        self._load_tokens()
        lens = np.concatenate([np.diff(self._offsets), *(n for _, n in self._new)])
        tokens = np.concatenate([self._tokens, *(t for t, _ in self._new)]) if self._new else self._tokens
        self._new = []
        return tokens, lens

    def _reindex(self) -> None:
        """Renumber the vocabulary (the words still used, in sorted order: the same ids however the rows came) and
        let bm25s's functions build the score matrix."""
        bm25s = _bm25s()
        tokens, lens = self._folded()
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
        self._tokens, self._offsets = tokens, _offsets(lens)
        self.tokenizer.word_to_id = {str(w): i for i, w in enumerate(words[order])}
        self._dirty = False
        if len(lens) == 0:
            self.retriever = None
            return
        retriever = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        retriever.scores, retriever.nonoccurrence_array = score_matrix(
            self._tokens, self._offsets, len(self.tokenizer.word_to_id), k1=self.k1, b=self.b, method=self.method,
            delta=retriever.delta)
        retriever.vocab_dict = dict(self.tokenizer.word_to_id)
        retriever.unique_token_ids_set = set(retriever.vocab_dict.values())
        self.retriever = retriever

    # ------------------------------------------------------------ scoring

    def scores(self, texts: list[str]) -> Iterator[np.ndarray | None]:
        """Every row's score, one query at a time (bm25s's score of the query's known terms); None: no known term."""
        self.finish()
        empty = self.tokenizer.word_to_id.get("")
        for ids in self.tokenizer.streaming_tokenize(texts, update_vocab=False):
            ids = [i for i in ids if i != empty]
            yield self.retriever.get_scores_from_ids(ids) if ids and self.retriever is not None else None

    def search(self, texts: list[str], k: int, key: np.ndarray, docids: list[str]) -> list[list[tuple[str, float]]]:
        """Each query's top k docs that match at least one query term (Lucene's semantics), ties by ``key``."""
        out = []
        for scores in self.scores(texts):
            if scores is None:
                out.append([])
                continue
            rows = base.top_k(scores, key, k)
            rows = rows[scores[rows] > 0]
            out.append([(docids[r], float(scores[r])) for r in rows])
        return out

    def scores_at(self, text: str, rows: np.ndarray) -> np.ndarray:
        """One query's scores of the rows at ``rows`` (0.0 where no query term occurs)."""
        scores = next(self.scores([text]))
        return np.zeros(len(rows), np.float32) if scores is None else scores[rows]

    # ------------------------------------------------------------ files

    def write(self, directory: Path, n: int | None = None) -> None:
        """The score matrix (bm25s's save), the vocabulary and the token rows into ``directory`` (created)."""
        self._load_tokens()
        self.finish()
        directory.mkdir(parents=True, exist_ok=True)
        if self.retriever is not None:
            self.retriever.save(str(directory / FILES["bm25s"]), show_progress=False)
        else:
            (directory / FILES["bm25s"]).mkdir()
            (directory / FILES["bm25s"] / "vocab.index.json").write_text(json.dumps(self.tokenizer.word_to_id))
        np.save(directory / FILES["tokens"], self._tokens)
        np.save(directory / FILES["offsets"], self._offsets)

    @classmethod
    def read(cls, directory: Path, settings: dict, n_docs: int) -> BM25Store:
        """A store written by ``write`` holding ``n_docs`` rows: the score matrix memory-mapped, the rows left on
        disk until they change (a missing file is damage now)."""
        bm25s = _bm25s()
        out = cls(**settings)
        where = directory / FILES["bm25s"]
        if n_docs:
            with base.reading(where), _naming_bad_file(where):
                out.retriever = bm25s.BM25.load(str(where), mmap=True, show_progress=False, verbosity=0)
            out.tokenizer.word_to_id = dict(out.retriever.vocab_dict)
            if out.retriever.scores.get("num_docs") != n_docs:
                raise store.damaged(where, f"{out.retriever.scores.get('num_docs')} docs but {base.DOCIDS} has {n_docs} ids")
        else:
            with base.reading(where / "vocab.index.json"):
                out.tokenizer.word_to_id = json.loads((where / "vocab.index.json").read_text())
        for name in (FILES["tokens"], FILES["offsets"]):
            if not (directory / name).is_file():
                raise store.damaged(directory / name, "missing")
        out._dir, out._dir_docs = directory, n_docs
        return out

    @classmethod
    def joined(cls, stores: list[BM25Store], counts: list[int] | None = None) -> BM25Store:
        """The rows of ``stores``, in order, in one vocabulary; statistics recomputed over the union."""
        first = stores[0]
        if any(s.settings() != first.settings() for s in stores):
            raise ValueError("cannot merge BM25 indexes with different settings")
        out = cls(**first.settings())
        vocab: dict[str, int] = {"": 0}
        toks, lens = [], []
        for s in stores:
            tokens, n = s._folded()
            s._tokens, s._offsets = tokens, _offsets(n)
            remap = np.empty(max(s.tokenizer.word_to_id.values(), default=0) + 1, np.int32)
            for w, i in s.tokenizer.word_to_id.items():
                remap[i] = vocab.setdefault(w, len(vocab))
            toks.append(remap[tokens] if len(tokens) else tokens)
            lens.append(n)
        out.tokenizer.word_to_id = vocab
        out.append_flat(np.concatenate(toks), np.concatenate(lens))
        out.finish()
        return out

    def manifest(self) -> dict:
        return {"settings": self.settings(), "variant": self.variant(), "vocab_size": len(self.tokenizer.word_to_id)}


def _offsets(lens: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def _gather(source: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The segments ``source[starts[i] : starts[i] + lens[i]]``, concatenated."""
    out_starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return source[np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - out_starts, lens)]

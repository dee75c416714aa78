"""BM25 index built and scored by bm25s (Lù 2024, arXiv:2407.03618).

BM25: Robertson & Zaragoza 2009; the default variant is Lucene's (Kamphuis et al. 2020, ECIR, "Which BM25
do you mean?"), with k1=0.9, b=0.4 — Pyserini's BEIR "flat" setting: one field, title + " " + text.
Tokens: bm25s's tokenizer (lower-case, ``\\w\\w+``), English stopwords by default, no stemming. This is the
setting of the reference in shared/data/README.md (SciFact nDCG@10 0.6569). ``--bm25-tokens multilingual`` (the
default) splits the scripts written without spaces into characters and their pairs and keeps Brahmic vowel signs
inside words (bm25_tokens.py); on text in other scripts its tokens are ``words``'s. The whole variant is written into
``index.json`` (BM25 numbers are only comparable with the variant named, beir#197, pyserini#1211).

The index is one ``bm25_store.BM25Store`` (the tokens, the statistics and bm25s's score matrix; memory as that
module describes) over the doc ids; a multi-head dense index holds the same store as its ``bm25`` head. The token
arrays are saved (``tokens.npy``, ``offsets.npy``): an update tokenizes only new or changed docs and recomputes the
statistics (idf, average length) from the stored tokens, so an updated index is identical to a fresh build. The
vocabulary is re-numbered in sorted word order at every build, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.indexes import base, store
from retrctl.indexes.bm25_store import FILES, METHODS, BM25Store, score_matrix
from retrctl.indexes.bm25_tokens import TOKENS

__all__ = ["METHODS", "BM25Index", "score_matrix"]

INDEX_FLAGS = (
    base.Flag("k1", "BM25 term-frequency saturation.", float, default=0.9),
    base.Flag("b", "BM25 length normalization.", float, default=0.4),
    base.Flag("stopwords", "BM25 stopword list (bm25s: en, de, fr, …) or 'none'.", default="en"),
    base.Flag("bm25_method", "BM25 variant.", METHODS, default="lucene"),
    base.Flag("bm25_tokens", "BM25 tokens: words (bm25s's \\w\\w+) or multilingual (the same, and Chinese, Japanese, "
              "Korean, Thai, Lao, Myanmar, Khmer as characters and character pairs; Brahmic vowel signs kept in "
              "words). [default: multilingual; an update keeps the index's]", TOKENS),
)


def bm25_settings(k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en", bm25_method: str = "lucene",
                  bm25_tokens: str | None = None) -> dict:
    """`index`'s BM25 flags as a store's settings ('none' or '' = no stopword list; no tokens: multilingual)."""
    return {"k1": k1, "b": b, "stopwords": None if stopwords in (None, "", "none") else stopwords, "method": bm25_method,
            "tokens": bm25_tokens or "multilingual"}


def held_settings(settings: dict) -> dict:
    """BM25 settings as a manifest holds them: one written before --bm25-tokens existed split with words."""
    return {"tokens": "words", **settings}


def keep_tokens(options: dict, held: dict) -> dict:
    """`index`'s options for an update of an index holding the BM25 settings ``held``: without --bm25-tokens its
    tokens are kept, so a cron job's re-index rebuilds nothing."""
    return options if options.get("bm25_tokens") is not None else {**options, "bm25_tokens": held_settings(held)["tokens"]}


class BM25Index(base.Index):
    name = "bm25"
    summary = "bm25s"
    flags = ("k1", "b", "stopwords", "bm25_method", "bm25_tokens")
    index_flags = INDEX_FLAGS

    def __init__(self, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en", method: str = "lucene",
                 tokens: str = "words"):
        self.terms = BM25Store(k1, b, stopwords, method, tokens)  # checks the method and the tokens
        super().__init__()
        self.k1, self.b, self.stopwords, self.method = self.terms.k1, self.terms.b, self.terms.stopwords, method
        self._clear()

    def config(self) -> dict:
        return self.terms.settings()

    @classmethod
    def create(cls, encoder=None, *, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en",
               bm25_method: str = "lucene", bm25_tokens: str | None = None) -> BM25Index:
        return cls(**bm25_settings(k1, b, stopwords, bm25_method, bm25_tokens))

    @classmethod
    def update_options(cls, manifest: dict, options: dict) -> dict:
        return keep_tokens(options, manifest.get("settings", {}))

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        return held_settings(manifest.get("settings", {}))

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        s = manifest.get("settings", {})
        return (f"bm25s-{s.get('method')}-k1={s.get('k1')}-b={s.get('b')}-sw={s.get('stopwords') or 'none'}"
                f"-tokens={s.get('tokens', 'words')}")

    def describe(self) -> str:
        return f"{len(self)} docs, {self.variant()}"

    def variant(self) -> str:
        return self.terms.variant()

    def _clear(self) -> None:
        super()._clear()
        self._invalidate()
        self.terms = BM25Store(**self.terms.settings())

    # the store's parts, as the backend's (tests compare them with bm25s's own build)
    @property
    def tokenizer(self):
        return self.terms.tokenizer

    @property
    def retriever(self):
        return self.terms.retriever

    @property
    def _tokens(self):
        return self.terms._tokens

    @property
    def _offsets(self):
        return self.terms._offsets

    # ------------------------------------------------------------ updates

    def sync(self, docs: Iterable[dict], delete: bool = True) -> dict:
        stats, seen, dead = base.new_stats(), set(), []
        changed = False
        for chunk in records.batched(self._classify(docs, seen, stats), 4096):
            self.terms.append_flat(*self.terms.tokenize([records.passage_text(d) for d, _, _ in chunk]))
            dead += [pos for _, _, pos in chunk if pos is not None]  # a changed doc: old row out, new row appended
            self._append_ids([d["docid"] for d, _, _ in chunk], [h for _, h, _ in chunk])
            changed = True
        removed = self._missing_rows(seen) if delete else []
        stats["removed"] = len(removed)
        self._drop(dead + removed)
        if changed or removed:
            self._invalidate()
        self.terms.finish()
        return stats

    def remove(self, docids: Iterable[str]) -> int:
        rows = sorted({self._pos[d] for d in docids if d in self._pos})
        self._drop(rows)
        self.terms.finish()
        return len(rows)

    def _drop(self, rows: list[int]) -> None:
        if not rows:
            return
        self._invalidate()
        keep = np.ones(len(self), dtype=bool)
        keep[rows] = False
        self.terms.apply({}, rows, len(self))
        self._keep_rows(keep)

    # ------------------------------------------------------------ search

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """Top k docs per query that match at least one query term (Lucene semantics), ties by docid."""
        self.terms.finish()
        key = self.order_key() if self.terms.retriever is not None else None
        found = self.terms.search([q["query_text"] for q in queries], k, key, self.docids)
        return {q["query_id"]: hits for q, hits in zip(queries, found, strict=True)}

    def score(self, query: dict, docids: Iterable[str]) -> dict[str, float]:
        """The BM25 score search computes for each given doc: 0.0 where no query term occurs (search leaves
        those out); docs not in the index left out."""
        rows = {d: self._pos[d] for d in docids if d in self._pos}
        if not rows:
            return {}
        scores = self.terms.scores_at(query["query_text"], np.fromiter(rows.values(), np.int64, count=len(rows)))
        return {d: float(s) for d, s in zip(rows, scores, strict=True)}

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        return {"backend": self.name, "settings": self.config(), "variant": self.variant(), "doc_count": len(self),
                "vocab_size": len(self.tokenizer.word_to_id), "files": {**FILES, "docids": base.DOCIDS},
                **self.meta}

    def save(self, directory: str | Path, keep: int = base.KEEP) -> None:
        """Publish this index as a new version of ``directory`` (see retrctl.indexes.store)."""
        self.terms.finish()
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    def write_files(self, directory: Path) -> None:
        """Write the complete index files into the empty ``directory`` (one version)."""
        self.terms.write(directory)
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, self.manifest())

    @classmethod
    def load(cls, directory: str | Path, **_ignored) -> BM25Index:
        version = store.resolved(directory)
        directory, manifest = version.path, version.manifest
        idx = cls(**manifest["settings"])
        idx.meta = {k: manifest[k] for k in ("source", "shard") if k in manifest}
        docids, hashes = base.read_docids(directory)
        idx._set_ids(docids, hashes)
        idx.terms = BM25Store.read(directory, idx.terms.settings(), len(docids))
        idx.version = version
        return idx

    @classmethod
    def merge(cls, parts: list[BM25Index]) -> BM25Index:
        first = parts[0]
        if any(p.config() != first.config() for p in parts):
            raise ValueError("cannot merge BM25 indexes with different settings")
        out = cls(**first.config())
        out._set_ids([d for p in parts for d in p.docids], [h for p in parts for h in p._hash])
        out.terms = BM25Store.joined([p.terms for p in parts])
        return out

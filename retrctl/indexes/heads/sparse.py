"""The sparse head: each doc's top-k (term, weight) pairs from the model's sparse head — SPLADE's, or BGE-M3's
lexical one — in a ``sparse.SparseRowStore`` (the sparse backend's store), searched exactly or with Seismic.

Its manifest section keeps what its query side needs without the model's head: the vocabulary size, the special
tokens and the query mode (LightRetriever's token counts come from the tokenizer alone), plus the kept terms' count,
the nonzeros and its files. ``settings.top_k`` is recorded in every multi-head index (null without this head), as
indexes written before the head registry did.
"""

from __future__ import annotations

import numpy as np

from retrctl.errors import UsageError
from retrctl.indexes.base import as_run
from retrctl.indexes.heads.base import Head
from retrctl.indexes.sparse import KNOBS, SEARCH_FLAGS, SPARSE_TOP_K, SparseRowStore, pack


def index_top_k(sp, top_k: int | None) -> int:
    """Terms kept per doc: ``--sparse-top-k``, else the head's; a lexical head keeping all (0) weighs only the doc's
    own tokens, so the longer length cap keeps every one; SPLADE's expansion over the vocabulary needs a cut."""
    k = top_k or sp.top_k
    if not k and sp.weights == "lexical":
        k = max(sp.config.query_max_len, sp.config.passage_max_len)
    if not k:
        raise UsageError("a sparse index keeps each doc's top-k terms: give --sparse-top-k N")
    return k


class SparseHead(Head):
    name = "sparse"
    backend = "sparse"
    index_flags = (SPARSE_TOP_K,)
    search_flags = SEARCH_FLAGS
    knobs = KNOBS
    encoded = True
    model_attr = "sparse"
    train_hint = "dense,sparse"
    rank_weight = 0.3  # BGE-M3's s_rank weight (arXiv:2402.03216, §4)
    unset = {"top_k": None}

    def __init__(self, encoder, settings: dict):
        self.top_k, self.desc = settings.get("top_k"), None
        sp = getattr(encoder, "sparse", None)
        if sp is not None:
            sp.top_k = self.top_k = index_top_k(sp, self.top_k)
            self.desc = {"vocab": sp.vocab, "special_ids": sp.special_ids, "query": sp.query, "top_k": sp.top_k}

    @classmethod
    def settings_from(cls, options: dict) -> dict:
        return {"top_k": options.get("sparse_top_k")}

    def settings(self) -> dict:
        return {"top_k": self.top_k}

    @classmethod
    def content(cls, settings: dict) -> dict:
        return {"sparse_top_k": settings.get("top_k")}

    def new_store(self, idx) -> SparseRowStore:
        return SparseRowStore(self.top_k, (self.desc or {}).get("vocab"))

    def columns(self, out: dict) -> np.ndarray:
        return pack(*out["sparse"])

    def section(self, store: SparseRowStore) -> dict:
        return {**self.desc, "nonzeros": store.nonzeros(),
                "files": {"terms": "terms.npy", "weights": "weights.npy", **store.files}}

    def read(self, idx, directory, manifest: dict, n: int) -> SparseRowStore:
        section = manifest[self.name]
        self.desc = {k: v for k, v in section.items() if k not in ("files", "nonzeros")}
        return SparseRowStore.read(directory, section["files"], n, self.top_k, self.desc["vocab"])

    def describe(self, store) -> str:
        return f"sparse top-{self.top_k}, queries by {self.desc['query']}"

    # ------------------------------------------------------------ search

    def queries(self, idx, queries: list[dict]) -> np.ndarray:
        """The queries as packed sparse rows: token counts from the tokenizer, or the model's sparse head."""
        from retrctl.models.sparse import token_counts

        texts = [q["query_text"] for q in queries]
        if not self.encoded_queries(idx):  # the tokenizer alone: no model runs (any query encoder has one)
            return pack(*token_counts(idx.encoder.tokenizer, texts, idx.encoder.config.query_max_len,
                                      self.desc["special_ids"]))
        self.check_queries(idx)
        return pack(*idx.encoder.encode_sparse(texts, "query", idx.batch_size))

    def run(self, idx, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        return as_run(queries, idx.search_store(self.name, self.queries(idx, queries), k))

    def encoded_queries(self, idx) -> bool:
        return self.desc["query"] != "tokens"

    def query_parts(self, idx, queries: list[dict], out: dict) -> np.ndarray:
        return pack(*out["sparse"]) if self.encoded_queries(idx) else self.queries(idx, queries)

    def raw_scores(self, idx, part, rows: np.ndarray) -> np.ndarray:
        return idx.stores[self.name].dot(part, rows)

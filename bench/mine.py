"""Benchmark: how well `retrctl mine` finds positives and avoids false negatives on SciFact train queries.

Two questions, each answered with the judged qrels (qrels/train.tsv) held out from mining:

1. Recall of the judged positive among mined positives. Mine with positives = ranks 1..m only (no qrels, no
   source_docid): the judged positives found among them, as R@m (ir_measures/pytrec_eval over the mined positives),
   plus the precision of the mined positives (judged / mined).
2. False-negative rate among mined negatives. With qrels given to mine, every judged positive is excluded by id, so
   the rate is 0 by construction (shown as a check). To measure what the guards do, mine with the positive from
   rank 1 only (DRAMA-style, no qrels) and count the negatives that are judged positives of their query, without a
   guard and with the margin guards (relative 0.05 = NV-Retriever's TopK-PercPos 95%; absolute margin in the
   retriever's score units). "pool" rows use every eligible candidate of the range (no sampling noise), "sampled"
   rows the 7 negatives a training group gets. SciFact judges ~1.1 docs per query, so these rates are lower bounds.

The peer in the same run is the unguarded row (FlagEmbedding's range-only sampling, FlagEmbedding#850); the ratio
column is the guarded FN rate over the unguarded one. `--peer-st` also runs sentence-transformers'
mine_hard_negatives (needs the `datasets` package) on (query, judged positive) pairs with the same model, range,
relative margin and count, and reports its FN rate and time beside ours.

    python bench/mine.py --queries 100 --retrievers bm25            # small: ~10 s
    python bench/mine.py --retrievers bm25,minilm [--peer-st]       # full: all 809 train queries
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from _run import ROOT, machine  # also puts the checkout on sys.path

from retrctl import metrics, records
from retrctl.records import passage_text
from retrctl.retrievers import IndexRetriever, dense_index
from stages.mine import mine

MARGINS = {"bm25": 1.0, "minilm": 0.05}  # absolute margins in each retriever's score units (BM25 ~5-40, cosine)


class Memo:
    """Search each query once at the deepest depth used; every configuration reads from it."""

    def __init__(self, inner, depth):
        self.inner, self.depth, self.cache = inner, depth, {}

    def search(self, queries, k):
        todo = [q for q in queries if q["query_id"] not in self.cache]
        if todo:
            self.cache.update(self.inner.search(todo, self.depth))
        return {q["query_id"]: self.cache[q["query_id"]][:k] for q in queries}


def judged_in(groups, qrels, field="negative_document_ids"):
    hit = total = 0
    for g in groups:
        pos = {d for d, r in qrels.get(g["query_id"], {}).items() if r > 0}
        total += len(g[field])
        hit += sum(d in pos for d in g[field])
    return hit, total


def run(args):
    data = Path(args.data)
    qrels_all = records.read_qrels(data / "qrels" / "train.tsv")
    queries = [q for q in records.read(data, "query") if q["query_id"] in qrels_all][: args.queries]
    qrels = {q["query_id"]: qrels_all[q["query_id"]] for q in queries}
    corpus = records.read_corpus(data)
    recall_rows, fn_rows, peer_rows = [], [], []
    for name in args.retrievers.split(","):
        t0 = time.perf_counter()
        if name == "bm25":
            from retrctl.indexes.bm25 import BM25Index

            idx = BM25Index()
            idx.build({"docid": d, **doc} for d, doc in corpus.items())
        else:
            idx = dense_index(name, corpus, str(data / "corpus.jsonl"), batch_size=64)
        raw = IndexRetriever(idx)
        build_s = time.perf_counter() - t0
        memo = Memo(raw, 100)
        common = {"corpus": corpus, "source_positives": False, "top_k": 100, "seed": 0}
        for m in (1, 10):
            groups = list(mine(queries, retriever=memo, positive_ranks=m, negative_range="30-100", **common))
            mined = {g["query_id"]: list(zip(g["positive_document_ids"], g["positive_scores"], strict=True)) for g in groups}
            r = metrics.evaluate(mined, qrels, [f"R@{m}"]).mean[f"R@{m}"]
            hit, total = judged_in(groups, qrels, "positive_document_ids")
            recall_rows.append((name, m, r, hit / max(total, 1), total / max(len(groups), 1)))
        guards = [("none", {}), ("relative 0.05", {"relative_margin": 0.05}),
                  (f"absolute {MARGINS.get(name, 0.05)}", {"margin": MARGINS.get(name, 0.05)})]
        for rng in ("2-30", "30-100"):
            base_pool = None
            for label, guard in guards:
                st_pool, st = {}, {}
                t1 = time.perf_counter()
                pool = list(mine(queries, retriever=memo, positive_ranks=1, negative_range=rng, num_negatives=10**6,
                                 stats=st_pool, **guard, **common))
                sampled = list(mine(queries, retriever=memo, positive_ranks=1, negative_range=rng, num_negatives=7,
                                    stats=st, **guard, **common))
                secs = time.perf_counter() - t1
                ph, pt = judged_in(pool, qrels)
                sh, stt = judged_in(sampled, qrels)
                if base_pool is None:
                    base_pool = (ph, pt)
                dropped = st_pool["skip_margin"] + st_pool["skip_relative_margin"]
                fn_rows.append((name, rng, label, len(sampled), stt / max(len(sampled), 1), st["short_groups"],
                                ph / max(pt, 1), sh / max(stt, 1), (ph / max(pt, 1)) / max(base_pool[0] / max(base_pool[1], 1), 1e-9),
                                dropped, base_pool[0] - ph, secs))
        # production setting: judged positives given to mine, excluded by id and text
        t1 = time.perf_counter()
        st = {}
        known = list(mine(queries, retriever=raw, qrels=qrels, negative_range="30-100", relative_margin=0.05,
                          stats=st, **{k: v for k, v in common.items() if k != "source_positives"}))
        secs = time.perf_counter() - t1
        h, t = judged_in(known, qrels)
        fn_rows.append((name, "30-100", "qrels known + relative 0.05", len(known), t / max(len(known), 1),
                        st["short_groups"], float("nan"), h / max(t, 1), float("nan"), st["skip_relative_margin"], 0, secs))
        peer_rows.append((name, "retrctl mine (qrels known, relative 0.05)", h / max(t, 1), st["short_groups"], build_s + secs))
        if args.peer_st and name != "bm25":
            peer_rows.append(st_peer(name, queries, qrels, corpus))
    return recall_rows, fn_rows, peer_rows, len(queries)


def st_peer(name, queries, qrels, corpus):
    """sentence-transformers mine_hard_negatives on (query, judged positive) pairs: same model/range/margin/count."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from retrctl.models import resolve

    ids = list(corpus)
    texts = [passage_text(corpus[d]) for d in ids]
    by_text = {}
    for d, t in zip(ids, texts, strict=True):
        by_text.setdefault(t, set()).add(d)
    pairs = [(q["query_id"], q["query_text"], d) for q in queries for d, r in qrels[q["query_id"]].items() if r > 0 and d in corpus]
    ds = Dataset.from_dict({"query": [p[1] for p in pairs], "positive": [passage_text(corpus[p[2]]) for p in pairs]})
    t0 = time.perf_counter()
    model = SentenceTransformer(str(resolve(name)), device="cpu")
    out = mine_hard_negatives(ds, model, corpus=texts, range_min=29, range_max=100, relative_margin=0.05, num_negatives=7,
                              sampling_strategy="random", output_format="n-tuple", batch_size=64, verbose=False)
    secs = time.perf_counter() - t0
    qid_of = {}
    for qid, text, _ in pairs:
        qid_of.setdefault(text, qid)
    hit = total = 0
    short = 0
    for row in out:
        pos = {d for d, r in qrels[qid_of[row["query"]]].items() if r > 0}
        negs = [row[k] for k in row if k.startswith("negative")]
        short += len(negs) < 7
        total += len(negs)
        hit += sum(bool(by_text.get(n, set()) & pos) for n in negs)
    return (name, "sentence-transformers mine_hard_negatives (same settings)", hit / max(total, 1),
            f"{len(pairs) - len(out)} rows dropped", secs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    ap.add_argument("--queries", type=int, default=None, help="first N train queries (default: all 809)")
    ap.add_argument("--retrievers", default="bm25,minilm")
    ap.add_argument("--peer-st", action="store_true", help="also run sentence-transformers' mine_hard_negatives")
    ap.add_argument("--fresh-cache", action="store_true", help="use an empty RETRCTL_CACHE (time corpus encoding)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.fresh_cache:
        os.environ["RETRCTL_CACHE"] = tempfile.mkdtemp(prefix="retrctl-bench-")
    t0 = time.perf_counter()
    recall_rows, fn_rows, peer_rows, n = run(args)
    out = [f"## mine on SciFact train ({n} queries, qrels/train.tsv held out unless stated)", "",
           f"machine: {machine()}; total {time.perf_counter() - t0:.1f} s", "",
           "### Recall of judged positives among mined positives (positives = ranks 1..m, no qrels given)", "",
           "| retriever | m | R@m (ir_measures) | precision of mined positives | positives/group |", "|---|---|---|---|---|"]
    out += [f"| {r} | {m} | {rec:.3f} | {p:.3f} | {pg:.1f} |" for r, m, rec, p, pg in recall_rows]
    out += ["", "### False negatives among mined negatives (positive = rank 1, judged positives NOT excluded, 7 negatives)", "",
            "| retriever | range | guard | groups | negatives/group | short groups | FN rate (pool) | FN rate (sampled 7) "
            "| pool FN vs unguarded | dropped by guard | judged positives dropped | s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fn_rows:
        out.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]} | {r[6]:.4f} | {r[7]:.4f} | {r[8]:.2f} | {r[9]} | {r[10]} | {r[11]:.1f} |")
    out += ["", "### Production setting vs peer (judged positives given, range 30-100, relative margin 0.05, 7 negatives)", "",
            "| retriever | tool | FN rate | short | s (incl. index build) |", "|---|---|---|---|---|"]
    out += [f"| {r[0]} | {r[1]} | {r[2]:.4f} | {r[3]} | {r[4]:.1f} |" for r in peer_rows]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

"""Reproduce published BEIR numbers with `retrctl index` / `search` / `eval`, and compare corpus encode speed
with sentence-transformers on the same model, docs and batch size, in the same process.

    .venv/bin/python bench/beir_retrieval.py                       # full: SciFact + ArguAna, ~15 min on 2 cores
    .venv/bin/python bench/beir_retrieval.py --max-docs 300 --throughput-docs 200   # smoke run, ~2 min

Targets: SciFact BM25 nDCG@10 0.665 (BEIR paper, Thakur et al. 2021; bm25s reference in shared/data/README.md
0.6569), minilm (all-MiniLM-L6-v2) 0.645 on SciFact and 0.502 on ArguAna (the sentence-transformers / MTEB
figures), ArguAna BM25 0.4111 (shared/data/README.md reference, query's own id removed). ArguAna runs use
`--remove-query`. With --max-docs the corpus is cut (judged docs first), so the targets do not apply.
Prints Markdown tables on stdout; the retrctl commands' logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _run import ROOT, machine, retrctl

# (dataset, retriever) -> (target nDCG@10, where the target comes from)
TARGETS = {
    ("scifact", "bm25"): (0.665, "BEIR paper; bm25s ref 0.6569"),
    ("scifact", "minilm"): (0.645, "sentence-transformers / MTEB"),
    ("arguana", "minilm"): (0.502, "sentence-transformers / MTEB"),
    ("arguana", "bm25"): (0.4111, "shared/data README (bm25s)"),
}
REMOVE_QUERY = {"arguana", "quora"}


def score(run: Path, data: Path) -> dict:
    """nDCG@10 and R@100 by `retrctl eval` (ir_measures directly if the eval stage is absent)."""
    if (ROOT / "stages" / "eval.py").exists():
        _, out, _ = retrctl("eval", run, "--qrels", data, "--keep-self", "--json", "-m", "nDCG@10", "-m", "R@100", "--quiet")
        row = json.loads(out.splitlines()[-1])
        return {"nDCG@10": row["nDCG@10"], "R@100": row["R@100"]}
    import ir_measures

    from retrctl import records

    qrels = records.read_qrels(data, "test")
    r = {q: dict(v) for q, v in records.read_run(run).items()}
    agg = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, ir_measures.R @ 100], qrels, r)
    return {"nDCG@10": agg[ir_measures.nDCG @ 10], "R@100": agg[ir_measures.R @ 100]}


def slice_dataset(data: Path, max_docs: int, work: Path) -> Path:
    """A BEIR folder with at most max_docs docs (judged test docs first) and the queries judged on them."""
    from retrctl import records

    qrels = records.read_qrels(data, "test")
    judged = {d for docs in qrels.values() for d in docs}
    docs = [d for d in records.read(data, "doc") if d["docid"] in judged][:max_docs]
    if len(docs) < max_docs:
        have = {d["docid"] for d in docs}
        docs += [d for d in records.read(data, "doc") if d["docid"] not in have][: max_docs - len(docs)]
    keep = {d["docid"] for d in docs}
    out = work / f"{data.name}-{max_docs}"
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    records.write(docs, out / "corpus.jsonl")
    queries = [q for q in records.read(data, "query") if q["query_id"] in qrels and set(qrels[q["query_id"]]) & keep]
    records.write(queries, out / "queries.jsonl")
    rows = [f"{q}\t{d}\t{r}" for q, ds in qrels.items() for d, r in ds.items() if q in {x["query_id"] for x in queries}]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return out


def retrieval(datasets: list[str], retrievers: list[str], data_dir: Path, work: Path, max_docs: int | None,
              batch_size: int, hits: int) -> list[str]:
    rows = ["| dataset | retriever | docs | nDCG@10 | target | Δ | within 0.01 | R@100 | index s | search s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in datasets:
        data = data_dir / name
        if max_docs:
            data = slice_dataset(data, max_docs, work)
        n_docs = sum(1 for _ in open(data / "corpus.jsonl"))
        for retriever in retrievers:
            if (name, retriever) not in TARGETS:
                continue
            idx, run = work / f"{data.name}-{retriever}", work / f"{data.name}-{retriever}.trec"
            how = ["--method", "bm25"] if retriever == "bm25" else ["--model", retriever, "--batch-size", batch_size]
            t_index, *_ = retrctl("index", data, *how, "-o", idx, "--quiet", "--rebuild")
            extra = ["--remove-query"] if name in REMOVE_QUERY else []
            t_search, *_ = retrctl("search", idx, data, "--hits", hits, *extra, "-o", run, "--quiet")
            m = score(run, data)
            target, source = TARGETS[(name, retriever)]
            delta = m["nDCG@10"] - target
            ok = "n/a (cut corpus)" if max_docs else ("yes" if abs(delta) <= 0.01 else "NO")
            rows.append(f"| {name} | {retriever} | {n_docs} | {m['nDCG@10']:.4f} | {target:.3f} ({source}) | {delta:+.4f} | {ok} "
                        f"| {m['R@100']:.4f} | {t_index:.1f} | {t_search:.1f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def throughput(data: Path, n: int, batch_size: int, repeats: int, model: str = "minilm", device: str = "cpu") -> list[str]:
    """Docs/s of retrctl's Encoder.encode and DenseIndex.build vs SentenceTransformer.encode, same process."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from retrctl import records
    from retrctl.indexes.dense import DenseIndex
    from retrctl.models import Encoder, resolve

    try:
        import faiss  # noqa: F401
    except ImportError:  # an encode-only machine: skip the index row
        DenseIndex = None  # noqa: N806
    docs = [d for _, d in zip(range(n), records.read(data, "doc"), strict=False)]
    texts = [records.passage_text(d) for d in docs]
    ours = Encoder.load(model, device=device)
    st = SentenceTransformer(str(resolve(model)), device=device)
    assert st.max_seq_length == ours.config.passage_max_len, (st.max_seq_length, ours.config.passage_max_len)
    ours.encode(texts[:batch_size], batch_size=batch_size)  # warm-up both
    st.encode(texts[:batch_size], batch_size=batch_size)

    # interleaved, best of N: background load on a shared machine hits both sides alike
    t_st = t_ours = t_index = float("inf")
    for _ in range(repeats):
        t_st = min(t_st, _timed(lambda: st.encode(texts, batch_size=batch_size, convert_to_numpy=True)))
        t_ours = min(t_ours, _timed(lambda: ours.encode(texts, batch_size=batch_size)))
        if DenseIndex is not None:
            t_index = min(t_index, _timed(lambda: DenseIndex(ours, batch_size=batch_size).build(docs)))
    vec_ours = ours.encode(texts[:64], batch_size=batch_size)
    vec_st = st.encode(texts[:64], batch_size=batch_size, convert_to_numpy=True)
    cos = float(np.min(np.sum(vec_ours * vec_st, axis=1) / np.linalg.norm(vec_ours, axis=1) / np.linalg.norm(vec_st, axis=1)))
    rate = lambda t: n / t  # noqa: E731
    return [
        f"Corpus encode, {Path(model).name} on {device}, {n} {data.name} docs (title + text, max {ours.config.passage_max_len} tokens), batch {batch_size}, "
        f"torch {torch.__version__} threads {torch.get_num_threads()}, best of {repeats}; min cosine retrctl vs ST {cos:.6f}",
        "",
        "| what | docs/s | sentence-transformers encode docs/s | ratio |",
        "|---|---|---|---|",
        f"| retrctl Encoder.encode | {rate(t_ours):.1f} | {rate(t_st):.1f} | {t_st / t_ours:.2f}x |",
    ] + ([f"| retrctl DenseIndex.build (encode + faiss Flat) | {rate(t_index):.1f} | {rate(t_st):.1f} | {t_st / t_index:.2f}x |"]
         if DenseIndex is not None else [])


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="scifact,arguana")
    p.add_argument("--retrievers", default="bm25,minilm")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--max-docs", type=int, help="cut each corpus to N docs (judged ones first): a smoke run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hits", type=int, default=100)
    p.add_argument("--throughput-docs", type=int, default=1000, help="docs for the encode comparison (0 = skip)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", default="minilm", help="encoder for the throughput comparison")
    p.add_argument("--device", default="cpu", help="device for the throughput comparison (cpu, cuda)")
    p.add_argument("--work", type=Path, help="where indexes and runs go (default: a temp dir)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="beir-bench-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        lines = [f"## BEIR retrieval with retrctl ({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}", ""]
        if a.retrievers:
            lines += retrieval(a.datasets.split(","), a.retrievers.split(","), a.data_dir, work, a.max_docs, a.batch_size, a.hits)
        if a.throughput_docs:
            lines += ["", *throughput(a.data_dir / a.datasets.split(",")[0], a.throughput_docs, a.batch_size, a.repeats, a.model, a.device)]
        lines += ["", f"Total {time.perf_counter() - t:.0f} s. Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

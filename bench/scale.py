"""How cost grows with corpus size: BM25 index + search time and peak memory; dense Flat vs HNSW32.

    .venv/bin/python bench/scale.py                                   # full: 10k/100k/1M docs, 100k/1M vectors
    .venv/bin/python bench/scale.py --sizes 10000 --dense-sizes 20000 --peer-max 10000   # smoke run, ~1 min

BM25: corpora of N docs whose title and 3–8 sentences are resampled (seeded) from SciFact, written as
.jsonl.zst; `retrctl index --method bm25` and `retrctl search --hits 100` (SciFact's 1,109 claims as queries)
run as child processes and their peak RSS is read from os.wait4's rusage (ru_maxrss of that child only).
The peer, in the same run, is the plain bm25s recipe that holds the texts: read all docs into a list,
`bm25s.tokenize(texts)`, `BM25().index(...)` (up to --peer-max docs). retrctl streams: docs are tokenized as
they are read into one int32 array, so its peak RSS tracks the index size, not the JSON.

Dense: N random unit 384-d vectors (seeded), 1,000 random unit queries, k=10. Flat (exact) vs HNSW32
(efConstruction 40, faiss's default) at several efSearch; recall@10 is measured against Flat's top 10. Through
retrctl's DenseIndex (`from_vectors` + `search_vectors`, i.e. including the docid tie-break). Random vectors
are HNSW's hard case (no low-dimensional structure), so its recall here is a lower bound. With --real-index, the
same comparison on the vectors of a built Flat index and real queries encoded by that index's own encoder.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _run import ROOT, machine, run_measured  # also puts the checkout on sys.path

PEER = """
import sys, bm25s, json
from retrctl import records
texts = [d["title"] + " " + d["text"] for d in records.read(sys.argv[1], "doc")]
tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
retriever.index(tokens, show_progress=False)
retriever.save(sys.argv[2])
"""


def child(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one child process."""
    ran = run_measured(cmd, stdout=subprocess.DEVNULL, stderr=None)
    return ran.seconds, ran.peak_bytes / 2**20


def du(path: Path) -> float:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 2**20


def generate(n: int, out: Path, seed: int = 0) -> tuple[Path, float]:
    """N docs of SciFact sentences resampled; returns the path and the uncompressed JSONL size in MiB."""
    from retrctl import records

    data = ROOT.parent / "shared" / "data" / "scifact"
    sentences, titles = [], []
    for d in records.read(data, "doc"):
        titles.append(d["title"])
        sentences += [s for s in re.split(r"(?<=[.!?])\s+", d["text"]) if len(s) > 20]
    rng = random.Random(seed)
    size = 0

    def docs():
        nonlocal size
        for i in range(n):
            rec = {"docid": f"g{i}", "title": rng.choice(titles), "text": " ".join(rng.choices(sentences, k=rng.randint(3, 8)))}
            size += len(json.dumps(rec).encode()) + 1
            yield rec

    path = out / f"corpus-{n}.jsonl.zst"
    records.write(docs(), path)
    return path, size / 2**20


def bm25_rows(sizes: list[int], work: Path, peer_max: int) -> list[str]:
    queries = ROOT.parent / "shared" / "data" / "scifact"
    rows = ["| docs | corpus JSONL MiB | index MiB | retrctl index s | retrctl index peak RSS MiB | bm25s-holds-texts peak RSS MiB "
            "| RSS ratio retrctl/peer | search 1,109 queries s | search peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|"]
    py = sys.executable
    for n in sizes:
        corpus, mib = generate(n, work)
        idx = work / f"bm25-{n}"
        t_index, rss_index = child([py, "-m", "retrctl", "index", corpus, "--method", "bm25", "-o", idx, "--quiet"])
        t_search, rss_search = child([py, "-m", "retrctl", "search", idx, queries, "--hits", 100, "-o", work / f"run-{n}.trec", "--quiet"])
        peer = ratio = "—"
        if n <= peer_max:
            _, rss_peer = child([py, "-c", PEER, str(corpus), str(work / f"peer-{n}")])
            peer, ratio = f"{rss_peer:.0f}", f"{rss_index / rss_peer:.2f}"
        rows.append(f"| {n:,} | {mib:.0f} | {du(idx):.0f} | {t_index:.1f} | {rss_index:.0f} | {peer} | {ratio} | {t_search:.1f} | {rss_search:.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
        corpus.unlink()
    return rows


DENSE_HEADER = ["| vectors | index | efSearch | build s | search ms/query | recall@10 vs Flat |", "|---|---|---|---|---|---|"]


def flat_vs_hnsw(x, ids: list[str], q, efs: list[int], k: int = 10) -> list[str]:
    """Flat (the truth) then HNSW32 at each efSearch, through DenseIndex (docid tie-break included)."""
    import numpy as np

    from retrctl.indexes.dense import DenseIndex

    n, nq = len(ids), len(q)
    t = time.perf_counter()
    flat = DenseIndex.from_vectors(x, ids, "Flat")
    t_flat = time.perf_counter() - t
    t = time.perf_counter()
    _, truth = flat.search_vectors(q, k)
    rows = [f"| {n:,} | Flat | — | {t_flat:.1f} | {(time.perf_counter() - t) / nq * 1000:.2f} | 1.000 |"]
    print(rows[-1], file=sys.stderr, flush=True)
    del flat
    t = time.perf_counter()
    hnsw = DenseIndex.from_vectors(x, ids, "HNSW32")
    t_hnsw = time.perf_counter() - t
    for ef in efs:
        hnsw.ef_search = ef
        t = time.perf_counter()
        _, got = hnsw.search_vectors(q, k)
        s = (time.perf_counter() - t) / nq * 1000
        recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(got, truth, strict=True)])
        rows.append(f"| {n:,} | HNSW32 | {ef} | {t_hnsw:.1f} | {s:.2f} | {recall:.3f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def dense_rows(sizes: list[int], efs: list[int], nq: int = 1000, dim: int = 384) -> list[str]:
    import numpy as np

    rows = list(DENSE_HEADER)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((nq, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for n in sizes:
        x = rng.standard_normal((n, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        rows += flat_vs_hnsw(x, [f"v{i}" for i in range(n)], q, efs)
        del x
    return rows


def real_rows(index_dir: Path, queries: Path, efs: list[int]) -> tuple[str, list[str]]:
    """The same comparison on real embeddings: the vectors of a built Flat index, its own encoder on real queries."""
    from retrctl import records
    from retrctl.indexes.dense import DenseIndex

    idx = DenseIndex.load(index_dir)
    texts = [q["query_text"] for q in records.read(queries, "query")]
    q = idx.encoder.encode(texts, kind="query")
    title = (f"Dense, real embeddings: {len(idx):,} docs of {index_dir} ({idx.manifest()['encoder']['model']}, "
             f"{q.shape[1]}-d), {len(texts):,} queries of {queries}, k=10:")
    return title, [*DENSE_HEADER, *flat_vs_hnsw(idx.vectors(), list(idx.docids), q, efs)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000", help="BM25 corpus sizes ('' = skip)")
    p.add_argument("--dense-sizes", default="100000,1000000", help="dense vector counts ('' = skip)")
    p.add_argument("--ef-search", default="16,64,128,256", help="HNSW efSearch values to try")
    p.add_argument("--real-index", type=Path, help="also compare Flat/HNSW on the vectors of this built Flat dense index")
    p.add_argument("--real-queries", type=Path, help="queries for --real-index (JSONL or a BEIR folder)")
    p.add_argument("--peer-max", type=int, default=100000, help="run the bm25s-holds-texts peer up to this size")
    p.add_argument("--work", type=Path, help="scratch dir (default: a temp dir)")
    a = p.parse_args()
    import faiss
    import numpy as np  # noqa: F401

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        lines = [f"## Scale ({time.strftime('%Y-%m-%d')})", "",
                 f"Machine: {machine()}, faiss {faiss.__version__} ({faiss.omp_get_max_threads()} threads)", ""]
        if a.sizes:
            lines += ["BM25 (bm25s lucene k1=0.9 b=0.4, English stopwords), SciFact sentences resampled:", "",
                      *bm25_rows([int(s) for s in a.sizes.split(",")], work, a.peer_max), ""]
        if a.dense_sizes:
            lines += ["Dense, random unit 384-d vectors, inner product, 1,000 queries, k=10:", "",
                      *dense_rows([int(s) for s in a.dense_sizes.split(",")], [int(e) for e in a.ef_search.split(",")]), ""]
        if a.real_index:
            title, rows = real_rows(a.real_index, a.real_queries, [int(e) for e in a.ef_search.split(",")])
            lines += [title, "", *rows, ""]
        lines.append(f"Total {time.perf_counter() - t0:.0f} s. Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

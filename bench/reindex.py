"""Reindex cost and readers during updates: an incremental `retrctl index` vs a full rebuild.

For each method (dense with --model, and BM25):
1. full build of corpus B (all docs) — timed with the encoder already loaded (model load excluded), and the
   model load timed on its own;
2. corpus A = B with 1 % of the docs' texts different, a few docs missing and a few extra: the base index of A is
   made from the full build by an update (so only one full build is paid for);
3. reindex A -> B (1 % changed back, the extra deleted, the missing added): timed with the encoder loaded
   (the API: load the index, sync, publish) and as the CLI does it (`python -m retrctl index`, imports and
   model load included); its search results on the queries are compared with the full build's;
4. readers: a process searching in a loop (open the index, search a batch of queries, as each `retrctl search`
   does; the encoder stays loaded) for a while without updates, then while updates A <-> B publish back to back;
   searches, errors, p50/p99 latency of both phases.

    python bench/reindex.py --max-docs 300                       # a smoke run
    flock /work/bench.lock python bench/reindex.py                # SciFact, 5,183 docs (minutes: one full build)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _run import DATA, ROOT, machine  # also puts the checkout on sys.path

from retrctl import records

READER = r"""
import json, sys, time
from pathlib import Path
from retrctl.indexes import open_index
root, stop, out, model, qfile = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
queries = [json.loads(l) for l in open(qfile)]
enc = None
if model != "-":
    from retrctl.models import Encoder
    enc = Encoder.load(model, device="cpu")
kw = {"encoder": enc} if enc is not None else {}
open_index(root, **kw).search(queries[:1], 10)  # warm
print("ready", flush=True)
rows, i = [], 0
while not stop.exists():
    q = queries[i % len(queries)]
    i += 1
    t0 = time.perf_counter()
    try:
        idx = open_index(root, **kw)
        idx.search([q], 10)
        rows.append({"s": time.perf_counter() - t0, "t": time.time(), "v": idx.version.name})
    except Exception as e:
        rows.append({"error": f"{type(e).__name__}: {e}", "t": time.time()})
json.dump(rows, open(out, "w"))
"""


def corpora(docs: list[dict], frac: float, n_add: int, n_del: int, seed: int) -> tuple[list[dict], int, int, int]:
    """Corpus A from B: `frac` of B's docs with an edited text, n_del of B's docs missing, n_add docs B lacks."""
    rng = random.Random(seed)
    ids = list(range(len(docs)))
    rng.shuffle(ids)
    n_change = max(1, round(frac * len(docs)))
    changed, missing = set(ids[:n_change]), set(ids[n_change : n_change + n_del])
    a = []
    for i, d in enumerate(docs):
        if i in missing:
            continue
        a.append({**d, "text": d["text"] + " (earlier draft)"} if i in changed else d)
    for j in range(n_add):
        src = docs[ids[-1 - j]]
        a.append({"docid": f"extra-{j}", "title": src["title"], "text": "Withdrawn: " + src["text"]})
    # B from A: n_change updated, n_del added, n_add removed
    return a, n_change, n_del, n_add


def compare(a: dict, b: dict) -> tuple[int, float]:
    """Queries with the same ranked docids; the largest score difference."""
    same, worst = 0, 0.0
    for q in a:
        same += [d for d, _ in a[q]] == [d for d, _ in b[q]]
        worst = max([worst, *(abs(x - y) for (_, x), (_, y) in zip(a[q], b[q], strict=False))])
    return same, worst


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def readers(root: Path, model: str | None, qfile: Path, work: Path, seconds: float, update) -> dict:
    """Search-loop stats for `seconds` without updates, then for as long as `update()` is called back to back."""
    out = {}
    for phase in ("idle", "updating"):
        stop, log = work / f"stop-{phase}", work / f"reads-{phase}.json"
        stop.unlink(missing_ok=True)
        p = subprocess.Popen([sys.executable, "-c", READER, str(root), str(stop), str(log), model or "-", str(qfile)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        t0, updates = time.time(), 0
        while time.time() - t0 < seconds or (phase == "updating" and updates < 2):
            if phase == "updating":
                update(updates)
                updates += 1
            else:
                time.sleep(0.2)
        stop.touch()
        p.wait(120)
        rows = json.loads(log.read_text())
        ok = [r["s"] for r in rows if "s" in r]
        out[phase] = {"searches": len(rows), "errors": sum("error" in r for r in rows), "p50_ms": 1000 * pct(ok, 50),
                      "p99_ms": 1000 * pct(ok, 99), "versions": len({r.get("v") for r in rows if "v" in r}),
                      "updates": updates, "first_error": next((r["error"] for r in rows if "error" in r), None)}
    return out


def run_method(method: str, docs_b: list[dict], docs_a: list[dict], queries: list[dict], args, work: Path) -> dict:
    from retrctl.indexes import BM25Index, DenseIndex, open_index
    from stages.index import index

    res: dict = {"method": method}
    full, base = work / f"{method}-full", work / f"{method}-base"
    enc = None
    if method == "dense":
        from retrctl.models import Encoder

        t0 = time.perf_counter()
        enc = Encoder.load(args.model, device=args.device)
        res["model_load_s"] = time.perf_counter() - t0
    else:
        res["model_load_s"] = 0.0
    # 1. full build of B, model loaded
    print(f"[{method}] full build of {len(docs_b)} docs", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    idx = DenseIndex(enc, "Flat", args.batch_size) if method == "dense" else BM25Index()
    idx.build(docs_b)
    idx.meta = {"source": "bench"}
    idx.save(full)
    res["full_s"] = time.perf_counter() - t0
    want = open_index(full, **({"encoder": enc} if enc else {})).search(queries, args.hits)
    # 2. the base index of A, by an update of a copy of the full build
    shutil.copytree(full, base)
    (base / "index.lock").unlink(missing_ok=True)
    a = open_index(base, **({"encoder": enc} if enc else {}))
    a.sync(docs_a)
    a.save(base)
    # 3a. reindex A -> B with the encoder loaded (what `retrctl index` does after loading the model)
    api = work / f"{method}-api"
    shutil.copytree(base, api)
    print(f"[{method}] reindex A -> B", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = open_index(api, **({"encoder": enc} if enc else {}))
    stats = r.sync(docs_b)
    r.save(api)
    res["reindex_s"] = time.perf_counter() - t0
    res["stats"] = stats
    res["encoded"] = getattr(r, "encoded", None)
    got = open_index(api, **({"encoder": enc} if enc else {})).search(queries, args.hits)
    res["same_ranking"], res["max_score_diff"] = compare(got, want)
    res["queries"] = len(queries)
    # 3b. the CLI, as cron runs it: python start, imports, model load, reindex
    cli = work / f"{method}-cli"
    shutil.copytree(base, cli)
    corpus_b = work / "corpus-b.jsonl"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "retrctl", "index", str(corpus_b), "-o", str(cli), "--quiet"], cwd=ROOT,
                       capture_output=True, text=True)
    res["cli_s"] = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"retrctl index failed: {p.stderr[-2000:]}")
    got = open_index(cli, **({"encoder": enc} if enc else {})).search(queries, args.hits)
    res["cli_same_ranking"], _ = compare(got, want)
    # 4. readers during updates (the update loop runs the Python API: index(), model load included per update)
    qfile = work / "queries.jsonl"
    records.write(iter(queries), qfile)
    live = work / f"{method}-live"
    shutil.copytree(base, live)

    def update(i: int) -> None:
        index(docs_b if i % 2 == 0 else docs_a, live, **({"model": None} if method == "dense" else {"method": "bm25"}))

    print(f"[{method}] readers for {args.reader_seconds:.0f} s idle + {args.reader_seconds:.0f} s updating",
          file=sys.stderr, flush=True)
    res["readers"] = readers(live, args.model if method == "dense" else None, qfile, work, args.reader_seconds, update)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA / "scifact")
    p.add_argument("--max-docs", type=int, help="first N docs only: a smoke run")
    p.add_argument("--methods", default="dense,bm25")
    p.add_argument("--model", default="minilm")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--change", type=float, default=0.01, help="fraction of docs whose text changes")
    p.add_argument("--add", type=int, default=5)
    p.add_argument("--delete", type=int, default=5)
    p.add_argument("--queries", type=int, default=300, help="queries compared and searched by the readers")
    p.add_argument("--hits", type=int, default=100)
    p.add_argument("--reader-seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, help="scratch dir (default: a temp dir, removed)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="reindex-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    docs_b = [dict(d) for d in records.read(args.data, "doc")]
    if args.max_docs:
        docs_b = docs_b[: args.max_docs]
    docs_a, n_change, n_add_back, n_gone = corpora(docs_b, args.change, args.add, args.delete, args.seed)
    records.write(iter(docs_b), work / "corpus-b.jsonl")
    queries = [q for _, q in zip(range(args.queries), records.read(args.data, "query"), strict=False)]
    print(f"corpus {args.data} ({len(docs_b)} docs): reindex changes {n_change} docs, adds {n_add_back}, "
          f"deletes {n_gone}", file=sys.stderr, flush=True)
    t0 = time.time()
    results = [run_method(m, docs_b, docs_a, queries, args, work) for m in args.methods.split(",") if m]
    total = time.time() - t0

    print(f"\nmachine: {machine()}; corpus {len(docs_b)} docs; "
          f"{n_change} changed ({args.change:.0%}), {n_add_back} added, {n_gone} deleted; {len(queries)} queries, "
          f"top-{args.hits}; total {total:.0f} s\n")
    print("| method | full build s (model loaded) | reindex s (model loaded) | reindex / full | docs encoded | "
          "model load s | full + load s | CLI reindex s (start+load+reindex) | CLI / (full + load) | "
          "same top-k ranking | max score diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        full_load = r["full_s"] + r["model_load_s"]
        enc = r["encoded"] if r["encoded"] is not None else "-"
        print(f"| {r['method']} | {r['full_s']:.1f} | {r['reindex_s']:.2f} | {r['reindex_s'] / r['full_s']:.1%} | {enc} | "
              f"{r['model_load_s']:.1f} | {full_load:.1f} | {r['cli_s']:.1f} | {r['cli_s'] / full_load:.1%} | "
              f"{r['same_ranking']}/{r['queries']} (CLI {r['cli_same_ranking']}/{r['queries']}) | {r['max_score_diff']:.1e} |")
    print("\n| method | phase | updates published | searches | errors | versions seen | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for phase, s in r["readers"].items():
            print(f"| {r['method']} | {phase} | {s['updates']} | {s['searches']} | {s['errors']} | {s['versions']} | "
                  f"{s['p50_ms']:.1f} | {s['p99_ms']:.1f} |")
            if s["first_error"]:
                print(f"\nfirst reader error ({r['method']}, {phase}): {s['first_error']}\n")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "docs": len(docs_b), "total_s": total}, indent=2, default=str))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if statistics.fmean(sum(s["errors"] for s in r["readers"].values()) for r in results) > 0:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Known items: does the base model read a collection? The verdict, and what it changes in the recipe's fusion weight.

    python bench/known_items.py WORK [--only NAME …]

For each collection in ../shared/data (the dev suite and every XQuAD language, or --only's), the recipe's own
targets up to the base model's held-out sweep, made as `KNOWN_ITEMS=0` makes them (`make -C examples/beir
DATA=… W=WORK/NAME …`: held-out crops and generated queries, the base model's and BM25's runs on them and on the
folder's queries, the sweep and the base hybrid; a work dir of the recipe suite serves as it is). Then the sweep
again with the verdict (`eval --sweep … --known-items dev-crops.jsonl`), and one row: the base model's and BM25's
nDCG@10 on the held-out crops (the known items: each crop judges the document it was cut from), their ratio and the
verdict (reads: at least half of BM25's), and on the folder's queries base dense, BM25, and the base hybrid at the
weight each sweep picks, with the paired p of the one against the other (`retrctl eval --json`). The trained lists'
sweeps take the base's verdict, so a collection whose base reads it runs the same commands as before; the deliveries
where it does not come from the recipe suite (bench/recipe_suite.py)."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

from _run import retrctl, work_and_collections
from recipe_suite import COLLECTIONS, folder, makefile_default, recipe_make

FUSE = ("--fusion", "linear", "--norm", "minmax")


def prepare(name: str, data: Path, work: Path) -> Path:
    """The recipe's targets this table reads, made as the recipe makes them without the verdict."""
    w = work / name
    targets = [w / t for t in ("dev-base.trec", "dev-bm25.trec", "dev-crops.jsonl", "sweep-base.jsonl",
                               "base.trec", "bm25.trec", "base-hybrid.trec")]
    recipe_make(data, w, "KNOWN_ITEMS=0", *map(str, targets))
    return w


def row(name: str, data: Path, w: Path) -> dict:
    from retrctl import fusion  # the checkout's (``_run`` put it on sys.path)

    weight_qrels = w / ("dev-qgen.jsonl" if (w / "dev-qgen.jsonl").exists() else "dev.jsonl")
    known = w / "sweep-base-known.jsonl"
    retrctl("eval", w / "dev-base.trec", w / "dev-bm25.trec", "--qrels", weight_qrels, "--sweep", "0:1:0.1",
            "--sweep-prior", makefile_default("DENSE_WEIGHT"), "--known-items", w / "dev-crops.jsonl", *FUSE,
            "-m", "nDCG@10", "--json", "--quiet", "-o", known, log=False)
    verdict = json.loads(known.read_text().splitlines()[0])["settings"]["known_items"]
    retrctl("fuse", w / "base.trec", w / "bm25.trec", *FUSE, "--weights-from", known, "--hits", 100, "--quiet",
            "-o", w / "base-hybrid-known.trec", log=False)
    out = retrctl("eval", w / "base-hybrid.trec", w / "base-hybrid-known.trec", w / "base.trec", w / "bm25.trec",
                  "--qrels", data, "-m", "nDCG@10", "--json", "--quiet", log=False).stdout
    scores = [json.loads(line) for line in out.splitlines() if line.strip()]
    chosen = {label: fusion.weights_from(sweep)[0][0] for label, sweep in (("old", w / "sweep-base.jsonl"), ("known", known))}
    return {"collection": name, "crops_base": verdict["dense"], "crops_bm25": verdict["last"],
            "crops": verdict["queries"], "reads": verdict["reads"], "base": scores[2]["nDCG@10"],
            "bm25": scores[3]["nDCG@10"], "hybrid_old": scores[0]["nDCG@10"], "w_old": chosen["old"],
            "hybrid_known": scores[1]["nDCG@10"], "w_known": chosen["known"], "p": scores[1]["p_value"]["nDCG@10"]}


def table(rows: list[dict]) -> str:
    lines = ["| collection | held-out crops: base / BM25 (n) | ratio | reads | base dense | BM25 "
             "| base hybrid, KNOWN_ITEMS=0 (weight) | with the verdict (weight) | − (p) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["crops_base"] / r["crops_bm25"] if r["crops_bm25"] else float("nan")
        lines.append(f"| {r['collection']} | {r['crops_base']:.4f} / {r['crops_bm25']:.4f} ({r['crops']}) | {ratio:.2f} "
                     f"| {'yes' if r['reads'] else '**no**'} | {r['base']:.4f} | {r['bm25']:.4f} "
                     f"| {r['hybrid_old']:.4f} ({r['w_old']:g}) | {r['hybrid_known']:.4f} ({r['w_known']:g}) "
                     f"| {r['hybrid_known'] - r['hybrid_old']:+.4f} ({r['p']:.2g}) |")
    return "\n".join(lines)


def main() -> None:
    work, names = work_and_collections(__doc__, COLLECTIONS)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    with open("/tmp/retrctl-bench.lock", "w") as lock:  # one real-model job at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in names:
            data = folder(name, work)
            rows.append(row(name, data, prepare(name, data, work)))
    print(table(rows))


if __name__ == "__main__":
    main()

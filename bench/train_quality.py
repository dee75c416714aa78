"""Benchmark: retrieval quality after `retrctl train`, against the same model untrained, in one run.

Every step is the shell pipeline a user runs (`retrctl mine | train | index | search | eval`), so the numbers
also prove the stages fit together:

- minilm: all-MiniLM-L6-v2 fine-tuned on SciFact train (queries judged in qrels/train.tsv, positives from those
  qrels, hard negatives mined by `retrctl mine --retriever bm25`, ranks 30-100, 7 per query; judged positives are
  never negatives). Scored on SciFact test (goal: nDCG@10 >= 0.68 from 0.645) and on ArguAna (goal: no more than
  0.01 below the untrained model: fine-tuning must not wreck out-of-domain quality).
- smollm2: SmolLM2-135M with bidirectional attention and mean pooling (DRAMA's setting), trained on the same
  SciFact train groups plus `retrctl crop` pseudo-queries of the corpus (their source doc the positive, negatives
  mined by BM25), against the same model/pooling untrained (goal: at least double its nDCG@10), within the
  45 min budget on the 2-core CPU (--smollm2-steps sets it).

Scores: nDCG@10 by `retrctl eval` (ir_measures); ArguAna drops self-retrieval (BEIR convention).

    python bench/train_quality.py --tiny            # proves the plumbing: ~11 min on the shared 2 cores
    python bench/train_quality.py --task minilm     # 3 epochs of 809 groups (78 steps, 22.5 min) + 4 evals: 53 min idle
    python bench/train_quality.py --task smollm2    # 24 GradCache steps (28 min) + crop/mine + 2 evals: 79 min idle
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from _run import DATA, ROOT, machine, ndcg, retrctl


def slice_beir(data: Path, work: Path, max_docs: int | None, max_queries: int | None) -> Path:
    """A BEIR folder cut to at most max_docs docs (judged test docs first) and max_queries judged test queries."""
    if not max_docs and not max_queries:
        return data
    from retrctl import records

    qrels = records.read_qrels(data, "test")
    qids = sorted(qrels)[: max_queries or None]
    judged = {d for q in qids for d in qrels[q]}
    docs = [d for d in records.read(data, "doc") if d["docid"] in judged]
    docs += [d for d in records.read(data, "doc") if d["docid"] not in judged][: max(0, (max_docs or 10**9) - len(docs))]
    out = work / f"{data.name}-slice"
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    records.write(docs, out / "corpus.jsonl")
    records.write([q for q in records.read(data, "query") if q["query_id"] in set(qids)], out / "queries.jsonl")
    rows = [f"{q}\t{d}\t{r}" for q in qids for d, r in qrels[q].items()]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return out


def index_and_search(model: str, data: Path, work: Path, tag: str, encoder: list, batch_size: int) -> Path:
    """`retrctl index` of ``data``'s corpus with ``model``, then `retrctl search` of its queries: the run file."""
    idx, run = work / f"idx-{tag}", work / f"run-{tag}.trec"
    retrctl("index", data, "--model", model, *encoder, "--batch-size", batch_size, "-o", idx, "--quiet", "--rebuild")
    extra = ["--remove-query"] if "arguana" in data.name else []
    retrctl("search", idx, data, "--hits", 100, *extra, "-o", run, "--quiet")
    return run


def train_groups(a, work: Path) -> Path:
    """SciFact train queries with their judged positives and BM25-mined negatives (retrctl mine)."""
    from retrctl import records

    scifact = DATA / "scifact"
    qrels = records.read_qrels(scifact, "train")
    queries = [q for q in records.read(scifact, "query") if q["query_id"] in qrels][: a.train_queries or None]
    records.write(queries, work / "train_queries.jsonl")
    groups = work / "train_groups.jsonl"
    t, *_ = retrctl("mine", work / "train_queries.jsonl", "--corpus", scifact, "--qrels", scifact / "qrels" / "train.tsv",
                    "--retriever", a.mine_retriever, "--num-negatives", a.group_size - 1, "-o", groups, "--quiet")
    print(f"mined {len(queries)} train groups in {t:.0f} s", file=sys.stderr)
    return groups


def crop_groups(a, work: Path) -> Path:
    """Crop pseudo-queries of SciFact docs, their source doc the positive, BM25 negatives."""
    from retrctl import records

    docs = list(records.read(DATA / "scifact", "doc"))[: a.crop_docs or None]
    records.write(docs, work / "crop_docs.jsonl")
    retrctl("crop", work / "crop_docs.jsonl", "--per-doc", 1, "-o", work / "crops.jsonl", "--quiet")
    groups = work / "crop_groups.jsonl"
    retrctl("mine", work / "crops.jsonl", "--corpus", DATA / "scifact", "--retriever", a.mine_retriever,
            "--num-negatives", a.group_size - 1, "-o", groups, "--quiet")
    return groups


def train(a, groups: Path, model: str, out: Path, encoder: list, steps: int | None, lr: float, batch_size: int,
          group_size: int, passage_max_len: int) -> float:
    how = ["--max-steps", steps] if steps else ["--epochs", a.epochs]
    t, *_ = retrctl("train", groups, "--corpus", DATA / "scifact", "--model", model, *encoder, "-o", out, *how,
                    "--train-batch-size", batch_size, "--train-group-size", group_size, "--lr", lr,
                    "--temperature", a.temperature, "--query-max-len", a.query_max_len, "--passage-max-len", passage_max_len,
                    "--logging-steps", 1, "--overwrite", capture_stderr=False)  # the model of an earlier run of this script
    return t


def task_minilm(a, work: Path) -> list[str]:
    scifact = slice_beir(DATA / "scifact", work / "minilm", a.eval_docs, a.eval_queries)
    arguana = slice_beir(DATA / "arguana", work / "minilm", a.eval_docs, a.eval_queries)
    groups = train_groups(a, work)
    model = work / "minilm-trained"
    t_train = train(a, groups, "minilm", model, [], a.minilm_steps, a.lr, a.batch_size, a.group_size, a.passage_max_len)
    enc = ["--passage-max-len", a.eval_max_len, "--query-max-len", a.eval_max_len]  # the same caps before and after
    rows = []
    for name, data, goal in (("SciFact test", scifact, "≥ 0.68"), ("ArguAna", arguana, "≥ untrained − 0.01")):
        before = ndcg(index_and_search("minilm", data, work, f"{data.name}-base", enc, a.eval_batch), data)
        after = ndcg(index_and_search(str(model), data, work, f"{data.name}-trained", enc, a.eval_batch), data)
        rows.append(f"| minilm | {name} | {before:.4f} | {after:.4f} | {after - before:+.4f} | {goal} | {t_train / 60:.1f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def task_smollm2(a, work: Path) -> list[str]:
    scifact = slice_beir(DATA / "scifact", work / "smollm2", a.eval_docs, a.eval_queries)
    both = work / "smollm2_groups.jsonl"
    lines = [ln for part in (train_groups(a, work), crop_groups(a, work)) for ln in part.read_text().splitlines(keepends=True)]
    random.Random(0).shuffle(lines)  # judged and crop groups mixed in every batch
    both.write_text("".join(lines))
    enc = ["--pooling", "mean", "--bidirectional"]
    model = work / "smollm2-trained"
    # GradCache bounds activation memory (uncached, batch 16 × 4 passages of 128 tokens took ~17 GB and was OOM-killed
    # on the shared 23 GB machine); it costs one extra forward per step
    t_train = train(a, both, "smollm2", model, [*enc, "--grad-cache", "--chunk-size", a.chunk_size], a.smollm2_steps,
                    a.smollm2_lr, a.smollm2_batch_size, a.group_size, a.smollm2_passage_max_len)
    caps = ["--passage-max-len", a.smollm2_eval_max_len, "--query-max-len", a.smollm2_eval_max_len]
    before = ndcg(index_and_search("smollm2", scifact, work, "smollm2-base", [*enc, *caps], a.eval_batch), scifact)
    after = ndcg(index_and_search(str(model), scifact, work, "smollm2-trained", caps, a.eval_batch), scifact)
    row = f"| smollm2 (bidirectional, mean) | SciFact test | {before:.4f} | {after:.4f} | {after / max(before, 1e-9):.2f}x | ≥ 2x | {t_train / 60:.1f} |"
    print(row, file=sys.stderr, flush=True)
    return [row]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["minilm", "smollm2", "all"], default="all")
    p.add_argument("--work", default=str(ROOT / "bench" / "work" / "train_quality"))
    p.add_argument("--tiny", action="store_true", help="A few steps on slices: proves the plumbing, not quality.")
    p.add_argument("--mine-retriever", default="bm25")
    p.add_argument("--train-queries", type=int, default=None, help="Cap on SciFact train queries (all 809 by default).")
    p.add_argument("--crop-docs", type=int, default=2000, help="SciFact docs to crop pseudo-queries from (smollm2).")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--minilm-steps", type=int, default=None, help="Optimizer steps (default: --epochs over the groups).")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--group-size", type=int, default=2,
                   help="1 positive + n-1 mined negatives per query (2: a step costs half of 4, so 3 epochs fit).")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--query-max-len", type=int, default=64)
    p.add_argument("--passage-max-len", type=int, default=256)
    p.add_argument("--smollm2-steps", type=int, default=24,
                   help="Sized for the 45 min budget: a GradCache step of 32 groups took ~70 s on the idle 2 cores.")
    p.add_argument("--chunk-size", type=int, default=16, help="GradCache chunk for smollm2.")
    p.add_argument("--smollm2-batch-size", type=int, default=32)
    p.add_argument("--smollm2-passage-max-len", type=int, default=128)
    p.add_argument("--smollm2-lr", type=float, default=1e-4)
    p.add_argument("--eval-max-len", type=int, default=256)
    p.add_argument("--smollm2-eval-max-len", type=int, default=128, help="A 5k-doc SmolLM2 index at 128 tokens takes ~24 min here.")
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--eval-docs", type=int, default=None, help="Cut eval corpora to this many docs (judged first).")
    p.add_argument("--eval-queries", type=int, default=None)
    a = p.parse_args()
    if a.tiny:
        a.train_queries, a.crop_docs, a.minilm_steps, a.smollm2_steps = 16, 16, 2, 2
        a.batch_size = a.smollm2_batch_size = 4
        a.group_size, a.passage_max_len, a.smollm2_passage_max_len, a.eval_max_len = 4, 64, 64, 64
        a.smollm2_eval_max_len = 64
        a.eval_docs, a.eval_queries = 200, 20
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    if a.task in ("minilm", "all"):
        rows += task_minilm(a, work)
    if a.task in ("smollm2", "all"):
        rows += task_smollm2(a, work)

    settings = [f"group {a.group_size}, τ {a.temperature}"]
    if a.task in ("minilm", "all"):
        settings.append(f"minilm batch {a.batch_size}, lr {a.lr}, max len {a.query_max_len}/{a.passage_max_len}, "
                        + (f"{a.minilm_steps} steps" if a.minilm_steps else f"{a.epochs} epoch(s)"))
    if a.task in ("smollm2", "all"):
        settings.append(f"smollm2 batch {a.smollm2_batch_size}, lr {a.smollm2_lr}, {a.smollm2_steps} steps, "
                        f"passage len {a.smollm2_passage_max_len}, eval max len {a.smollm2_eval_max_len}")
    lines = [f"## Training quality ({time.strftime('%Y-%m-%d')}{', --tiny: plumbing only' if a.tiny else ''})", "",
             f"Machine: {machine()}. Train: {'; '.join(settings)}. "
             f"Negatives mined by `retrctl mine --retriever {a.mine_retriever}`; minilm eval max len {a.eval_max_len}. "
             "Peer in the same run: the same model untrained.", "",
             "| model | eval | nDCG@10 untrained | nDCG@10 trained | Δ / ratio | goal | train min |", "|---|---|---|---|---|---|---|", *rows]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""The recipe's cost, printed before it runs: its model timed on a sample of the folder's own texts on this machine.

    plan.py DATA --model M --train-flags FLAGS [--adapt full|query|both] [--epochs 3] [--batch 16] [--shards 10]
            [--guard-alphas 0.5] [--llm-docs N --dev-llm-docs N --qgen-command CMD [--candidates-file FILE
            --dev-candidates-file FILE]] [--qlm] [--ensemble] [--audit] [--crop-words 32] [--record FILE]

Encodes SAMPLE documents, SAMPLE of the folder's queries and SAMPLE document crops (a stable sample, after a
warm-up batch) with the model, and scales each of the recipe's steps by the texts it encodes: the corpus encodes,
the pseudo-queries and the folder's queries searched and the guard's candidates over its pool. ADAPT=full's training
step is timed itself: STEPS_TIMED steps of `retrctl train` with the recipe's own training flags (FLAGS, the Makefile's:
its --max-steps and --train-group-size included) on groups of the folder's own documents (the first runs at the
maximum length, as the recipe's first does). ADAPT=query's step, a batch of queries forward and backward, is
STEP_FACTOR times their encode; ADAPT=both runs both trainings. The LLM is timed as the recipe runs it: CMD, the
recipe's qgen command, on QGEN_TIMED of the documents it samples (one of its batches), and its generation
seconds a document (its manifest's throughput, the model's load not counted) scale each document qgen samples (at
most the documents of its shard) and has not generated yet. With --candidates-file and --dev-candidates-file (the
recipe's two qgen checkpoints) the timed batch is written to the training qgen's checkpoint, which qgen then resumes
past: its documents are generated once, not timed and generated again; a checkpoint that holds documents already
moves the timed batch to the next ones (or to the held-out sample's, when the training sample is done), and the
documents a checkpoint holds are not counted. Prints one line to stderr: the total and its three largest parts, in minutes, the
training groups expected and the query side's steps; ``--record`` also writes every part's seconds, those counts and
the timed rates to FILE as JSON (bench/recipe_suite.py prints them beside the minutes measured).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from retrctl import records
from retrctl.guard import MAX_POOL, MAX_QUERIES
from retrctl.hashing import in_shard, sample

SAMPLE = 48
# the query tower's step over its queries' encode: measured on the seven dev collections' tower training with the
# recipe's flags (AMD 2-core box, bench/tower_step_factor.py: 1.3 to 4.8, mean 2.9); it varies with the queries' lengths
STEP_FACTOR = 2.9
STEPS_TIMED = 3
# documents the LLM is timed on: one batch of the recipe's qgen (QGEN_BATCH); a generated query's seconds range from
# 0.8 to 2.8 over the boxes and collections measured (its document's length and the CPU), too wide for a constant
QGEN_TIMED = 16
QLM_DOC = 8 / 3  # seconds of query likelihood a generated query's group (TEACHER=qlm)
FIXED = 8.0  # seconds a retrctl command takes to start and load its model


def per_text(encoder, texts: list[str], kind: str) -> float:
    """Seconds an encode takes per text of ``texts`` (a warm-up batch first: the first call's setup is not timed)."""
    if not texts:
        return 0.0
    encoder.encode(texts[:4], kind=kind, batch_size=32)
    start = time.perf_counter()
    encoder.encode(texts, kind=kind, batch_size=32)
    return (time.perf_counter() - start) / len(texts)


def crop(doc: dict, words: int) -> str:
    return " ".join(records.passage_text(doc).split()[:words])


def train_settings(flags: str) -> tuple[int, int]:
    """(--max-steps, --train-group-size) among the recipe's training flags."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--train-group-size", type=int, required=True)
    known, _ = ap.parse_known_args(shlex.split(flags))
    return known.max_steps, known.train_group_size


def step_times(model: str, docs: list[dict], flags: str, *, batch: int, group: int,
               crop_words: int) -> tuple[float, float]:
    """(the first step's seconds, each later step's) of the recipe's full training on this machine: STEPS_TIMED
    steps of ``retrctl train`` with its ``flags`` on ``batch`` groups of ``group`` sampled documents (a crop of the
    first as the query, the others as negatives, seeded scores: the teacher's values do not change the cost)."""
    import random

    picked = list(sample(docs, batch * group, 2, "docid"))  # each group's documents distinct where there are enough
    rng = random.Random(0)
    groups = []
    for i in range(batch):
        pos = picked[i % len(picked)]["docid"]
        negs = [picked[(batch + i * (group - 1) + j) % len(picked)]["docid"] for j in range(group - 1)]
        negs = [n for n in negs if n != pos]
        groups.append({"query_id": f"q{i}", "query_text": crop(picked[i % len(picked)], crop_words),
                       "positive_document_ids": [pos], "positive_scores": [1.0], "negative_document_ids": negs,
                       "negative_scores": [rng.random() for _ in negs]})
    with tempfile.TemporaryDirectory() as tmp:
        records.write(groups, Path(tmp) / "groups.jsonl")
        records.write(picked, Path(tmp) / "corpus.jsonl")
        return timed_steps(Path(tmp) / "groups.jsonl", Path(tmp) / "corpus.jsonl",
                           ["--model", model, "--train-batch-size", str(batch), "--seed", "1", *shlex.split(flags)],
                           STEPS_TIMED)


def run_timed(cmd: list[str], what: str) -> None:
    """Run ``cmd``, one of the recipe's commands timed on this machine; where it fails, its stderr's tail and exit."""
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-2000:])
        raise SystemExit(f"plan.py: the timed {what} failed (exit {done.returncode}): {shlex.join(cmd)}")


def timed_steps(groups: Path, corpus: Path, flags: list[str], steps: int) -> tuple[float, float]:
    """(the first step's seconds, the mean of the later ones) of ``steps`` steps of ``retrctl train`` on ``groups``
    with ``flags`` (its --max-steps overridden: click keeps an option's last value), from the run's metrics.jsonl."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "retrctl", "train", str(groups), "--corpus", str(corpus), *map(str, flags),
               "--max-steps", str(steps), "-o", str(Path(tmp) / "m")]
        run_timed(cmd, "training steps")
        metrics = (Path(tmp) / "m" / "metrics.jsonl").read_text().splitlines()
        elapsed = [json.loads(line)["elapsed_s"] for line in metrics]
    return elapsed[0], (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1)


def checkpointed(candidates: str | None) -> int:
    """Documents a qgen checkpoint (``--candidates-file``) holds a query of: 0 where there is no such file."""
    if not candidates or not Path(candidates).is_file():
        return 0
    docs = set()
    with open(candidates, encoding="utf-8") as f:
        next(f, None)  # the settings line
        for line in f:
            try:
                docs.add(json.loads(line)["source_docid"])
            except (ValueError, KeyError, TypeError):
                break  # a line torn by a kill is the last one: qgen cuts it and generates its document again
    return len(docs)


def qgen_seconds(command: str, docs: int, shard: int, shards: int, candidates: str | None = None) -> tuple[float, int]:
    """(seconds a generated query takes, the documents timed): ``command`` (the recipe's qgen command) run on ``docs``
    of the documents it samples from ``shard`` of ``shards``, its manifest's generation seconds (the LLM's load not
    counted) over the documents it generated. ``candidates``: qgen's checkpoint, where the generated queries are kept
    for the recipe's qgen (which resumes past them) and whose documents are not generated again; without it the
    queries are thrown away."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "qgen.jsonl"
        cmd = [*shlex.split(command), "--shard-id", str(shard), "--shard-num", str(shards), "--sample", str(docs),
               "-o", str(out)]
        run_timed([*cmd, *(["--candidates-file", candidates] if candidates else [])], "qgen")
        throughput = json.loads(Path(f"{out}.manifest.json").read_text())["throughput"]
    return throughput["seconds"] / max(throughput["docs"], 1), throughput["docs"]


def estimate(data: str, model: str, train_flags: str, *, adapt: str = "full", epochs: int = 3, batch: int = 16,
             shards: int = 10, alphas: int = 1, llm_docs: int = 0, dev_llm_docs: int = 0, qgen_command: str = "",
             candidates: tuple[str | None, str | None] = (None, None), qlm: bool = False, ensemble: bool = False,
             audit: bool = False, crop_words: int = 32) -> tuple[float, dict[str, float], dict[str, int], dict[str, float]]:
    """(seconds, {part: seconds}, {count: n}, {rate: seconds}) the recipe is expected to take on ``data`` with
    ``model`` on this machine, the training groups and query-side steps it expects, and the seconds a generated query
    takes (timed with ``qgen_command``, which the recipe needs when it generates any; ``candidates``: the checkpoints
    of the training and the held-out qgen, ``qgen_seconds``)."""
    from retrctl.models import Encoder

    docs = list(records.read(data, "doc"))
    queries = list(records.read(data, "query")) if _has(data, "query") else []
    enc = Encoder.load(model, device="cpu")
    t_doc = per_text(enc, [records.passage_text(d) for d in sample(docs, SAMPLE, 0, "docid")], "passage")
    t_query = per_text(enc, [q["query_text"] for q in sample(queries, SAMPLE, 0, "query_id")], "query")
    t_crop = per_text(enc, [crop(d, crop_words) for d in sample(docs, SAMPLE, 1, "docid")], "query")
    # qgen's --sample draws from one shard's documents (training: shard 1, held-out: shard 0): a small corpus has fewer
    llm_docs = min(llm_docs, sum(in_shard(d["docid"], 1, shards) for d in docs))
    dev_llm_docs = min(dev_llm_docs, sum(in_shard(d["docid"], 0, shards) for d in docs))
    n, generated = len(docs), llm_docs + dev_llm_docs
    rates = {}
    # a crop of each training document and a generated query for each sampled one (train holds out the held-out ones)
    counts = {"training groups": n * (shards - 1) // shards + llm_docs}
    held_out = n // shards + dev_llm_docs  # the held-out crops and generated queries: the weights' sweeps
    pseudo = n + generated  # every document's crop and the generated queries, searched by the base model
    dense_lists = 2 if ensemble else 1  # an ensemble's search encodes each query with both of its models
    # ADAPT=both's second encode (idx-tuned) starts from the guard's encode of its pool with the model it delivers
    second = max(0, n - MAX_POOL) if adapt == "both" else n
    parts = {"corpus encodes": (n if adapt == "query" else n + second + audit * n) * t_doc + n * 0.005,
             "pseudo-queries searched": (pseudo + held_out * (1 + dense_lists)) * t_crop,
             "the folder's queries searched": len(queries) * t_query * (1 + 2 * dense_lists + audit)}
    parts["training"] = parts["the guard"] = 0.0
    if adapt in ("query", "both"):
        counts["query-side steps"] = epochs * -(-counts["training groups"] // batch)
        parts["training"] += counts["query-side steps"] * STEP_FACTOR * batch * t_crop
        parts["the guard"] += MAX_QUERIES * (1 + alphas) * t_crop
    if adapt in ("full", "both"):
        steps, group = train_settings(train_flags)
        first, later = step_times(model, docs, train_flags, batch=batch, group=group, crop_words=crop_words)
        parts["training"] += first + (steps - 1) * later
        # the base's vectors of the pool are the base index's (--guard-base-index): the interpolations encode it
        parts["the guard"] += min(n, MAX_POOL) * t_doc * alphas + MAX_QUERIES * t_crop * (1 + alphas)
    if generated:
        # the next documents of the training sample (shard 1), or of the held-out one (shard 0) where the training
        # sample is empty or generated already
        samples = ((1, llm_docs, candidates[0]), (0, dev_llm_docs, candidates[1]))
        for shard, sampled, cands in samples:
            done = checkpointed(cands)
            if sampled > done and "generated query" not in rates:
                rate, timed = qgen_seconds(qgen_command, min(sampled, done + QGEN_TIMED), shard, shards, cands)
                if timed:
                    rates["generated query"] = rate
        left = sum(max(0, sampled - checkpointed(cands)) for _, sampled, cands in samples)
        parts["query generation"] = left * rates.get("generated query", 0.0) + generated * (QLM_DOC if qlm else 0)
    parts["starting commands"] = 20 * FIXED
    return sum(parts.values()), parts, counts, rates


def _has(data: str, kind: str) -> bool:
    try:
        records.resolve(data, kind)
    except records.RecordError:
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapt", choices=("full", "query", "both"), default="full")
    ap.add_argument("--train-flags", required=True,
                    help="the recipe's full training flags (--max-steps and --train-group-size among them)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--guard-alphas", default="0.5", help="the guard's candidates besides the base")
    ap.add_argument("--llm-docs", type=int, default=0, help="training documents the LLM writes a query for (0: no LLM)")
    ap.add_argument("--dev-llm-docs", type=int, default=0, help="held-out documents the LLM writes a query for")
    ap.add_argument("--qgen-command", default="",
                    help="the recipe's qgen command (its shard, --sample and -o added): timed on "
                    f"{QGEN_TIMED} documents when --llm-docs or --dev-llm-docs is given")
    ap.add_argument("--candidates-file", help="the training qgen's checkpoint (qgen's --candidates-file): the timed "
                    "batch is kept there for qgen to resume past, and the documents it holds are not counted")
    ap.add_argument("--dev-candidates-file", help="the held-out qgen's checkpoint: the documents it holds are not "
                    "counted (the timed batch goes there when the training sample is done)")
    ap.add_argument("--qlm", action="store_true", help="the LLM also scores the generated queries' groups")
    ap.add_argument("--ensemble", action="store_true")
    ap.add_argument("--audit", action="store_true")
    ap.add_argument("--crop-words", type=int, default=32)
    ap.add_argument("--record", help="write {part: seconds}, the total, the counts and the timed rates to this JSON file")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # stopped: its temporary dirs removed
    if (a.llm_docs or a.dev_llm_docs) and not a.qgen_command:
        ap.error("--llm-docs and --dev-llm-docs need --qgen-command: the LLM is timed as the recipe runs it")
    total, parts, counts, rates = estimate(
        a.data, a.model, a.train_flags, adapt=a.adapt, epochs=a.epochs, batch=a.batch, shards=a.shards,
        alphas=len(a.guard_alphas.split(",")), llm_docs=a.llm_docs, dev_llm_docs=a.dev_llm_docs,
        qgen_command=a.qgen_command, candidates=(a.candidates_file, a.dev_candidates_file), qlm=a.qlm,
        ensemble=a.ensemble, audit=a.audit, crop_words=a.crop_words)
    largest = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    print(f"estimated on this machine: {total / 60:.0f} min ("
          + ", ".join(f"{k} {v / 60:.0f}" for k, v in largest)
          + "".join(f"; {k} ~{v}" for k, v in counts.items())
          + f"; {a.model} timed on {SAMPLE} of the folder's texts"
          + "".join(f", a {k} {v:.2f} s" for k, v in rates.items()) + ")", file=sys.stderr)
    if a.record:
        with records.atomic_path(a.record) as tmp:
            plan = {"total_s": round(total, 1), "parts_s": {k: round(v, 1) for k, v in parts.items()}, "counts": counts,
                    "rates_s": {k: round(v, 4) for k, v in rates.items()}}
            Path(tmp).write_text(json.dumps(plan) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

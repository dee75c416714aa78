"""Benchmark: a pruned encoder (all-MiniLM-L6-v2) with no heal, an InfoNCE heal and a distillation heal, for each
number of layers dropped; speed and quality of each, and the healed model's ONNX int8 against sentence-transformers.

For each K of ``--drop-layers`` (1,2,3,4), every step a CLI call as a user runs it:

1. **no heal**: `retrctl prune MODEL --drop-layers K --calibration HEAL -o W/drop-K`, HEAL the corpus of the first
   of ``--datasets``, all of it (the acceptance command's data) unless ``--heal-docs`` cuts it;
2. **InfoNCE heal**: `retrctl train GROUPS --corpus scifact --model W/drop-K -o W/drop-K-infonce` with train's
   defaults (3 epochs of 32 groups, lr 2e-5, one hard negative): the recipe that took the unpruned MiniLM from
   0.645 to 0.69 on SciFact (bench/RESULTS.md, "Training quality"), on SciFact's train queries with their judged
   positives and BM25-mined negatives (`retrctl mine`);
3. **distillation heal**: `retrctl train --corpus HEAL --model W/drop-K --teacher MODEL -o W/drop-K-distill` with
   the command's defaults (the issue's acceptance command: no labels, the unpruned model as teacher).

Then, in this process:

- **speed**: docs/s of the unpruned model, each pruned model and the distilled model of ``--speed-drop``, and that
  model exported with `retrctl export --format onnx-int8`, beside sentence-transformers' own MiniLM
  (`SentenceTransformer(dir).encode`) and the unpruned model's int8 export: the same ``--speed-docs`` docs and
  batch, rounds interleaved (bench/_run.py's ``throughput``; docs per CPU-second is the steadier ratio on a shared
  box). A healed model has its pruned model's architecture, so it shares its row's speed (the distilled model of
  ``--speed-drop`` is timed too, to show it).
- **quality**: nDCG@10 on each dataset's test queries by `retrctl index` / `search --hits 100` (ArguAna:
  `--remove-query`) / `eval`, with `eval`'s paired t-test of each model against the unpruned one.

``--docs N`` cuts every dataset to N docs for the quality columns (every doc judged for a test query first, then
corpus order: bench/beir_retrieval.py's ``slice_dataset``); ``--heal-docs N`` cuts HEAL the same way (the
distillation heal's cost grows with it: bench/distill_cost.py).
``--steps K`` caps both heals at K steps (a smoke test; the table is the defaults' only without it). Commands
whose output an earlier run of the same ``--work`` left complete, with the same arguments and inputs, are reused
(``W/steps.json``), so a run stopped part-way continues where it was.

    flock /tmp/retrctl-bench.lock .venv/bin/python bench/heal_encoder.py --drop-layers 3 \\
        --datasets scifact,arguana --work /tmp/heal-encoder       # the acceptance rows: all of both datasets
    flock /tmp/retrctl-bench.lock .venv/bin/python bench/heal_encoder.py --docs 1000 \\
        --datasets scifact,arguana --work /tmp/heal-encoder       # K = 1..4 on 1,000-doc cuts (K = 3's heals reused)
    .venv/bin/python bench/heal_encoder.py --docs 60 --heal-docs 60 --steps 2 --train-queries 16 \\
        --drop-layers 3,4 --speed-docs 32 --rounds 1 --datasets scifact,arguana   # smoke test (~40 commands)

Markdown tables on stdout, the figures also in ``W/results.json``; the commands' logs on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from _run import DATA, machine, retrctl, throughput
from beir_retrieval import slice_dataset

HEALS = ("none", "infonce", "distill")
REMOVE_QUERY = {"arguana", "quora"}  # BEIR drops the query's own doc there (eval's --ignore-self default agrees)


def say(*a):
    print(*a, file=sys.stderr, flush=True)


class Steps:
    """Each command's wall seconds in ``W/steps.json``, keyed by its arguments; a command is run again unless its
    output exists and the record of it names the same arguments and the same state of its input files."""

    def __init__(self, work: Path):
        self.path = work / "steps.json"
        self.done = json.loads(self.path.read_text()) if self.path.is_file() else {}

    @staticmethod
    def _state(inputs) -> list:
        """The newest mtime under each input path (a model dir is rewritten as a whole when it is remade)."""
        out = []
        for p in map(Path, inputs):
            files = [p] if p.is_file() else list(p.rglob("*")) if p.is_dir() else []
            out.append(max((f.stat().st_mtime_ns for f in files), default=0))
        return out

    def run(self, *argv, output: Path, done: str = "", inputs=()) -> float:
        """Run `retrctl *argv` writing ``output`` (complete once ``output/done`` exists), unless an earlier run of
        it is reusable; its wall seconds. An incomplete or outdated ``output`` and its ``.partial`` (this benchmark's
        own) are removed first."""
        key = " ".join(map(str, argv))
        state = self._state(inputs)
        rec = self.done.get(key)
        if rec and rec["inputs"] == state and (output / done).exists():
            say(f"reused: retrctl {key} ({rec['seconds']:.0f} s)")
            return rec["seconds"]
        for stale in (output, output.with_name(output.name + ".partial")):  # and a killed run's work dir
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        seconds, *_ = retrctl(*argv, capture_stderr=False)
        self.done[key] = {"seconds": seconds, "inputs": state}
        self.path.write_text(json.dumps(self.done, indent=1) + "\n")
        return seconds


def train_groups(data: Path, work: Path, max_queries: int | None) -> Path:
    """``data``'s train queries with their judged positives and one BM25-mined negative each (`retrctl mine`)."""
    from retrctl import records

    groups = work / f"train_groups-{data.name}-{max_queries or 'all'}.jsonl"
    if groups.is_file():  # written once (atomically, by mine): its mtime keeps the heals trained on it reusable
        return groups
    qrels = records.read_qrels(data, "train")
    queries = [q for q in records.read(data, "query") if q["query_id"] in qrels][: max_queries or None]
    records.write(queries, work / "train_queries.jsonl")
    retrctl("mine", work / "train_queries.jsonl", "--corpus", data, "--qrels", data / "qrels" / "train.tsv",
            "--retriever", "bm25", "--num-negatives", 1, "-o", groups, "--quiet")
    return groups


def cut(data: Path, docs: int, work: Path) -> Path:
    """``data`` cut to ``docs`` docs (bench/beir_retrieval.py's ``slice_dataset``), written once per --work."""
    out = work / f"{data.name}-{docs}"
    if not (out / "qrels" / "test.tsv").is_file():  # the slice's last file
        slice_dataset(data, docs, work)
    return out


def heal_all(a, steps: Steps, heal_data: Path) -> tuple[dict, dict]:
    """Prune and heal for every K: ({(K, heal): model dir}, {(K, heal): heal seconds}); (0, "none") the source."""
    cap = ["--max-steps", a.steps] if a.steps else []
    models, minutes = {(0, "none"): a.model}, {}
    groups = train_groups(a.infonce_data, a.work, a.train_queries) if "infonce" in a.heals else None
    for k in a.drop_layers:
        small = a.work / f"drop-{k}"
        steps.run("prune", a.model, "--drop-layers", k, "--calibration", heal_data, "-o", small,
                  output=small, done="prune.json", inputs=[heal_data])
        models[(k, "none")] = small
        if "infonce" in a.heals:
            out = a.work / f"drop-{k}-infonce"
            minutes[(k, "infonce")] = steps.run("train", groups, "--corpus", a.infonce_data, "--model", small, *cap, "-o", out,
                                                output=out, done="train_config.json", inputs=[small, groups]) / 60
            models[(k, "infonce")] = out
        if "distill" in a.heals:
            out = a.work / f"drop-{k}-distill"
            minutes[(k, "distill")] = steps.run("train", "--corpus", heal_data, "--model", small, "--teacher", a.model, *cap,
                                                "-o", out, output=out, done="train_config.json",
                                                inputs=[small, heal_data]) / 60
            models[(k, "distill")] = out
    return models, minutes


def int8_export(steps: Steps, model, out: Path) -> Path:
    steps.run("export", model, "-o", out, "--format", "onnx-int8", output=out, done="export.json",
              inputs=[model] if Path(str(model)).exists() else [])
    return out / "onnx" / "model_int8.onnx"


def speed(a, steps: Steps, models: dict, heal_data: Path) -> tuple[dict, int, list[str]]:
    """{name: (median wall s, median CPU s)} over the same docs, the models interleaved; (…, docs, names in order)."""
    from sentence_transformers import SentenceTransformer

    from retrctl import records
    from retrctl.models import Encoder, locate_shipped
    from retrctl.models.runtime import load_encoder

    texts = [records.passage_text(d) for _, d in zip(range(a.speed_docs), records.read(heal_data, "doc"), strict=False)]
    timed = {"unpruned": Encoder.load(a.model, device="cpu", inference=True)}
    for k in a.drop_layers:
        timed[f"drop {k}"] = Encoder.load(models[(k, "none")], device="cpu", inference=True)
    healed = models.get((a.speed_drop, "distill"))
    if healed is not None:
        timed[f"drop {a.speed_drop}, distilled"] = Encoder.load(healed, device="cpu", inference=True)
        timed[f"drop {a.speed_drop}, distilled, ONNX int8"] = load_encoder(int8_export(steps, healed, a.work / "healed-dist"))
    timed["unpruned, ONNX int8"] = load_encoder(int8_export(steps, a.model, a.work / "unpruned-dist"))
    source = locate_shipped(a.model) if a.model == "minilm" else Path(a.model)
    st = SentenceTransformer(str(source), device="cpu")
    timed["sentence-transformers"] = st
    say(f"sentence-transformers max_seq_length {st.max_seq_length}, retrctl passage cap "
        f"{timed['unpruned'].config.passage_max_len}")
    return throughput(timed, texts, a.rounds, a.batch_size), len(texts), list(timed)


def quality(a, steps: Steps, models: dict, data: Path) -> dict:
    """{(K, heal): {"nDCG@10", "p"}} on ``data``'s test queries; p: paired t-test against the unpruned model."""
    runs = []
    for (k, heal), model in models.items():
        idx, run = a.work / f"idx-{data.name}-{k}-{heal}", a.work / f"run-{data.name}-{k}-{heal}.trec"
        inputs = [model, data] if Path(str(model)).exists() else [data]
        steps.run("index", data, "--model", model, "--batch-size", a.batch_size, "-o", idx, "--quiet", output=idx,
                  done="index.json", inputs=inputs)
        extra = ["--remove-query"] if any(n in data.name for n in REMOVE_QUERY) else []
        steps.run("search", idx, data, "--hits", 100, *extra, "-o", run, "--quiet", output=run, inputs=[idx, data])
        runs.append(run)
    _, out, _ = retrctl("eval", *runs, "--qrels", data, "--json", "-m", "nDCG@10", "--quiet")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {key: {"nDCG@10": row["nDCG@10"], "p": row.get("p_value", {}).get("nDCG@10", 1.0)}
            for key, row in zip(models, rows, strict=True)}


def count_docs(data: Path) -> int:
    from retrctl import records

    return sum(1 for _ in records.read(data, "doc"))


def params(models: dict) -> dict:
    """Non-embedding parameters of each model dir (the heals keep the pruned model's shape)."""
    from retrctl.models import Encoder
    from retrctl.prune import surgery

    return {k: surgery.non_embedding_params(Encoder.load(m, device="cpu", inference=True).model)
            for (k, heal), m in models.items() if heal == "none"}


def report(a, datasets: dict, models, minutes, scores, timing, n_texts, names, n_params, layers) -> None:
    how = f"--max-steps {a.steps}" if a.steps else "defaults"
    heal_label = {"none": "no heal", "infonce": f"InfoNCE ({a.infonce_data.name} train groups, {how})",
                  "distill": f"distillation (`train --corpus {a.heal_data.name} --teacher {a.model}`, {how})"}
    base_wall, base_cpu = timing["unpruned"]
    st_wall, st_cpu = timing["sentence-transformers"]
    steps_note = f"; both heals capped at --steps {a.steps} (NOT the defaults)" if a.steps else ""
    print(f"## Healing `retrctl prune {a.model} --drop-layers K`: no heal, InfoNCE, distillation\n")
    print(f"`python bench/heal_encoder.py {' '.join(sys.argv[1:])}`; {machine()}, box shared with other jobs{steps_note}. "
          f"Speed: {n_texts} docs, batch {a.batch_size}, median of {a.rounds} interleaved rounds in one process; "
          "a healed model has its pruned model's architecture and speed. Quality: `retrctl index` / `search --hits 100` "
          "/ `eval` (paired t-test against the unpruned model).\n")
    for name, data in datasets.items():
        n_docs = count_docs(data)
        print(f"### {name} test, {n_docs} docs{f' (--docs {a.docs})' if a.docs else ''}\n")
        print("| --drop-layers | layers kept | non-embedding params | heal | heal min | encode vs unpruned (CPU) "
              "| vs unpruned (wall) | nDCG@10 | Δ vs unpruned | p vs unpruned |")
        print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        base = scores[name][(0, "none")]["nDCG@10"]
        for (k, heal) in models:
            s = scores[name][(k, heal)]
            wall, cpu = timing["unpruned" if k == 0 else f"drop {k}"]
            mins = f"{minutes[(k, heal)]:.1f}" if (k, heal) in minutes else "—"
            print(f"| {k} | {layers[k]} | {n_params[k] / 1e6:.1f}M ({n_params[k] / n_params[0]:.0%}) | "
                  f"{'unpruned' if k == 0 else heal_label[heal]} | {mins} | {base_cpu / cpu:.2f}× | {base_wall / wall:.2f}× "
                  f"| {s['nDCG@10']:.4f} | {s['nDCG@10'] - base:+.4f} | {'—' if k == 0 else format(s['p'], '.3g')} |")
        print()
    print(f"### Encode speed, {n_texts} {a.datasets[0]} docs, one process\n")
    print("| model | docs/s (wall) | docs per CPU-s | vs unpruned (CPU) | vs sentence-transformers (CPU) | "
          "vs sentence-transformers (wall) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        wall, cpu = timing[name]
        print(f"| {name} | {n_texts / wall:.1f} | {n_texts / cpu:.1f} | {base_cpu / cpu:.2f}× | {st_cpu / cpu:.2f}× "
              f"| {st_wall / wall:.2f}× |")
    k, key = a.speed_drop, (a.speed_drop, "distill")
    if key not in models:
        return
    first = a.datasets[0]
    int8 = timing[f"drop {k}, distilled, ONNX int8"][1]
    loss = {n: scores[n][(0, "none")]["nDCG@10"] - scores[n][key]["nDCG@10"] for n in scores}
    print(f"\nThe issue's goals for `--drop-layers {k}` healed by distillation (on all of {first} and with the heal's "
          f"defaults only; this run: {'--docs ' + str(a.docs) if a.docs else 'all docs'}, "
          f"{'--steps ' + str(a.steps) if a.steps else 'default steps'}):\n")
    print(f"- encode {base_cpu / timing[f'drop {k}, distilled'][1]:.2f}× the unpruned model per CPU-second (goal ≥ 1.8×); "
          f"its ONNX int8 export {st_cpu / int8:.2f}× sentence-transformers' MiniLM (goal ≥ 3×)")
    print(f"- {first} nDCG@10 {scores[first][key]['nDCG@10']:.4f} (goal ≥ 0.625 on all of SciFact, unpruned 0.645); "
          + "; ".join(f"{n} loss {loss[n]:+.4f}" for n in scores) + " (goal: no dataset loses more than the first)")
    print(f"- heal {minutes[key]:.1f} min on {count_docs(a.heal_data)} docs (goal ≤ 30 min for 5,000 docs, "
          "on the idle box)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm", help="the unpruned retriever: pruned, then the distillation teacher")
    ap.add_argument("--drop-layers", default="1,2,3,4", help="--drop-layers settings, comma-separated")
    ap.add_argument("--heals", default=",".join(HEALS), help=f"comma-separated, of: {', '.join(HEALS)} (none always runs)")
    ap.add_argument("--datasets", default="scifact", help="BEIR folders under ../shared/data (or paths); the first is healed on")
    ap.add_argument("--docs", type=int, default=0, help="cut every dataset to N docs for nDCG@10 (0: all)")
    ap.add_argument("--heal-docs", type=int, default=0, help="cut the healing corpus to N docs (0: all)")
    ap.add_argument("--steps", type=int, default=0, help="cap both heals at N steps (0: the commands' defaults)")
    ap.add_argument("--infonce-data", type=Path, default=DATA / "scifact", help="BEIR folder with qrels/train.tsv")
    ap.add_argument("--train-queries", type=int, default=0, help="cap the InfoNCE heal's train queries (0: all)")
    ap.add_argument("--speed-drop", type=int, default=3, help="the K whose distilled model is timed and exported")
    ap.add_argument("--speed-docs", type=int, default=256, help="docs encoded per throughput round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--work", type=Path, default=Path("/tmp/heal-encoder"))
    a = ap.parse_args()
    a.drop_layers = [int(k) for k in a.drop_layers.split(",")]
    a.heals = {"none", *(h.strip() for h in a.heals.split(",") if h.strip())}
    if a.heals - set(HEALS):
        ap.error(f"--heals: unknown {sorted(a.heals - set(HEALS))}")
    a.datasets = a.datasets.split(",")
    a.work.mkdir(parents=True, exist_ok=True)
    steps = Steps(a.work)
    sources = [Path(name) if Path(name).is_dir() else DATA / name for name in a.datasets]
    datasets = {data.name: cut(data, a.docs, a.work) if a.docs else data for data in sources}
    heal_data = a.heal_data = cut(sources[0], a.heal_docs, a.work) if a.heal_docs else sources[0]

    models, minutes = heal_all(a, steps, heal_data)
    n_params = params(models)
    from transformers import AutoConfig

    from retrctl.models import locate_shipped

    layers = {k: AutoConfig.from_pretrained(str(locate_shipped(m) if m == "minilm" else m)).num_hidden_layers
              for (k, heal), m in models.items() if heal == "none"}
    timing, n_texts, names = speed(a, steps, models, heal_data)
    scores = {name: quality(a, steps, models, data) for name, data in datasets.items()}
    report(a, datasets, models, minutes, scores, timing, n_texts, names, n_params, layers)
    (a.work / "results.json").write_text(json.dumps({
        "argv": sys.argv[1:], "speed": {n: {"wall_s": w, "cpu_s": c, "docs": n_texts} for n, (w, c) in timing.items()},
        "heal_minutes": {f"{k}/{h}": m for (k, h), m in minutes.items()},
        "ndcg": {d: {f"{k}/{h}": s for (k, h), s in rows.items()} for d, rows in scores.items()}}, indent=1) + "\n")


if __name__ == "__main__":
    main()

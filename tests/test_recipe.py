"""The zero-label recipe (examples/beir/Makefile) end to end on a tiny model and a 40-document folder: a folder
without qrels delivers the model and the hybrid index (its weight DENSE_WEIGHT unless the sweep shows a better one
significantly, its files the adapted index's),
the guard scores exactly the held-out groups, qrels added later cost only the table, generated queries come from
fixed samples of the training and held-out documents, and a corpus of one document stops before anything runs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_group

from retrctl.fusion import weights_from
from retrctl.guard import hold_out
from retrctl.hashing import in_shard
from retrctl.indexes.store import resolve

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["cats purr and hunt mice", "rivers flow to the sea", "compilers translate source code",
          "volcanoes erupt molten rock", "bees make honey from nectar", "glaciers carve deep valleys",
          "violins have four strings", "comets orbit the distant sun"]


def folder(path: Path, docs: int) -> Path:
    path.mkdir()
    rows = [{"_id": f"d{i}", "title": f"note {i}",
             "text": f"{TOPICS[i % 8].capitalize()} in record {i}. It also says {TOPICS[(3 * i + 1) % 8]}. "
                     f"Entry {i} ends with {TOPICS[(5 * i + 2) % 8]}."} for i in range(docs)]
    (path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    queries = [{"_id": f"q{t}", "text": TOPICS[t]} for t in range(8)]
    (path / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return path


def judge(data: Path) -> None:
    """Qrels for the folder: each topic's query judges the document of the same number relevant."""
    (data / "qrels").mkdir()
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{t}\td{t}\t1\n" for t in range(8)))


def recipe_env() -> dict[str, str]:
    """The environment the recipe's commands run in here: this checkout's retrctl, offline."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def make(data: Path, work: Path, model: Path, *targets: str, llm: str = "none") -> subprocess.CompletedProcess:
    """The recipe's Makefile; targets may hold variables (NAME=VALUE) as well."""
    args = ["make", "-C", str(ROOT / "examples" / "beir"), f"PY={sys.executable}", f"DATA={data}", f"W={work}",
            f"MODEL={model}", f"LLM={llm}", "STEPS=2", "BATCH=4", "GUARD_SHARDS=2", *targets]
    return run_group(args, recipe_env(), timeout=900)


def commands(out: subprocess.CompletedProcess) -> list[str]:
    """The commands make printed, each command's continued lines joined."""
    return out.stdout.replace("\\\n", " ").splitlines()


def delivered_ensemble(work: Path) -> list[dict]:
    """The manifests of the delivered index's two dense lists, its shape checked: the two lists and BM25's are one
    fusion at the weights of the sweep's chosen row (the dense weight shared equally, the sweep made over the same
    lists' runs on the held-out queries), and the same two lists fused 1:1 are the adapted dense retriever."""
    adapted, delivered = resolve(work / "idx-adapted"), resolve(work / "delivered")
    assert adapted.manifest["backend"] == delivered.manifest["backend"] == "fused"
    assert adapted.manifest["search_defaults"] == {"weights": [0.5, 0.5]}
    weights, _ = weights_from(work / "sweep-adapted.jsonl")
    assert delivered.manifest["search_defaults"] == {"weights": weights, "fusion": "linear", "norm": "minmax"}
    assert len(weights) == 3 and weights[0] == weights[1]
    members = [json.loads((delivered.path / "members" / m / "index.json").read_text())
               for m in delivered.manifest["settings"]["members"]]
    assert [m["backend"] for m in members][2:] == ["bm25"]
    assert members[:2] == [json.loads((adapted.path / "members" / m / "index.json").read_text()) for m in ("0", "1")]
    swept = json.loads((work / "sweep-adapted.jsonl").read_text().splitlines()[0])["settings"]["runs"]
    assert [Path(r).name for r in swept][2:] == ["dev-bm25.trec"] and len(swept) == 3
    return members[:2]


def planned_and_guarded(out: subprocess.CompletedProcess, data: Path, work: Path) -> None:
    """A recipe run on the 40-document folder without qrels: its plan printed and recorded, every part timed or
    counted; no table; the whole model's guard weighed the base and the halfway model on every held-out group."""
    assert "recipe on notes: 40 docs" in out.stderr and "estimated on this machine: " in out.stderr
    plan = json.loads((work / "plan.json").read_text())  # every part timed or counted, the training step timed
    assert plan["total_s"] == pytest.approx(sum(plan["parts_s"].values()), abs=0.5) and plan["parts_s"]["training"] > 0
    assert set(plan["parts_s"]) >= {"corpus encodes", "pseudo-queries searched", "training", "the guard"}
    assert f"no qrels in {data}" in out.stdout and not (work / "eval.txt").exists()
    guard = json.loads((work / "model" / "guard.json").read_text())
    assert guard["pick"] in (0.0, 0.5) and guard["queries"] >= 2
    assert [c["alpha"] for c in guard["candidates"]] == [0.0, 0.5]  # GUARD_ALPHAS: the halfway model, not α = 1
    groups = [json.loads(r) for r in (work / "groups.jsonl").read_text().splitlines()]
    assert guard["queries"] == len(hold_out(groups, 2)[1])  # GUARD_SHARDS=2: every held-out group, no other


def judgements_arrive(data: Path, work: Path, model: Path, *variables: str) -> None:
    """Qrels added to a folder the recipe has run on: the same make makes only the table, nothing retrained or
    re-encoded, and the plan's steps are not timed again."""
    judge(data)
    again = make(data, work, model, *variables)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to time" in again.stderr and "estimated on this machine" not in again.stderr
    assert " train " not in again.stdout and " index " not in again.stdout and " eval " in again.stdout
    table = (work / "eval.txt").read_text()
    for run in ("base.trec", "bm25.trec", "base-hybrid.trec", "adapted.trec", "delivered.trec"):
        assert run in table
    assert table.splitlines()[-1].startswith("guard: ")


def swept_from_the_base_verdict(work: Path) -> tuple[list[dict], float]:
    """The trained lists' sweep rows and prior: DENSE_WEIGHT (0.7), kept unless a weight beats it significantly, or
    0 (BM25 alone) where the base model found its held-out known items (the crops) less than half as well as BM25;
    that verdict is the one the base's sweep recorded, carried over."""
    base = json.loads((work / "sweep-base.jsonl").read_text().splitlines()[0])["settings"]["known_items"]
    assert base["qrels"] == str(work / "dev-crops.jsonl") and base["queries"] >= 1
    sweep = [json.loads(r) for r in (work / "sweep-adapted.jsonl").read_text().splitlines()]
    assert sweep[0]["settings"]["known_items"] == {**base, "from": str(work / "sweep-base.jsonl")}
    prior = 0.7 if base["reads"] else 0.0
    assert {r["prior"] for r in sweep} == {prior}
    return sweep, prior


def holds_the_base_vectors(index: Path) -> bool:
    """Whether ``index`` (a copy of idx-base with a query tower recorded, or an index started from its vectors) holds
    the base index's own vectors."""
    from retrctl.indexes.dense import stored_vectors

    _, ids, vectors = stored_vectors(index)
    _, base_ids, base_vectors = stored_vectors(index.parent / "idx-base")
    return ids == base_ids and bool((vectors == base_vectors).all())


@pytest.mark.slow  # the recipe, ADAPT=full: ~22 processes that each import torch, 70 s to 3 min on the 2 cores
def test_recipe_full_delivers_without_qrels_and_evaluates_once_they_come(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "ADAPT=full")  # ENSEMBLE=0, its default with ADAPT=full: the adapted model alone
    assert out.returncode == 0, out.stderr[-3000:]
    planned_and_guarded(out, data, work)
    delivered, adapted = resolve(work / "delivered"), resolve(work / "idx-adapted")
    weights, _ = weights_from(work / "sweep-adapted.jsonl")
    sweep, prior = swept_from_the_base_verdict(work)
    assert weights == [prior, round(1 - prior, 10)] or any(r["weights"] == weights and "nDCG@10" in r["significant"]
                                                           for r in sweep)
    assert delivered.manifest["search_defaults"] == {"weights": {"dense": weights[0], "bm25": weights[1]},
                                                     "fusion": "linear", "norm": "minmax"}
    assert "search_defaults" not in adapted.manifest
    assert (delivered.path / "index.faiss").stat().st_ino == (adapted.path / "index.faiss").stat().st_ino
    for run in ("base", "bm25", "base-hybrid", "adapted", "delivered"):
        rows = (work / f"{run}.trec").read_text().splitlines()
        assert {r.split()[0] for r in rows} == {f"q{t}" for t in range(8)}, run

    judgements_arrive(data, work, tiny_bert, "ADAPT=full")


@pytest.mark.slow  # the recipe with an LLM: qgen and query likelihood on a tiny random Llama, ~3 min
def test_recipe_with_the_llm_as_teacher_scores_the_generated_queries(tiny_bert, tiny_llama, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "TEACHER=qlm", "QGEN_DOCS=4", "DEV_QGEN_DOCS=5", llm=str(tiny_llama))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "teacher qlm" in out.stderr and "rerank" in out.stdout and "--mode qlm" in out.stdout
    generated = {json.loads(r)["query_id"] for f in ("qgen", "dev-qgen") for r in (work / f"{f}.jsonl").read_text().splitlines()}
    groups = [json.loads(r) for r in (work / "groups.jsonl").read_text().splitlines()]
    scored = {g["query_id"]: g for g in groups if g["query_id"] in generated}
    assert generated and set(scored) == generated
    fused = {json.loads(r)["query_id"]: json.loads(r) for r in (work / "groups-generated.jsonl").read_text().splitlines()}
    for qid, g in scored.items():  # the same documents, the LLM's log-likelihoods (< 0) instead of min-max (>= 0)
        assert g["positive_document_ids"] == fused[qid]["positive_document_ids"]
        assert g["negative_document_ids"] == fused[qid]["negative_document_ids"]
        assert max(g["positive_scores"] + g["negative_scores"]) < 0 <= min(fused[qid]["negative_scores"])
    assert len(groups) == len(generated) + 40  # one crop per document, then the generated queries
    for name, size, held_out in (("qgen", 4, False), ("dev-qgen", 5, True)):  # QGEN_DOCS, DEV_QGEN_DOCS
        lines = (work / f"{name}.jsonl.candidates.jsonl").read_text().splitlines()[1:]  # after the settings
        sources = {json.loads(r)["source_docid"] for r in lines}
        kept, held = hold_out([{"positive_document_ids": [d]} for d in sources], 2)
        assert len(sources) == size and len(held if held_out else kept) == size, name
    assert (work / "delivered.trec").exists()


@pytest.mark.slow  # the recipe again, ADAPT=query: ~2 min on the idle 2 cores
def test_recipe_adapting_the_query_side_encodes_the_corpus_once(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "ADAPT=query", "ENSEMBLE=0", "EPOCHS=2", "AUDIT=1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the query side for 2 epochs" in out.stderr
    encodes = [ln for ln in out.stdout.splitlines() if " index " in ln and "--model" in ln]
    assert len(encodes) == 1 and "--heads dense,bm25" in encodes[0]  # idx-base, the only corpus encode
    config = json.loads((work / "model" / "train_config.json").read_text())
    assert config["passage_index"] == str(work / "idx-base") and config["epochs"] == 2
    base = json.loads((work / "idx-base" / "index.json").read_text())
    delivered = json.loads((work / "delivered" / "index.json").read_text())
    assert delivered["query_model"]["model"] == str((work / "model").resolve())
    assert delivered["settings"]["heads"] == ["dense", "bm25"] and delivered["search_defaults"]["weights"]
    assert "query_model" not in base  # idx-base itself is untouched
    assert holds_the_base_vectors(work / "delivered")
    for run in ("base", "adapted", "delivered", "trained"):
        assert {r.split()[0] for r in (work / f"{run}.trec").read_text().splitlines()} == {f"q{t}" for t in range(8)}
    for run in ("base", "adapted", "trained"):  # the dense runs search the dense head alone, beside the BM25 head
        assert json.loads((work / f"{run}.trec.manifest.json").read_text())["settings"]["heads"] in ("dense", ["dense"]), run


def ranked(run: Path) -> dict[str, list[str]]:
    """A TREC run's doc ids per query, in rank order."""
    out: dict[str, list[str]] = {}
    for line in run.read_text().splitlines():
        q, _, d, *_ = line.split()
        out.setdefault(q, []).append(d)
    return out


def delivered_is_fuse_of(work: Path, data: Path, tmp_path: Path, lists: tuple[str, ...]) -> bool:
    """Whether searching the delivered index ranks as `fuse` of its lists' runs (idx-NAME for each NAME searched
    alone, in its order) at the weights of the sweep's chosen row."""
    weights, _ = weights_from(work / "sweep-adapted.jsonl")
    retrctl = [sys.executable, "-m", "retrctl"]
    runs = [tmp_path / f"{name}.trec" for name in lists]
    for name, run in zip(lists, runs, strict=True):
        subprocess.run([*retrctl, "search", work / f"idx-{name}", data, "--hits", "100", "-o", run], check=True,
                       capture_output=True)
    subprocess.run([*retrctl, "fuse", *runs, "--weights", ",".join(map(str, weights)), "--hits", "100",
                    "-o", tmp_path / "fused.trec"], check=True, capture_output=True)
    return ranked(tmp_path / "fused.trec") == ranked(work / "delivered.trec")


@pytest.mark.slow  # the recipe again, ADAPT=full ENSEMBLE=1 AUDIT=1: ~25 processes, 80 s to 5 min on the 2 cores
def test_recipe_ensemble_delivers_the_base_and_the_guards_model_fused_with_bm25(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    judge(data)
    out = make(data, work, tiny_bert, "ADAPT=full", "ENSEMBLE=1", "AUDIT=1")
    assert out.returncode == 0, out.stderr[-3000:]
    guard = json.loads((work / "model" / "guard.json").read_text())
    assert "--guard-deliver trained" in out.stdout and guard["delivered"] == (1.0 if guard["pick"] > 0 else 0.0)
    inner = [m["encoder"]["model"] for m in delivered_ensemble(work)]
    assert inner[0] == str(tiny_bert) and Path(inner[1]).resolve() == (work / "model").resolve()
    assert delivered_is_fuse_of(work, data, tmp_path, ("base", "tuned", "bm25"))
    assert "delivered.trec" in (work / "eval.txt").read_text()


@pytest.mark.slow  # the recipe again, ADAPT=query (ENSEMBLE=1, its default there): ~20 processes, 70 s to 5 min
def test_recipe_query_side_fuses_the_base_and_the_trained_tower_over_one_encode(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "ADAPT=query", "EPOCHS=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the query side for 2 epochs" in out.stderr
    encodes = [ln for ln in out.stdout.splitlines() if " index " in ln and "--model" in ln]
    assert len(encodes) == 1 and "--heads" not in encodes[0]  # idx-base, dense alone: BM25 is its own index
    assert "--guard-keep" in out.stdout and "--guard-deliver" not in out.stdout  # the tower kept whatever the guard says
    assert json.loads((work / "model" / "guard.json").read_text())["queries"] >= 2
    trained = json.loads((work / "idx-trained" / "index.json").read_text())
    assert trained["query_model"]["model"] == str((work / "trained").resolve())
    assert holds_the_base_vectors(work / "idx-trained")  # the tower searches the base's own vectors
    inner = delivered_ensemble(work)
    assert "query_model" not in inner[0] and Path(inner[1]["query_model"]["model"]) == (work / "trained").resolve()
    for run in ("base", "adapted", "delivered"):
        assert {r.split()[0] for r in (work / f"{run}.trec").read_text().splitlines()} == {f"q{t}" for t in range(8)}
    judgements_arrive(data, work, tiny_bert, "ADAPT=query", "EPOCHS=2")


# the recipe with its defaults (ADAPT=both), the one run of it in CI: ~30 processes that each import torch, 90 s to 5
# min on the 2 cores (idle to busy)
def test_recipe_by_default_fuses_the_trained_tower_and_the_whole_models_pick(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "EPOCHS=2", "-j2")  # independent targets side by side: the same delivery
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"2 whole-model steps ({native_dtype()}) and the query side for 2 epochs" in out.stderr
    planned_and_guarded(out, data, work)
    planned = (work / "plan.json").stat().st_mtime  # the plan's timed steps ran before the first targets, not beside
    assert all((work / f).stat().st_mtime >= planned for f in ("crops.jsonl", "dev-crops.jsonl", "idx-bm25", "idx-base"))
    swept_from_the_base_verdict(work)
    trainings = [ln for ln in out.stdout.splitlines() if " train " in ln]
    assert len(trainings) == 2 and sum("--passage-index" in ln for ln in trainings) == 1
    assert "--guard-deliver" not in out.stdout  # the whole model's guard delivers its own pick
    assert holds_the_base_vectors(work / "idx-tower")
    tower, tuned = delivered_ensemble(work)
    assert Path(tower["query_model"]["model"]) == (work / "tower").resolve()
    assert Path(tuned["encoder"]["model"]).resolve() == (work / "model").resolve() and "query_model" not in tuned
    kept_base = json.loads((work / "model" / "guard.json").read_text())["delivered"] == 0.0
    assert holds_the_base_vectors(work / "idx-tuned") == kept_base  # the base kept: idx-base's vectors, not encoded
    # else the guard's encode of its pool (the whole corpus here) with the model it delivered: nothing encoded again
    assert (work / "guard-pool").exists() == (not kept_base)
    assert f"starting from {work / ('idx-base' if kept_base else 'guard-pool')}'s vectors" in out.stderr
    assert json.loads((work / "tower-guard" / "guard.json").read_text())["queries"] >= 2
    assert delivered_is_fuse_of(work, data, tmp_path, ("tower", "tuned", "bm25"))
    for run in ("base", "bm25", "base-hybrid", "adapted", "delivered"):
        assert set(ranked(work / f"{run}.trec")) == {f"q{t}" for t in range(8)}, run

    judgements_arrive(data, work, tiny_bert, "EPOCHS=2")
    shutil.rmtree(work / "model")  # deleted by hand: made again, and everything made from it with it
    remade = "\n".join(commands(make(data, work, tiny_bert, "EPOCHS=2", "-n")))
    source = work / ("idx-base" if kept_base else "guard-pool")  # make -n: the guard's pool index of the run before
    assert f"-o {work}/model" in remade and f"--model {work}/model --vectors-from {source} -o {work}/idx-tuned" in remade
    assert f"--weights-from {work}/sweep-adapted.jsonl --fusion linear --norm minmax -o {work}/delivered" in remade
    assert f"-o {work}/delivered.trec" in remade and f"> {work}/eval.txt" in remade


def test_recipe_with_one_training_delivers_as_make_would_run_it(tiny_bert, tmp_path):
    """ENSEMBLE=1 with one training, as make would run it (make -n: the default's ensemble runs above, these
    end to end in the slow tests): ADAPT=query's second list is the trained tower over the base's vectors (kept
    whatever the guard says), ADAPT=full's the guard's delivered model (the trained one where an interpolation
    passes); the lists and BM25's are swept and delivered as one fusion. ENSEMBLE=0: one index of the adapted
    model's dense head and BM25, published with the swept weight."""
    data, work = folder(tmp_path / "notes", 4), tmp_path / "w"
    for adapt, second, train_flag in (("query", "trained", f"--guard-keep {work}/trained"),
                                      ("full", "tuned", "--guard-deliver trained")):
        out = make(data, work, tiny_bert, "-n", str(work / "delivered"), f"ADAPT={adapt}", "ENSEMBLE=1")
        assert out.returncode == 0, out.stderr[-3000:]
        printed = commands(out)
        assert any(" train " in ln and train_flag in ln for ln in printed), adapt
        trainings = [ln for ln in printed if " train " in ln]  # nothing trained where the base does not read
        assert trainings and all(f"--guard-known-items {work}/sweep-base.jsonl" in ln for ln in trainings), adapt
        runs = " ".join(f"{work}/dev-{m}.trec" for m in ("base", second, "bm25"))
        assert any(f"eval {work}/dev-base.trec {work}/dev-bm25.trec --qrels {work}/dev.jsonl --sweep 0:1:0.1 "
                   f"--sweep-prior 0.7 --known-items {work}/dev-crops.jsonl" in ln for ln in printed), adapt
        assert any(f"eval {runs} --qrels {work}/dev.jsonl --sweep 0:1:0.1 --sweep-prior 0.7 --known-items "
                   f"{work}/sweep-base.jsonl" in ln for ln in printed), adapt  # the base's verdict, carried
        out = make(data, work, tiny_bert, "-n", str(work / "delivered"), f"ADAPT={adapt}", "ENSEMBLE=1", "KNOWN_ITEMS=0")
        assert out.returncode == 0 and "--known-items" not in out.stdout, adapt
        out = make(data, work, tiny_bert, "-n", str(work / "delivered"), f"ADAPT={adapt}", "ENSEMBLE=1", "TRAINED_PRIOR=base")
        assert any(f"eval {runs} --qrels {work}/dev.jsonl --sweep 0:1:0.1 --sweep-prior {work}/sweep-base.jsonl" in ln
                   for ln in commands(out)), adapt  # the trained lists start where the base's sweep ended
        lists = " ".join(f"{work}/idx-{m}" for m in ("base", second, "bm25"))
        assert any(f"index --fuse {lists} --weights-from {work}/sweep-adapted.jsonl" in ln for ln in printed), adapt
        assert f"index --fuse {work}/idx-base {work}/idx-{second} --weights 0.5,0.5" not in out.stdout  # the 1:1 ensemble is not on its path
    out = make(data, work, tiny_bert, "-n", str(work / "delivered"), "ADAPT=full", "ENSEMBLE=0")  # the adapted model alone
    assert out.returncode == 0, out.stderr[-3000:]
    printed = commands(out)
    assert any(f"eval {work}/dev-adapted.trec {work}/dev-bm25.trec --qrels" in ln for ln in printed)
    assert any(f"index --copy-from {work}/idx-adapted --weights-from {work}/sweep-adapted.jsonl" in ln for ln in printed)
    assert any(f"--model {work}/model --heads dense,bm25 -o {work}/idx-adapted" in ln for ln in printed)


def test_recipe_checks_its_teacher_before_anything_runs(tiny_bert, tmp_path):
    data = folder(tmp_path / "notes", 4)
    for teacher, llm, message in (("bm25", "smollm2", "TEACHER=bm25: fusion or qlm"),
                                  ("qlm", "none", "TEACHER=qlm needs an LLM")):
        out = make(data, tmp_path / "w", tiny_bert, f"TEACHER={teacher}", "-j4", llm=llm)  # also under make -j
        assert out.returncode == 2 and message in out.stderr
        assert not (tmp_path / "w").exists()
    out = make(data, tmp_path / "w", tiny_bert, "ADAPT=both", "ENSEMBLE=0")
    assert out.returncode != 0 and "ADAPT=both delivers an ensemble" in out.stderr and not (tmp_path / "w").exists()
    out = make(data, tmp_path / "w", tiny_bert, "ADAPT=queries")
    assert out.returncode != 0 and "ADAPT=queries: query, full or both" in out.stderr and not (tmp_path / "w").exists()
    out = make(data, tmp_path / "w", tiny_bert, "KNOWN_ITEMS=yes")
    assert out.returncode != 0 and "KNOWN_ITEMS=yes: 1 or 0" in out.stderr and not (tmp_path / "w").exists()


def test_recipe_refuses_a_one_document_corpus(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "one", 1), tmp_path / "w"
    out = make(data, work, tiny_bert, "-j4")
    assert out.returncode == 2 and "corpus.jsonl: 1 documents; the recipe needs at least 2" in out.stderr
    assert not work.exists()


def test_recipe_cuts_crops_to_crop_words(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 4), tmp_path / "w"
    for given, words in (((), 32), (("CROP_WORDS=5",), 5)):
        out = make(data, work, tiny_bert, "-n", str(work / "crops.jsonl"), *given)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"--per-doc 1 --max-words {words} --seed 1" in out.stdout


def test_recipe_calibrates_the_teacher_only_when_asked(tiny_bert, tmp_path):
    data, work = folder(tmp_path / "notes", 4), tmp_path / "w"
    for given, calibrated in (((), False), (("CALIBRATE=1",), True)):
        out = make(data, work, tiny_bert, "-n", str(work / "model"), "LLM=none", *given)
        assert out.returncode == 0, out.stderr[-3000:]
        train = [ln for ln in commands(out) if " train " in ln]
        assert train and any("--teacher-temperature 0.05" in ln for ln in train)
        assert any("--calibrate-teacher" in ln for ln in train) is calibrated


def native_dtype() -> str:
    """The whole model's training dtype the recipe picks here: bf16 where the CPU computes it natively."""
    cpu = Path("/proc/cpuinfo")
    return "bf16" if cpu.exists() and {"avx512_bf16", "amx_bf16"} & set(cpu.read_text().split()) else "fp32"


def test_recipe_runs_the_whole_models_steps_fused_and_in_bf16_where_the_cpu_computes_it(tiny_bert, tmp_path):
    """The whole model's steps run without attention dropout (CPU attention's fused kernel), in bf16 mixed precision
    where /proc/cpuinfo shows AVX512-BF16 or AMX and fp32 elsewhere, or as TRAIN_DTYPE says; the query tower's steps
    run without the dropout too, in chunks of 8 queries, in fp32 whatever TRAIN_DTYPE says."""
    data, work = folder(tmp_path / "notes", 4), tmp_path / "w"
    for given, dtype in (((), native_dtype()), (("TRAIN_DTYPE=fp32",), "fp32"), (("TRAIN_DTYPE=bf16",), "bf16")):
        out = make(data, work, tiny_bert, "-n", str(work / "model"), str(work / "tower"), "LLM=none", *given)
        assert out.returncode == 0, out.stderr[-3000:]
        train = [ln for ln in commands(out) if " train " in ln]
        whole = [ln for ln in train if "--passage-index" not in ln]
        tower = [ln for ln in train if "--passage-index" in ln]
        assert len(whole) == len(tower) == 1, train
        assert f"--attention-dropout 0 --dtype {dtype}" in whole[0], (given, whole[0])
        assert "--dtype" not in tower[0] and "--attention-dropout 0 --chunk-size 8" in tower[0], tower[0]


def test_plan_times_the_llm_on_the_next_documents_and_keeps_its_queries_in_qgens_checkpoint(tiny_bert, tiny_llama,
                                                                                          tmp_path, monkeypatch):
    """qgen samples QGEN_DOCS of shard 1's documents: 100 asked for of a 60-document folder in two shards are shard 1's
    31, each counted at the seconds the plan timed the LLM at. With the recipe's qgen checkpoints the plan's timed
    batch (QGEN_TIMED documents) is written to the training qgen's checkpoint, and qgen resumes past it: the queries
    it writes are those of a run without the plan. A plan run again times the next documents (the held-out sample's
    once the training sample is done) and counts only the documents no checkpoint holds; with every document
    generated it times nothing. A qgen command that fails stops the plan with its reason."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "beir"))
    from plan import QGEN_TIMED

    data = folder(tmp_path / "notes", 60)
    train_docs = sum(in_shard(f"d{i}", 1, 2) for i in range(60))
    assert QGEN_TIMED < train_docs  # the plan times QGEN_TIMED of them, qgen generates the rest
    qgen = f"{sys.executable} -m retrctl qgen {data} --llm {tiny_llama} --per-doc 1 --seed 1 --batch-size 4"
    work = tmp_path / "w"
    work.mkdir()
    cands = [work / "qgen.jsonl.candidates.jsonl", work / "dev-qgen.jsonl.candidates.jsonl"]
    plan = [sys.executable, str(ROOT / "examples" / "beir" / "plan.py"), str(data), "--model", str(tiny_bert),
            "--adapt", "query", "--train-flags", "--max-steps 2 --train-group-size 4", "--shards", "2",
            "--llm-docs", "100", "--dev-llm-docs", str(QGEN_TIMED), "--qgen-command", qgen,
            "--candidates-file", str(cands[0]), "--dev-candidates-file", str(cands[1]), "--record", str(work / "plan.json")]

    def planned() -> tuple[float, float | None, list[int]]:
        subprocess.run(plan, env=recipe_env(), check=True, capture_output=True, timeout=300)
        recorded = json.loads((work / "plan.json").read_text())
        held = [len({json.loads(r)["source_docid"] for r in c.read_text().splitlines()[1:]}) if c.exists() else 0
                for c in cands]
        return recorded["parts_s"]["query generation"], recorded["rates_s"].get("generated query"), held

    part, rate, held = planned()
    assert held == [QGEN_TIMED, 0] and rate > 0
    # the training sample's train_docs - QGEN_TIMED left and the held-out sample's QGEN_TIMED, rounded as recorded
    assert part == pytest.approx(train_docs * rate, abs=0.05 + 60 * 5e-5)

    # the recipe's qgen resumes past the plan's documents and writes what a run without the plan writes
    args = ["--shard-id", "1", "--shard-num", "2", "--sample", "100", "-o"]
    out = subprocess.run([*shlex.split(qgen), *args, str(work / "qgen.jsonl")], env=recipe_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and f"resumed: {QGEN_TIMED} of {train_docs} docs" in out.stderr, out.stderr[-2000:]
    subprocess.run([*shlex.split(qgen), *args, str(tmp_path / "alone.jsonl")], env=recipe_env(), check=True,
                   capture_output=True, timeout=300)
    assert (work / "qgen.jsonl").read_bytes() == (tmp_path / "alone.jsonl").read_bytes()

    part, rate, held = planned()  # the training sample done: the held-out one's batch, all of it
    assert held == [train_docs, QGEN_TIMED] and rate > 0 and part == 0
    part, rate, held = planned()  # every document generated: nothing left to time
    assert held == [train_docs, QGEN_TIMED] and part == 0 and rate is None

    cands[0].unlink()
    out = subprocess.run([*plan[:-2], "--qgen-command", qgen.replace(str(tiny_llama), str(tmp_path / "no-such-llm"))],
                         env=recipe_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "plan.py: the timed qgen failed" in out.stderr, out.stderr[-2000:]
    out = subprocess.run([p for p in plan if p not in ("--qgen-command", qgen)], env=recipe_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and "need --qgen-command" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("qgen_docs", [400, 4])
def test_recipe_plan_counts_the_generated_queries_shard_1_can_give(tiny_bert, tiny_llama, tmp_path, qgen_docs):
    """qgen's training sample is QGEN_DOCS of shard 1's documents: with four guard shards of 40 documents, 400 asked
    for are shard 1's ~10, 4 are 4; the plan counts a crop of each of the 30 training documents and a generated query
    for each sampled one, and the query side's steps from them."""
    data, work = folder(tmp_path / "notes", 40), tmp_path / "w"
    out = make(data, work, tiny_bert, "-n", str(work / "qgen.jsonl"), "GUARD_SHARDS=4", f"QGEN_DOCS={qgen_docs}", llm="smollm2")
    assert out.returncode == 0, out.stderr[-3000:]
    qgen = [c for c in commands(out) if " qgen " in c and "qgen.jsonl" in c]
    assert len(qgen) == 1 and f"--shard-id 1 --shard-num 4 --sample {qgen_docs} " in qgen[0], qgen
    assert "--batch-size 16 " in qgen[0], qgen  # QGEN_BATCH: a cost setting, the queries the same at any size
    out = make(data, work, tiny_bert, "plan", "GUARD_SHARDS=4", f"QGEN_DOCS={qgen_docs}", "EPOCHS=2", llm=str(tiny_llama))
    assert out.returncode == 0, out.stderr[-3000:]
    groups = 30 + min(qgen_docs, sum(in_shard(f"d{i}", 1, 4) for i in range(40)))
    assert f"training groups ~{groups}; query-side steps ~{2 * -(-groups // 4)};" in out.stderr, out.stderr[-2000:]
    assert ", a generated query " in out.stderr, out.stderr[-2000:]  # the LLM timed with the recipe's qgen command
    lines = (work / "qgen.jsonl.candidates.jsonl").read_text().splitlines()[1:]  # kept for qgen to resume past
    assert len({json.loads(r)["source_docid"] for r in lines}) == groups - 30

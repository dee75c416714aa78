"""The guard (retrctl/guard.py): the held-out split, WiSE-FT interpolation, the decision rule, and train
--guard-shards end to end on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from trainkit import FAST, corpus, groups, write_jsonl

from retrctl import guard
from retrctl.hashing import shard
from retrctl.metrics import Result
from retrctl.train.config import parse_alphas


def test_hold_out_is_shard_zero_of_the_documents():
    gs = [{"query_id": f"q{i}", "query_text": "t", "positive_document_ids": [f"d{i}"]} for i in range(4000)]
    train, dev = guard.hold_out(gs, 10)
    assert len(train) + len(dev) == 4000 and 300 < len(dev) < 500
    assert guard.hold_out(gs, 10) == (train, dev)
    docs = [{"docid": f"d{i}"} for i in range(4000)]  # the docs crop/qgen read with --shard-id 0 --shard-num 10
    assert {g["positive_document_ids"][0] for g in dev} == {d["docid"] for d in shard(docs, 0, 10, "docid")}


def test_a_corpus_within_the_cap_is_the_pool():
    docs = {f"d{i}": {"text": "t"} for i in range(30)}
    dev = [{"query_id": "q0", "positive_document_ids": ["d0"], "negative_document_ids": ["d5"]}]
    assert guard.pool(dev, docs, [{"q0": [("d9", 1.0)]}], cap=30) == docs


def _ranking(qids, docs, seed):
    rng = np.random.default_rng(seed)
    return {q: [(d, 1.0 / (r + 1)) for r, d in enumerate(rng.permutation(docs))] for q in qids}


def test_a_larger_corpus_pools_each_systems_top_hits_rank_by_rank():
    docs = {f"d{i}": {"text": "t"} for i in range(100)}
    dev = [{"query_id": f"q{i}", "positive_document_ids": [f"d{i}"],
            "negative_document_ids": [f"d{90 + i}"]} for i in range(4)]  # the teacher's negatives
    systems = [_ranking([g["query_id"] for g in dev], sorted(docs), seed) for seed in (1, 2)]
    got = guard.pool(dev, docs, systems, cap=30)
    assert len(got) == 30 and {f"d{i}" for i in range(4)} <= got.keys()
    covered = max(k for k in range(1, 100) if all(d in got for s in systems for hits in s.values() for d, _ in hits[:k]))
    assert covered >= (30 - 4) // (2 * 4)  # every system's top k of every query, for the largest k that fits
    for s in systems:  # so a system's rank of each positive is its rank over the whole corpus wherever it is <= k
        for g in dev:
            full = [d for d, _ in s[g["query_id"]]]
            pooled = [d for d in full if d in got]
            if full.index(g["positive_document_ids"][0]) < covered:
                assert pooled.index(g["positive_document_ids"][0]) == full.index(g["positive_document_ids"][0])
    near_top = {d for s in systems for hits in s.values() for d, _ in hits[:covered + 1]}
    assert got.keys() - {f"d{i}" for i in range(4)} <= near_top  # nothing but positives and top hits
    assert len(guard.pool(dev, docs, systems, cap=2)) == 4  # positives survive a cap below their count
    assert guard.pool(dev, docs, systems, cap=30) == got


def test_the_pool_scores_a_system_as_the_whole_corpus_does_where_the_teachers_negatives_flatter_it():
    """A trained model that learnt to push the teacher's negatives down but ranks other documents above the
    positive: a pool of the positives and those negatives scores it perfect; the pooled top hits of each system
    score it (and the base) as the whole corpus does."""
    from retrctl import metrics

    docs = {f"d{i}": {"text": "t"} for i in range(50)}
    dev = [{"query_id": f"q{i}", "positive_document_ids": [f"d{i}"],
            "negative_document_ids": [f"d{10 + i}", f"d{20 + i}"]} for i in range(5)]
    base = {g["query_id"]: [(g["negative_document_ids"][0], 3.0), (g["positive_document_ids"][0], 2.0)] +
            [(f"d{j}", 1.0 / j) for j in range(30, 50)] for g in dev}
    trained = {g["query_id"]: [(f"d{40 + int(g['query_id'][1:])}", 3.0), (f"d{45 + int(g['query_id'][1:]) % 5}", 2.5),
                               (g["positive_document_ids"][0], 2.0)] + [(f"d{j}", 1.0 / j) for j in range(30, 40)] for g in dev}
    qrels = {g["query_id"]: {g["positive_document_ids"][0]: 1} for g in dev}

    def ndcg(run, pool):
        kept = {q: [(d, s) for d, s in hits if d in pool] for q, hits in run.items()}
        return metrics.evaluate(kept, qrels, [guard.MEASURE]).mean[guard.MEASURE]

    teachers = {d for g in dev for d in g["positive_document_ids"] + g["negative_document_ids"]}
    assert ndcg(trained, teachers) == 1.0 > ndcg(base, teachers)  # the tilted pool prefers the trained model
    pooled = guard.pool(dev, docs, [base, trained], cap=40)
    for run in (base, trained):
        assert ndcg(run, pooled) == pytest.approx(ndcg(run, docs))
    assert ndcg(trained, pooled) < ndcg(base, pooled)


def test_interpolation_is_exact_at_the_ends():
    base = {"w": torch.tensor([0.0, 2.0]), "step": torch.tensor([1])}
    trained = {"w": torch.tensor([4.0, 6.0]), "step": torch.tensor([9]), "extra": torch.tensor([1.0])}
    assert torch.equal(guard.interpolate(base, trained, 0.0)["w"], base["w"])
    assert torch.equal(guard.interpolate(base, trained, 1.0)["w"], trained["w"])
    mid = guard.interpolate(base, trained, 0.5)
    assert torch.allclose(mid["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(mid["step"], trained["step"]) and torch.equal(mid["extra"], trained["extra"])


def _result(values):
    per_query = {f"q{i}": {"nDCG@10": v} for i, v in enumerate(values)}
    return Result(["nDCG@10"], {"nDCG@10": sum(values) / len(values)}, per_query, {})


def test_decision_keeps_the_base_unless_a_gain_beats_the_noise():
    base = [0.5, 0.2, 0.9, 0.4, 0.6, 0.3, 0.7, 0.5]
    noisy = [v + d for v, d in zip(base, [0.3, -0.2, 0.1, -0.25, 0.2, -0.1, 0.3, -0.1], strict=True)]
    clear = [v + 0.1 + 0.01 * (i % 3) for i, v in enumerate(base)]
    worse = [v - 0.1 for v in base]
    kept = guard.decide({0.0: _result(base), 0.5: _result(noisy), 1.0: _result(worse)})
    assert kept["pick"] == 0.0 and "kept the base" in guard.describe(kept)
    won = guard.decide({0.0: _result(base), 0.5: _result(clear), 1.0: _result(noisy)})
    assert won["pick"] == 0.5 and won["threshold"] == pytest.approx(0.025)
    assert "delivered α=0.5" in guard.describe(won)


def test_the_veto_queries_refuse_a_candidate_that_loses_on_them():
    base = [0.5, 0.2, 0.9, 0.4, 0.6, 0.3, 0.7, 0.5]
    clear = [v + 0.1 + 0.01 * (i % 3) for i, v in enumerate(base)]
    mixed = [v + 0.2 for v in base[:6]] + [v - 0.05 for v in base[6:]]  # wins overall, loses on q6 and q7
    results = {0.0: _result(base), 0.5: _result(clear), 1.0: _result(mixed)}
    assert guard.decide(results)["pick"] == 1.0
    vetoed = guard.decide(results, veto=["q6", "q7", "not-scored"])
    assert vetoed["pick"] == 0.5 and vetoed["veto_queries"] == 2
    assert [r["veto_gain"] for r in vetoed["candidates"]] == [0.0, pytest.approx(0.105), pytest.approx(-0.05)]
    assert "α=1 -0.0500" in guard.describe(vetoed)
    refused = guard.decide({0.0: _result(base), 1.0: _result(mixed)}, veto=["q6", "q7"])
    assert refused["pick"] == 0.0 and "the veto queries refused α=1" in guard.describe(refused)
    veto_first = guard.scored([{"query_id": f"q{i}"} for i in range(300)], veto={"q250", "q299"})
    assert len(veto_first) == guard.MAX_QUERIES and {g["query_id"] for g in veto_first[:2]} == {"q250", "q299"}


def test_alphas_are_parsed_and_checked():
    assert parse_alphas("1,0.5, 0.5") == [0.5, 1.0]
    for bad in ("", "0", "1.5", "a"):
        with pytest.raises(ValueError, match="guard-alphas"):
            parse_alphas(bad)


def _state(model_dir):
    from retrctl.models import Encoder

    return Encoder.load(model_dir, device="cpu").model.state_dict()


def test_train_with_the_guard_delivers_its_pick_and_records_it(tiny_bert, tmp_path, runner):
    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(16))
    out = tmp_path / "m"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    r = runner("train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-o", out, "--max-steps", 3,
               "--guard-shards", 3, "--guard-alphas", "0.5,1", "--guard-keep", tmp_path / "trained", *flags)
    assert r.exit_code == 0, r.output
    record = json.loads((out / "guard.json").read_text())
    assert [c["alpha"] for c in record["candidates"]] == [0.0, 0.5, 1.0]
    assert record["queries"] >= 2 and record["pick"] in (0.0, 0.5, 1.0)
    assert "guard: " in r.stderr and ("kept the base" in r.stderr or "delivered" in r.stderr)
    delivered, base, trained = _state(out), _state(tiny_bert), _state(tmp_path / "trained")
    assert all(torch.equal(delivered[k], base[k]) for k in base) == (record["pick"] == 0.0)
    assert not all(torch.equal(trained[k], base[k]) for k in base)  # the kept model is the trained one, α = 1
    assert all(torch.equal(delivered[k], trained[k]) for k in base) == (record["pick"] == 1.0)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".trained.")]  # no work dir left beside it


def test_guard_veto_names_the_queries_that_may_refuse(tiny_bert, tmp_path, runner):
    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    gs = groups(16)
    _, dev = guard.hold_out(gs, 3)
    chosen = [{"_id": g["query_id"], "text": g["query_text"]} for g in dev[:2]]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    args = [write_jsonl(tmp_path / "groups.jsonl", gs), "--corpus", corpus_file, "--model", tiny_bert, "--max-steps", 1,
            "--guard-shards", 3, *flags]
    r = runner("train", *args, "-o", tmp_path / "m", "--guard-veto", write_jsonl(tmp_path / "q.jsonl", chosen))
    assert r.exit_code == 0, r.output
    record = json.loads((tmp_path / "m" / "guard.json").read_text())
    assert record["queries"] == len(dev) and record["veto_queries"] == 2
    assert all("veto_gain" in row for row in record["candidates"])
    r = runner("train", *args, "-o", tmp_path / "m2", "--guard-veto", write_jsonl(tmp_path / "q1.jsonl", chosen[:1]))
    assert r.exit_code == 2 and "q1.jsonl" in r.output and not (tmp_path / "m2").exists()


def _sweep(path, **settings):
    """A one-row sweep file as `eval --sweep --json` writes it, with ``settings``."""
    return write_jsonl(path, [{"run": "linear:0,1", "nDCG@10": 0.5, "weights": [0.0, 1.0], "settings": settings}])


def test_a_base_the_known_items_say_cannot_read_the_corpus_is_delivered_untrained(tiny_bert, tmp_path, runner,
                                                                                  monkeypatch):
    from retrctl.train.loop import Trainer

    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    flags = [write_jsonl(tmp_path / "groups.jsonl", groups(16)), "--corpus", corpus_file, "--model", tiny_bert,
             "--max-steps", 1, "--guard-shards", 3, *(f"--{k.replace('_', '-')}={v}" for k, v in FAST.items())]
    unread = {"dense": 0.1, "last": 1.0, "queries": 8, "reads": False, "qrels": "dev-crops.jsonl"}
    (tmp_path / "pool").mkdir()  # an earlier run's pool index: no pool is encoded now, so it goes
    with monkeypatch.context() as m:
        m.setattr(Trainer, "fit", lambda self: pytest.fail("trained"))
        r = runner("train", *flags, "-o", tmp_path / "m", "--guard-keep", tmp_path / "kept", "--guard-pool-index",
                   tmp_path / "pool", "--guard-known-items", _sweep(tmp_path / "unread.jsonl", known_items=unread))
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "pool").exists()
    record = json.loads((tmp_path / "m" / "guard.json").read_text())
    assert record["known_items"] == unread and record["trained"] is False and record["delivered"] == 0.0
    assert "does not read the corpus" in r.stderr
    base = _state(tiny_bert)
    for out in ("m", "kept"):
        assert all(torch.equal(_state(tmp_path / out)[k], base[k]) for k in base), out
    reads = {**unread, "dense": 0.9, "reads": True}  # a base that reads: trained and guarded as without the flag
    r = runner("train", *flags, "-o", tmp_path / "m2", "--guard-known-items", _sweep(tmp_path / "reads.jsonl", known_items=reads))
    assert r.exit_code == 0, r.output
    assert [c["alpha"] for c in json.loads((tmp_path / "m2" / "guard.json").read_text())["candidates"]][0] == 0.0
    for bad, words in ((_sweep(tmp_path / "plain.jsonl", fusion="linear"), "a sweep made without --known-items"),
                       (corpus_file, "not a sweep file")):
        r = runner("train", *flags, "-o", tmp_path / "m3", "--guard-known-items", bad)
        assert r.exit_code == 2 and words in r.output and "--guard-known-items" in r.output, r.output
    r = runner("train", *flags[:5], "-o", tmp_path / "m3", "--guard-known-items", tmp_path / "unread.jsonl")
    assert r.exit_code == 2 and "only applies with --guard-shards" in r.output
    assert not (tmp_path / "m3").exists()


def test_guard_keep_needs_the_guard(tiny_bert, tmp_path, runner):
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(4))
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", "--guard-keep", tmp_path / "t")
    assert r.exit_code == 2 and "--guard-shards" in r.output and not (tmp_path / "m").exists()


def perturbed(model, out):
    """``model`` with noise added to every weight (seeded), saved to ``out``: a stand-in for a trained model."""
    from retrctl.models import Encoder

    enc = Encoder.load(model, device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.05 * torch.randn_like(p))
    enc.save(out)
    return out


def test_select_writes_the_picks_weights(tiny_bert, tmp_path, monkeypatch):
    trained_dir = perturbed(tiny_bert, tmp_path / "trained")
    trained = _state(trained_dir)
    docs = corpus()
    dev = groups(16)
    monkeypatch.setattr(guard, "decide", lambda results, level=0.05, veto=(): {  # force each pick in turn
        "pick": 0.5, "threshold": level, "level": level, "queries": 16, "measure": guard.MEASURE,
        "candidates": [{"alpha": a, guard.MEASURE: r.mean[guard.MEASURE], "gain": 0.0, "p": 1.0} for a, r in results.items()]})
    decision = guard.select(trained_dir, str(tiny_bert), dev, docs, alphas=[0.5, 1.0], seed=0, batch_size=8)
    assert decision["pool_docs"] == 40 and decision["pool"] == "corpus" and decision["pick"] == 0.5
    want = guard.interpolate(_state(tiny_bert), trained, 0.5)
    delivered = _state(trained_dir)
    assert all(torch.allclose(delivered[k], want[k], atol=1e-6) for k in want)
    assert json.loads((trained_dir / "guard.json").read_text())["pick"] == 0.5


@pytest.mark.parametrize("pick, delivered", [(0.5, 1.0), (0.0, 0.0)])
def test_guard_deliver_trained_writes_the_trained_model_when_a_candidate_passes(tiny_bert, tmp_path, monkeypatch,
                                                                                 pick, delivered):
    trained_dir = perturbed(tiny_bert, tmp_path / "trained")
    trained = _state(trained_dir)
    monkeypatch.setattr(guard, "decide", lambda results, level=0.05, veto=(): {
        "pick": pick, "threshold": level, "level": level, "queries": 16, "measure": guard.MEASURE,
        "candidates": [{"alpha": a, guard.MEASURE: r.mean[guard.MEASURE], "gain": 0.01 if a else 0.0, "p": 0.01 if a else 1.0}
                       for a, r in results.items()]})
    decision = guard.select(trained_dir, str(tiny_bert), groups(16), corpus(), alphas=[0.5], seed=0, batch_size=8,
                            deliver="trained")
    want = guard.interpolate(_state(tiny_bert), trained, delivered)
    got = _state(trained_dir)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    saved = json.loads((trained_dir / "guard.json").read_text())
    assert saved["pick"] == pick and saved["delivered"] == delivered == decision["delivered"]
    assert ("the trained model (α=0.5 passed" in guard.describe(decision)) == (pick > 0)


@pytest.mark.parametrize("args, words", [(("--guard-deliver", "trained"), "only applies with --guard-shards"),
                                         (("--guard-deliver", "best"), "--guard-deliver must be one of")])
def test_guard_deliver_is_checked(tiny_bert, tmp_path, runner, args, words):
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(4))
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", *args)
    assert r.exit_code == 2 and words in r.output and not (tmp_path / "m").exists()


def test_guard_needs_a_corpus_and_two_shards(tiny_bert, tmp_path, runner):
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(16))
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", "--guard-shards", 1)
    assert r.exit_code == 2 and "--guard-shards" in r.stderr
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", "--guard-shards", 3)
    assert r.exit_code == 2 and "needs --corpus" in r.stderr
    assert not (tmp_path / "m").exists()


def test_training_never_reads_a_held_out_group_nor_its_query(tiny_bert, tmp_path, runner, monkeypatch):
    from retrctl.hashing import in_shard
    from retrctl.train import data

    given, seen = [], []
    source_init, example = data.GroupSource.__init__, data.Batches.example

    def record_source(self, groups, corpus):
        source_init(self, groups, corpus)
        given.extend(g for _, g in self)

    def record_example(self, line, g, rng):
        seen.append(example(self, line, g, rng))
        return seen[-1]

    monkeypatch.setattr(data.GroupSource, "__init__", record_source)
    monkeypatch.setattr(data.Batches, "example", record_example)
    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    gs = groups(16)
    kept, dev = guard.hold_out(gs, 3)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    r = runner("train", write_jsonl(tmp_path / "groups.jsonl", gs), "--corpus", corpus_file, "--model", tiny_bert,
               "-o", tmp_path / "m", "--epochs", 2, "--guard-shards", 3, *flags)
    assert r.exit_code == 0, r.output
    assert len(dev) >= 2 and json.loads((tmp_path / "m" / "guard.json").read_text())["queries"] == len(dev)
    held_ids, held_texts = {g["query_id"] for g in dev}, {g["query_text"] for g in dev}
    assert {g["query_id"] for g in given} == {g["query_id"] for g in kept}  # the trainer got the others, all of them
    assert {e.query_id for e in seen} == {g["query_id"] for g in kept}  # and its steps read each of them
    assert not any(e.query_id in held_ids or e.query in held_texts for e in seen)
    assert not any(in_shard(e.keys[0][0], 0, 3) for e in seen)  # no step's positive is a held-out document


def test_select_pools_a_corpus_larger_than_the_cap_from_bm25_and_the_base(tiny_bert, tmp_path, monkeypatch):
    from retrctl.models import Encoder

    Encoder.load(tiny_bert, device="cpu").save(tmp_path / "trained")
    monkeypatch.setattr(guard, "MAX_POOL", 25)
    searched = []
    rankings = guard.rankings
    monkeypatch.setattr(guard, "rankings", lambda *a, **k: searched.append(a[1]) or rankings(*a, **k))
    decision = guard.select(tmp_path / "trained", str(tiny_bert), groups(16), corpus(), alphas=[1.0], seed=0, batch_size=8)
    assert decision["pool"] == "bm25+base top hits" and decision["pool_docs"] == 25
    assert len(searched) == 1 and len(searched[0]) == decision["queries"]  # the held-out queries, over all 40 docs


def _write_trec(path, run):
    path.write_text("".join(f"{q} Q0 {d} {r} {s} t\n" for q, hits in run.items() for r, (d, s) in enumerate(hits, 1)))
    return path


def test_select_pools_from_given_runs_as_from_its_own_search(tiny_bert, tmp_path, monkeypatch):
    from retrctl.models import Encoder

    monkeypatch.setattr(guard, "MAX_POOL", 25)
    docs, dev = corpus(), groups(16)
    queries, _ = guard.queries_and_qrels(guard.scored(dev))
    runs = guard.rankings(docs, queries, Encoder.load(tiny_bert, device="cpu"), 8)
    decisions = []
    for given in (None, runs):
        perturbed(tiny_bert, tmp_path / "trained")
        decisions.append(guard.select(tmp_path / "trained", str(tiny_bert), dev, docs, alphas=[1.0], seed=0,
                                      batch_size=8, pool_runs=given))
    searched, given = decisions
    assert searched["pool"] == "bm25+base top hits" and given["pool"] == "the given runs' top hits"
    assert given["pool_docs"] == searched["pool_docs"] == 25
    for a, b in zip(searched["candidates"], given["candidates"], strict=True):  # the same pool, the same scores
        assert a["alpha"] == b["alpha"] and a[guard.MEASURE] == pytest.approx(b[guard.MEASURE], abs=1e-6)
    monkeypatch.setattr(guard, "rankings", lambda *a, **k: pytest.fail("the corpus was searched again"))
    guard.select(tmp_path / "trained", str(tiny_bert), dev, docs, alphas=[1.0], seed=0, batch_size=8, pool_runs=runs)


def test_train_reads_the_pool_runs_before_training(tiny_bert, tmp_path, runner, monkeypatch):
    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    gs = groups(16)
    _, dev = guard.hold_out(gs, 3)
    held = [g["query_id"] for g in dev]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    args = [write_jsonl(tmp_path / "groups.jsonl", gs), "--corpus", corpus_file, "--model", tiny_bert, "--max-steps", 1,
            "--guard-shards", 3, *flags]
    other = _write_trec(tmp_path / "other.trec", {"nope": [("d1", 1.0)]})
    some = _write_trec(tmp_path / "some.trec", {q: [(d, 1.0 / (r + 1)) for r, d in enumerate(sorted(docs))]
                                                for q in held[:-1]})
    from retrctl.train import loop

    monkeypatch.setattr(loop.Trainer, "fit", lambda *a, **k: pytest.fail("trained before reading the runs"))
    r = runner("train", *args, "--guard-pool-runs", f"{some},{other}", "-o", tmp_path / "m")
    assert r.exit_code == 2 and "other.trec" in r.output and "held-out" in r.output and not (tmp_path / "m").exists()
    monkeypatch.undo()
    monkeypatch.setattr(guard, "MAX_POOL", 25)
    r = runner("train", *args, "--guard-pool-runs", str(some), "-o", tmp_path / "m")
    assert r.exit_code == 0, r.output
    assert f"holds {len(held) - 1} of the {len(held)} held-out queries" in r.stderr
    assert json.loads((tmp_path / "m" / "guard.json").read_text())["pool"] == "the given runs' top hits"


def test_guard_pool_runs_is_checked(tiny_bert, tmp_path, runner):
    gs = groups(16)
    groups_file = write_jsonl(tmp_path / "groups.jsonl", gs)
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", "--guard-pool-runs", "a.trec")
    assert r.exit_code == 2 and "only applies with --guard-shards" in r.output and not (tmp_path / "m").exists()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in corpus().items()])
    run = _write_trec(tmp_path / "a.trec", {g["query_id"]: [("d1", 1.0)] for g in guard.hold_out(gs, 3)[1]})
    r = runner("train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "m",
               "--guard-shards", 3, "--guard-pool-runs", run, "--passage-index", tmp_path / "idx")
    assert r.exit_code == 2 and "every vector of that index" in r.output and not (tmp_path / "m").exists()


def _base_index(runner, tiny_bert, tmp_path, docs, *flags, name="idx-base"):
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    r = runner("index", corpus_file, "--model", tiny_bert, *flags, "-o", tmp_path / name)
    assert r.exit_code == 0, r.output
    return corpus_file, tmp_path / name


@pytest.mark.parametrize("cap", [guard.MAX_POOL, 25])  # the whole corpus the pool; a pool of BM25's and the base's hits
def test_the_base_scored_on_its_index_as_when_encoded(tiny_bert, tmp_path, runner, monkeypatch, cap):
    monkeypatch.setattr(guard, "MAX_POOL", cap)
    docs, dev = corpus(), groups(16)
    _, idx = _base_index(runner, tiny_bert, tmp_path, docs)
    encoded_pools = []
    score = guard.score
    monkeypatch.setattr(guard, "score", lambda enc, docs, **k: encoded_pools.append(len(docs)) or score(enc, docs, **k))
    decisions = []
    for base_index in (None, idx):
        perturbed(tiny_bert, tmp_path / "trained")
        decisions.append(guard.select(tmp_path / "trained", str(tiny_bert), dev, docs, alphas=[0.5, 1.0], seed=0,
                                      batch_size=8, base_index=base_index))
    encoded, stored = decisions
    assert encoded_pools == [encoded["pool_docs"]] * 3 + [stored["pool_docs"]] * 2  # α = 0 encoded no pool the 2nd time
    assert stored["base_vectors"] == str(idx) and "base_vectors" not in encoded
    assert stored["pool_docs"] == encoded["pool_docs"] == min(cap, len(docs))
    for a, b in zip(encoded["candidates"], stored["candidates"], strict=True):  # the same vectors, the same scores
        assert a["alpha"] == b["alpha"] and a[guard.MEASURE] == pytest.approx(b[guard.MEASURE], abs=1e-6)
    assert stored["pick"] == encoded["pick"]


def test_guard_base_index_is_checked(tiny_bert, tmp_path, runner, monkeypatch):
    docs, gs = corpus(), groups(16)
    corpus_file, idx = _base_index(runner, tiny_bert, tmp_path, docs, "--passage-max-len", FAST["passage_max_len"])
    args = [write_jsonl(tmp_path / "groups.jsonl", gs), "--corpus", corpus_file, "--model", tiny_bert, "--max-steps", 1,
            *[f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()], "-o", tmp_path / "m"]
    r = runner("train", *args, "--guard-base-index", idx)
    assert r.exit_code == 2 and "only applies with --guard-shards" in r.output
    changed = dict(docs)
    first = next(iter(sorted(changed)))
    changed[first] = {**changed[first], "text": changed[first]["text"] + " edited"}
    other = write_jsonl(tmp_path / "other.jsonl", [{"_id": d, **v} for d, v in changed.items()])
    bm25 = tmp_path / "idx-bm25"
    assert runner("index", corpus_file, "--method", "bm25", "-o", bm25).exit_code == 0
    for flags, words in ((["--guard-base-index", bm25], "a bm25 index with no model;"),
                         (["--guard-base-index", idx, "--corpus", other], f"doc {first!r} has another text there"),
                         (["--guard-base-index", idx, "--passage-index", idx], "scores every candidate on that index")):
        r = runner("train", *args, "--guard-shards", 3, *flags)
        assert r.exit_code == 2 and words in r.output and "--guard-base-index" in r.output, r.output
        assert not (tmp_path / "m").exists()
    from retrctl.models import Encoder

    other = tmp_path / "other-model"  # a model with other weights: its vectors are not the base's
    enc = Encoder.load(tiny_bert, device="cpu")
    with torch.no_grad():
        next(enc.parameters()).add_(1e-3)
    enc.save(other)
    _, by_other = _base_index(runner, other, tmp_path, docs, "--passage-max-len", FAST["passage_max_len"],
                              name="idx-other")
    r = runner("train", *args, "--guard-shards", 3, "--guard-base-index", by_other)
    assert r.exit_code == 2 and "has other weights" in r.output and not (tmp_path / "m").exists(), r.output
    again = tmp_path / "saved-again"  # the base saved again elsewhere: the same weights, so its index serves
    Encoder.load(tiny_bert, device="cpu").save(again)
    _, by_again = _base_index(runner, again, tmp_path, docs, "--passage-max-len", FAST["passage_max_len"],
                              name="idx-again")
    r = runner("train", *args, "--guard-shards", 3, "--guard-base-index", by_again)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m" / "guard.json").read_text())["base_vectors"] == str(by_again)
    r = runner("train", *args, "--guard-shards", 3, "--guard-base-index", idx, "--overwrite")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m" / "guard.json").read_text())["base_vectors"] == str(idx)
    _, longer = _base_index(runner, tiny_bert, tmp_path, docs, name="idx-longer")  # passages cut at 256, not 24

    def unread(*_):
        raise AssertionError("vectors read from an index whose settings differ")

    monkeypatch.setattr("retrctl.indexes.dense.stored_vectors", unread)  # the manifest decides before any vector
    r = runner("train", *args, "--guard-shards", 3, "--guard-base-index", longer, "--overwrite")
    assert r.exit_code == 0, r.output
    assert "built with other passage_max_len than the candidates encode with: the base is encoded too" in r.stderr
    assert "base_vectors" not in json.loads((tmp_path / "m" / "guard.json").read_text())


@pytest.mark.parametrize("cap", [guard.MAX_POOL, 25])  # the whole corpus the pool; a pool of BM25's and the base's hits
def test_the_delivered_models_encode_of_the_pool_starts_its_index(tiny_bert, tmp_path, runner, monkeypatch, cap):
    """``pool_index`` (train --guard-pool-index): the guard's encode of its pool with the model it delivers is a dense
    index that `index --vectors-from` starts the delivered model's index from, so only the documents outside the pool
    are encoded, to the vectors an index encoded in full holds. Where the base is kept on its stored vectors the
    guard encoded no pool with it: nothing is written, and an earlier run's pool index is removed."""
    from retrctl.indexes.dense import stored_vectors

    monkeypatch.setattr(guard, "MAX_POOL", cap)
    docs, dev = corpus(), groups(16)
    corpus_file, base_idx = _base_index(runner, tiny_bert, tmp_path, docs)
    pick = {"alpha": 0.5}
    monkeypatch.setattr(guard, "decide", lambda results, level=0.05, veto=(): {
        "pick": pick["alpha"], "threshold": level, "level": level, "queries": 16, "measure": guard.MEASURE,
        "candidates": [{"alpha": a, guard.MEASURE: r.mean[guard.MEASURE], "gain": 0.0, "p": 1.0} for a, r in results.items()]})
    model, pool_index = tmp_path / "model", tmp_path / "guard-pool"
    decision = guard.select(perturbed(tiny_bert, model), str(tiny_bert), dev, docs, alphas=[0.5, 1.0], seed=0,
                            batch_size=8, base_index=base_idx, pool_index=pool_index)
    _, pooled, _ = stored_vectors(pool_index)
    assert len(pooled) == decision["pool_docs"] == min(cap, len(docs))
    r = runner("index", corpus_file, "--model", model, "--vectors-from", pool_index, "-o", tmp_path / "seeded")
    assert r.exit_code == 0 and "its model has the same weights" in r.output, r.output
    assert f"({len(docs) - len(pooled)} added, 0 updated, {len(pooled)} unchanged, 0 removed)" in r.output, r.output
    assert runner("index", corpus_file, "--model", model, "-o", tmp_path / "full").exit_code == 0
    (_, ids, seeded), (_, full_ids, full) = stored_vectors(tmp_path / "seeded"), stored_vectors(tmp_path / "full")
    row = {d: i for i, d in enumerate(ids)}
    assert sorted(ids) == sorted(full_ids)
    # the same model's vectors, encoded in other batches: float32 rounding of unit vectors' components
    np.testing.assert_allclose(seeded[[row[d] for d in full_ids]], full, rtol=0, atol=1e-5)

    pick["alpha"] = 0.0
    guard.select(perturbed(tiny_bert, model), str(tiny_bert), dev, docs, alphas=[0.5], seed=0, batch_size=8,
                 base_index=base_idx, pool_index=pool_index)
    assert not pool_index.exists()


def test_guard_pool_index_is_checked(tiny_bert, tmp_path, runner):
    gs = groups(16)
    groups_file = write_jsonl(tmp_path / "groups.jsonl", gs)
    r = runner("train", groups_file, "--model", tiny_bert, "-o", tmp_path / "m", "--guard-pool-index", tmp_path / "p")
    assert r.exit_code == 2 and "only applies with --guard-shards" in r.output and not (tmp_path / "m").exists()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in corpus().items()])
    r = runner("train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "m",
               "--guard-shards", 3, "--guard-pool-index", tmp_path / "p", "--passage-index", tmp_path / "idx")
    assert r.exit_code == 2 and "the guard encodes no passage" in r.output and not (tmp_path / "m").exists()

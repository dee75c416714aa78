"""SPLADE's sparse head (retrctl/models/sparse.py), its training terms and the sparse index backend
(retrctl/indexes/sparse.py). Tiny random BERT and Llama; the real-model numbers are bench/light.py's."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from trainkit import FAST, write_jsonl
from trainkit import corpus as _corpus
from trainkit import groups as _groups

from retrctl.indexes import open_index
from retrctl.models import Encoder
from retrctl.models import sparse as sp
from retrctl.models.layout import StepOutputs
from retrctl.train import losses
from stages.index import index


@pytest.fixture(params=["bert", "llama"])
def enc(request, tiny_bert, tiny_llama):
    e = Encoder.load(tiny_bert if request.param == "bert" else tiny_llama, device="cpu")
    if request.param == "llama":  # tiny_llama's LM head is untied (refused, below); SmolLM2's is tied
        with pytest.raises(ValueError, match="not tied"):
            e.add_sparse_head()
        e.model.config.tie_word_embeddings = True
    e.add_sparse_head(top_k=8)
    return e.eval()


def test_flops_is_the_squared_batch_mean_summed():
    w = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert sp.flops(w).item() == pytest.approx(((1 + 3) / 2) ** 2 + 0 + (2 / 2) ** 2)


def test_flops_weight_grows_quadratically():
    assert losses.flops_weight_at(0, 1e-3, 100) == 0
    assert losses.flops_weight_at(50, 1e-3, 100) == pytest.approx(0.25e-3)
    assert losses.flops_weight_at(100, 1e-3, 100) == losses.flops_weight_at(5000, 1e-3, 100) == 1e-3
    assert losses.flops_weight_at(3, 1e-3, 0) == 1e-3


def test_chunked_projection_equals_the_naive_one_with_its_gradient(enc):
    batch = enc.tokenize(["a cat sat on the mat", "x", "retrieval " * 9], "passage")
    hidden = enc.model(**batch).last_hidden_state.detach().requires_grad_()
    enc.sparse.chunk = 1000  # 31 slices of the 30,522-term vocabulary
    chunked = enc.sparse(hidden, batch["attention_mask"], batch["input_ids"])
    naive = enc.sparse.naive(hidden, batch["attention_mask"], batch["input_ids"])
    assert chunked.shape == (3, enc.tokenizer.vocab_size)
    assert torch.allclose(chunked, naive, atol=1e-6)
    weight = enc.sparse.weight
    g1 = torch.autograd.grad(chunked.square().sum(), (hidden, weight))
    g2 = torch.autograd.grad(enc.sparse.naive(hidden, batch["attention_mask"], batch["input_ids"]).square().sum(),
                             (hidden, weight))
    assert torch.allclose(g1[0], g2[0], atol=1e-5) and torch.allclose(g1[1], g2[1], atol=1e-5)
    assert float(g1[1].abs().max()) > 0


def test_max_over_tokens_gradient_by_finite_differences():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda h, w: sp.MaxOverTokens.apply(h, w, keep, 3), (h, w))
    masked = (h @ w.T).masked_fill(~keep[:, :, None], float("-inf"))
    assert torch.allclose(sp.MaxOverTokens.apply(h, w, keep, 3), masked.amax(1))


def test_backward_keeps_no_logits(enc):
    """What autograd keeps per text for the projection does not grow with the tokens: [vocab]-sized rows only."""
    from retrctl import memory

    def kept(head, words: int):
        batch = enc.tokenize(["retrieval " * words] * 2, "passage")
        hidden = enc.model(**batch).last_hidden_state.detach().requires_grad_()
        return memory.probe(lambda b: head(hidden, b["attention_mask"], b["input_ids"]), lambda n: batch, enc)

    vocab, width = enc.sparse.vocab, enc.model.config.hidden_size * 4
    assert kept(enc.sparse.naive, 60) >= 60 * vocab * 4  # the textbook keeps [T, vocab] float logits per text
    short, long = kept(enc.sparse, 30), kept(enc.sparse, 60)
    assert long - short <= 30 * width  # 30 more tokens add their hidden states, nothing × vocab
    assert long < 16 * vocab  # winners (int64) + a few [vocab] rows of the finish


def test_special_tokens_give_no_terms(enc):
    batch = enc.tokenize(["tea", ""], "passage")
    with torch.no_grad():
        w = enc.sparse(enc.model(**batch).last_hidden_state, batch["attention_mask"], batch["input_ids"])
    specials = enc.sparse.special_ids
    assert specials and float(w[:, specials].abs().max()) == 0.0
    assert int((w[0] > 0).sum()) > 0
    assert float(w[1].abs().max()) == 0.0  # only [CLS]/[SEP] (or BOS): nothing to weigh


def test_token_count_queries_run_no_model_and_skip_the_prompt(enc):
    enc.config.query_prompt = "query: "
    terms, counts = enc.encode_sparse(["dog dog cat", "cat"], "query")
    ids = enc.tokenizer(["dog", "cat"], add_special_tokens=False)["input_ids"]
    dog, cat = ids[0][0], ids[1][0]
    row = dict(zip(terms[0].tolist(), counts[0].tolist(), strict=True))
    assert row == {dog: 2.0, cat: 1.0}
    assert dict(zip(terms[1].tolist(), counts[1].tolist(), strict=True)) == {cat: 1.0, 0: 0.0}  # zero-padded


def test_encoded_docs_keep_their_top_k_terms(enc):
    texts = ["a cat sat on the mat", "coffee beans"]
    terms, weights = enc.encode_sparse(texts, "passage")
    assert terms.shape == weights.shape == (2, 8)
    batch = enc.tokenize(texts, "passage")
    with torch.no_grad():
        full = enc.sparse(enc.model(**batch).last_hidden_state, batch["attention_mask"], batch["input_ids"])
    for r in range(2):
        assert np.allclose(np.sort(weights[r])[::-1], torch.topk(full[r], 8).values.numpy(), atol=1e-6)
        assert np.allclose(full[r, terms[r]].numpy(), weights[r], atol=1e-6)


def test_sparse_loss_adds_the_sparse_ce_and_flops_to_the_dense_loss():
    torch.manual_seed(0)
    vocab, h, g = 7, 4, 2
    q_dense = torch.randn(2, h)
    passages = {"dense": torch.randn(4, h), "sparse": torch.rand(4, vocab)}
    terms = torch.zeros(2, vocab)
    terms[0, 1] = terms[1, 3] = 1.0
    dense = functools.partial(losses.dense_loss, loss=lambda q, p: losses.group_loss(q, p, group_size=g))
    out = StepOutputs({"dense": q_dense}, passages)
    total, parts = losses.sparse_loss(out, loss=dense, group_size=g, flops_weight=0.5, query_terms=terms)
    base, _ = dense(out)
    ce, _ = losses.group_loss(terms, passages["sparse"], group_size=g, temperature=1.0, normalize=False)
    assert total.item() == pytest.approx((base + ce + 0.5 * sp.flops(passages["sparse"])).item(), rel=1e-6)
    assert parts["ce_sparse"].item() == pytest.approx(ce.item())
    # symmetric: the query's encoded weights are its own sparse part and get their FLOPS term too
    q_sparse = torch.rand(2, vocab)
    total2, _ = losses.sparse_loss(StepOutputs({"dense": q_dense, "sparse": q_sparse}, passages), loss=dense,
                                   group_size=g, flops_weight=0.5)
    ce2, _ = losses.group_loss(q_sparse, passages["sparse"], group_size=g, temperature=1.0, normalize=False)
    want = base + ce2 + 0.5 * (sp.flops(passages["sparse"]) + sp.flops(q_sparse))
    assert total2.item() == pytest.approx(want.item(), rel=1e-6)


@pytest.fixture(scope="module")
def sparse_model(tiny_bert, tmp_path_factory):
    """A tiny BERT trained 2 steps with --heads dense,sparse through the CLI."""
    from click.testing import CliRunner
    from conftest import _retrctl

    tmp = tmp_path_factory.mktemp("sparse_model")
    groups = write_jsonl(tmp / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    r = CliRunner().invoke(_retrctl, [str(a) for a in ("train", groups, "--corpus", corpus, "--model", tiny_bert,
                           "-o", tmp / "m", "--max-steps", 2, "--train-group-size", 2, "--heads", "dense,sparse",
                           "--sparse-top-k", 16, "--flops-warmup", 0, *fast)])
    assert r.exit_code == 0, r.stderr
    return tmp / "m", corpus


def test_trained_sparse_head_saves_loads_and_keeps_the_dense_layout(sparse_model):
    model, _ = sparse_model
    metrics = [json.loads(line) for line in (model / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[-1]["ce_sparse"] > 0 and metrics[-1]["flops"] > 0
    assert json.loads((model / "sparse" / "config.json").read_text())["top_k"] == 16
    enc = Encoder.load(model, device="cpu")
    assert enc.sparse is not None and enc.sparse.query == "tokens"
    again = Encoder.load(model, device="cpu")
    a, b = enc.encode_sparse(["rust memory safety"], "passage"), again.encode_sparse(["rust memory safety"], "passage")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(model), device="cpu").encode(["a"]).shape[-1] == 32  # the dense head, stock


def _brute(enc, docs, queries):
    from retrctl.records import passage_text

    d = sp.to_csr(*enc.encode_sparse([passage_text(x) for x in docs], "passage"), enc.sparse.vocab)
    q = sp.to_csr(*enc.encode_sparse([x["query_text"] for x in queries], "query"), enc.sparse.vocab)
    return (q @ d.T).toarray()


def test_sparse_index_search_is_the_exact_dot_product_and_updates_like_a_fresh_build(sparse_model, tmp_path):
    model, _ = sparse_model
    docs = [{"docid": k, **v} for k, v in _corpus().items()]
    queries = [{"query_id": f"q{i}", "query_text": t} for i, t in enumerate(["cat dog", "rust python memory", "leaf"])]
    index(docs, tmp_path / "idx", model=str(model), method="sparse")
    idx = open_index(tmp_path / "idx")
    run = idx.search(queries, k=5)
    want = _brute(idx.encoder, docs, queries)
    for i, q in enumerate(queries):
        got = run[q["query_id"]]
        assert len(got) == 5
        for docid, score in got:
            assert score == pytest.approx(want[i, int(docid[1:])], abs=1e-5)
        assert got[0][1] == pytest.approx(want[i].max(), abs=1e-5)
    assert idx.score(queries[0], ["d3", "nope"]) == {"d3": pytest.approx(want[0, 3], abs=1e-5)}

    changed = [d for d in docs if d["docid"] != "d1"] + [{"docid": "new", "title": "", "text": "rust rust memory"}]
    changed[0] = {**changed[0], "text": "python memory safety"}
    stats = index(changed, tmp_path / "idx")
    assert (stats["added"], stats["updated"], stats["removed"], stats["encoded"]) == (1, 1, 1, 2)
    index(changed, tmp_path / "fresh", model=str(model), method="sparse")
    a, b = open_index(tmp_path / "idx"), open_index(tmp_path / "fresh")
    assert sorted(a.docids) == sorted(b.docids)
    ra, rb = a.search(queries, k=10), b.search(queries, k=10)
    for q in queries:
        assert [d for d, _ in ra[q["query_id"]]] == [d for d, _ in rb[q["query_id"]]]
        assert np.allclose([s for _, s in ra[q["query_id"]]], [s for _, s in rb[q["query_id"]]], atol=1e-5)


def test_sparse_shards_merge_to_the_whole(sparse_model, tmp_path, runner):
    model, corpus = sparse_model
    for s in (0, 1):
        r = runner("index", corpus, "--method", "sparse", "--model", model, "--shard-id", s, "--shard-num", 2, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    assert runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged").exit_code == 0
    assert runner("index", corpus, "--method", "sparse", "--model", model, "-o", tmp_path / "whole").exit_code == 0
    q = [{"query_id": "1", "query_text": "cat water hot"}]
    assert open_index(tmp_path / "merged").search(q, 7) == open_index(tmp_path / "whole").search(q, 7)


def test_a_model_without_a_sparse_head_or_a_bad_head_name_exits_2(tiny_bert, corpus_file, runner, tmp_path):
    r = runner("index", corpus_file, "--method", "sparse", "--model", tiny_bert, "-o", tmp_path / "idx")
    assert r.exit_code == 2 and "no sparse head" in r.stderr and "--heads dense,sparse" in r.stderr, r.stderr
    assert not (tmp_path / "idx" / "index.json").exists()
    r = runner("train", "-", "--model", tiny_bert, "-o", tmp_path / "m", "--heads", "colbert")
    assert r.exit_code == 2 and "--heads" in r.stderr


def test_sparse_model_exports_and_its_index_exports_as_json_vectors(sparse_model, tmp_path, runner):
    import gzip

    model, corpus = sparse_model
    r = runner("export", model, "--format", "st", "--query-max-len", 24, "-o", tmp_path / "dist")  # one ST length cap
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "dist" / "sparse" / "config.json").exists()
    assert runner("index", corpus, "--method", "sparse", "--model", tmp_path / "dist", "-o", tmp_path / "idx").exit_code == 0
    r = runner("export", tmp_path / "idx", "--format", "json-vectors", "-o", tmp_path / "lucene")
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(x) for x in gzip.open(tmp_path / "lucene" / "docs.jsonl.gz", "rt")]
    idx = open_index(tmp_path / "idx")
    assert [x["id"] for x in lines] == idx.docids
    terms, weights = idx.encoder.encode_sparse([json.loads(x)["title"] + " " + json.loads(x)["text"]
                                                for x in open(corpus)][:1], "passage")
    tokens = idx.encoder.tokenizer.convert_ids_to_tokens(terms[0].tolist())
    want = {t: round(float(w) * 100) for t, w in zip(tokens, weights[0], strict=True) if round(float(w) * 100) > 0}
    assert lines[0]["vector"] == want and lines[0]["contents"] == ""
    r = runner("export", tmp_path / "idx", "--format", "json-vectors,st", "-o", tmp_path / "bad")
    assert r.exit_code == 2


# ---------------------------------------------------------------- one index, both heads (indexes/heads/)


def _ids(run):
    return {q: [d for d, _ in hits] for q, hits in run.items()}


def test_a_sparse_model_indexes_both_heads_in_one_pass_and_fuses_them(sparse_model, tmp_path):
    from retrctl import fusion
    from retrctl.indexes import HeadsIndex

    model, _ = sparse_model
    docs = [{"docid": k, **v} for k, v in _corpus().items()]
    queries = [{"query_id": f"q{i}", "query_text": t} for i, t in enumerate(["cat dog", "rust python memory", "leaf"])]
    stats = index(docs, tmp_path / "idx", model=str(model))  # default: every head the model has
    assert stats["encoded"] == len(docs)
    idx = open_index(tmp_path / "idx")
    assert isinstance(idx, HeadsIndex) and idx.version.manifest["settings"]["heads"] == ["dense", "sparse"]
    fused = idx.search(queries, k=10)
    idx.heads = "dense"
    dense = idx.search(queries, k=100)
    idx.heads = "sparse"
    sparse = idx.search(queries, k=100)
    assert fused == fusion.fuse([dense, sparse], method="linear", norm="minmax", hits=10)
    # each head is what its single-head index gives
    index(docs, tmp_path / "only-sparse", model=str(model), method="sparse")
    assert _ids(sparse) == _ids(open_index(tmp_path / "only-sparse").search(queries, k=100))
    index(docs, tmp_path / "only-dense", model=str(model), heads="dense")
    assert _ids(dense) == _ids(open_index(tmp_path / "only-dense").search(queries, k=100))

    changed = [d for d in docs if d["docid"] != "d5"] + [{"docid": "new", "title": "", "text": "leaf water leaf"}]
    changed[2] = {**changed[2], "text": "cat cat dog"}
    stats = index(changed, tmp_path / "idx")
    assert (stats["added"], stats["updated"], stats["removed"], stats["encoded"]) == (1, 1, 1, 2)
    index(changed, tmp_path / "fresh", model=str(model))
    a, b = open_index(tmp_path / "idx"), open_index(tmp_path / "fresh")
    for heads in ("dense", "sparse", "dense,sparse"):
        a.heads = b.heads = heads
        ra, rb = a.search(queries, k=10), b.search(queries, k=10)
        assert _ids(ra) == _ids(rb), heads
        assert all(np.allclose([s for _, s in ra[q]], [s for _, s in rb[q]], atol=1e-5) for q in ra)


def test_two_head_shards_merge_and_search_flags(sparse_model, tmp_path, runner, queries_file):
    model, corpus = sparse_model
    for s in (0, 1):
        r = runner("index", corpus, "--model", model, "--shard-id", s, "--shard-num", 2, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    assert runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged").exit_code == 0
    assert runner("index", corpus, "--model", model, "-o", tmp_path / "whole").exit_code == 0
    runs = {}
    for name in ("merged", "whole"):
        r = runner("search", tmp_path / name, queries_file, "--hits", 5, "--fusion", "rrf", "-o", tmp_path / f"{name}.trec")
        assert r.exit_code == 0, r.stderr
        runs[name] = (tmp_path / f"{name}.trec").read_text()
    assert runs["merged"] == runs["whole"]
    m = json.loads((tmp_path / "whole.trec.manifest.json").read_text())
    assert m["settings"]["heads"] == ["dense", "sparse"] and m["settings"]["fusion"] == "rrf"
    r = runner("search", tmp_path / "whole", queries_file, "--heads", "colbert")
    assert r.exit_code == 2 and "colbert" in r.stderr
    r = runner("search", tmp_path / "whole", queries_file, "--weights", "1,2,3")
    assert r.exit_code == 2 and "weights" in r.stderr


def test_heads_flags_on_a_one_head_model_or_index_exit_2(tiny_bert, corpus_file, queries_file, runner, tmp_path):
    r = runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,sparse", "-o", tmp_path / "idx")
    assert r.exit_code == 2 and "no sparse head" in r.stderr, r.stderr
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "idx").exit_code == 0
    r = runner("search", tmp_path / "idx", queries_file, "--heads", "sparse")
    assert r.exit_code == 2 and "one head" in r.stderr, r.stderr


def test_token_lookup_and_token_count_heads_search_without_a_transformer(tiny_bert, runner, tmp_path, queries_file):
    from retrctl.models import lookup

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--max-steps", 2,
               "--train-group-size", 2, "--query-encoder", "token-lookup", "--heads", "dense,sparse", *fast)
    assert r.exit_code == 0, r.stderr
    metrics = json.loads((tmp_path / "m" / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["ce_lookup"] > 0 and metrics["ce_sparse"] > 0
    assert runner("index", corpus, "--model", tmp_path / "m", "-o", tmp_path / "idx").exit_code == 0
    idx = open_index(tmp_path / "idx", query_encoder="auto")
    assert isinstance(idx.encoder, lookup.TokenLookupEncoder)  # the LightRetriever hybrid: no transformer for queries
    run = idx.search([{"query_id": "1", "query_text": "cat water"}], k=5)
    assert len(run["1"]) == 5


def test_seismic_search_rescores_exactly_and_matches_exact_search_on_a_small_corpus(capfd):
    import scipy.sparse as sps

    from retrctl.indexes import sparse as sidx

    rng = np.random.default_rng(0)
    n, vocab, k = 300, 500, 10
    dense = np.where(rng.random((n, vocab)) < 0.05, rng.random((n, vocab)), 0).astype(np.float32)
    docs = sps.csr_matrix(dense)
    terms = np.stack([rng.choice(vocab, 6, replace=False) for _ in range(20)])
    weights = np.ones_like(terms, dtype=np.float32)
    weights[3] = 0  # a query with no term: no hit, no error
    qrows = sidx.pack(terms, weights)
    key, docids = np.arange(n), [f"d{i:03d}" for i in range(n)]
    want_s, want_ids = sidx.exact_search(docs, qrows, k, key, docids)
    built = sidx.seismic_index(docs)
    assert capfd.readouterr().out == ""  # Seismic's build log goes to stderr, never into records on stdout
    got_s, got_ids = sidx.seismic_search(built, docs, qrows, k, key, docids, query_cut=6, heap_factor=1.0)
    assert got_ids[3] == [] and not got_s[3].any()
    recall = np.mean([len(set(a) & set(b)) / k for i, (a, b) in enumerate(zip(want_ids, got_ids, strict=True)) if i != 3])
    assert recall >= 0.95  # per query: Seismic's threads return queries in any order
    for i, (s, ids) in enumerate(zip(got_s, got_ids, strict=True)):  # candidates rescored exactly, best first
        exact = [float(dense[int(d[1:])] @ (np.isin(np.arange(vocab), terms[i]) * (i != 3))) for d in ids]
        assert np.allclose(s[: len(ids)], exact, atol=1e-5) and list(s) == sorted(s, reverse=True)


def test_search_sparse_search_flags(sparse_model, tmp_path, runner, queries_file):
    model, corpus = sparse_model
    assert runner("index", corpus, "--model", model, "-o", tmp_path / "idx").exit_code == 0
    runs = {}
    for mode in ("exact", "seismic"):
        r = runner("search", tmp_path / "idx", queries_file, "--heads", "sparse", "--hits", 3, "--sparse-search", mode,
                   "--heap-factor", "1.0", "-o", tmp_path / f"{mode}.trec")
        assert r.exit_code == 0, r.stderr
        runs[mode] = [line for line in (tmp_path / f"{mode}.trec").read_text().splitlines() if float(line.split()[4]) > 0]
    assert runs["seismic"] == runs["exact"]  # a handful of docs: Seismic finds every doc that shares a term
    m = json.loads((tmp_path / "seismic.trec.manifest.json").read_text())
    assert m["settings"]["sparse_search"] == "seismic" and m["settings"]["heap_factor"] == 1.0
    assert runner("index", corpus, "--method", "bm25", "-o", tmp_path / "bm25").exit_code == 0
    r = runner("search", tmp_path / "bm25", queries_file, "--sparse-search", "seismic")
    assert r.exit_code == 2 and "no sparse head" in r.stderr


@pytest.mark.parametrize("method", ["dense", "sparse"], ids=["two-heads", "sparse-only"])
def test_a_large_index_saves_its_seismic_index_and_search_loads_it(method, sparse_model, tmp_path, runner, queries_file,
                                                                   monkeypatch):
    from retrctl.indexes import sparse as sidx

    model, corpus = sparse_model
    monkeypatch.setattr(sidx, "SEISMIC_FROM", 3)  # "large": as auto would choose Seismic for it
    assert runner("index", corpus, "--model", model, "--method", method, "-o", tmp_path / "idx").exit_code == 0
    saved = list(tmp_path.joinpath("idx").rglob(sidx.SEISMIC_FILE))
    assert len(saved) == 1 and sidx.SEISMIC_FILE in (saved[0].parent / "index.json").read_text()
    heads = ["--heads", "sparse"] if method == "dense" else []
    r = runner("search", tmp_path / "idx", queries_file, *heads, "--hits", 3, "--sparse-search", "exact", "-o", tmp_path / "exact.trec")
    assert r.exit_code == 0, r.stderr
    built = []
    real = sidx.seismic_index
    monkeypatch.setattr(sidx, "seismic_index", lambda docs: built.append(1) or real(docs))
    r = runner("search", tmp_path / "idx", queries_file, *heads, "--hits", 3, "--heap-factor", "1.0", "-o", tmp_path / "auto.trec")
    assert r.exit_code == 0, r.stderr
    assert built == []  # loaded from the version, not built again
    keep = lambda p: [x for x in p.read_text().splitlines() if float(x.split()[4]) > 0]  # noqa: E731
    assert keep(tmp_path / "auto.trec") == keep(tmp_path / "exact.trec")
    from retrctl.indexes import open_index

    idx = open_index(tmp_path / "idx")
    assert idx.stores["sparse"]._seismic_saved is not None
    first = idx.get_vectors(idx.docids[:1])  # one more row: the rows changed in memory
    idx._append_vectors(first if method == "sparse" else np.concatenate([first, idx.stores["sparse"].vectors()[:1]], axis=1))
    assert idx.stores["sparse"]._seismic_saved is None  # a changed index never searches the saved version's Seismic index


def test_symmetric_sparse_head_exports_as_a_stock_sparse_encoder(tiny_bert, tmp_path, runner):
    from sentence_transformers import SparseEncoder

    from retrctl.models.sparse import to_csr

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--max-steps", 2,
               "--train-group-size", 2, "--heads", "dense,sparse", "--sparse-query", "encoder", "--flops-warmup", 0,
               "--query-prompt", "query: ", "--query-max-len", 12, *fast)
    assert r.exit_code == 0, r.stderr
    r = runner("export", tmp_path / "m", "-o", tmp_path / "dist", "--format", "st,sparse-encoder")
    assert r.exit_code == 0, r.stderr
    assert "sparse-encoder parity: max_abs_diff" in r.stderr
    stock = SparseEncoder(str(tmp_path / "dist" / "sparse-encoder"), device="cpu")  # no retrctl code, no remote code
    enc = Encoder.load(tmp_path / "m", device="cpu")
    enc.sparse.top_k = 0
    texts = ["rust memory safety without a garbage collector", "cats purr", "a longer passage " * 10]
    for kind, encode in (("query", stock.encode_query), ("passage", stock.encode_document)):
        ours = to_csr(*enc.encode_sparse(texts, kind), enc.sparse.vocab).toarray()
        theirs = encode(texts, convert_to_tensor=True).to_dense().numpy()
        assert np.abs(ours - theirs).max() <= 1e-4
        assert not theirs[:, enc.sparse.special_ids].any()  # special terms weigh nothing, as in retrctl
    report = json.loads((tmp_path / "dist" / "export.json").read_text())
    assert report["formats"]["sparse-encoder"]["max_abs_diff"] <= 1e-4


def test_sparse_encoder_export_refuses_what_it_cannot_express(sparse_model, tiny_llama, tmp_path, runner):
    model, _ = sparse_model  # token-count queries (LightRetriever)
    r = runner("export", model, "-o", tmp_path / "d1", "--format", "sparse-encoder")
    assert r.exit_code == 2 and "token counts" in r.stderr and not (tmp_path / "d1").exists()
    r = runner("export", tiny_llama, "-o", tmp_path / "d2", "--format", "sparse-encoder")
    assert r.exit_code == 2 and "no sparse head" in r.stderr and not (tmp_path / "d2").exists()

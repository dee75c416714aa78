"""The built-in backends (faiss dense, BM25) through the engine: build-save-load-search round trips, incremental updates equal fresh builds, ties, shards."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DOCS, QUERIES

from retrctl import records
from retrctl.indexes import BACKENDS, BM25Index, DenseIndex, bm25_tokens, open_index
from retrctl.models import Encoder
from retrctl.records import RecordError

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda sigma omega cat dog tea code "
         "rust python coffee memory language small fast").split()


def synthetic(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"docid": f"s{i:03d}", "title": "", "text": " ".join(rng.choice(WORDS, 8))} for i in range(n)]


@pytest.fixture(scope="module")
def encoder(tiny_bert):
    return Encoder.load(tiny_bert, device="cpu")


def make(kind, encoder, **kw):
    if kind == "bm25":
        return BM25Index(**kw)
    return DenseIndex(encoder, kind, batch_size=8, **kw)


def same(a, b, tol=1e-5):
    """Same docids in the same order and scores within tol, for every query."""
    assert a.keys() == b.keys()
    for q in a:
        assert [d for d, _ in a[q]] == [d for d, _ in b[q]], q
        assert np.allclose([s for _, s in a[q]], [s for _, s in b[q]], atol=tol), q


EDITED = [DOCS[0], {**DOCS[1], "text": "Dogs bark at cats and drink coffee."}, *DOCS[3:],
          {"docid": "d7", "title": "Tea time", "text": "Green tea and black tea are brewed from leaves."}]


@pytest.mark.parametrize("kind", ["bm25", "Flat", "HNSW32", "IVF2,Flat"])
def test_round_trip_and_incremental_equals_fresh(kind, encoder, tmp_path):
    docs = DOCS + synthetic(40) if kind.startswith("IVF") else DOCS
    edited = EDITED + synthetic(40) if kind.startswith("IVF") else EDITED
    idx = make(kind, encoder)
    assert idx.build(docs)["added"] == len(docs)
    before = idx.search(QUERIES, 4)
    idx.save(tmp_path / "idx")
    again = open_index(tmp_path / "idx", encoder=None if kind == "bm25" else encoder)
    assert type(again) is type(idx) and again.docids == idx.docids and again.hashes == idx.hashes
    same(again.search(QUERIES, 4), before, tol=0)

    stats = again.sync(edited)  # d2 changed, d3 gone, d7 new
    assert stats == {"added": 1, "updated": 1, "unchanged": len(edited) - 2, "removed": 1}
    again.save(tmp_path / "idx")
    updated = open_index(tmp_path / "idx", encoder=None if kind == "bm25" else encoder)
    fresh = make(kind, encoder)
    fresh.build(edited)
    assert sorted(updated.docids) == sorted(fresh.docids) and updated.hashes == fresh.hashes
    same(updated.search(QUERIES, 4), fresh.search(QUERIES, 4))
    assert "d3" not in {d for hits in updated.search(QUERIES, 10).values() for d, _ in hits}


def test_ivf_pq_trains_on_a_sample_and_searches(encoder, tmp_path):
    docs = synthetic(300)
    idx = DenseIndex(encoder, "IVF4,PQ4x4", train_size=200)
    idx.build(docs)
    assert idx.index.is_trained and idx.index.ntotal == 300
    idx.save(tmp_path / "pq")
    manifest = json.loads((tmp_path / "pq" / "index.json").read_text())
    assert manifest["files"]["vectors"] == "vectors.npy"  # PQ is lossy: exact vectors kept for rebuilds
    loaded = DenseIndex.load(tmp_path / "pq", encoder=encoder)
    exact = DenseIndex(encoder, "Flat")
    exact.build(docs)
    q = encoder.encode(["alpha beta cat", "rust python code"], kind="query")
    _, approx_ids = loaded.search_vectors(q, 10)
    _, exact_ids = exact.search_vectors(q, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx_ids, exact_ids, strict=True)])
    assert recall >= 0.3, recall
    assert np.allclose(loaded.get_vectors(["s005"]), exact.get_vectors(["s005"]), atol=1e-6)


def test_bad_factory_string_is_a_clear_error(encoder):
    with pytest.raises(ValueError, match="bad faiss index type"):
        DenseIndex(encoder, "NoSuchIndex42")


def test_ivf_with_too_few_docs_says_so(encoder):
    idx = DenseIndex(encoder, "IVF64,Flat")
    with pytest.raises(ValueError, match="could not be trained"):
        idx.build(DOCS)


@pytest.mark.parametrize("kind", ["bm25", "Flat", "HNSW32"])
def test_ties_are_broken_by_docid_ascending(kind, encoder):
    # 30 identical docs score the same for any query; the cut at k must keep the smallest docids
    docs = [{"docid": f"x{i:02d}", "title": "", "text": "tea leaves brewed"} for i in reversed(range(30))]
    docs += [{"docid": "a-other", "title": "", "text": "rust memory safety"}]
    idx = make(kind, encoder)
    idx.build(docs)
    hits = idx.search([{"query_id": "q", "query_text": "tea leaves"}], 5)["q"]
    assert [d for d, _ in hits] == ["x00", "x01", "x02", "x03", "x04"]
    assert len({s for _, s in hits}) == 1


def test_nan_vectors_are_refused(encoder):
    class Broken:
        config, dim = encoder.config, encoder.dim

        def describe(self):
            return encoder.describe()

        def encode(self, texts, **kw):
            out = np.ones((len(texts), self.dim), np.float32)
            out[1] = np.nan
            return out

    with pytest.raises(ValueError, match="NaN/inf vectors for 1 docs, e.g. 'd2'"):
        DenseIndex(Broken()).build(DOCS)


def test_unchanged_docs_are_not_re_encoded(encoder):
    idx = DenseIndex(encoder)
    idx.build(DOCS)
    assert idx.encoded == len(DOCS)
    idx.encoded = 0
    idx.add(DOCS)
    assert idx.encoded == 0
    idx.add([{**DOCS[2], "text": "Python is slow but pleasant."}])
    assert idx.encoded == 1 and len(idx) == len(DOCS)
    assert idx.remove(["d1", "nope"]) == 1 and "d1" not in idx.docids


def test_killed_encode_resumes_from_saved_chunks(encoder, tmp_path):
    class Dies:
        def __init__(self, enc, after):
            self.enc, self.after, self.calls = enc, after, 0
            self.config, self.dim = enc.config, enc.dim

        def describe(self):
            return self.enc.describe()

        def encode(self, texts, **kw):
            self.calls += 1
            if self.calls > self.after:
                raise KeyboardInterrupt
            return self.enc.encode(texts, **kw)

    work = tmp_path / "idx.partial"
    first = DenseIndex(Dies(encoder, after=2), chunk_size=2)
    first.workdir = work
    with pytest.raises(KeyboardInterrupt):
        first.build(DOCS)
    assert len(list(work.glob("*.json"))) == 2
    second = DenseIndex(encoder, chunk_size=2)
    second.workdir = work
    second.build(DOCS)
    assert second.encoded == 2  # chunks 0 and 1 came from disk
    fresh = DenseIndex(encoder, chunk_size=2)
    fresh.build(DOCS)
    same(second.search(QUERIES, 6), fresh.search(QUERIES, 6))
    # a chunk whose docs changed is not reused; the others (all 3 now on disk) are
    third = DenseIndex(encoder, chunk_size=2)
    third.workdir = work
    third.build([{**DOCS[0], "text": "changed"}, *DOCS[1:]])
    assert third.encoded == 2
    assert np.allclose(third.get_vectors(["d1"]), encoder.encode(["Cats changed"]), atol=1e-6)


@pytest.mark.parametrize("kind", ["bm25", "Flat", "IVF2,Flat"])
def test_merged_shards_equal_one_index(kind, encoder):
    docs = DOCS + synthetic(40) if kind.startswith("IVF") else DOCS
    parts = []
    for s in range(2):
        p = make(kind, encoder)
        p.build(d for i, d in enumerate(docs) if i % 2 == s)
        parts.append(p)
    merged = BACKENDS[parts[0].name].merge(parts)
    whole = make(kind, encoder)
    whole.build(docs)
    assert len(merged) == len(docs)
    same(merged.search(QUERIES, 5), whole.search(QUERIES, 5))
    with pytest.raises(ValueError, match="duplicate"):
        BACKENDS[parts[0].name].merge([parts[0], parts[0]])


def test_bm25_scores_equal_plain_bm25s():
    import bm25s

    texts = [(d["title"] + " " + d["text"]) for d in DOCS]
    ref = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    ref.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    ours = BM25Index()
    ours.build(DOCS)
    for q in QUERIES:
        want = ref.get_scores(bm25s.tokenize(q["query_text"], stopwords="en", return_ids=False, show_progress=False)[0])
        got = dict(ours.search([q], len(DOCS))[q["query_id"]])
        for i, d in enumerate(DOCS):
            assert got.get(d["docid"], 0.0) == pytest.approx(float(want[i]), abs=1e-6)


def test_bm25_search_leaves_an_installed_jax_unloaded(tmp_path):
    """bm25s imports JAX where it is installed and runs a top-k with it (on a GPU, JAX then takes three quarters of
    its memory); a BM25 build and search must not, and `import jax` still works afterwards."""
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("import os\nopen(os.environ['JAX_MARK'], 'a').write('imported\\n')\n")
    (fake / "lax.py").write_text("def top_k(x, k):\n    return x, x\n")
    mark = tmp_path / "mark"
    code = ("import sys\nfrom conftest import DOCS, QUERIES\nfrom retrctl.indexes import BM25Index\n"
            "idx = BM25Index()\nidx.build(DOCS)\nassert idx.search(QUERIES[:1], 3)\n"
            "import bm25s.selection\nassert not bm25s.selection.JAX_IS_AVAILABLE\nassert 'jax' not in sys.modules\n"
            "import jax\nprint(jax.__file__)\n")
    env = {**os.environ, "JAX_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(fake / "__init__.py")
    assert mark.read_text() == "imported\n"  # by the test's own import only


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_bm25_matrix_is_identical_to_bm25s_builder(method):
    """Our chunked numpy build of the score matrix equals bm25s's own BM25.index, array for array."""
    import bm25s

    from retrctl.indexes.bm25 import score_matrix

    idx = BM25Index(method=method)
    idx.build(DOCS + synthetic(50) + [{"docid": "empty", "title": "", "text": "the and of"}])
    ids = [idx._tokens[a:b].tolist() for a, b in zip(idx._offsets[:-1], idx._offsets[1:], strict=True)]
    ref = bm25s.BM25(k1=0.9, b=0.4, method=method)
    ref.index(bm25s.tokenization.Tokenized(ids=ids, vocab=dict(idx.tokenizer.word_to_id)), show_progress=False)
    ours, nonocc = score_matrix(idx._tokens, idx._offsets, len(idx.tokenizer.word_to_id), k1=0.9, b=0.4,
                                method=method, chunk_tokens=37)  # many small chunks
    for key in ("data", "indices", "indptr"):
        assert ours[key].dtype == ref.scores[key].dtype, key
        assert np.array_equal(ours[key], ref.scores[key]), key
    assert ours["num_docs"] == ref.scores["num_docs"]
    assert (nonocc is None) == (ref.nonoccurrence_array is None)
    if nonocc is not None:
        assert np.array_equal(nonocc, ref.nonoccurrence_array)


def test_bm25_settings_matter_and_are_recorded(tmp_path):
    plain = BM25Index(stopwords=None, k1=1.2, b=0.75)
    plain.build(DOCS)
    default = BM25Index()
    default.build(DOCS)
    q = [{"query_id": "q", "query_text": "the cats are purring"}]
    assert plain.search(q, 3)["q"] != default.search(q, 3)["q"]
    plain.save(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "index.json").read_text())
    assert manifest["settings"] == {"k1": 1.2, "b": 0.75, "stopwords": None, "method": "lucene", "tokens": "words"}
    assert "stopwords none" in manifest["variant"]
    assert open_index(tmp_path / "b").search(q, 3) == plain.search(q, 3)


UNSPACED_DOCS = [{"docid": "zh", "title": "", "text": "信息检索系统根据查询返回相关文档。"},
                 {"docid": "zh2", "title": "", "text": "今天的天气很好，我们去公园散步。"},
                 {"docid": "th", "title": "", "text": "ภาษาไทยเขียนติดกันโดยไม่เว้นวรรค"},
                 {"docid": "hi", "title": "", "text": "भारत की राजधानी नई दिल्ली है"},
                 {"docid": "en", "title": "Cats", "text": "The cat (猫) naps in the sun."}]


def test_multilingual_tokens_split_unspaced_scripts_into_characters_and_pairs():
    assert bm25_tokens.multilingual("信息检索") == ["信", "息", "检", "索", "信息", "息检", "检索"]
    assert bm25_tokens.WORDS("信息检索") == ["信息检索"]  # one token per clause: no query shares it
    assert bm25_tokens.multilingual("ไม่เว้น") == ["ไ", "ม่", "เ", "ว้", "น", "ไม่", "ม่เ", "เว้", "ว้น"]  # marks stay on their letter
    assert bm25_tokens.multilingual("राजधानी नई") == ["राजधानी", "नई"]
    assert bm25_tokens.WORDS("राजधानी नई") == ["जध", "नई"]  # राजधानी broken at the vowel signs \\w does not match
    assert bm25_tokens.multilingual("cat猫dog") == ["cat", "猫", "dog"]
    for doc in DOCS:  # no such script, the same tokens
        text = records.passage_text(doc).lower()
        assert bm25_tokens.multilingual(text) == bm25_tokens.WORDS(text)
    for text in ("naïve café ﬁne x1 _ab", "Привет мир", "Καλημέρα κόσμε", "مرحبا بالعالم", "Xin chào thế giới"):
        assert bm25_tokens.multilingual(text) == bm25_tokens.WORDS(text), text
        assert bm25_tokens.multilingual(f"{text} 猫") == [*bm25_tokens.WORDS(text), "猫"], text  # beside a split script
    with pytest.raises(ValueError, match="words, multilingual"):
        bm25_tokens.splitter("chars")


def test_bm25_tokens_default_to_multilingual_and_find_chinese_thai_hindi(runner, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d["docid"], "title": d["title"], "text": d["text"]}, ensure_ascii=False)
                              + "\n" for d in UNSPACED_DOCS))
    queries = [{"query_id": "zh", "query_text": "检索系统"}, {"query_id": "th", "query_text": "ภาษาไทย"},
               {"query_id": "hi", "query_text": "राजधानी"}]
    assert runner("index", corpus, "--method", "bm25", "-o", tmp_path / "m").exit_code == 0
    assert runner("index", corpus, "--method", "bm25", "--bm25-tokens", "words", "-o", tmp_path / "w").exit_code == 0
    multi, words = open_index(tmp_path / "m"), open_index(tmp_path / "w")
    assert multi.config()["tokens"] == "multilingual" and words.config()["tokens"] == "words"
    assert "character unigrams and bigrams" in multi.variant() and multi.run_tag(multi.version.manifest).endswith(
        "-tokens=multilingual")
    assert {q: hits[0][0] for q, hits in multi.search(queries, 1).items()} == {"zh": "zh", "th": "th", "hi": "hi"}
    found = words.search(queries, 1)
    assert found["zh"] == found["th"] == []  # words: each clause one token, which no query shares
    en = [{"query_id": "en", "query_text": "cat naps"}]
    assert [d for d, _ in multi.search(en, 5)["en"]] == [d for d, _ in words.search(en, 5)["en"]] == ["en"]


def test_an_update_keeps_the_tokens_an_index_was_built_with(runner, tiny_bert, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d["docid"], "text": d["text"]}, ensure_ascii=False) + "\n"
                              for d in UNSPACED_DOCS))
    for name, flags, changed in (("bm25", ["--method", "bm25"], "tokens: 'words' -> 'multilingual'"),
                                 ("heads", ["--model", tiny_bert, "--heads", "dense,bm25", "--device", "cpu"],
                                  "'tokens': 'words'")):
        out = tmp_path / name
        r = runner("index", corpus, *flags, "--bm25-tokens", "words", "-o", out)
        assert r.exit_code == 0, r.output
        r = runner("index", corpus, "-o", out, "--device", "cpu")  # a cron job's re-index: no flags
        assert r.exit_code == 0 and "0 added, 0 updated, 5 unchanged" in r.stderr and "rebuilding" not in r.stderr, r.stderr
        r = runner("index", corpus, "--bm25-tokens", "multilingual", "-o", out, "--device", "cpu")
        assert r.exit_code == 0 and "rebuilding from scratch" in r.stderr and changed in r.stderr, r.stderr


def test_query_without_known_terms_gets_no_hits():
    idx = BM25Index()
    idx.build(DOCS)
    assert idx.search([{"query_id": "q", "query_text": "zzzz the"}], 5) == {"q": []}


def test_search_vectors_shapes_and_small_index(encoder):
    idx = DenseIndex(encoder)
    idx.build(DOCS[:3])
    scores, ids = idx.search_vectors(encoder.encode(["cats", "code"], kind="query"), 10)
    assert scores.shape == (2, 3) and all(len(r) == 3 for r in ids)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_open_index_rejects_non_index_and_newer_format(tmp_path):
    with pytest.raises(RecordError, match="not an index directory"):
        open_index(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"format_version": 99, "backend": "bm25"}))
    with pytest.raises(RecordError, match="newer"):
        open_index(tmp_path)

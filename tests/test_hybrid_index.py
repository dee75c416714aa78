"""The bm25 head of a multi-head index (`index --heads dense,bm25`): the delivered hybrid in one index.

Its search equals `fuse` of the standalone dense and bm25 backends' runs at the same settings, its bm25 head alone
equals the bm25 backend, and updates, resumed builds and merges keep both true; `index --weights` records the
search's default weights.
"""

import json

import numpy as np
import pytest
from conftest import DOCS, QUERIES

from retrctl import fusion
from retrctl.indexes import HeadsIndex, open_index
from retrctl.models import Encoder
from stages.index import index

WORDS = "cats dogs python rust coffee tea memory language small fast purr loyal code beans safe".split()
EXTRA = [{"docid": f"x{i:02d}", "title": "", "text": " ".join(np.random.default_rng(i).choice(WORDS, 6))}
         for i in range(14)]
CORPUS = DOCS + EXTRA
MORE_QUERIES = [*QUERIES, {"query_id": "q9", "query_text": "fast coffee beans"}]


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def near(a, b, tol=1e-5):
    """Same docids in the same order and scores within tol, for every query."""
    assert a.keys() == b.keys()
    for q in a:
        assert [d for d, _ in a[q]] == [d for d, _ in b[q]], q
        assert np.allclose([s for _, s in a[q]], [s for _, s in b[q]], atol=tol), q


def one_error_line(stderr: str) -> str:
    """A usage error's message: click's usage lines around exactly one "Error:" line, no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def succeeding(runner):
    """``runner`` asserting exit 0."""
    def run(*args):
        r = runner(*args)
        assert r.exit_code == 0, r.stderr
        return r
    return run


def trec(path):
    out = {}
    for line in path.read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        out.setdefault(q, []).append((d, float(s)))
    return out


def head(idx_dir, heads, k=100):
    idx = open_index(idx_dir)
    idx.heads = heads
    return idx.search(MORE_QUERIES, k)


def standalone(tmp_path, docs, model, name):
    """The dense and bm25 backends' runs (depth 100) over ``docs``."""
    index(docs, tmp_path / f"{name}-dense", model=str(model))
    index(docs, tmp_path / f"{name}-bm25", method="bm25")
    return (open_index(tmp_path / f"{name}-dense").search(MORE_QUERIES, 100),
            open_index(tmp_path / f"{name}-bm25").search(MORE_QUERIES, 100))


def test_hybrid_equals_fuse_of_the_standalone_backends_and_survives_updates(tiny_bert, tmp_path):
    out = tmp_path / "hybrid"
    stats = index(CORPUS, out, model=str(tiny_bert), heads="dense,bm25")
    assert stats["encoded"] == len(CORPUS)
    idx = open_index(out)
    assert isinstance(idx, HeadsIndex) and idx.version.manifest["settings"]["heads"] == ["dense", "bm25"]
    dense, bm25 = standalone(tmp_path, CORPUS, tiny_bert, "v1")
    for weights in (None, [0.7, 0.3]):
        idx.weights = weights
        near(idx.search(MORE_QUERIES, 10), fusion.fuse([dense, bm25], weights=weights, hits=10))
    idx.weights, idx.fusion = None, "rrf"
    assert idx.search(MORE_QUERIES, 10) == fusion.fuse([dense, bm25], method="rrf", hits=10)
    assert head(out, "bm25") == bm25  # the head alone is the backend, score for score
    near(head(out, "dense"), dense)

    # edit one doc, remove one, add one: updated in place, still equal to the backends built on the new corpus
    changed = [{**CORPUS[0], "text": "Cats sleep and purr; coffee keeps people awake."}, *CORPUS[2:],
               {"docid": "new", "title": "Tea", "text": "Tea is a drink brewed from leaves, small and fast."}]
    stats = index(changed, out)
    assert (stats["added"], stats["updated"], stats["removed"], stats["encoded"], stats["rebuilt"]) == (1, 1, 1, 2, False)
    dense, bm25 = standalone(tmp_path, changed, tiny_bert, "v2")
    assert head(out, "bm25") == bm25
    near(head(out, "dense"), dense)
    near(open_index(out).search(MORE_QUERIES, 10), fusion.fuse([dense, bm25], hits=10))
    idx = open_index(out)
    assert idx.score(QUERIES[0], ["d3"]) == {}  # a fused rank has no per-doc score
    idx.heads = "bm25"
    assert idx.score(QUERIES[1], ["d3", "d2"]) == open_index(tmp_path / "v2-bm25").score(QUERIES[1], ["d3", "d2"])
    # recording a weight publishes a version and encodes nothing
    stats = index(changed, out, search_defaults={"weights": [0.9, 0.1]})
    assert (stats["encoded"], stats["rebuilt"], stats["written"]) == (0, False, True)
    near(open_index(out).search(MORE_QUERIES, 10), fusion.fuse([dense, bm25], weights=[0.9, 0.1], hits=10))


def test_resumed_build_and_shard_merge_keep_the_heads_aligned(tiny_bert, tmp_path):
    encoder = Encoder.load(tiny_bert, device="cpu")

    class Dies:
        """The encoder, killed after ``after`` chunks."""

        def __init__(self, after):
            self.after, self.calls, self.config, self.dim = after, 0, encoder.config, encoder.dim

        def describe(self):
            return encoder.describe()

        def encode(self, texts, **kw):
            self.calls += 1
            if self.calls > self.after:
                raise KeyboardInterrupt
            return encoder.encode(texts, **kw)

    work = tmp_path / "idx.partial"
    first = HeadsIndex(Dies(after=2), heads=["dense", "bm25"], chunk_size=4)
    first.workdir = work
    with pytest.raises(KeyboardInterrupt):
        first.build(CORPUS)
    resumed = HeadsIndex(encoder, heads=["dense", "bm25"], chunk_size=4)
    resumed.workdir = work
    resumed.build(CORPUS)
    assert resumed.encoded == len(CORPUS) - 8  # two chunks of encoded rows came from disk, their tokens did not
    resumed.save(tmp_path / "resumed")
    index(CORPUS, tmp_path / "whole", model=str(tiny_bert), heads="dense,bm25")
    for heads in ("bm25", "dense", "dense,bm25"):
        near(head(tmp_path / "resumed", heads), head(tmp_path / "whole", heads))

    for s in (0, 1):
        index((d for i, d in enumerate(CORPUS) if i % 2 == s), tmp_path / f"s{s}", model=str(tiny_bert),
              heads="dense,bm25", search_defaults={"weights": [0.6, 0.4]})
    from stages.index import merge

    assert merge([tmp_path / "s0", tmp_path / "s1"], tmp_path / "merged") == len(CORPUS)
    assert head(tmp_path / "merged", "bm25") == head(tmp_path / "whole", "bm25")  # statistics over the union
    near(head(tmp_path / "merged", "dense"), head(tmp_path / "whole", "dense"))
    merged = open_index(tmp_path / "merged")
    assert merged.version.manifest["search_defaults"] == {"weights": {"dense": 0.6, "bm25": 0.4}}


def test_cli_records_the_weights_and_search_equals_fuse_of_the_backends(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    run = succeeding(runner)
    h = tmp_path / "hybrid"
    run("index", corpus_file, "--model", tiny_bert, "--heads", "dense,bm25", "--weights", "0.8,0.2", "-o", h)
    assert open_index(h).version.manifest["search_defaults"] == {"weights": {"dense": 0.8, "bm25": 0.2}}
    run("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "dense")
    run("index", corpus_file, "--method", "bm25", "-o", tmp_path / "bm25")
    for name in ("dense", "bm25"):
        run("search", tmp_path / name, queries_file, "--hits", 100, "-o", tmp_path / f"{name}.trec")
    run("fuse", tmp_path / "dense.trec", tmp_path / "bm25.trec", "--weights", "0.8,0.2", "--hits", 3, "-o", tmp_path / "fused.trec")
    run("search", h, queries_file, "--hits", 3, "-o", tmp_path / "hybrid.trec")  # no flag: the recorded weights
    near(trec(tmp_path / "hybrid.trec"), trec(tmp_path / "fused.trec"))
    manifest = json.loads((tmp_path / "hybrid.trec.manifest.json").read_text())
    assert manifest["settings"]["weights"] == {"dense": 0.8, "bm25": 0.2}
    # flags given to search win; --heads bm25 is the bm25 backend's run
    run("fuse", tmp_path / "dense.trec", tmp_path / "bm25.trec", "--fusion", "rrf", "--hits", 3, "-o", tmp_path / "rrf.trec")
    run("search", h, queries_file, "--hits", 3, "--fusion", "rrf", "--weights", "1,1", "-o", tmp_path / "h-rrf.trec")
    near(trec(tmp_path / "h-rrf.trec"), trec(tmp_path / "rrf.trec"))
    run("search", h, queries_file, "--hits", 100, "--heads", "bm25", "-o", tmp_path / "h-bm25.trec")
    assert trec(tmp_path / "h-bm25.trec") == trec(tmp_path / "bm25.trec")
    # an update without the flags keeps the recorded weights; with them, replaces them
    run("index", corpus_file, "-o", h)
    assert open_index(h).version.manifest["search_defaults"] == {"weights": {"dense": 0.8, "bm25": 0.2}}
    run("index", corpus_file, "--weights", "0.5,0.5", "--norm", "zscore", "-o", h)
    assert open_index(h).version.manifest["search_defaults"] == {"weights": {"dense": 0.5, "bm25": 0.5}, "norm": "zscore"}


@pytest.mark.parametrize("args, words", [
    (("--heads", "dense,bm42"), "choose from dense, sparse, colbert, bm25"),
    (("--heads", "dense,bm25", "--weights", "1.5"), "one weight w for 2 lists means w,1-w: w must be in [0, 1]"),
    (("--heads", "dense,bm25", "--weights", "0.5,0.2,0.3"), "give one weight per head indexed, in dense,bm25 order"),
    (("--heads", "dense,bm25", "--weights", "0.5,-1"), "weights must be finite, >= 0"),
    (("--weights", "0.5,0.5"), "this dense index has one head"),
    (("--heads", "bm25"), "an index holds the dense head too"),
])
def test_bad_heads_or_weights_exit_2_with_one_line(runner, tiny_bert, corpus_file, tmp_path, args, words):
    r = runner("index", corpus_file, "--model", tiny_bert, *args, "-o", tmp_path / "idx")
    assert r.exit_code == 2 and one_error_line(r.stderr).count(words) == 1, r.stderr
    assert not (tmp_path / "idx").exists() or not list((tmp_path / "idx").glob("versions/*"))


def test_search_of_a_head_the_index_lacks_exits_2(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    assert runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,bm25", "-o", tmp_path / "h").exit_code == 0
    for args, words in ((("--heads", "sparse"), "this index holds dense,bm25"),
                        (("--weights", "1,2,3"), "3 weights for 2 runs")):
        r = runner("search", tmp_path / "h", queries_file, *args)
        assert r.exit_code == 2 and one_error_line(r.stderr).count(words) == 1, r.stderr


def _tree(root):
    """{relative path: (inode, bytes)} of the files under a version directory, its manifest aside."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "index.json"}


def test_copy_from_records_search_defaults_as_a_new_index_sharing_the_files(runner, tiny_bert, corpus_file,
                                                                            queries_file, tmp_path):
    h, delivered = tmp_path / "hybrid", tmp_path / "delivered"
    assert runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,bm25", "-o", h).exit_code == 0
    before = (h / "index.json").read_text()
    sweep = write_jsonl(tmp_path / "sweep.jsonl", [{"weights": [w, round(1 - w, 10)], "nDCG@10": v,
                                                    "settings": {"fusion": "linear", "norm": "minmax", "depth": None}}
                                                   for w, v in ((0.2, 0.4), (0.7, 0.6), (0.9, 0.5))])
    r = runner("index", "--copy-from", h, "--weights-from", sweep, "-o", delivered)
    assert r.exit_code == 0, r.stderr
    assert "retrctl.models" not in r.stderr or "encod" not in r.stderr.split("retrctl.models")[-1]
    source, copy = open_index(h).version, open_index(delivered).version
    assert (h / "index.json").read_text() == before and "search_defaults" not in source.manifest  # the source as it was
    assert copy.manifest["search_defaults"] == {"weights": {"dense": 0.7, "bm25": 0.3}, "fusion": "linear", "norm": "minmax"}
    assert {k: v for k, v in copy.manifest.items() if k != "search_defaults"} == source.manifest
    assert _tree(copy.path) == _tree(source.path)  # the same files, hard-linked
    for run, args in (("copy", (delivered,)), ("flags", (h, "--weights", "0.7"))):
        assert runner("search", *args, queries_file, "--hits", 5, "-o", tmp_path / f"{run}.trec").exit_code == 0
    assert (tmp_path / "copy.trec").read_text() == (tmp_path / "flags.trec").read_text()
    # again onto the copy: its next version, the earlier defaults updated by the flags given
    assert runner("index", "--copy-from", h, "--norm", "zscore", "-o", delivered).exit_code == 0
    assert open_index(delivered).version.name == "000002"
    assert open_index(delivered).version.manifest["search_defaults"] == {"norm": "zscore"}


@pytest.mark.parametrize("args, words", [
    (("--copy-from", "{h}", "--model", "x"), "--model cannot apply"),
    (("--copy-from", "{h}", "{corpus}"), "a corpus cannot apply"),
    (("--copy-from", "{h}", "--weights", "0.5,0.2,0.3"), "give one weight per head indexed"),
    (("--copy-from", "{dense}", "--weights", "0.5"), "this dense index has one head"),
    (("--copy-from", "{tmp}/nowhere", "--weights", "0.5"), "not an index directory"),
    (("--copy-from", "{h}", "--weights-from", "{tmp}/sweep.jsonl"), "sweep.jsonl:1: field 'weights'"),
])
def test_copy_from_bad_input_exits_2_and_writes_nothing(runner, tiny_bert, corpus_file, tmp_path, args, words):
    h, dense = tmp_path / "h", tmp_path / "dense"
    assert runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,bm25", "-o", h).exit_code == 0
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", dense).exit_code == 0
    (tmp_path / "sweep.jsonl").write_text('{"nDCG@10": 0.5}\n')
    out = tmp_path / "out"
    r = runner("index", *(str(a).format(h=h, dense=dense, corpus=corpus_file, tmp=tmp_path) for a in args), "-o", out)
    assert r.exit_code == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len([line for line in r.stderr.splitlines() if words in line]) == 1
    assert not out.exists()


def test_remove_query_drops_the_querys_own_doc_before_fusion_as_fuse_of_such_runs_does(runner, tiny_bert, tmp_path):
    """ArguAna's convention: a query is itself a doc. Its own doc tops both lists; fused in the index, it must leave
    each list before min-max scaling, or it sets each list's scale and the ranking differs from `fuse`'s."""
    run = succeeding(runner)
    corpus = write_jsonl(tmp_path / "c.jsonl", CORPUS)
    queries = write_jsonl(tmp_path / "q.jsonl", [{"query_id": d["docid"], "query_text": d["text"]} for d in CORPUS[:6]])
    run("index", corpus, "--model", tiny_bert, "--heads", "dense,bm25", "--weights", "0.6,0.4", "-o", tmp_path / "h")
    run("index", corpus, "--model", tiny_bert, "-o", tmp_path / "dense")
    run("index", corpus, "--method", "bm25", "-o", tmp_path / "bm25")
    for name in ("dense", "bm25"):
        run("search", tmp_path / name, queries, "--hits", 100, "--remove-query", "-o", tmp_path / f"{name}.trec")
    run("fuse", tmp_path / "dense.trec", tmp_path / "bm25.trec", "--weights", "0.6,0.4", "--hits", 10,
        "-o", tmp_path / "fused.trec")
    run("search", tmp_path / "h", queries, "--hits", 10, "--remove-query", "-o", tmp_path / "hybrid.trec")
    hybrid = trec(tmp_path / "hybrid.trec")
    assert all(q not in [d for d, _ in hits] for q, hits in hybrid.items())
    near(hybrid, trec(tmp_path / "fused.trec"))

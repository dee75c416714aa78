"""`retrctl index`: the Python function and the CLI — build, incremental update, shards + merge, bad input."""

import json
import os

import pytest
from conftest import DOCS, QUERIES

from retrctl.indexes import open_index, resolve
from stages.index import SettingsError, index


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def current(idx_dir):
    """The directory holding the files of the version idx_dir points to."""
    return resolve(idx_dir).path


def results(idx_dir, k=4):
    return open_index(idx_dir).search(QUERIES, k)


def assert_same(a, b):
    assert a.keys() == b.keys()
    for q in a:
        assert [d for d, _ in a[q]] == [d for d, _ in b[q]]
        assert [s for _, s in a[q]] == pytest.approx([s for _, s in b[q]], abs=1e-5)


# ---------------------------------------------------------------- Python API


def test_update_in_place_equals_fresh_build(tiny_bert, tmp_path):
    out = tmp_path / "idx"
    assert index(DOCS[:4], out, model=str(tiny_bert))["added"] == 4
    step2 = DOCS  # add d5, d6
    assert index(step2, out)["added"] == 2  # model comes from the manifest
    step3 = [{**DOCS[0], "text": "Cats sleep a lot."}, *DOCS[2:]]  # change d1, delete d2
    stats = index(step3, out)
    assert (stats["updated"], stats["removed"], stats["rebuilt"]) == (1, 1, False)
    index(step3, tmp_path / "fresh", model=str(tiny_bert))
    assert_same(results(out), results(tmp_path / "fresh"))
    assert not (tmp_path / "idx.partial").exists()


def test_no_change_leaves_the_index_untouched(tmp_path):
    out = tmp_path / "bm"
    index(DOCS, out, method="bm25")
    mtime = (out / "index.json").stat().st_mtime_ns
    stats = index(DOCS, out)
    assert stats["written"] is False and stats["unchanged"] == len(DOCS)
    assert (out / "index.json").stat().st_mtime_ns == mtime


def test_no_delete_keeps_docs_missing_from_the_corpus(tmp_path):
    out = tmp_path / "bm"
    index(DOCS, out, method="bm25")
    index(DOCS[:2], out, delete=False)
    assert len(open_index(out)) == len(DOCS)
    index(DOCS[:2], out)
    assert len(open_index(out)) == 2


def test_changed_settings_rebuild(tiny_bert, tmp_path, caplog):
    out = tmp_path / "idx"
    index(DOCS, out, model=str(tiny_bert))
    stats = index(DOCS, out, model=str(tiny_bert), index_type="HNSW32")
    assert stats["rebuilt"] and "rebuilding from scratch" in caplog.text
    assert json.loads((out / "index.json").read_text())["settings"]["index_type"] == "HNSW32"


def test_a_model_trained_again_under_the_same_path_is_encoded_again(tiny_bert, tmp_path, caplog):
    """An index records a hash of its model's weights: an update with the same --model path rebuilds once the weights
    there changed (a pipeline's model/ trained again) and is up to date while they did not; an index written before
    the hash (no "weights" in its manifest) keeps its vectors, as an update kept them then."""
    import shutil

    import torch

    from retrctl.models import Encoder

    def train_again(model):  # other weights, the same dir
        enc = Encoder.load(model, device="cpu")
        with torch.no_grad():
            for p in enc.parameters():
                p.add_(0.05 * torch.randn_like(p))
        enc.save(model)

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    out = tmp_path / "idx"
    index(DOCS, out, model=str(model))
    first = json.loads((out / "index.json").read_text())["encoder"]["weights"]
    assert index(DOCS, out, model=str(model))["written"] is False
    train_again(model)
    stats = index(DOCS, out, model=str(model))
    assert stats["rebuilt"] and stats["encoded"] == len(DOCS) and "encoder.weights" in caplog.text
    assert json.loads((out / "index.json").read_text())["encoder"]["weights"] != first
    index(DOCS, tmp_path / "fresh", model=str(model))
    assert_same(results(out), results(tmp_path / "fresh"))
    for manifest in (out / "index.json", current(out) / "index.json"):  # as written before the hash
        m = json.loads(manifest.read_text())
        del m["encoder"]["weights"]
        manifest.write_text(json.dumps(m))
    train_again(model)
    assert index(DOCS, out, model=str(model))["rebuilt"] is False


def test_vectors_from_an_index_of_the_same_weights_encode_only_what_it_lacks(tiny_bert, tmp_path, caplog):
    """--vectors-from: a model saved again under another path (as the guard saves the base it keeps) starts from
    the base index's vectors, encodes only the docs that index lacks or holds with another text, records itself,
    not the source's query tower or search defaults, and searches as a full build would; a model with other
    weights encodes every doc, saying why."""
    import logging

    import torch

    from retrctl.models import Encoder

    caplog.set_level(logging.INFO, logger="retrctl.index")
    base = tmp_path / "idx-base"
    index(DOCS[:4], base, model=str(tiny_bert), heads="dense,bm25", search_defaults={"weights": [0.6, 0.4]})
    index(DOCS[:4], base, query_model=str(tiny_bert))  # a query tower recorded: not carried over
    same = tmp_path / "same"
    enc = Encoder.load(tiny_bert, device="cpu")
    enc.config.temperature = 0.05  # recorded by train: a score scale, not what the vectors are
    enc.save(same)
    corpus = [{**DOCS[0], "text": "Cats sleep a lot."}, *DOCS[2:]]  # d1 changed, d2 gone, d5 and d6 new
    stats = index(corpus, tmp_path / "tuned", model=str(same), heads="dense,bm25", vectors_from=base)
    assert stats["encoded"] == 3 and (stats["unchanged"], stats["updated"], stats["removed"]) == (2, 1, 1)
    manifest = json.loads((tmp_path / "tuned" / "index.json").read_text())
    assert manifest["encoder"]["model"] == str(same.resolve()) and manifest["encoder"]["temperature"] == 0.05
    assert "query_model" not in manifest and "search_defaults" not in manifest
    index(corpus, tmp_path / "fresh", model=str(same), heads="dense,bm25")
    assert_same(results(tmp_path / "tuned"), results(tmp_path / "fresh"))

    other = tmp_path / "other"
    enc = Encoder.load(tiny_bert, device="cpu")
    with torch.no_grad():
        next(enc.parameters()).add_(1e-3)
    enc.save(other)
    stats = index(corpus, tmp_path / "retrained", model=str(other), heads="dense,bm25", vectors_from=base)
    assert stats["encoded"] == len(corpus) and "has other weights" in caplog.text
    index(corpus, tmp_path / "by-same", model=str(same), heads="dense,bm25")
    enc.save(same)  # trained again in place: the recorded path loads the new weights, the recorded hash tells
    caplog.clear()
    stats = index(corpus, tmp_path / "in-place", model=str(same), heads="dense,bm25", vectors_from=tmp_path / "by-same")
    assert stats["encoded"] == len(corpus) and "saved again with other weights" in caplog.text
    caplog.clear()
    stats = index(corpus, tmp_path / "flat", model=str(same), vectors_from=base)  # no bm25 head: other settings
    assert stats["encoded"] == len(corpus) and "heads: " in caplog.text and "other weights" not in caplog.text
    with pytest.raises(SettingsError, match="stores no vectors"):
        index(corpus, tmp_path / "bm", method="bm25", vectors_from=base)


def test_dense_without_model_is_a_usage_error(tmp_path):
    with pytest.raises(SettingsError, match="--model"):
        index(DOCS, tmp_path / "idx")


# ---------------------------------------------------------------- CLI


def test_cli_builds_dense_index_with_manifest(runner, tiny_bert, corpus_file, tmp_path):
    out = tmp_path / "idx"
    r = runner("index", corpus_file, "--model", tiny_bert, "--query-prompt", "query: ", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""  # an artifact stage writes nothing on stdout
    assert "6 docs (6 added" in r.stderr
    m = json.loads((out / "index.json").read_text())
    assert m["backend"] == "dense" and m["doc_count"] == 6 and m["metric"] == "inner_product"
    assert m["encoder"]["query_prompt"] == "query: " and m["encoder"]["pooling"] == "mean" and m["dim"] == 32
    assert m["source"] == str(corpus_file)
    assert {p.name for p in current(out).iterdir()} == {"index.json", "index.faiss", "docids.parquet"}


def test_cli_vectors_from_reuses_the_source_and_names_a_bad_one(runner, tiny_bert, corpus_file, tmp_path):
    base, out = tmp_path / "base", tmp_path / "again"
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", base).exit_code == 0
    r = runner("index", corpus_file, "--model", tiny_bert, "--vectors-from", base, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert "starting from" in r.stderr and "6 docs (0 added, 0 updated, 6 unchanged" in r.stderr
    r = runner("index", corpus_file, "--model", tiny_bert, "--vectors-from", corpus_file, "-o", tmp_path / "bad")
    assert r.exit_code == 2 and "not an index" in r.stderr and not (tmp_path / "bad").exists()


def test_cli_reports_truncated_passages(runner, tiny_bert, corpus_file, tmp_path):
    r = runner("index", corpus_file, "--model", tiny_bert, "--passage-max-len", "8", "-o", tmp_path / "idx")
    assert r.exit_code == 0, r.stderr
    assert "passage texts were cut at 8 tokens" in r.stderr


def test_cli_incremental_bm25_from_stdin(runner, tmp_path):
    out = tmp_path / "bm"
    lines = "".join(json.dumps(d) + "\n" for d in DOCS)
    assert runner("index", "-", "--method", "bm25", "-o", out, input=lines).exit_code == 0
    edited = "".join(json.dumps(d) + "\n" for d in DOCS[1:] + [{"docid": "d9", "text": "cats purr"}])
    r = runner("index", "--method", "bm25", "-o", out, input=edited)
    assert r.exit_code == 0, r.stderr
    assert "(1 added, 0 updated, 5 unchanged, 1 removed)" in r.stderr
    assert set(open_index(out).docids) == {"d2", "d3", "d4", "d5", "d6", "d9"}


@pytest.mark.parametrize("bad, where", [
    ('{"docid": "d7", "text": null}\n', "corpus.jsonl:7: field 'text'"),
    ("not json\n", "corpus.jsonl:7: invalid JSON"),
    ('{"docid": "d1", "text": "again"}\n', "corpus.jsonl:7: field 'docid': duplicate"),
])
def test_cli_bad_corpus_line_exits_2_and_leaves_no_index(runner, tiny_bert, corpus_file, tmp_path, bad, where):
    corpus_file.write_text(corpus_file.read_text() + bad)
    out = tmp_path / "idx"
    r = runner("index", corpus_file, "--model", tiny_bert, "-o", out)
    assert r.exit_code == 2
    assert where in r.stderr and r.stdout == ""
    assert not out.exists()


def test_cli_bad_corpus_on_update_keeps_the_old_index(runner, corpus_file, tmp_path):
    out = tmp_path / "bm"
    assert runner("index", corpus_file, "--method", "bm25", "-o", out).exit_code == 0
    before = (current(out) / "docids.parquet").read_bytes()
    corpus_file.write_text(corpus_file.read_text() + '{"docid": 5}\n')
    r = runner("index", corpus_file, "-o", out)
    assert r.exit_code == 2 and "corpus.jsonl:7" in r.stderr
    assert (current(out) / "docids.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm", "corpus.jsonl"]  # no temp dirs left


def test_cli_shards_then_merge_equal_one_build(runner, tiny_bert, corpus_file, tmp_path):
    for s in range(3):
        r = runner("index", corpus_file, "--model", tiny_bert, "--shard-id", s, "--shard-num", 3, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
        assert json.loads((tmp_path / f"s{s}" / "index.json").read_text())["shard"] == {"id": s, "num": 3}
    sizes = [len(open_index(tmp_path / f"s{s}")) for s in range(3)]
    assert sum(sizes) == len(DOCS)
    r = runner("index", "--merge", *(tmp_path / f"s{s}" for s in range(3)), "-o", tmp_path / "merged")
    assert r.exit_code == 0, r.stderr
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "whole").exit_code == 0
    assert_same(results(tmp_path / "merged"), results(tmp_path / "whole"))
    assert "shard" not in json.loads((tmp_path / "merged" / "index.json").read_text())


def test_cli_a_range_of_shards_merges_with_the_rest_to_the_whole_corpus(runner, tiny_bert, corpus_file, tmp_path):
    for s in ("0", "1-2"):
        r = runner("index", corpus_file, "--model", tiny_bert, "--shard-id", s, "--shard-num", 3, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "s1-2" / "index.json").read_text())["shard"] == {"ids": [1, 2], "num": 3}
    r = runner("index", "--merge", tmp_path / "s0", tmp_path / "s1-2", "-o", tmp_path / "merged")
    assert r.exit_code == 0 and "not the whole corpus" not in r.stderr, r.stderr
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "whole").exit_code == 0
    assert_same(results(tmp_path / "merged"), results(tmp_path / "whole"))
    r = runner("index", "--merge", tmp_path / "s1-2", tmp_path / "whole", "-o", tmp_path / "part")
    assert "merging shards [1, 2] of 3" in r.stderr, r.stderr


def test_cli_merge_takes_a_shard_indexed_before_the_weights_hash_and_refuses_other_weights(runner, tiny_bert,
                                                                                            corpus_file, tmp_path):
    """Shards agree on their model by name and, where both recorded it, by its weights' hash: a shard whose manifest
    predates the hash merges with one that has it; a shard of other weights under the same name is refused."""
    import shutil

    import torch

    from retrctl.models import Encoder

    for s in range(2):
        r = runner("index", corpus_file, "--model", tiny_bert, "--shard-id", s, "--shard-num", 2, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    for manifest in (tmp_path / "s0" / "index.json", current(tmp_path / "s0") / "index.json"):  # as written before
        m = json.loads(manifest.read_text())
        del m["encoder"]["weights"]
        manifest.write_text(json.dumps(m))
    r = runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged")
    assert r.exit_code == 0, r.stderr
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "whole").exit_code == 0
    assert_same(results(tmp_path / "merged"), results(tmp_path / "whole"))

    other = tmp_path / "elsewhere" / os.path.basename(tiny_bert)  # the same name, other weights
    shutil.copytree(tiny_bert, other)
    enc = Encoder.load(other, device="cpu")
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.05 * torch.randn_like(p))
    enc.save(other)
    r = runner("index", corpus_file, "--model", other, "--shard-id", 0, "--shard-num", 2, "-o", tmp_path / "t0")
    assert r.exit_code == 0, r.stderr
    r = runner("index", "--merge", tmp_path / "t0", tmp_path / "s1", "-o", tmp_path / "mixed")
    assert r.exit_code == 2 and "different encoders" in r.stderr, r.stderr
    assert not (tmp_path / "mixed").exists()


def test_cli_merge_refuses_overlapping_or_mixed_inputs(runner, tiny_bert, corpus_file, tmp_path):
    assert runner("index", corpus_file, "--method", "bm25", "-o", tmp_path / "a").exit_code == 0
    r = runner("index", "--merge", tmp_path / "a", tmp_path / "a", "-o", tmp_path / "m")
    assert r.exit_code == 2 and "duplicate" in r.stderr
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "d").exit_code == 0
    r = runner("index", "--merge", tmp_path / "a", tmp_path / "d", "-o", tmp_path / "m")
    assert r.exit_code == 2 and "different backends" in r.stderr
    assert not (tmp_path / "m").exists()


def test_cli_refuses_to_overwrite_a_non_index_dir(runner, corpus_file, tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "keep.txt").write_text("mine")
    r = runner("index", corpus_file, "--method", "bm25", "-o", tmp_path / "stuff")
    assert r.exit_code == 2 and "not an index" in r.stderr
    assert (tmp_path / "stuff" / "keep.txt").read_text() == "mine"

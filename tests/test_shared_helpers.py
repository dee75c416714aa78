"""Helpers written once for logic several stages need: one LO-HI range parser (mine --negative-range, rerank
--negative-ranks), one pad-token fix, one id padder, one stdout guard; and the measures every benchmark shares
(bench/_run.py: nDCG@10, exact search, a child's peak RSS, this process's high-water mark, the machine line)."""

import sys

import pytest

from retrctl.options import parse_range


@pytest.mark.parametrize("text, want", [("30-100", (30, 100)), (" 1 - 1 ", (1, 1)), ("10-20", (10, 20))])
def test_parse_range_accepts_lo_hi(text, want):
    assert parse_range(text) == want


@pytest.mark.parametrize("text", ["abc", "9-3", "0-5", "-5-10", "5", "1-2-3", ""])
def test_parse_range_refuses_with_the_name(text):
    with pytest.raises(ValueError, match="negative range"):
        parse_range(text, "negative range")


@pytest.mark.parametrize("stage, flag", [("mine", "--negative-range"), ("rerank", "--negative-ranks")])
def test_both_range_flags_refuse_alike(runner, tmp_path, stage, flag):
    inp = tmp_path / "in.jsonl"
    inp.write_text("")
    res = runner(stage, str(inp), flag, "9-3")
    assert res.exit_code == 2 and f"'{flag}'" in res.stderr and "1 <= LO <= HI" in res.stderr and not res.stdout


@pytest.mark.parametrize("left", [True, False])
def test_pad_ids_places_rows_on_the_side_and_masks_the_pad(left):
    from retrctl.models import pad_ids

    batch = pad_ids([[5, 6, 7], [8]], pad_id=0, left=left)
    want = [[5, 6, 7], [0, 0, 8]] if left else [[5, 6, 7], [8, 0, 0]]
    assert batch["input_ids"].tolist() == want
    assert batch["attention_mask"].tolist() == [[int(t != 0) for t in row] for row in want]
    wide = pad_ids([[5, 6, 7], [8]], pad_id=9, left=left, width=5)  # a longer width pads further; a shorter one is ignored
    assert wide["input_ids"].shape == (2, 5) and wide["attention_mask"].sum().item() == 4
    assert pad_ids([[5, 6, 7]], pad_id=9, left=left, width=2)["input_ids"].tolist() == [[5, 6, 7]]


def test_tokenize_to_a_width_equals_padding_afterwards(tiny_llama):
    """The trainer's pad-to-max-length step (first step measures the worst case) now asks tokenize for the width."""
    import torch

    from retrctl.models import Encoder

    enc = Encoder.load(str(tiny_llama))
    short = enc.tokenize(["a b c", "a"])
    wide = enc.tokenize(["a b c", "a"], width=short["input_ids"].size(1) + 3)
    left = enc.tokenizer.padding_side == "left"
    pad = (3, 0) if left else (0, 3)
    assert torch.equal(wide["input_ids"], torch.nn.functional.pad(short["input_ids"], pad, value=enc.tokenizer.pad_token_id))
    assert torch.equal(wide["attention_mask"], torch.nn.functional.pad(short["attention_mask"], pad, value=0))


def test_ensure_pad_token_uses_eos_then_unk_and_keeps_an_existing_one():
    from types import SimpleNamespace

    from retrctl.models import ensure_pad_token

    class Tok(SimpleNamespace):
        @property
        def pad_token_id(self):
            return None if self.pad_token is None else 0

    assert ensure_pad_token(Tok(pad_token=None, eos_token="</s>", unk_token="<unk>")).pad_token == "</s>"
    assert ensure_pad_token(Tok(pad_token=None, eos_token=None, unk_token="<unk>")).pad_token == "<unk>"
    assert ensure_pad_token(Tok(pad_token="<pad>", eos_token="</s>", unk_token="<unk>")).pad_token == "<pad>"


def test_stdout_to_stderr_keeps_stdout_for_data(capsys):
    from retrctl.process import stdout_to_stderr

    with stdout_to_stderr():
        print("DeepSpeed banner")
    print("data")
    out, err = capsys.readouterr()
    assert out == "data\n" and err == "DeepSpeed banner\n"


def test_stdout_to_stderr_also_moves_the_descriptor_and_puts_both_back(capfd):
    """What C or Rust code writes on descriptor 1 (Seismic's build log) is no record either."""
    import os
    import sys

    from retrctl.process import stdout_to_stderr

    print("before", flush=True)
    python_stdout = sys.stdout
    with stdout_to_stderr():
        os.write(1, b"rust println\n")
        print("python print")
    assert sys.stdout is python_stdout
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert out == "before\nafter\n" and err == "rust println\npython print\n"


def test_stdout_onto_stderr_undone_also_when_the_block_raises(capfd):
    import os

    from retrctl.process import stdout_to_stderr

    with pytest.raises(RuntimeError), stdout_to_stderr():
        raise RuntimeError("boom")
    os.write(1, b"data\n")
    assert capfd.readouterr().out == "data\n"


def test_pid_alive_one_semantics_for_locks_and_leftovers():
    import os
    import subprocess
    import sys

    from retrctl.process import pid_alive

    assert pid_alive(os.getpid()) and pid_alive(str(os.getpid()))
    assert pid_alive(1)  # init: running, whether signalling it is allowed (root) or refused with EPERM
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not pid_alive(gone.pid)
    for junk in (None, "", "abc", 0, -1, -os.getpid(), 2**80):  # 0 and negatives would name process groups
        assert not pid_alive(junk), junk


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_with_dies_with_parent_ends_when_its_parent_is_killed():
    import signal
    import subprocess
    import time

    # the parent starts a long child as LlamaCppServer starts its server, prints its pid, and is SIGKILLed:
    # no finally, no __exit__ runs, and the child must still end
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; from retrctl.process import "
                               "dies_with_parent; c = subprocess.Popen([sys.executable, '-c', 'import time; "
                               "time.sleep(120)'], preexec_fn=dies_with_parent()); print(c.pid, flush=True); "
                               "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert _running(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper (the child's new parent may never reap it)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- bench/_run.py: the measures every benchmark shares


@pytest.fixture(scope="module")
def bench_run():
    """bench/_run.py, loaded from its path (bench/ is a folder of scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "_run.py"
    spec = importlib.util.spec_from_file_location("bench_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _toy_vectors(n_docs=40, n_queries=6, dim=8, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n_docs, dim)).astype("float32")
    queries = rng.normal(size=(n_queries, dim)).astype("float32")
    docids, qids = [f"d{j}" for j in range(n_docs)], [f"q{i}" for i in range(n_queries)]
    qrels = {q: {docids[(7 * i + k) % n_docs]: 1 + k % 2 for k in range(3)} for i, q in enumerate(qids)}
    return docs, queries, docids, qids, qrels


def test_bench_ndcg_of_nearest_equals_the_exact_search_the_benchmarks_spelled_out(bench_run):
    """The run ``nearest`` builds and the nDCG@10 ``ndcg`` gives equal an exact top-100 dot-product search scored
    by retrctl.metrics, written out here as export.py and prune.py each wrote it."""
    import numpy as np

    from retrctl import metrics

    docs, queries, docids, qids, qrels = _toy_vectors()
    sims = queries @ docs.T
    by_hand = {q: [(docids[j], float(sims[i, j])) for j in np.argsort(-sims[i])[:100]] for i, q in enumerate(qids)}
    run = bench_run.nearest(queries, docs, qids, docids)
    assert run == by_hand
    assert bench_run.ndcg(run, qrels) == metrics.evaluate(by_hand, qrels, ["nDCG@10"]).mean["nDCG@10"]
    assert 0 < bench_run.ndcg(run, qrels) < 1


def test_bench_ndcg_of_a_run_file_equals_the_in_memory_score(bench_run, tmp_path):
    """A TREC run scored by `retrctl eval` (light.py's and train_quality.py's way) gives the in-memory number."""
    from retrctl import records

    docs, queries, docids, qids, qrels = _toy_vectors(seed=1)
    run = bench_run.nearest(queries, docs, qids, docids)
    run_file, qrels_file = tmp_path / "run.trec", tmp_path / "qrels.txt"
    records.write_run(records.run_rows(run), run_file, tag="toy")
    qrels_file.write_text("".join(f"{q} 0 {d} {g}\n" for q, judged in qrels.items() for d, g in judged.items()))
    assert bench_run.ndcg(run_file, qrels_file) == pytest.approx(bench_run.ndcg(run, qrels), abs=1e-4)


def test_bench_run_measured_reads_the_childs_own_peak(bench_run):
    """A child that holds 200 MiB has a peak RSS of at least that, whatever this process holds; its stdout comes
    back; a failing child ends the benchmark with its stderr."""
    import sys

    hold = "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ok')"
    ran = bench_run.run_measured([sys.executable, "-c", hold])
    assert ran.stdout.strip() == "ok" and ran.seconds > 0
    assert ran.peak_bytes >= 200 * 2**20
    with pytest.raises(SystemExit, match="boom"):
        bench_run.run_measured([sys.executable, "-c", "import sys; sys.exit('boom')"])


def test_bench_peak_bytes_is_this_processes_high_water_mark(bench_run):
    import resource

    before = bench_run.peak_bytes()
    held = bytearray(64 * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    after = bench_run.peak_bytes()
    assert after >= before
    assert after == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del held


def test_bench_machine_names_cores_and_python(bench_run):
    import os
    import platform

    line = bench_run.machine()
    assert f"{os.cpu_count()} cores" in line and f"python {platform.python_version()}" in line

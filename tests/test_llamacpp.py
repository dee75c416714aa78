"""qgen and rerank against llama.cpp's real server (llama-cpp-python, the retrctl[llamacpp] extra) on the shipped
SmolLM2 Q4_1 GGUF, started the stock way on loopback and stopped by the tests (retrctl.llm.llamacpp), as a user
runs it: generation, listwise / pointwise / query-likelihood rerank, scores against the in-process transformers
model of the same GGUF, a request that times out, a 503 retried, and a server killed mid-run and restarted
(qgen resumes from its checkpoint). Skipped, with the reason, when the extra is not installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import DOCS, QUERIES
from fault_proxy import FaultProxy

from retrctl.llm import ServerError, llamacpp, load_llm
from stages.rerank import TEMPLATES, passage_content, pointwise_prompt

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(not llamacpp.available(),
                                 reason=f"llama.cpp's server is not installed: {llamacpp.EXTRA}")]
ROOT = Path(__file__).resolve().parents[1]
# llama.cpp's Q4_1 kernels quantize the activations to 8 bits; transformers runs the dequantized weights in fp32.
# The two sides' mean log-probs of the same text differed by up to 1.7% of the score (0.17 nats on a score of
# -12.1, 0.05 on -2.95) and by 0.05 nats on a generated text scoring -0.87: the error grows with the logit gaps
# an unlikely token sits behind. Bound: 3% of the score or 0.1 nats, whichever is larger; a one-token slip
# of the offsets costs whole nats.
TOLERANCE = {"rel": 0.03, "abs": 0.1}


@pytest.fixture(scope="module")
def server():
    with llamacpp.LlamaCppServer("smollm2") as srv:
        yield srv


@pytest.fixture(scope="module")
def hf():
    return load_llm("smollm2")


def upr_pairs(pairs):
    """The query-likelihood prompts and answers of (query, document) index pairs. The server spends ~60 ms a prompt
    token on echoed log-probs here (llama-cpp-python sorts the whole vocabulary in Python for each), so a test
    scores a few pairs: a likely one and an unlikely one, whose gap to the in-process score is the larger."""
    prompts, answers = [], []
    for qi, di in pairs:
        p, a = pointwise_prompt(TEMPLATES["upr"], QUERIES[qi]["query_text"], passage_content(DOCS[di], 100), chat=True)
        prompts.append(p)
        answers.append(a)
    return prompts, answers


def test_query_likelihood_equals_the_in_process_scores(server, hf):
    oa = load_llm("smollm2", backend="openai", base_url=server.url, concurrency=2)
    prompts, answers = upr_pairs([(0, 0), (1, 1)])
    got, want = oa.logprobs(prompts, answers), hf.logprobs(prompts, answers)
    assert got == pytest.approx(want, **TOLERANCE)
    assert oa.usage["calls"] == len(prompts) and oa.describe()["server_models"] == [str(server.gguf)]
    with pytest.raises(ServerError, match="one token off"):  # a plain prompt: llama-cpp-python misplaces its scores
        oa.logprobs("Is tea a drink? Answer:", " Yes")


def test_generation_is_the_same_model(server, hf):
    oa = load_llm("smollm2", backend="openai", base_url=server.url)
    msgs = [{"role": "user", "content": "Write one short search query about green tea. Reply with the query only."}]
    out = oa.generate([msgs], max_new_tokens=16, stop=["\n"], details=True)[0]
    assert out["text"] and "\n" not in out["text"] and 0 < out["tokens"] <= 16
    # the server's score of its greedy text is the in-process model's score of that text
    assert out["logprob"] == pytest.approx(hf.logprobs([msgs], [out["text"]])[0], **TOLERANCE)
    sampled = [oa.generate([msgs], max_new_tokens=12, temperature=0.8, top_p=0.9, seed=5)[0] for _ in range(2)]
    assert sampled[0] == sampled[1]  # seeded per request


def _run_and_corpus(tmp_path: Path, n_queries: int, n_docs: int):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS[:n_docs]))
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES[:n_queries]))
    run = tmp_path / "run.trec"
    run.write_text("".join(f"{q['query_id']} Q0 {d['docid']} {r + 1} {10 - r} bm25\n"
                           for q in QUERIES[:n_queries] for r, d in enumerate(DOCS[:n_docs])))
    return corpus, queries, run


def test_qgen_and_every_rerank_mode_through_the_cli(server, runner, tmp_path):
    corpus, queries, run = _run_and_corpus(tmp_path, n_queries=1, n_docs=2)
    res = runner("qgen", corpus, "--llm", "smollm2", "--base-url", server.url, "-o", tmp_path / "q.jsonl")
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(x) for x in (tmp_path / "q.jsonl").read_text().splitlines()]
    manifest = json.loads((tmp_path / "q.jsonl.manifest.json").read_text())
    assert manifest["llm"]["backend"] == "openai" and manifest["counts"]["generated"] == 2
    assert len(rows) == manifest["counts"]["kept"] and {r["source_docid"] for r in rows} <= {d["docid"] for d in DOCS[:2]}
    for mode in ("listwise", "pointwise", "qlm"):
        out = tmp_path / f"{mode}.trec"
        res = runner("rerank", run, "--queries", queries, "--corpus", corpus, "--llm", "smollm2", "--base-url",
                     server.url, "--mode", mode, "-o", out)
        assert res.exit_code == 0, res.stderr
        ranked: dict = {}
        for line in out.read_text().splitlines():
            ranked.setdefault(line.split()[0], []).append(line.split()[2])
        assert {q: sorted(d) for q, d in ranked.items()} == {q["query_id"]: sorted(d["docid"] for d in DOCS[:2])
                                                              for q in QUERIES[:1]}


def test_a_request_that_times_out_is_retried_then_named(server):
    oa = load_llm("smollm2", backend="openai", base_url=server.url, timeout=0.2, max_retries=1, backoff=0.01)
    msgs = [{"role": "user", "content": "Tell a long story about tea."}]
    with pytest.raises(ServerError, match=r"failed after 2 attempts; last error .*(Timeout|timed out)") as err:
        oa.generate([msgs], max_new_tokens=64)
    assert err.value.path == server.url + "/chat/completions" and oa.usage["retries"] == 1


def test_a_503_is_retried(server):
    with FaultProxy(server.url, faults=["503"]) as proxy:
        oa = load_llm("smollm2", backend="openai", base_url=proxy.url, backoff=0.01)
        assert oa.generate([[{"role": "user", "content": "Name a tea."}]], max_new_tokens=4)[0]
        assert oa.usage["retries"] == 1 and len(proxy.requests) == 2


def _qgen(corpus: Path, out: Path, url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "retrctl", "qgen", str(corpus), "--llm", "smollm2", "--base-url", url,
                             "--batch-size", "1", "--max-retries", "1", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_a_server_killed_mid_run_and_restarted_resumes_qgen(tmp_path):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "q.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    candidates = Path(f"{out}.candidates.jsonl")
    first = llamacpp.LlamaCppServer("smollm2").start()
    try:
        proc = _qgen(corpus, out, first.url)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if candidates.exists() and len(candidates.read_text().splitlines()) >= 3:  # header + 2 docs done
                break
            time.sleep(0.1)
        first.stop(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        first.stop()
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1].startswith(f"retrctl qgen: {first.url}/chat/completions: failed after")
    assert not out.exists()  # nothing half-written
    before = candidates.read_text().splitlines()
    assert 3 <= len(before) < len(DOCS) + 1
    # restarted on another port: the checkpoint is the model's (the GGUF the server reports), not the URL's
    with llamacpp.LlamaCppServer("smollm2") as second:
        proc = _qgen(corpus, out, second.url)
        _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert f"resumed: {len(before) - 1} of {len(DOCS)} docs" in stderr
    after = candidates.read_text().splitlines()
    assert after[: len(before)] == before  # what was done is kept, not generated again
    ids = [json.loads(x)["query_id"] for x in after[1:]]
    assert sorted(ids) == sorted(f"{d['docid']}#qgen0" for d in DOCS)  # nothing lost, nothing twice
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["counts"]["generated"] == len(DOCS) and len(out.read_text().splitlines()) == manifest["counts"]["kept"]


def test_the_recipe_helper_runs_a_command_with_the_server_up_and_stops_it(tmp_path):
    probe = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/models'); print(sys.argv[1])"
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "beir" / "with_llm_server.py"), "--log",
                          str(tmp_path / "server.log"), "--", sys.executable, "-c", probe, "{url}"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and (tmp_path / "server.log").stat().st_size > 0
    with pytest.raises(OSError):  # stopped once the command ended
        urllib.request.urlopen(url + "/models", timeout=5)
    crash = ("import os, signal, sys, time, psutil; port = int(sys.argv[1].rsplit(':', 1)[1].split('/')[0]); "
             "[os.kill(c.pid, signal.SIGSEGV) for c in psutil.net_connections('tcp') "
             "if c.laddr.port == port and c.status == 'LISTEN']; time.sleep(2); sys.exit(2)")
    crashed = subprocess.run([sys.executable, str(ROOT / "examples" / "beir" / "with_llm_server.py"), "--", sys.executable,
                              "-c", crash, "{url}"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert crashed.returncode == 2  # the command's status, and why the server stopped answering it
    assert "llama.cpp's server ended during the command (killed by SIGSEGV); its log" in crashed.stderr
    failed = subprocess.run([sys.executable, str(ROOT / "examples" / "beir" / "with_llm_server.py"), "--model",
                             str(tmp_path / "server.log"), "--", "true"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert failed.returncode == 2 and "is not one" in failed.stderr  # not a GGUF file: one line, exit 2


def test_a_temporary_log_goes_with_a_stopped_server_and_stays_after_a_crash():
    with llamacpp.LlamaCppServer("smollm2") as srv:
        temporary = srv.log_path
        assert temporary.stat().st_size > 0
    assert not temporary.exists()  # a clean stop leaves nothing in the temporary folder
    crashed = llamacpp.LlamaCppServer("smollm2").start()
    crashed.proc.kill()
    crashed.proc.wait()
    crashed.stop()
    try:
        assert crashed.ended() == "killed by SIGKILL" and crashed.log_path.stat().st_size > 0  # kept for the error
    finally:
        crashed.log_path.unlink(missing_ok=True)


def test_a_server_that_ended_on_its_own_says_how():
    srv = llamacpp.LlamaCppServer("smollm2")
    assert srv.ended() is None  # never started
    srv.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert srv.ended() is None  # running
    finally:
        srv.proc.kill()
        srv.proc.wait()
    assert srv.ended() == "killed by SIGKILL"
    srv.proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    srv.proc.wait()
    assert srv.ended() == "killed by SIGSEGV"  # what a crash in llama.cpp's kernels looks like
    srv.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    srv.proc.wait()
    assert srv.ended() == "exited with status 3"

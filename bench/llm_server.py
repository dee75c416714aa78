"""Bench: the shipped SmolLM2 GGUF in-process (transformers, dequantized to fp32) vs llama.cpp's server
(llama-cpp-python, the retrctl[llamacpp] extra, on the same Q4_1 file) at concurrency 1, 2 and 4, in one run.

Two rates on the same prompts:

- **qgen**: documents per minute of ``stages.qgen.qgen`` (the chat prompt, one query per document, sampled with
  the command's defaults and ``--seed``) on the first ``--docs`` SciFact documents; with the share of the
  generated queries each filter keeps (length, dedupe, copies), so the queries' quality is compared too;
- **query likelihood**: (query, passage) pairs per second of ``llm.logprobs`` with rerank's UPR prompt
  (``--mode qlm``), SciFact's test queries each with its judged document and the next corpus document; with the
  largest difference between the two sides' scores.

The server is started the stock way (``python -m llama_cpp.server --model GGUF``) on a free loopback port, with
``--n_threads`` and ``--n_threads_batch`` set to torch's thread count so both sides use the same cores.

    flock /tmp/retrctl-bench.lock .venv/bin/python bench/llm_server.py            # ~20 min on 2 busy cores
    .venv/bin/python bench/llm_server.py --docs 2 --pairs 2 --concurrency 1       # smoke test
    python3 bench/llm_server.py --in-process cpu,cuda,cuda:bf16 --concurrency none   # a GPU: in-process rates only

The first in-process runtime (``--in-process``, device[:dtype]) is the baseline of every ratio.

Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from _run import ROOT, machine

from retrctl import records
from retrctl.llm import load_llm
from retrctl.llm.llamacpp import LlamaCppServer
from stages.qgen import qgen
from stages.rerank import TEMPLATES, passage_content, pointwise_prompt


def qgen_rate(llm, docs: list[dict], seed: int) -> tuple[float, dict]:
    """(documents per minute, the filters' counts)."""
    stats: dict = {}
    t0 = time.perf_counter()
    list(qgen(docs, llm, seed=seed, stats=stats))
    return len(docs) * 60 / (time.perf_counter() - t0), stats["counts"]


def ql_rate(llm, prompts, answers) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    scores = llm.logprobs(prompts, answers)
    return len(prompts) / (time.perf_counter() - t0), scores


def ql_pairs(data: Path, n: int) -> tuple[list, list]:
    corpus = list(records.read(data / "corpus.jsonl", "doc"))
    by_id = {d["docid"]: i for i, d in enumerate(corpus)}
    queries = {q["query_id"]: q["query_text"] for q in records.read(data / "queries.jsonl", "query")}
    prompts, answers = [], []
    for line in (data / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        qid, docid, *_ = line.split("\t")
        if qid not in queries or docid not in by_id:
            continue
        for doc in (corpus[by_id[docid]], corpus[(by_id[docid] + 1) % len(corpus)]):
            p, a = pointwise_prompt(TEMPLATES["upr"], queries[qid], passage_content(doc, 100), chat=True)
            prompts.append(p)
            answers.append(a)
        if len(prompts) >= n:
            break
    return prompts[:n], answers[:n]


def kept_share(counts: dict) -> str:
    return f"{counts['kept']}/{counts['generated']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"), help="BEIR folder.")
    ap.add_argument("--docs", type=int, default=24, help="Documents for qgen.")
    ap.add_argument("--pairs", type=int, default=16, help="(query, passage) pairs for query likelihood.")
    ap.add_argument("--concurrency", default="1,2,4",
                    help="Client concurrency levels against the server; 'none' runs no server.")
    ap.add_argument("--in-process", default="cpu",
                    help="In-process runtimes, device[:dtype] (fp32 unless named), comma-separated; the first is the "
                         "baseline of the ratios.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", default="/tmp/retrctl-bench-llamacpp.log", help="The server's log.")
    args = ap.parse_args()
    data = Path(args.data)
    docs = [d for _, d in zip(range(args.docs), records.read(data / "corpus.jsonl", "doc"), strict=False)]
    prompts, answers = ql_pairs(data, args.pairs)
    threads = torch.get_num_threads()
    levels = [] if args.concurrency == "none" else [int(c) for c in args.concurrency.split(",")]

    rows = []
    for spec in args.in_process.split(","):
        device, _, dtype = spec.partition(":")
        hf = load_llm("smollm2", device=device, dtype=dtype or "fp32")
        hf.logprobs(prompts[:1], answers[:1])  # warm up
        print(f"in-process on {spec}: qgen on {len(docs)} docs, QL on {len(prompts)} pairs", file=sys.stderr)
        rows.append((f"in-process (transformers {hf.dtype} on {device}, batch {hf.batch_size})",
                     *qgen_rate(hf, docs, args.seed), *ql_rate(hf, prompts, answers)))
        del hf
    server_args = ["--n_threads", threads, "--n_threads_batch", threads]
    with LlamaCppServer("smollm2", args=server_args, log_path=args.log) if levels else nullcontext() as srv:
        for c in levels:
            oa = load_llm("smollm2", backend="openai", base_url=srv.url, concurrency=c)
            oa.logprobs(prompts[:1], answers[:1])  # warm up
            print(f"server, concurrency {c}", file=sys.stderr)
            rows.append((f"llama.cpp server (Q4_1), concurrency {c}", *qgen_rate(oa, docs, args.seed),
                         *ql_rate(oa, prompts, answers)))

    base_q, base_l, base_scores = rows[0][1], rows[0][3], rows[0][4]
    on = "cuda" if "cuda" in args.in_process else "cpu"
    print(f"SmolLM2-135M-Instruct Q4_1 GGUF, {len(docs)} SciFact docs (qgen), {len(prompts)} pairs (query "
          f"likelihood); {threads} CPU threads; {machine(on)}\n")
    print("| runtime | qgen docs/min | ratio | queries kept (length, dedupe, copies) | QL pairs/s | ratio | "
          "max abs score diff |")
    print("|---|---|---|---|---|---|---|")
    for name, q_rate, counts, l_rate, scores in rows:
        diff = max(abs(a - b) for a, b in zip(scores, base_scores, strict=True))
        print(f"| {name} | {q_rate:.1f} | {q_rate / base_q:.2f}x | {kept_share(counts)} | {l_rate:.2f} | "
              f"{l_rate / base_l:.2f}x | {diff:.3f} |")


if __name__ == "__main__":
    main()

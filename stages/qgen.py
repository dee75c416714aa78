"""qgen: LLM-written queries for documents, filtered, with the document as the known positive.

Method: InPars (Bonifacio et al. 2022, "InPars: Data Augmentation for Information Retrieval using Large Language
Models", arXiv:2202.05144): few-shot prompt "Document: … Relevant Query: …", then keep the queries the LM itself
finds most likely (mean token log-prob of the query given the document; the top K of the pairs). Promptagator (Dai
et al. 2022, arXiv:2209.11755): few-shot generation plus round-trip consistency filtering (keep a query only if
a retriever ranks its source document in the top k). DRAMA (Ma et al. 2025, arXiv:2502.18460, §3.1) prompts a
chat LLM with 3 shots for one query per document.

| paper knob                                         | flag                              | default          |
|----------------------------------------------------|-----------------------------------|------------------|
| generator LM (InPars: GPT-3 Curie; DRAMA: Llama)   | `--llm`, `--llm-backend`, `--base-url`| smollm2, hf (openai with `--base-url`) |
| prompt: zero-shot / few-shot (InPars 3, DRAMA 3)   | `--examples FILE`, `--shots`      | zero-shot, 3     |
| chat template (DRAMA) or plain prompt (InPars)     | `--prompt-style auto|chat|plain`  | auto             |
| queries per document                               | `--per-doc`                       | 1                |
| sampling (InPars: greedy; DRAMA: sampled)          | `--sampling-temperature`, `--top-p` | 0.8, 0.9         |
| query length cap, stop at newline/EOS              | `--max-new-tokens`                | 32               |
| InPars score filter: top fraction by mean log-prob | `--keep-top`                      | 1.0 (off)        |
| Promptagator consistency: source doc in top k      | `--retriever`, `--consistency-k`  | off              |
| length bounds, dedupe                              | `--min-words/--max-words`, `--dedupe/--no-dedupe` | 2 / 32, on |
| copies of the document (not in the papers)         | `--drop-copies/--keep-copies`     | drop             |
| chatter, not a query (not in the papers)           | `--drop-chatter/--keep-chatter`   | drop             |
| a fixed sample of N documents (not in the papers)  | `--sample N`                      | all              |

Filters run in that order (length, dedupe, copies, chatter, score, consistency) and each one removes rows; the kept/dropped
counts go to stderr and the kept count is the number of rows written (ARES#77: a filter that filtered nothing).
The score is the mean raw log-prob of the query's tokens given the prompt, taken from the generation pass itself
(no second forward); the score filter needs every score, so it ranks within one run: with
`--shard-id/--shard-num` each shard keeps its own top fraction. The consistency index is `--retriever` (an index
dir over the whole corpus), or `bm25` / a model built over the docs of this run (of this shard, when sharded).

`--sample N` generates for N documents only (of this shard, or of a range of shards: `--shard-id 1-9 --shard-num 10`
samples from all but shard 0): those with the smallest stable hash of (seed, docid), the same in any input order
(DUQGen and UnIte choose documents for qgen more cleverly; a hash sample is the plain baseline).

Resumable: every generated query, with its score, is appended to `<output>.candidates.jsonl` as soon as
its batch is done; a re-run with the same `-o` skips the docs found there and the output is rewritten atomically
from all candidates. Re-running with other filter settings therefore regenerates nothing; other generation
settings are refused (the checkpoint records them). Sampling is seeded per (seed, docid, i), so a document's query
does not depend on the batch it lands in nor on an interruption. Throughput goes to stderr. A manifest
`<output>.manifest.json` records the model (path, fingerprint, backend, versions), the prompt template and its
hash, the decoding parameters, the seed, the filter thresholds and the counts (InPars#21: scripts and papers
disagreed and nobody could tell which setting made the data).

Deviations: InPars keeps a fixed number of pairs (10k of 100k); we keep a fraction, which works at any corpus
size. Small models often echo the document instead of writing a query, and a copy has a high log-prob, so the score
filter would favour it: queries that are a verbatim run of >= 6 words of their document are dropped as copies
(crop makes such queries on purpose; `--keep-copies` keeps them; in a script written without spaces the run is
compared character by character, a Han or kana character one word, four letters of Thai and the like one). SmolLM2 also answers its user instead of
writing a query ("i am sure that the document is here.", "here is the answer to your question.") or copies a
passage and runs on: `--drop-chatter` drops outputs that open with Sure/Here/Okay/Thanks/Answer, name "the document"
(text, passage, article) or "your question", hold a URL, or hold a verbatim run of >= 10 words of their document
(bench/RESULTS.md, "qgen's filters on six collections"). Candidates checkpointed before this filter existed lack the
run check; only its text rules apply to them. Documents are cut to `--doc-max-words` words in the prompt (counted on
stderr); here and in the length bounds a word is a whitespace token, or in Chinese, Japanese and the scripts written
without spaces a character or a few letters (`crop`'s units), so a Chinese query of eight characters is eight words.
Labels the model sometimes writes ("Query:", quotes, list markers) are stripped. Output: `{query_id, query_text,
source_docid}` with query_id `<docid>#qgen<i>`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path

import click
import regex

from retrctl import distributed, records
from retrctl.crops import char_units, count_words, cut_words
from retrctl.errors import UsageError
from retrctl.hashing import sample as sample_docs
from retrctl.hashing import stable_int
from retrctl.llm import LLM, Checkpoint, llm_from_flags, load_llm, resumable, sha
from retrctl.options import options, renamed
from retrctl.stage import Output, progress, stage

log = logging.getLogger("retrctl.qgen")

# prompts: InPars' "vanilla" format for plain LMs; an instruction turn (few-shot as earlier turns) for chat LMs
PLAIN_SHOT = "Example {n}:\nDocument: {document}\nRelevant Query: {query}\n\n"
PLAIN_ZERO = "Document: {document}\nRelevant Query:"
PLAIN_LAST = "Example {n}:\nDocument: {document}\nRelevant Query:"
CHAT_USER = ("Write one short search query that a user could type to find this document. Reply with the query "
             "only.\n\nDocument: {document}")

_LABEL = re.compile(r"^\s*(?:(?:relevant\s+|search\s+)?(?:query|document)\s*[:：]\s*|[-*•]\s+|\d+[.)]\s+)", re.I)
COPY_WORDS = 6  # a query that is a verbatim run of >= this many words of its doc was copied, not written
SPAN_WORDS = 10  # a query holding a verbatim run of this many words of its doc copied a passage, whatever follows
# what a small chat model writes when it talks to its user or describes the document instead of asking for it
CHATTER = re.compile(r"^(?:sure|here|okay|ok|certainly|thanks|thank you|answer)\b|\b(?:the|this|that) "
                     r"(?:document|text|passage|article)\b|\byour (?:question|query|request)\b|https?://|www\.", re.I)
_PUNCT = regex.compile(r"[^\w\p{M}\s]")
_QUOTES = "\"'“”‘’«»`"


def document_text(doc: dict, max_words: int) -> tuple[str, bool]:
    """Title and text, cut to max_words words (a Han or kana character, or a few letters of Thai, counts as one);
    whether it was cut."""
    return cut_words(f"{doc['title']}. {doc['text']}" if doc.get("title") else doc["text"], max_words)


def build_prompt(document: str, examples: list[dict], chat: bool):
    """A chat message list or a plain string for one document."""
    if chat:
        msgs = []
        for ex in examples:
            msgs += [{"role": "user", "content": CHAT_USER.format(document=ex["document"])},
                     {"role": "assistant", "content": ex["query"]}]
        return msgs + [{"role": "user", "content": CHAT_USER.format(document=document)}]
    if not examples:
        return PLAIN_ZERO.format(document=document)
    shots = "".join(PLAIN_SHOT.format(n=i + 1, **ex) for i, ex in enumerate(examples))
    return shots + PLAIN_LAST.format(n=len(examples) + 1, document=document)


def clean(text: str) -> str:
    """The query without labels, list markers or wrapping quotes the model sometimes adds."""
    prev = None
    while prev != text:
        prev, text = text, _LABEL.sub("", text).strip().strip(_QUOTES).strip()
    return " ".join(text.split())


def _seed(seed: int, docid: str, i: int) -> int:
    return stable_int(seed, docid, i, size=7)


def _norm(text: str) -> str:
    """Lower case, punctuation made spaces; combining marks (Devanagari's and Thai's vowel signs) kept inside their
    words, which a plain word class would split into fragments."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def _joined(units: list[tuple[str, float]]) -> str:
    return f" {' '.join(u for u, _ in units)} "


def copy_flags(query: str, doc: dict) -> dict[str, bool]:
    """``copied``: the query is a verbatim run of COPY_WORDS or more words of its document; ``span``: it holds one
    of SPAN_WORDS (a copied passage, whatever follows). Compared as ``char_units`` of the normalised texts."""
    units = char_units(_norm(query))
    text = _joined(char_units(_norm(doc.get("title", "") + " " + doc["text"])))
    return {"copied": sum(w for _, w in units) >= COPY_WORDS and _joined(units) in text,
            "span": _holds_a_run(units, text, SPAN_WORDS)}


def _holds_a_run(units: list[tuple[str, float]], doc: str, words: int) -> bool:
    """Whether ``doc`` (``char_units`` joined by spaces, padded) holds a run of the query's ``units`` at least
    ``words`` words long (``char_units``' shares): the shortest such run from each start is enough."""
    for i in range(len(units)):
        total, j = 0.0, i
        while j < len(units) and total < words:
            total, j = total + units[j][1], j + 1
        if total < words:
            return False
        if _joined(units[i:j]) in doc:
            return True
    return False


def qgen(docs: Iterable[dict], llm: LLM | str = "smollm2", *, per_doc: int = 1, examples: list[dict] | None = None,
         shots: int = 3, prompt_style: str = "auto", temperature: float = 0.8, top_p: float = 0.9,
         max_new_tokens: int = 32, seed: int = 0, batch_size: int = 8, doc_max_words: int = 256, min_words: int = 2,
         max_words: int = 32, dedupe: bool = True, drop_copies: bool = True, drop_chatter: bool = True, keep_top: float = 1.0,
         retriever=None, consistency_k: int = 0,
         sample: int | None = None, checkpoint: Checkpoint | None = None, stats: dict | None = None) -> Iterator[dict]:
    """Yield query records {query_id, query_text, source_docid}: per_doc generated queries per doc, filtered.

    llm: an LLM (retrctl.llm) or a name for the hf backend. retriever: for the consistency filter, an index
    (``.search(queries, k)``) or a callable building one from the list of docs. checkpoint: resume from and append
    to it. stats: filled with the settings, template and counts (for the manifest). sample: only the ``sample``
    docs with the smallest stable hash of (seed, docid) (retrctl.hashing.sample)."""
    if per_doc < 1 or not 0 < keep_top <= 1 or min_words < 0 or max_words < min_words or batch_size < 1:
        raise ValueError("need per_doc >= 1, 0 < keep_top <= 1, 0 <= min_words <= max_words, batch_size >= 1")
    if prompt_style not in ("auto", "chat", "plain"):
        raise ValueError(f"prompt_style must be auto, chat or plain, got {prompt_style!r}")
    if (retriever is None) != (consistency_k < 1):
        raise ValueError("the consistency filter needs both a retriever and consistency_k >= 1")
    if sample is not None:
        # the sample is known once the input is read: its own progress (the input's ends before generation starts)
        picked = list(sample_docs(docs, sample, seed, "docid"))
        docs = progress(picked, desc="qgen", total=len(picked), unit="doc")
    llm = load_llm(llm) if isinstance(llm, str) else llm
    chat = prompt_style == "chat" or (prompt_style == "auto" and llm.prefers_chat)
    shots_used = list(examples or [])[:shots]
    template = {"style": "chat" if chat else "plain", "user": CHAT_USER if chat else None,
                "plain": None if chat else [PLAIN_SHOT, PLAIN_ZERO, PLAIN_LAST], "examples": shots_used}
    template["sha"] = sha(json.dumps(template, sort_keys=True))
    desc = llm.describe()
    settings = {"model": {k: desc.get(k) for k in ("backend", "model", "path", "revision", "server_models", "chat_template")},
                "template_sha": template["sha"], "per_doc": per_doc, "temperature": temperature, "top_p": top_p,
                "max_new_tokens": max_new_tokens, "stop": ["\n"], "seed": seed, "doc_max_words": doc_max_words}
    st = stats if stats is not None else {}
    st.update(settings=settings, template=template, llm=desc, counts={})
    counts = st["counts"]

    order: list[str] = []
    keep_docs = [] if retriever is not None and not hasattr(retriever, "search") else None
    cands: dict[str, list[dict]] = {}
    n_new = n_cut = n_resumed = 0
    t0 = time.perf_counter()
    gen_before = llm.usage["generated_tokens"]

    def generate(batch: list[dict]) -> list[dict]:
        nonlocal n_new, n_cut
        texts = [document_text(doc, doc_max_words) for doc in batch]
        n_cut += sum(cut for _, cut in texts)
        jobs = [(doc, text, i) for doc, (text, _) in zip(batch, texts, strict=True) for i in range(per_doc)]
        prompts = [build_prompt(text, shots_used, chat) for _, text, _ in jobs]
        outs = llm.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            stop=["\n"], seed=[_seed(seed, d["docid"], i) for d, _, i in jobs], details=True)
        rows = [{"query_id": f"{d['docid']}#qgen{i}", "query_text": clean(o["text"]), "source_docid": d["docid"],
                 "score": o["logprob"], "tokens": o["tokens"]} for (d, _, i), o in zip(jobs, outs, strict=True)]
        for r, (d, _, _) in zip(rows, jobs, strict=True):
            r.update(copy_flags(r["query_text"], d))
        n_new += len(batch)
        return rows

    # a doc is done once the checkpoint holds all its per_doc candidates (a torn batch is generated again)
    for doc, rows, resumed in resumable(docs, generate, key=itemgetter("docid"), batch_size=batch_size,
                                        checkpoint=checkpoint, settings=settings, owner=itemgetter("source_docid"),
                                        row_id=itemgetter("query_id"), complete=lambda rows: len(rows) == per_doc,
                                        pool=getattr(llm, "pool", None)):
        order.append(doc["docid"])
        if keep_docs is not None:
            keep_docs.append(doc)
        cands[doc["docid"]] = rows
        n_resumed += resumed
    secs = time.perf_counter() - t0
    toks = llm.usage["generated_tokens"] - gen_before
    if n_resumed:
        log.info("resumed: %d of %d docs were already done in the checkpoint", n_resumed, len(order))
    if n_cut:
        log.info("%d docs were cut to %d words in the prompt", n_cut, doc_max_words)
    if n_new:
        log.info("generated %d queries for %d docs in %.1fs: %.2f queries/s, %d tokens, %.1f tok/s", n_new * per_doc,
                 n_new, secs, n_new * per_doc / max(secs, 1e-9), toks, toks / max(secs, 1e-9))
    st["throughput"] = {"docs": n_new, "seconds": round(secs, 3), "generated_tokens": toks}

    alive = [c for d in order for c in cands.get(d, [])]
    counts["generated"] = len(alive)

    def drop(name: str, keep) -> None:
        nonlocal alive
        kept = [c for c in alive if keep(c)]
        counts[name] = len(alive) - len(kept)
        alive = kept

    drop("too_short", lambda c: count_words(c["query_text"]) >= max(min_words, 1))
    drop("too_long", lambda c: count_words(c["query_text"]) <= max_words)
    if dedupe:
        seen: set[str] = set()
        drop("duplicate", lambda c: not (_norm(c["query_text"]) in seen or seen.add(_norm(c["query_text"]))))
    if drop_copies:
        drop("copied", lambda c: not c.get("copied"))
    if drop_chatter:
        drop("chatter", lambda c: not (CHATTER.search(c["query_text"]) or c.get("span")))
    if keep_top < 1:
        n = math.ceil(keep_top * len(alive))
        ranked = sorted(alive, key=lambda c: (-(c["score"] if c["score"] is not None else -math.inf), c["query_id"]))
        top = {c["query_id"] for c in ranked[:n]}
        st["score_threshold"] = ranked[n - 1]["score"] if n else None
        drop("low_score", lambda c: c["query_id"] in top)
    if retriever is not None and alive:
        index = retriever if hasattr(retriever, "search") else retriever(keep_docs)
        hits = index.search([{"query_id": c["query_id"], "query_text": c["query_text"]} for c in alive], consistency_k)
        drop("inconsistent", lambda c: c["source_docid"] in {d for d, _ in hits.get(c["query_id"], [])})
    counts["kept"] = len(alive)
    dropped = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items() if k not in ("generated", "kept"))
    log.info("filters: %d generated, dropped %s; kept %d", counts["generated"], dropped or "none", counts["kept"])
    for c in alive:
        yield {"query_id": c["query_id"], "query_text": c["query_text"], "source_docid": c["source_docid"]}


# ---------------------------------------------------------------- command


def read_examples(path: str) -> list[dict]:
    """Few-shot examples: JSONL with a document (`document`, `text` or `doc`, optional `title`) and a query
    (`query` or `query_text`)."""
    out = []
    for line, obj in records.read_jsonl(path):
        doc = next((obj[k] for k in ("document", "text", "doc") if k in obj), None)
        query = next((obj[k] for k in ("query", "query_text") if k in obj), None)
        for field, value in (("document", doc), ("query", query)):
            if not isinstance(value, str) or not value.strip():
                raise records.RecordError(path, line, field, "expected a non-empty string")
        if obj.get("title"):
            doc = f"{obj['title']}. {doc}"
        out.append({"document": " ".join(doc.split()), "query": " ".join(query.split())})
    if not out:
        raise records.RecordError(path, message="no examples")
    return out


def open_consistency_retriever(spec: str, sharded: bool):
    """--retriever for the consistency filter: an index dir (the whole corpus), or bm25/hybrid/a model built
    over this run's docs once they are known (retrctl.retrievers)."""
    from retrctl.retrievers import check_spec, open_retriever

    check_spec(spec)
    if Path(spec, "index.json").exists():
        return open_retriever(spec, model=None, docs={}, corpus_path=None)
    if sharded:
        log.warning("--retriever %s is built over this shard's docs only; give an index dir for the whole corpus", spec)
    return lambda docs: open_retriever(spec, model=None, docs={d["docid"]: d for d in docs}, corpus_path=None, cache=False)


@stage(qgen, reads="doc", writes="query")
@options("llm", "llm_server", "batch_size", "seed", "per_doc", "sample", "retriever", "ray")
@click.option("--examples", type=click.Path(dir_okay=False), help="Few-shot examples (JSONL: document, query).")
@click.option("--shots", type=click.IntRange(min=0), help="Examples used from --examples (DRAMA and InPars use 3).")
@click.option("--prompt-style", type=click.Choice(["auto", "chat", "plain"]), help="chat template or InPars plain prompt.")
@click.option("--sampling-temperature", "temperature", type=click.FloatRange(min=0), help="Sampling temperature (0 = greedy).")
@renamed("--temperature", "--sampling-temperature", type=click.FloatRange(min=0))  # train's is the softmax's
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), help="Nucleus sampling mass.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Tokens per query at most; generation also stops at newline/EOS.")
@click.option("--doc-max-words", type=click.IntRange(min=1), help="Document words shown in the prompt.")
@options("query_words")
@click.option("--dedupe/--no-dedupe", default=None, help="Drop repeated queries (case and punctuation folded).")
@click.option("--drop-copies/--keep-copies", default=None, help="Drop queries copied verbatim from their doc (>= 6 words).")
@click.option("--drop-chatter/--keep-chatter", default=None, help="Drop outputs that talk to the user (Sure, Here, your "
              "question), name the document, hold a URL, or copy a run of >= 10 words of their doc.")
@click.option("--keep-top", type=click.FloatRange(0, 1, min_open=True), help="InPars filter: keep this fraction of queries with the best mean log-prob.")
@click.option("--consistency-k", type=click.IntRange(min=0), help="Keep a query only if --retriever ranks its source doc in the top k.")
@click.option("--candidates-file", "candidates", help="Checkpoint of raw generations (default: <output>.candidates.jsonl; none for stdout).")
@renamed("--candidates", "--candidates-file")  # search's --candidates are heads
def command(docs, output, llm, retriever, consistency_k, examples, candidates, shard_num, **opts):
    """LLM-written queries for documents (InPars / Promptagator / DRAMA), filtered; resumable."""
    ray = distributed.pop_settings(opts)
    opts = {k: v for k, v in opts.items() if v is not None}
    if opts.get("max_words", qgen.__kwdefaults__["max_words"]) < opts.get("min_words", qgen.__kwdefaults__["min_words"]):
        raise UsageError("must be >= --min-words", flag="--max-words")
    if (retriever is not None) != (consistency_k > 0):
        raise UsageError("the consistency filter needs both --retriever and --consistency-k")
    if retriever is not None:
        opts.update(retriever=open_consistency_retriever(retriever, shard_num > 1), consistency_k=consistency_k)
    if examples:
        opts["examples"] = read_examples(examples)
    model = llm_from_flags(llm, opts, ray=ray)
    if candidates is None and output != "-":
        candidates = f"{output}.candidates.jsonl"
    stats: dict = {}
    queries = qgen(docs, model, checkpoint=Checkpoint(candidates) if candidates else None, stats=stats, **opts)
    if ray is not None:
        queries = _closing(model, queries)
    return Output(queries, finish=lambda n: provenance(n, stats, opts, model, retriever, candidates))


def _closing(model, queries: Iterator[dict]) -> Iterator[dict]:
    """The queries, the model's Ray workers let go once the last one is taken (or the writing fails)."""
    try:
        yield from queries
    finally:
        model.close()


def provenance(n: int, stats: dict, opts: dict, model: LLM, retriever: str | None, candidates: str | None) -> dict:
    """The queries' manifest: model, settings, prompt template, filter counts, throughput, LLM usage."""
    if n != stats["counts"]["kept"]:  # a filter that reports what it did not do is a peer bug (ARES#77)
        raise RuntimeError(f"wrote {n} rows but the filters kept {stats['counts']['kept']}")
    log.info("%s", model.report("llm"))
    return {"stage": "qgen", **{k: stats[k] for k in ("llm", "settings", "template", "counts", "throughput")},
            "filters": {k: opts.get(k, qgen.__kwdefaults__[k]) for k in
                        ("min_words", "max_words", "dedupe", "drop_copies", "drop_chatter", "keep_top", "consistency_k")},
            "sample": opts.get("sample"), "score_threshold": stats.get("score_threshold"), "retriever": retriever,
            "candidates": candidates, "usage": model.usage}

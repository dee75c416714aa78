"""rerank: LLM reranking of a run, or relabelling of training groups, listwise or pointwise.

Method: listwise reranking with a sliding window (RankGPT: Sun et al. 2023, "Is ChatGPT Good at Search?
Investigating Large Language Models as Re-Ranking Agents", arXiv:2304.09542, §3.2; defaults and prompts as in
rank_llm, Pradeep et al. 2023, RankVicuna arXiv:2309.15088 / RankZephyr arXiv:2312.02724): the LLM orders `window`
passages at a time, from the bottom of the top-k to the top, moving up by `stride`, so good passages bubble up.
Pointwise (`--mode pointwise`): each passage is scored by the log-probability of "Yes" as the answer to "is the
passage relevant?" (the relevance-generation score of Liang et al. 2022, HELM, arXiv:2211.09110), which suits
small models that cannot follow the listwise format. Query likelihood (`--mode qlm`): each passage is scored by the
mean log-probability of the query's tokens given the passage and an instruction to write a question for it (UPR:
Sachan et al. 2022, "Improving Passage Retrieval with Zero-Shot Question Generation", arXiv:2204.07496, which helped
with LMs of ~250M parameters): the LM needs no instruction following, so small LMs and any served LLM with
logprobs can label. Group relabelling as DRAMA (Ma et al. 2025,
arXiv:2502.18460, §3.1): after reranking a mined group, the top-1 is the positive and ranks 10-20 the negatives.
With `--keep-labels` a group keeps its positives and negatives and only gains the reranker's scores
(`positive_scores`/`negative_scores`): GPL's pseudo-labelling (Wang et al. 2022, arXiv:2112.07577, §3), where a
generated query's source document stays the positive and the teacher scores it against the mined negatives, for
MarginMSE.

| paper knob                                   | flag                            | default            |
|----------------------------------------------|---------------------------------|--------------------|
| window size / step (RankGPT, rank_llm)       | `--window`, `--stride`          | 20, 10             |
| depth reranked (rank_llm)                    | `--top-k`                       | 100                |
| prompt template (tied to the model, below)   | `--template`                    | from the model     |
| passage length in the prompt (RankGPT: 300 tokens) | `--passage-max-words`     | 100 words          |
| listwise, pointwise or query likelihood      | `--mode`                        | listwise           |
| DRAMA relabelling: positive rank, negatives  | `--negative-ranks`              | 10-20              |
| GPL: keep the group, score it                | `--keep-labels`                 | off                |

Templates are tied to models (castorini/rank_llm#318: the wrong template made reranking worse than the first
stage): ``MODEL_TEMPLATES`` maps a model name to its template; an unknown model gets the generic rank_llm
template with a warning. With `--qrels`, nDCG@10 before and after is printed and a drop is warned about (a probe
set).

The permutation parser is total (castorini/rank_llm's receive_permutation and clean_ranking_response;
FlashRank#33 read `[11]` as `1`; llama_index#11092 raised on prose): `<think>` blocks are dropped, superscript,
circled and full-width digits are mapped, bracketed ids are preferred over bare numbers, multi-digit ids are read
whole, duplicates and out-of-range ids are dropped and missing ids appended in their input order; if nothing usable
remains (or anything raises) the window keeps its input order. Windows are counted as ok, repaired or failed, and
the failure rate goes to stderr with LLM calls and tokens.

Cost: the same window of every query in a batch goes to the LLM together; `--dry-run` prints the
number of windows, LLM calls and prompt tokens (a table on stderr; nothing on stdout) without loading weights.
Resumable per query: finished queries are appended to `<output>.partial.jsonl` (with their window outcomes, so
the totals of a resumed run cover every query) and skipped by a re-run; the output is written atomically and the
checkpoint removed on success. Backend, model fingerprint, template and
versions go to `<output>.manifest.json` (TREC runs have no header; rank_llm#410, tevatron#112).

Deviations: rank_llm slides one window past the top when (top_k - window) is not a multiple of the stride; we
stop after the window that reaches rank 1. Run scores are rank-based (top-k reranked, then the rest in input
order, scores strictly decreasing); group scores are the reranker's (pointwise log P(Yes); qlm mean log p(query | passage); listwise 1/rank).
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Iterable, Iterator
from operator import itemgetter

import click

from retrctl import distributed, records
from retrctl.errors import UsageError
from retrctl.hashing import in_shard, shard
from retrctl.llm import LLM, Checkpoint, llm_from_flags, load_llm, planning_llm, resumable, sha
from retrctl.options import check_range, options, parse_range
from retrctl.stage import Output, progress, stage

log = logging.getLogger("retrctl.rerank")

SYSTEM = "You are RankLLM, an intelligent assistant that can rank passages based on their relevancy to the query."
TEMPLATES = {
    # rank_llm's single-turn prompt (RankVicuna / RankZephyr)
    "rank_llm": {
        "mode": "listwise", "system": SYSTEM,
        "prefix": "I will provide you with {num} passages, each indicated by a numerical identifier []. "
                  "Rank the passages based on their relevance to the search query: {query}.\n",
        "passage": "[{i}] {content}\n",
        "suffix": "Search Query: {query}.\nRank the {num} passages above based on their relevance to the search query. "
                  "All the passages should be included and listed using identifiers, in descending order of relevance. "
                  "The output format should be [] > [], e.g., [4] > [2]. Only respond with the ranking results, "
                  "do not say any word or explain.",
    },
    # RankGPT's multi-turn prompt (Sun et al. 2023, one turn per passage)
    "rankgpt": {
        "mode": "listwise", "multi_turn": True,
        "system": "You are RankGPT, an intelligent assistant that can rank passages based on their relevancy to the query.",
        "prefix": "I will provide you with {num} passages, each indicated by number identifier []. \n"
                  "Rank the passages based on their relevance to query: {query}.",
        "ack": "Okay, please provide the passages.",
        "passage": "[{i}] {content}",
        "received": "Received passage [{i}].",
        "suffix": "Search Query: {query}. \nRank the {num} passages above based on their relevance to the search query. "
                  "The passages should be listed in descending order using identifiers. The most relevant passages "
                  "should be listed first. The output format should be [] > [], e.g., [1] > [2]. Only response the "
                  "ranking results, do not say any word or explain.",
    },
    "yes_no": {
        "mode": "pointwise",
        "user": "Query: {query}\nPassage: {content}\nIs the passage relevant to the query? Answer Yes or No.",
        "plain_suffix": "\nAnswer:", "answer": "Yes",
    },
    # UPR's question-generation prompt: the score is the query's own likelihood as the answer
    "upr": {
        "mode": "qlm",
        "user": "Passage: {content}\nPlease write a question based on this passage.",
        "plain_suffix": "\nQuestion:", "answer": "{query}",
    },
}
SCORED_MODES = ("pointwise", "qlm")  # one LLM call per (query, passage): the log-probability of the template's answer
# model name (substring, lower case) -> (listwise template, pointwise template); first match wins
MODEL_TEMPLATES = [
    ("rank_zephyr", "rank_llm", "yes_no"),
    ("rank_vicuna", "rank_llm", "yes_no"),
    ("gpt-3.5", "rankgpt", "yes_no"),
    ("gpt-4", "rankgpt", "yes_no"),
    ("smollm2", "rank_llm", "yes_no"),
]
GENERIC = ("rank_llm", "yes_no")
NEGATIVE_RANKS = (10, 20)  # DRAMA: reranked ranks 10-20 become the negatives


def template_for(model_name: str, mode: str, override: str | None = None) -> str:
    """The template tied to a model; the generic one, with a warning, for a model not in MODEL_TEMPLATES."""
    if override:
        if override not in TEMPLATES or TEMPLATES[override]["mode"] != mode:
            names = [n for n, t in TEMPLATES.items() if t["mode"] == mode]
            raise ValueError(f"template {override!r} is not a {mode} template ({', '.join(names)})")
        return override
    if mode == "qlm":  # the prompt asks for no format the model must know, so one template serves every model
        return "upr"
    name = str(model_name).lower()
    for key, listwise, pointwise in MODEL_TEMPLATES:
        if key in name:
            return listwise if mode == "listwise" else pointwise
    chosen = GENERIC[0] if mode == "listwise" else GENERIC[1]
    log.warning("no prompt template is tied to %s: using the generic %r one (a wrong template can rank below the "
                "first stage, rank_llm#318; pass --template to choose)", model_name, chosen)
    return chosen


# ---------------------------------------------------------------- the permutation parser

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_BRACKETED = re.compile(r"\[\s*(\d+)\s*\]")
_NUMBER = re.compile(r"\d+")


def clean_response(text: str) -> str:
    """Drop reasoning blocks and map look-alike digits to ASCII (rank_llm's clean_ranking_response, widened)."""
    text = _THINK.sub(" ", text)
    low = text.lower()
    if "</think>" in low:  # an opening tag the template already sent: keep what follows the close
        text = text[low.rindex("</think>") + len("</think>"):]
    elif "<think>" in low:  # reasoning that never ended holds no answer
        text = text[: low.index("<think>")]
    out = []
    for ch in text:
        if ch.isascii():
            out.append(ch)
            continue
        name = unicodedata.name(ch, "")
        value = unicodedata.numeric(ch, None)
        if value is not None and value == int(value) and any(k in name for k in ("CIRCLED", "PARENTHESIZED", "FULL STOP")):
            out.append(f" {int(value)} ")  # ⑪ -> 11, kept apart so ①② is not 12
        elif unicodedata.decimal(ch, None) is not None:
            out.append(str(unicodedata.decimal(ch)))  # full-width, Arabic-Indic, Devanagari ... digits
        elif unicodedata.digit(ch, None) is not None:
            out.append(str(unicodedata.digit(ch)))  # superscripts and subscripts
        else:
            out.append(unicodedata.normalize("NFKC", ch))  # full-width brackets and '>'
    return "".join(out)


def parse_permutation(text, n: int) -> tuple[list[int], str]:
    """A permutation of range(n) from an LLM answer listing 1-based ids, and 'ok', 'repaired' or 'failed'.

    Total: any input gives a permutation (the input order when nothing usable is found)."""
    try:
        cleaned = clean_response(text if isinstance(text, str) else str(text))
        found = _BRACKETED.findall(cleaned) or _NUMBER.findall(cleaned)
        seen, perm = set(), []
        for tok in found:
            if len(tok) > 6:  # not an id (and int() of a huge digit string raises)
                continue
            i = int(tok) - 1
            if 0 <= i < n and i not in seen:
                seen.add(i)
                perm.append(i)
        if not perm:
            return list(range(n)), "failed" if n > 1 else "ok"
        exact = len(perm) == n and len(found) == n
        perm += [i for i in range(n) if i not in seen]
        return perm, "ok" if exact else "repaired"
    except Exception:  # the parser must never lose a window's candidates
        return list(range(n)), "failed"


# ---------------------------------------------------------------- prompts


def passage_content(doc: dict, max_words: int) -> str:
    text = " ".join(doc.get("text", "").split()[:max_words])
    return f"Title: {doc['title']} Content: {text}" if doc.get("title") else text


def window_prompt(template: dict, query: str, contents: list[str]) -> list[dict]:
    num = len(contents)
    if template.get("multi_turn"):
        msgs = [{"role": "system", "content": template["system"]},
                {"role": "user", "content": template["prefix"].format(num=num, query=query)},
                {"role": "assistant", "content": template["ack"]}]
        for i, c in enumerate(contents, 1):
            msgs += [{"role": "user", "content": template["passage"].format(i=i, content=c)},
                     {"role": "assistant", "content": template["received"].format(i=i)}]
        return msgs + [{"role": "user", "content": template["suffix"].format(num=num, query=query)}]
    body = template["prefix"].format(num=num, query=query)
    body += "".join(template["passage"].format(i=i, content=c) for i, c in enumerate(contents, 1))
    body += template["suffix"].format(num=num, query=query)
    return [{"role": "system", "content": template["system"]}, {"role": "user", "content": body}]


def pointwise_prompt(template: dict, query: str, content: str, chat: bool):
    """(prompt, answer) whose log-probability scores the passage: "Yes" (yes_no) or the query itself (upr)."""
    user = template["user"].format(query=query, content=content)
    answer = template["answer"].format(query=query)
    if chat:
        return [{"role": "user", "content": user}], answer
    return user + template["plain_suffix"], " " + answer


def windows(n: int, window: int = 20, stride: int = 10) -> list[tuple[int, int]]:
    """(start, end) of each window, bottom of the list first, as rank_llm's sliding_windows (see Deviations)."""
    out, end, start = [], n, n - window
    while end > 0:
        start = max(start, 0)
        out.append((start, end))
        if start == 0:
            break
        end, start = end - stride, start - stride
    return out


# ---------------------------------------------------------------- the method


def rerank(items: Iterable[dict], llm: LLM | str = "smollm2", *, mode: str = "listwise", window: int = 20,
           stride: int = 10, top_k: int = 100, template: str | None = None, passage_max_words: int = 100,
           batch_size: int = 8, checkpoint: Checkpoint | None = None, stats: dict | None = None) -> Iterator[dict]:
    """Rerank candidate lists. items: {query_id, query_text, docs: [{docid, title, text}] best first}.

    Yields {query_id, docids, scores}: the top_k reordered, the rest below in input order; scores are the
    reranker's for the top_k (pointwise log P(Yes), qlm mean log p(query | passage), listwise 1/rank) and None below."""
    if mode not in ("listwise", *SCORED_MODES):
        raise ValueError(f"mode must be listwise, pointwise or qlm, got {mode!r}")
    if window < 2 or not 0 < stride <= window or top_k < 1 or batch_size < 1:
        raise ValueError("need window >= 2, 0 < stride <= window, top_k >= 1, batch_size >= 1")
    llm = load_llm(llm) if isinstance(llm, str) else llm
    name = template_for(llm.name, mode, template)
    tmpl = TEMPLATES[name]
    chat = llm.has_chat_template  # pointwise scores go through /v1/completions: templated locally or plain
    max_new = llm.count_tokens(" > ".join(f"[{i}]" for i in range(1, window + 1))) + 8
    desc = llm.describe()
    settings = {"model": {k: desc.get(k) for k in ("backend", "model", "path", "revision", "server_models", "chat_template")},
                "template": name, "template_sha": sha(json.dumps(tmpl, sort_keys=True)), "mode": mode, "window": window,
                "stride": stride, "top_k": top_k, "passage_max_words": passage_max_words, "max_new_tokens": max_new}
    st = stats if stats is not None else {}
    st.update(settings=settings, llm=desc, windows={"ok": 0, "repaired": 0, "failed": 0}, queries=0, resumed=0)

    def run_batch(batch: list[dict]) -> list[dict]:
        results = []
        if mode in SCORED_MODES:
            pairs = [(q, d) for q in batch for d in q["docs"][:top_k]]
            prompts = [pointwise_prompt(tmpl, q["query_text"], passage_content(d, passage_max_words), chat) for q, d in pairs]
            scores = llm.logprobs([p for p, _ in prompts], [a for _, a in prompts]) if prompts else []
            k = 0
            for q in batch:
                head = q["docs"][:top_k]
                s = scores[k : k + len(head)]
                k += len(head)
                order = sorted(range(len(head)), key=lambda i: (-s[i], i))
                results.append({"query_id": q["query_id"], "docids": [head[i]["docid"] for i in order]
                                + [d["docid"] for d in q["docs"][top_k:]], "scores": [s[i] for i in order]})
            return results
        heads = {q["query_id"]: list(q["docs"][:top_k]) for q in batch}
        outcomes = {qid: {"ok": 0, "repaired": 0, "failed": 0} for qid in heads}  # kept per query: a resume adds them back
        plans = {qid: windows(len(h), window, stride) for qid, h in heads.items()}
        for step in range(max((len(p) for p in plans.values()), default=0)):
            live = [q for q in batch if step < len(plans[q["query_id"]])]
            spans = [plans[q["query_id"]][step] for q in live]
            prompts = [window_prompt(tmpl, q["query_text"], [passage_content(d, passage_max_words)
                                                              for d in heads[q["query_id"]][s:e]])
                       for q, (s, e) in zip(live, spans, strict=True)]
            answers = llm.generate(prompts, max_new_tokens=max_new, temperature=0.0)
            for q, (s, e), answer in zip(live, spans, answers, strict=True):
                perm, status = parse_permutation(answer, e - s)
                outcomes[q["query_id"]][status] += 1
                if status != "ok":
                    log.debug("query %s window %d-%d %s: %r", q["query_id"], s + 1, e, status, answer[:300])
                head = heads[q["query_id"]]
                head[s:e] = [head[s + i] for i in perm]
        for q in batch:
            head = heads[q["query_id"]]
            results.append({"query_id": q["query_id"], "docids": [d["docid"] for d in head]
                            + [d["docid"] for d in q["docs"][top_k:]], "scores": [1.0 / r for r in range(1, len(head) + 1)],
                            "windows": outcomes[q["query_id"]]})
        return results

    for _, (result,), resumed in resumable(items, run_batch, key=itemgetter("query_id"), batch_size=batch_size,
                                           checkpoint=checkpoint, settings=settings, pool=getattr(llm, "pool", None)):
        st["queries"] += 1
        st["resumed"] += resumed
        for status, n in result.get("windows", {}).items():
            st["windows"][status] += n
        yield result
    w = st["windows"]
    total = sum(w.values())
    if mode == "listwise":
        log.info("%d windows: %d ok, %d repaired, %d failed (parse-failure rate %.1f%%)", total, w["ok"], w["repaired"],
                 w["failed"], 100.0 * w["failed"] / max(total, 1))
    if st["resumed"]:
        log.info("resumed: %d of %d queries were already done in the checkpoint", st["resumed"], st["queries"])
    log.info("%s", llm.report("rerank"))


def plan(items: Iterable[dict], llm: LLM, *, mode: str = "listwise", window: int = 20, stride: int = 10,
         top_k: int = 100, template: str | None = None, passage_max_words: int = 100) -> dict:
    """What a run would cost, without calling the LLM: queries, windows (= LLM calls), prompt tokens (windows
    rendered in input order; later windows hold other passages once earlier ones reorder, so this is an
    estimate) and generated tokens at most."""
    tmpl = TEMPLATES[template_for(llm.name, mode, template)]
    chat = llm.has_chat_template  # pointwise scores go through /v1/completions: templated locally or plain
    out = {"queries": 0, "llm_calls": 0, "prompt_tokens": 0, "generated_tokens_max": 0}
    per_answer = llm.count_tokens(" > ".join(f"[{i}]" for i in range(1, window + 1))) + 8
    for q in items:
        out["queries"] += 1
        head = q["docs"][:top_k]
        contents = [passage_content(d, passage_max_words) for d in head]
        if mode in SCORED_MODES:
            for c in contents:
                prompt, answer = pointwise_prompt(tmpl, q["query_text"], c, chat)  # "Yes" is one token; a query is counted
                out["prompt_tokens"] += llm.count_tokens(prompt) + (1 if mode == "pointwise" else llm.count_tokens(answer))
            out["llm_calls"] += len(head)
            continue
        for s, e in windows(len(head), window, stride):
            out["llm_calls"] += 1
            out["prompt_tokens"] += llm.count_tokens(window_prompt(tmpl, q["query_text"], contents[s:e]))
            out["generated_tokens_max"] += per_answer
    return out


def relabel(group: dict, result: dict, negative_ranks: tuple[int, int] = NEGATIVE_RANKS) -> dict:
    """DRAMA's relabelling: the reranked top-1 is the positive, ranks lo..hi (1-based, inclusive) the negatives."""
    ids, scores = result["docids"], result["scores"]
    lo, hi = negative_ranks
    neg = list(range(lo - 1, min(hi, len(ids))))
    score = lambda i: scores[i] if i < len(scores) else None  # noqa: E731
    out = {"query_id": group["query_id"], "query_text": group["query_text"], "positive_document_ids": [ids[0]],
           "negative_document_ids": [ids[i] for i in neg]}
    if all(score(i) is not None for i in [0, *neg]):
        out["positive_scores"], out["negative_scores"] = [score(0)], [score(i) for i in neg]
    return out


def scored(group: dict, result: dict) -> dict:
    """GPL's pseudo-labels: the group's own positives and negatives, with the reranker's scores (the caller checks
    that every document of the group is within the reranked top_k)."""
    score = dict(zip(result["docids"], result["scores"], strict=False))  # docids below top_k have no score
    return {**group, "positive_scores": [score[d] for d in group["positive_document_ids"]],
            "negative_scores": [score[d] for d in group["negative_document_ids"]]}


# ---------------------------------------------------------------- command


def _run_items(run: dict, queries_path: str, corpus_path: str, run_path: str) -> Iterator[dict]:
    needed = {d for ranked in run.values() for d, _ in ranked}
    texts = {q["query_id"]: q["query_text"] for q in records.read(queries_path, "query") if q["query_id"] in run}
    corpus = {d["docid"]: d for d in records.read(corpus_path, "doc") if d["docid"] in needed}
    for qid, ranked in run.items():
        if qid not in texts:
            raise records.RecordError(run_path, None, "query_id", f"query {qid!r} is not in {queries_path}")
        missing = [d for d, _ in ranked if d not in corpus]
        if missing:
            raise records.RecordError(run_path, None, "doc_id", f"doc {missing[0]!r} (query {qid!r}) is not in {corpus_path}")
        yield {"query_id": qid, "query_text": texts[qid], "docs": [corpus[d] for d, _ in ranked]}


def _group_items(path: str, corpus_path: str | None, shard_id: int | range, shard_num: int) -> list[dict]:
    """This shard's groups as rerank items, passages from --corpus or the groups' own ``passages``."""
    try:
        groups = list(shard(records.read(path, "group"), shard_id, shard_num, "query_id"))
    except records.RecordError as e:
        if e.field is None and e.path == str(path):
            e.message += " (without --queries INPUT is read as groups; to rerank a run, give --queries)"
        raise
    needed = {d for g in groups for d in g["positive_document_ids"] + g["negative_document_ids"]}
    corpus = {d["docid"]: d for d in records.read(corpus_path, "doc") if d["docid"] in needed} if corpus_path else {}
    items = []
    for g in groups:
        docs = []
        for d in dict.fromkeys(g["positive_document_ids"] + g["negative_document_ids"]):
            doc = corpus.get(d) or ({"docid": d, **g["passages"][d]} if d in g.get("passages", {}) else None)
            if doc is None:
                raise records.RecordError(path, None, "positive_document_ids",
                                          f"doc {d!r} (query {g['query_id']!r}) has no text: give --corpus")
            docs.append(doc)
        items.append({"query_id": g["query_id"], "query_text": g["query_text"], "docs": docs, "group": g})
    return items


def _probe(before: dict, after: dict, qrels_path: str) -> None:
    from retrctl import metrics

    qrels = records.read_qrels(qrels_path)
    a = metrics.evaluate(before, qrels, ["nDCG@10"]).mean["nDCG@10"]
    b = metrics.evaluate(after, qrels, ["nDCG@10"]).mean["nDCG@10"]
    (log.warning if b < a else log.info)("probe: nDCG@10 %.4f -> %.4f after reranking%s", a, b,
                                         " (worse than the first stage: check the template)" if b < a else "")


@stage(rerank, writes="run")
@click.argument("input", default="-", required=False)
@options("llm", "llm_server", "corpus", "qrels", "top_k", "batch_size", "shard", "ray")
@click.option("--queries", help="Queries of the run (JSONL/Parquet/BEIR folder); without it INPUT is read as groups.")
@click.option("--mode", type=click.Choice(["listwise", *SCORED_MODES]),
              help="Listwise sliding window, pointwise yes/no, or qlm: query likelihood log p(query | passage) (UPR).")
@click.option("--window", type=click.IntRange(min=2), help="Passages per listwise window (RankGPT/rank_llm: 20).")
@click.option("--stride", type=click.IntRange(min=1), help="Step between windows (RankGPT/rank_llm: 10).")
@click.option("--template", help=f"Prompt template ({', '.join(TEMPLATES)}; default: the one tied to the model).")
@click.option("--passage-max-words", type=click.IntRange(min=1), help="Words of each passage shown to the LLM.")
@click.option("--negative-ranks", callback=check_range, help="Groups: reranked ranks that become negatives [10-20].")
@click.option("--keep-labels", is_flag=True,
              help="Groups: keep each group's positives and negatives and add the reranker's scores (GPL), instead "
                   "of DRAMA's reranked top-1 and --negative-ranks (needs --mode pointwise or qlm).")
@click.option("--dry-run", is_flag=True, help="Print windows, LLM calls and prompt tokens on stderr; call nothing.")
def command(input, output, llm, queries, corpus, qrels, negative_ranks, keep_labels, dry_run, shard_id, shard_num,
            **opts):
    """Rerank a run (with --queries and --corpus) or relabel groups (no --queries) with an LLM."""
    if keep_labels and (queries is not None or negative_ranks is not None):
        raise UsageError("relabels groups in place: not with --queries or --negative-ranks", flag="--keep-labels")
    if keep_labels and opts.get("mode") not in SCORED_MODES:
        raise UsageError("needs scores: --mode pointwise or qlm (listwise gives ranks)", flag="--keep-labels")
    negative_ranks = parse_range(negative_ranks) if negative_ranks is not None else NEGATIVE_RANKS
    ray = distributed.pop_settings(opts)
    opts = {k: v for k, v in opts.items() if v is not None}
    if opts.get("stride", rerank.__kwdefaults__["stride"]) > opts.get("window", rerank.__kwdefaults__["window"]):
        raise UsageError("must be <= --window", flag="--stride")
    if queries is None:
        items = _group_items(input, corpus, shard_id, shard_num)
    else:
        if corpus is None:
            raise UsageError("reranking a run needs --queries and --corpus")
        run = {q: r for q, r in records.read_run(input).items() if in_shard(q, shard_id, shard_num)}
        items = list(_run_items(run, queries, corpus, input))
    top_k = opts.get("top_k", rerank.__kwdefaults__["top_k"])
    if keep_labels and (long := next((it for it in items if len(it["docs"]) > top_k), None)):
        raise UsageError(f"query {long['query_id']!r} has {len(long['docs'])} documents in its group, more than the "
                         f"{top_k} reranked; raise it", flag="--top-k")
    if dry_run:
        return _dry_run(items, planning_llm(llm, opts), opts)
    model = llm_from_flags(llm, opts, ray=ray)
    partial = f"{output}.partial.jsonl" if output != "-" else None
    stats: dict = {}
    try:
        results = list(rerank(progress(items, desc="rerank", unit="query"), model,
                              checkpoint=Checkpoint(partial) if partial else None, stats=stats, **opts))
    finally:
        if ray is not None:
            model.close()
    done = {"finish": lambda n: provenance(stats, model, negative_ranks if queries is None and not keep_labels else None,
                                           input_kind="run" if queries is not None else "groups"),
            "remove": (partial,) if partial else ()}
    if keep_labels:
        return Output([scored(it["group"], r) for it, r in zip(items, results, strict=True)], kind="group", **done)
    if queries is None:
        return Output(relabelled(items, results, negative_ranks), kind="group", **done)
    reranked = {r["query_id"]: [(d, float(len(r["docids"]) - i)) for i, d in enumerate(r["docids"])] for r in results}
    if qrels:
        _probe(run, reranked, qrels)
    return Output(records.run_rows(reranked), tag="retrctl-rerank", **done)


def relabelled(items: list[dict], results: list[dict], negative_ranks: tuple[int, int]) -> list[dict]:
    out = [relabel(it["group"], r, negative_ranks) for it, r in zip(items, results, strict=True)]
    lo, hi = negative_ranks
    short = sum(len(g["negative_document_ids"]) < hi - lo + 1 for g in out)
    if short:
        log.info("%d of %d groups had fewer than %d candidates below rank %d", short, len(out), hi, lo)
    return out


def provenance(stats: dict, model: LLM, negative_ranks: tuple[int, int] | None, input_kind: str) -> dict:
    """The output's manifest: model, settings, window outcomes; usage counts this run's calls (queries - resumed);
    negative_ranks is None for a run and for groups that keep their labels."""
    return {"stage": "rerank", "input": input_kind, "llm": stats["llm"],
            "settings": stats["settings"], "queries": stats["queries"], "resumed": stats["resumed"],
            "windows": stats["windows"], "usage": model.usage,
            "negative_ranks": list(negative_ranks) if negative_ranks is not None else None}


def _dry_run(items: list[dict], model: LLM, opts: dict) -> None:
    p = plan(items, model, **opts)
    rows = [("queries", p["queries"]), ("LLM calls" + (" (windows)" if opts.get("mode", "listwise") == "listwise" else ""),
                                         p["llm_calls"]),
            ("prompt tokens (windows in input order)", p["prompt_tokens"]),
            ("generated tokens (at most)", p["generated_tokens_max"])]
    width = max(len(r[0]) for r in rows)
    click.echo("\n".join(f"{k:<{width}}  {v:>12,}" for k, v in rows), err=True)

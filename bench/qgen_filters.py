"""Bench: what each qgen filter keeps of SmolLM2's queries on the six dev collections, and what the kept ones say.

For each collection, 40 documents (`qgen --sample 40 --seed 1`: the same documents in every run) get one query
each from the shipped SmolLM2, zero-shot and few-shot (`--examples`: three hand-written generic pairs, not taken
from any collection, as InPars' prompt takes MS MARCO's). The zero-shot candidates are then re-filtered without
generating again (same -o, the candidates checkpoint): the default filters (length 2-32 words, dedupe, verbatim
copies of >= 6 words, chatter: outputs that talk to the user, name the document, hold a URL or copy a run of >= 10
words), `--keep-top 0.5` (InPars' score filter) and `--consistency-k 10` with a BM25 index of the whole corpus
(Promptagator's round trip). Each row gives what each filter dropped and the queries kept; ten kept queries are
printed verbatim.

    flock /tmp/retrctl-bench.lock python bench/qgen_filters.py [--docs 40] [--work DIR]

Prints Markdown on stdout; the commands run go to stderr. Run under the bench lock: ~1.6 s a document a run on 2
CPU cores, two generation runs per collection.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from _run import DATA, machine, retrctl

COLLECTIONS = ["scifact", "arguana", "xquad/en", "cystic-fibrosis", "liveqa-med", "cosqa"]
EXAMPLES = [
    {"document": "The Great Barrier Reef, off the coast of Queensland, is the world's largest coral reef system, made "
                 "of some 2,900 reefs over 344,400 square kilometres.", "query": "how big is the great barrier reef"},
    {"document": "Ibuprofen reduces fever and treats pain or inflammation. Common side effects include heartburn and "
                 "nausea; it can increase the risk of stomach bleeding.", "query": "ibuprofen side effects stomach"},
    {"document": "In Python, a list comprehension builds a list from an iterable in one expression, for example "
                 "[x * x for x in range(10)].", "query": "python create list from loop in one line"},
]


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def qgen(data: Path, out: Path, docs: int, *extra) -> tuple[dict, list[dict]]:
    """One qgen run: the manifest's counts and the queries kept."""
    ran = retrctl("qgen", data, "--llm", "smollm2", "--per-doc", 1, "--seed", 1, "--sample", docs, "-o", out, *extra)
    counts = json.loads(Path(f"{out}.manifest.json").read_text())["counts"]
    seconds = re.search(r"for \d+ docs in ([\d.]+)s", ran.stderr)
    counts["seconds"] = float(seconds.group(1)) if seconds else None
    return counts, rows_of(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--work", default="/tmp/retrctl-bench-qgen-filters")
    ap.add_argument("--collections", default=",".join(COLLECTIONS), help="Comma-separated, under ../shared/data.")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shots = work / "examples.jsonl"
    shots.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    print(f"`python bench/qgen_filters.py --docs {args.docs}` ({machine()})\n")
    print("| collection | generated | too short | too long | duplicate | copied | chatter | kept (default filters) | "
          "+ --keep-top 0.5 | + --consistency-k 10 (BM25) | few-shot: chatter, kept | s/doc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    kept_examples = []
    for name in args.collections.split(","):  # a row as each collection finishes
        data, tag = DATA / name, name.replace("/", "-")
        bm25 = work / f"{tag}-bm25"
        if not (bm25 / "index.json").exists():
            retrctl("index", data, "--method", "bm25", "-o", bm25, "-q")
        zero, few = work / f"{tag}-zero.jsonl", work / f"{tag}-few.jsonl"
        c, kept = qgen(data, zero, args.docs)
        top, _ = qgen(data, zero, args.docs, "--keep-top", 0.5)
        consistent, _ = qgen(data, zero, args.docs, "--retriever", bm25, "--consistency-k", 10)
        shot, shot_kept = qgen(data, few, args.docs, "--examples", shots)
        per_doc = f"{c['seconds'] / c['generated']:.2f}" if c["seconds"] and c["generated"] else "–"
        print(f"| {name} | {c['generated']} | {c['too_short']} | {c['too_long']} | {c['duplicate']} | {c['copied']} | "
              f"{c['chatter']} | {c['kept']} | {top['kept']} | {consistent['kept']} | {shot['chatter']}, {shot['kept']} | "
              f"{per_doc} |", flush=True)
        kept_examples += [(name, "zero-shot", q["query_text"]) for q in kept[:1]]
        kept_examples += [(name, "few-shot", q["query_text"]) for q in shot_kept[:1]]
    print("\nKept queries, verbatim (the first kept of each collection and prompt; ten shown):\n")
    for name, prompt, text in kept_examples[:10]:
        print(f"- {name}, {prompt}: `{text}`")


if __name__ == "__main__":
    main()

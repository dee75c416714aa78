"""Build the demo's corpus, queries and qrels from data that ships with Python itself.

Corpus: the topics of `pydoc_data.topics` (the Python language reference used by `help()`), split at blank
lines and packed into passages of at most ~120 words; ids are `<topic>#<n>`.
Queries: examples/demo/queries.jsonl, hand-written; each names the topic it is about and a phrase that an
answering passage contains. Qrels are derived from that rule (grade 1 for every passage of the topic that
contains the phrase), so they stay right if a Python release rewords a topic.

    python pydoc_corpus.py OUTDIR     # writes OUTDIR/corpus.jsonl, queries.jsonl, qrels/test.tsv (a BEIR folder)
"""

import json
import re
import sys
from pathlib import Path
from pydoc_data.topics import topics

from retrctl.records import atomic_path

MAX_WORDS = 120
HERE = Path(__file__).resolve().parent


def passages(text: str):
    paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    chunk: list[str] = []
    for p in (p for p in paras if p):
        if chunk and len(" ".join(chunk + [p]).split()) > MAX_WORDS:
            yield " ".join(chunk)
            chunk = []
        chunk.append(p)
    if chunk:
        yield " ".join(chunk)


def main(out: str) -> None:
    out_dir = Path(out)
    (out_dir / "qrels").mkdir(parents=True, exist_ok=True)
    docs = []
    for topic in sorted(topics):
        for n, text in enumerate(passages(topics[topic])):
            docs.append({"_id": f"{topic}#{n}", "title": topic.replace("-", " "), "text": text})
    queries = [json.loads(line) for line in (HERE / "queries.jsonl").read_text().splitlines() if line.strip()]
    qrels = []
    for q in queries:
        hits = [d["_id"] for d in docs if d["_id"].split("#")[0] == q["topic"] and q["phrase"].lower() in d["text"].lower()]
        if not hits:
            sys.exit(f"{HERE / 'queries.jsonl'}: query {q['_id']}: no passage of topic {q['topic']!r} contains {q['phrase']!r}")
        qrels += [(q["_id"], h) for h in hits]
    with atomic_path(out_dir / "corpus.jsonl") as tmp:  # the Make target: whole or absent
        Path(tmp).write_text("".join(json.dumps(d) + "\n" for d in docs))
    (out_dir / "queries.jsonl").write_text("".join(json.dumps({"_id": q["_id"], "text": q["text"]}) + "\n" for q in queries))
    (out_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels))
    sys.stderr.write(f"demo data: {len(docs)} passages, {len(queries)} queries, {len(qrels)} qrels in {out_dir}\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "work/data")

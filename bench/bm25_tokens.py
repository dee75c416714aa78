"""BM25's tokens, `--bm25-tokens words` against `multilingual`, on every collection in ../shared/data.

    python bench/bm25_tokens.py WORK [--only NAME …]

Per collection (the recipe's dev suite, then XQuAD's other eleven languages): `retrctl index --method bm25` with
each mode into WORK/NAME/MODE (stopwords as the recipe's index has them: the default, en), `retrctl search` of the
folder's test queries (ArguAna: --remove-query, as the recipe searches it), `retrctl eval` of the two runs, paired.
Prints nDCG@10 and R@100 of each mode, the change with its p, and how many of the corpus's documents hold a
character `multilingual` splits otherwise (a script written without spaces, or a Brahmic combining mark)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from _run import DATA, retrctl, work_and_collections

from retrctl import records
from retrctl.indexes.bm25_tokens import SPLIT_OTHERWISE

COLLECTIONS = {"xquad-en": DATA / "xquad" / "en", "cystic-fibrosis": DATA / "cystic-fibrosis",
               "liveqa-med": DATA / "liveqa-med", "scifact": DATA / "scifact", "cosqa": DATA / "cosqa",
               "arguana": DATA / "arguana",
               **{f"xquad-{lang}": DATA / "xquad" / lang
                  for lang in ("ar", "de", "el", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh")}}
MODES = ("words", "multilingual")


def run(name: str, data: Path, work: Path) -> dict:
    w = work / name
    w.mkdir(parents=True, exist_ok=True)
    search_flags = ("--remove-query",) if name == "arguana" else ()
    for mode in MODES:
        if not (w / f"{mode}.trec").exists():
            retrctl("index", data, "--method", "bm25", "--bm25-tokens", mode, "-o", w / mode)
            retrctl("search", w / mode, data, *search_flags, "--hits", 100, "-o", w / f"{mode}.trec")
    out = retrctl("eval", *(w / f"{m}.trec" for m in MODES), "--qrels", data, "-m", "nDCG@10", "-m", "R@100",
                  "--json", "--quiet", log=False).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    docs = sum(bool(re.search(SPLIT_OTHERWISE, records.passage_text(d))) for d in records.read(data, "doc"))
    return {"name": name, "rows": rows, "docs": docs}


def table(results: list[dict]) -> str:
    lines = ["| collection | docs with such characters | words nDCG@10 | multilingual nDCG@10 | change (p) | words R@100 "
             "| multilingual R@100 |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        words, multi = r["rows"]
        gain = multi["nDCG@10"] - words["nDCG@10"]
        p = multi["p_value"]["nDCG@10"]
        change = "0 (same runs)" if p is None and gain == 0 else f"{gain:+.4f} ({p:.2g})"
        lines.append(f"| {r['name']} | {r['docs']} | {words['nDCG@10']:.4f} | {multi['nDCG@10']:.4f} | {change} | "
                     f"{words['R@100']:.4f} | {multi['R@100']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    work, names = work_and_collections(__doc__, COLLECTIONS)
    print(table([run(n, COLLECTIONS[n], work) for n in names]))


if __name__ == "__main__":
    main()

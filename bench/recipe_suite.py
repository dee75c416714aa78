"""The zero-label recipe over the dev collections, one table: what the learned part adds beyond both controls.

    python bench/recipe_suite.py WORK [--only NAME …] [--against OTHER] [MAKEVAR=VALUE …]   # e.g. ADAPT=full AUDIT=1

Runs `make -C examples/beir DATA=<collection> W=WORK/<name> MAKEVARS…` for each collection in turn (one real-model
job at a time: it holds /tmp/retrctl-bench.lock), times it into WORK/<name>.minutes, and resumes: a collection whose
eval.txt exists is not run again. The demo corpus is built from pydoc as `make demo` builds it. Then prints, per
collection, base dense, BM25, the base hybrid (the base model fused with BM25 at the recipe's chosen weight: the
control a user would run instead), the adapted dense model, the delivered retriever, delivered − base dense and −
base hybrid with their paired p (`retrctl eval --json`), the guard's pick with its held-out gain, the trained model's
(α = 1) true change when AUDIT=1 kept it, alone and fused with BM25 as the recipe would have delivered it
(its weight from its own held-out sweep), the minutes with the plan's estimate (WORK/NAME/plan.json), and with
--against another suite's WORK the delivered run against that suite's, paired; then the mean over the collections
and the issue's acceptance counts: significantly below either control, above the better control at p < .05."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from _run import DATA, ROOT, retrctl

COLLECTIONS = {  # name: BEIR folder (the demo's is built under WORK)
    "xquad-en": DATA / "xquad" / "en",
    "demo": None,
    "cystic-fibrosis": DATA / "cystic-fibrosis",
    "liveqa-med": DATA / "liveqa-med",
    "scifact": DATA / "scifact",
    "cosqa": DATA / "cosqa",
    "arguana": DATA / "arguana",
}
SUITE = list(COLLECTIONS)  # the dev suite; below, collections run on request (--only) as checks of a failure mode
# XQuAD's other languages: the base model reads few of them (Arabic barely), and BM25's tokenizer splits Chinese
# and Thai poorly: both controls fail in turn, the failure modes a user's collection may have
for lang in ("ar", "de", "el", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh"):
    COLLECTIONS[f"xquad-{lang}"] = DATA / "xquad" / lang
RUNS = ("base", "bm25", "base-hybrid", "adapted", "delivered")
LEVEL = 0.05


def folder(name: str, work: Path) -> Path:
    if COLLECTIONS[name] is not None:
        return COLLECTIONS[name]
    data = work / "demo-data"
    if not (data / "corpus.jsonl").exists():
        subprocess.run([sys.executable, "pydoc_corpus.py", str(data)], cwd=ROOT / "examples" / "demo", check=True)
    return data


def run_recipe(name: str, data: Path, work: Path, makevars: list[str]) -> None:
    w = work / name
    if (w / "eval.txt").exists():
        return
    print(f"== {name}: make -C examples/beir DATA={data} W={w} {' '.join(makevars)}", file=sys.stderr, flush=True)
    start = time.time()
    recipe_make(data, w, *makevars)
    (work / f"{name}.minutes").write_text(f"{(time.time() - start) / 60:.1f}\n")


def recipe_make(data: Path, w: Path, *args: str) -> None:
    """`make -C examples/beir DATA=data W=w ARGS…` (variables and targets), its output on stderr. The collection's
    corpus counts as older than what is made from it: ../shared/data is copied afresh with new dates, and a resumed
    or derived work dir (bench/tower_alpha.py) remakes only what changed in it. make runs in its own process group:
    the suite stopped (Ctrl-C, or SIGTERM: ``main``) stops make and every command it runs, and make deletes the
    target it was making, so a later run resumes from the last finished one."""
    proc = subprocess.Popen(["make", "-C", str(ROOT / "examples" / "beir"), "-o", str(data / "corpus.jsonl"),
                             f"PY={sys.executable}", f"DATA={data}", f"W={w}", *args], stdout=sys.stderr,
                            start_new_session=True)
    try:
        rc = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if rc:
        raise subprocess.CalledProcessError(rc, proc.args)


def scores(w: Path, data: Path, baseline: str, others: list[str]) -> dict[str, dict]:
    """nDCG@10 of each run and its paired p against ``baseline`` (`retrctl eval --json`, one line a run)."""
    out = retrctl("eval", w / f"{baseline}.trec", *(w / f"{o}.trec" for o in others), "--qrels", data,
                  "-m", "nDCG@10", "--json", "--quiet", log=False).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {Path(r["run"]).name.removesuffix(".trec"): r for r in rows}


def makefile_default(var: str) -> str:
    """A variable's default in the recipe's Makefile (``VAR ?= value``): the one place it is set."""
    text = (ROOT / "examples" / "beir" / "Makefile").read_text()
    return re.search(rf"^{var}\s*\?=\s*(\S+)", text, re.MULTILINE).group(1)


def fused_as_delivered(w: Path, name: str) -> Path:
    """``w/NAME-hybrid.trec``: ``w/NAME.trec`` (a dense model's run on the folder's queries, from ``w/idx-NAME``)
    fused with BM25 at the weight the recipe's rule picks on that model's own held-out sweep (``eval --sweep``
    with DENSE_WEIGHT as its prior, moved by the base's known-item verdict where the recipe's was, then ``fuse
    --weights-from``), as the recipe fuses the adapted model."""
    out = w / f"{name}-hybrid.trec"
    if out.exists():
        return out
    qrels = w / ("dev-qgen.jsonl" if (w / "dev-qgen.jsonl").exists() else "dev.jsonl")
    fuse = ("--fusion", "linear", "--norm", "minmax")
    heads = json.loads((w / f"idx-{name}" / "index.json").read_text())["settings"].get("heads") or ["dense"]
    dense = ("--heads", "dense") if len(heads) > 1 else ()  # ADAPT=query's copy of idx-base holds BM25 too
    retrctl("search", w / f"idx-{name}", w / "dev.jsonl", *dense, "--hits", 100, "-o", w / f"dev-{name}.trec")
    base_sweep = json.loads((w / "sweep-base.jsonl").read_text().splitlines()[0])["settings"]
    known = ("--known-items", w / "sweep-base.jsonl") if "known_items" in base_sweep else ()  # as the recipe ran
    retrctl("eval", w / f"dev-{name}.trec", w / "dev-bm25.trec", "--qrels", qrels, "--sweep", "0:1:0.1",
            "--sweep-prior", makefile_default("DENSE_WEIGHT"), *known, *fuse, "-m", "nDCG@10", "--json",
            "-o", w / f"sweep-{name}.jsonl")
    retrctl("fuse", w / f"{name}.trec", w / "bm25.trec", *fuse, "--weights-from", w / f"sweep-{name}.jsonl",
            "--hits", 100, "-o", out)
    return out


def held_out_generated(w: Path) -> dict | None:
    """α = 1 (dense) on the held-out generated queries alone, over the whole corpus: against the base model (the
    guard's veto set tested on its own) and against the base hybrid (the base and BM25 fused at the recipe's weight)."""
    if not (w / "dev-qgen.jsonl").exists():
        return None
    if not (w / "dev-base-hybrid.trec").exists():
        retrctl("fuse", w / "dev-base.trec", w / "dev-bm25.trec", "--fusion", "linear", "--norm", "minmax",
                "--weights-from", w / "sweep-base.jsonl", "--hits", 100, "-o", w / "dev-base-hybrid.trec")
    out = {}
    for control in ("base", "base-hybrid"):
        rows = scores(w, w / "dev-qgen.jsonl", f"dev-{control}", ["dev-trained"])
        out[control] = {"gain": rows["dev-trained"]["nDCG@10"] - rows[f"dev-{control}"]["nDCG@10"],
                        "p": rows["dev-trained"]["p_value"]["nDCG@10"], "queries": rows["dev-trained"]["counts"]["evaluated"]}
    return out


def versus(run: Path, other: Path, data: Path) -> tuple[float, float]:
    """nDCG@10 of ``run`` − ``other``'s on ``data``'s queries, and the paired p."""
    out = retrctl("eval", other, run, "--qrels", data, "-m", "nDCG@10", "--json", "--quiet", log=False).stdout
    theirs, ours = (json.loads(line) for line in out.splitlines() if line.strip())
    return ours["nDCG@10"] - theirs["nDCG@10"], ours["p_value"]["nDCG@10"]


def collection_row(name: str, data: Path, work: Path, against: Path | None = None) -> dict:
    w = work / name
    audit = (w / "trained.trec").exists()
    if audit:
        fused_as_delivered(w, "trained")  # what the recipe would have delivered had the guard picked α = 1
    vs_base = scores(w, data, "base", [r for r in RUNS[1:]] + (["trained"] if audit else []))
    vs_hybrid = scores(w, data, "base-hybrid", ["delivered"] + (["trained", "trained-hybrid"] if audit else []))
    generated = held_out_generated(w) if audit else None
    ndcg = {r: vs_base[r]["nDCG@10"] for r in vs_base}
    guard = json.loads((w / "model" / "guard.json").read_text())
    # no candidates where nothing was trained (train --guard-known-items: the base does not read the corpus)
    pick = next((c for c in guard["candidates"] if c["alpha"] == guard["pick"]), {})
    full = next((c for c in guard["candidates"] if c["alpha"] == 1.0), {})  # absent where GUARD_ALPHAS leaves α = 1 out
    better = "base" if ndcg["base"] >= ndcg["base-hybrid"] else "base-hybrid"
    minutes = work / f"{name}.minutes"
    return {
        "collection": name, "docs": sum(1 for _ in open(data / "corpus.jsonl")), **ndcg,
        "d_base": ndcg["delivered"] - ndcg["base"], "p_base": vs_base["delivered"]["p_value"]["nDCG@10"],
        "d_hybrid": ndcg["delivered"] - ndcg["base-hybrid"], "p_hybrid": vs_hybrid["delivered"]["p_value"]["nDCG@10"],
        "better": better, "p_better": (vs_base if better == "base" else vs_hybrid)["delivered"]["p_value"]["nDCG@10"],
        "pick": guard["pick"], "pick_gain": pick.get("gain"), "pick_p": pick.get("p"), "guard_queries": guard["queries"],
        "full_gain": full.get("gain"), "full_p": full.get("p"), "full_veto": full.get("veto_gain"),
        "trained_change": ndcg["trained"] - ndcg["base"] if audit else None,
        "trained_p": vs_base["trained"]["p_value"]["nDCG@10"] if audit else None,
        "trained_vs_hybrid": vs_hybrid["trained"]["nDCG@10"] - ndcg["base-hybrid"] if audit else None,
        "trained_vs_hybrid_p": vs_hybrid["trained"]["p_value"]["nDCG@10"] if audit else None,
        "generated": generated,
        "trained_hybrid": vs_hybrid["trained-hybrid"]["nDCG@10"] - ndcg["base-hybrid"] if audit else None,
        "trained_hybrid_p": vs_hybrid["trained-hybrid"]["p_value"]["nDCG@10"] if audit else None,
        "minutes": float(minutes.read_text()) if minutes.exists() else None,
        "planned": json.loads(plan.read_text())["total_s"] / 60 if (plan := w / "plan.json").exists() else None,
        "against": versus(w / "delivered.trec", against / name / "delivered.trec", data) if against else None,
    }


def guarded(r: dict) -> str:
    """The table's two guard columns: the pick and its held-out gain, α = 1's (or why nothing was trained)."""
    if r["pick_gain"] is None:
        return "α = 0, nothing trained (the base does not read the corpus) | –"
    return (f"α = {r['pick']:g}, {r['pick_gain']:+.4f} ({r['pick_p']:.2g}) | "
            f"{'not a candidate' if r['full_gain'] is None else format(r['full_gain'], '+.4f')} "
            f"({'–' if r['full_p'] is None else format(r['full_p'], '.2g')}); veto "
            f"{'–' if r['full_veto'] is None else format(r['full_veto'], '+.4f')}; {r['guard_queries']} queries")


def table(rows: list[dict]) -> str:
    head = ("| collection | docs | base dense | BM25 | base hybrid | adapted dense | delivered | − base dense (p) "
            "| − base hybrid (p) | guard: pick, held-out gain (p) | guard: α = 1 held-out gain (p), veto "
            "| α = 1 on the held-out generated queries alone − base dense / − base hybrid (p), n | α = 1 − base dense (p) | α = 1 − base hybrid (p) "
            "| α = 1 + BM25 − base hybrid (p) | minutes (planned) |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|"]
    against = all(r["against"] is not None for r in rows)
    if against:
        lines = [lines[0] + " delivered − the other suite's (p) |", lines[1] + "---:|"]
    for r in rows:
        g = r["generated"]
        trained = "– | – | – | –" if r["trained_change"] is None else (
            ("–" if g is None else " / ".join(f"{g[c]['gain']:+.4f} ({g[c]['p']:.2g})" for c in ("base", "base-hybrid"))
             + f", {g['base']['queries']}")
            + f" | {r['trained_change']:+.4f} ({r['trained_p']:.2g}) | {r['trained_vs_hybrid']:+.4f} "
            f"({r['trained_vs_hybrid_p']:.2g}) | {r['trained_hybrid']:+.4f} ({r['trained_hybrid_p']:.2g})")
        minutes = ("–" if r["minutes"] is None else f"{r['minutes']:.0f}") + (
            "" if r["planned"] is None else f" ({r['planned']:.0f})")
        versus_other = "" if r["against"] is None else " {:+.4f} ({:.2g}) |".format(*r["against"])
        lines.append(
            f"| {r['collection']} | {r['docs']:,} | {r['base']:.4f} | {r['bm25']:.4f} | {r['base-hybrid']:.4f} "
            f"| {r['adapted']:.4f} | {r['delivered']:.4f} | {r['d_base']:+.4f} ({r['p_base']:.2g}) "
            f"| {r['d_hybrid']:+.4f} ({r['p_hybrid']:.2g}) | {guarded(r)} "
            f"| {trained} | {minutes} |{versus_other}")
    n = len(rows)
    mean = {k: sum(r[k] for r in rows) / n for k in ("base", "bm25", "base-hybrid", "adapted", "delivered",
                                                      "d_base", "d_hybrid")}
    d_better = sum(r["delivered"] - max(r["base"], r["base-hybrid"]) for r in rows) / n
    lines.append(f"| mean of {n} | | {mean['base']:.4f} | {mean['bm25']:.4f} | {mean['base-hybrid']:.4f} "
                 f"| {mean['adapted']:.4f} | {mean['delivered']:.4f} | {mean['d_base']:+.4f} | {mean['d_hybrid']:+.4f} "
                 f"| | | | | | | |" + (f" {sum(r['against'][0] for r in rows) / n:+.4f} |" if against else ""))
    below = [r["collection"] for r in rows if (r["d_base"] < 0 and r["p_base"] < LEVEL)
             or (r["d_hybrid"] < 0 and r["p_hybrid"] < LEVEL)]
    above = [r["collection"] for r in rows
             if r["delivered"] > max(r["base"], r["base-hybrid"]) and r["p_better"] < LEVEL]
    lines += ["", f"delivered − the better control, mean over the {n}: {d_better:+.4f}",
              f"significantly below a control (p < {LEVEL}): {', '.join(below) or 'none'}",
              f"above the better control at p < {LEVEL}: {len(above)} ({', '.join(above) or 'none'})"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("makevars", nargs="*", help="MAKEVAR=VALUE passed to the recipe's make")
    ap.add_argument("--only", action="append", choices=list(COLLECTIONS), help="run these collections only")
    ap.add_argument("--table-only", action="store_true", help="print the table of the collections already run")
    ap.add_argument("--against", type=Path, help="another suite's WORK: each delivered run against its, paired")
    a = ap.parse_intermixed_args()  # MAKEVAR=VALUE before or after the options
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # stops the recipe's make too
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    names = a.only or SUITE
    settings = work / "makevars.txt"  # what the table's runs were made with, for --table-only
    if not a.table_only:
        settings.write_text(" ".join(a.makevars) + "\n")
        with open("/tmp/retrctl-bench.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name in names:
                run_recipe(name, folder(name, work), work, a.makevars)
    against = a.against.resolve() if a.against else None
    rows = [collection_row(n, folder(n, work), work, against) for n in names if (work / n / "eval.txt").exists()]
    made_with = settings.read_text().strip() if settings.exists() else " ".join(a.makevars)
    print(f"# recipe suite, {made_with or 'defaults'}, {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} CPUs")
    print(table(rows) if rows else f"no collection of {', '.join(names)} has finished in {work}")


if __name__ == "__main__":
    main()

"""The scaling study's steps that are not retrctl stages, called by this folder's Makefile (each reads and writes
files, so every Make target stays resumable); the logic is study_lib's, beside this script.

    study.py plan --backbone minilm=minilm --backbone smollm2-drop8=smollm2:8 --groups 192 ...   # the estimate
    study.py slice DATA --docs 300 --queries 50 -o OUT                                            # a collection cut
    study.py proxy --model DIR --corpus DATA --texts 64 --max-len 128 -o proxy.json               # the LM proxy
    study.py row NAME --model DIR --status ok --work W/NAME --collections scifact,arguana -o ROW  # one row
    study.py report ROW... --collections scifact,arguana --plot study.png -o table.md             # table, fit, plot
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # study_lib uses the checkout's retrctl, wherever the script is run from
    sys.path.insert(0, str(ROOT))

import study_lib as study  # noqa: E402  (beside this script, which Python puts first on sys.path)


def plan(a) -> None:
    """The estimate, per backbone and in all, on stderr. NAME=SOURCE[:DROP]: DROP blocks of SOURCE's removed by
    `retrctl prune`, whose non-embedding parameters scale with the blocks kept."""
    budget = study.Budget(groups=a.groups, group_size=a.group_size, max_len=a.max_len, docs=a.docs,
                          queries=a.queries, collections=a.collections)
    total = 0.0
    print(f"scaling study: {len(a.backbone)} backbones, {a.groups} training groups of {a.group_size} passages (one "
          f"epoch), {a.max_len} tokens, {a.collections} collections of {a.docs} docs and {a.queries} queries",
          file=sys.stderr)
    for spec in a.backbone:
        name, _, source = spec.partition("=")
        source, _, drop = source.partition(":")
        try:
            params = study.count_parameters(source)
        except Exception as err:  # noqa: BLE001  (the plan still prints the other backbones)
            print(f"  {name}: ? ({source}: {str(err).splitlines()[0][:120]})", file=sys.stderr)
            continue
        n = params.non_embedding
        if drop:
            n = round(n * (params.layers - int(drop)) / params.layers)
        secs = study.estimate_seconds(n, budget, flops_per_second=a.cpu_flops)
        total += secs
        print(f"  {name}: N {n / 1e6:.1f}M non-embedding, ~{secs / 60:.1f} min", file=sys.stderr)
    print(f"estimated: ~{total / 60:.0f} min at {a.cpu_flops:.2g} FLOP/s (train, index and search; "
          f"mining and pruning add a few minutes)", file=sys.stderr)


def cut(a) -> None:
    study.slice_collection(Path(a.data), Path(a.output), a.docs, a.queries)


def proxy(a) -> None:
    """The untrained backbone's LM loss on the first TEXTS passages of the corpus (corpus order), or why there is
    none: a model that cannot be scored leaves a note, never a failed step."""
    import json
    from itertools import islice

    from retrctl import records

    texts = [f"{d.get('title') or ''} {d['text']}".strip() for d in islice(records.read(a.corpus, "doc"), a.texts)]
    try:
        bits, note = study.lm_bits_per_byte(a.model, texts, a.max_len)
    except Exception as err:  # noqa: BLE001  (the proxy is optional: its failure is a note in the row)
        bits, note = None, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    with records.atomic_path(a.output) as tmp:
        Path(tmp).write_text(json.dumps({"bits_per_byte": bits, "note": note, "texts": len(texts), "max_len": a.max_len}) + "\n")
    print(f"LM proxy of {a.model}: " + (f"{bits:.3f} bits/byte" if bits is not None else f"none ({note})"), file=sys.stderr)


def row(a) -> None:
    collections = [c for c in a.collections.split(",") if c]
    result = study.build_row(a.name, a.model, status=a.status, work=Path(a.work), collections=collections,
                             log=Path(a.log) if a.log else None, tokens_fallback=a.tokens, family=a.family)
    result.write(Path(a.output))
    if result.status != "ok":
        print(f"{a.name}: failed ({result.reason}); the study goes on without it", file=sys.stderr)


def report(a) -> None:
    collections = [c for c in a.collections.split(",") if c]
    rows = [study.Row.read(Path(p)) for p in a.rows]
    text = "\n".join([study.table(rows, collections), "", *study.fit_lines(rows)])
    if a.plot:
        drawn = study.plot(rows, Path(a.plot), note=a.note)
        text += f"\nplot: {drawn}" if drawn else "\nplot: no backbone finished, nothing to draw"
    if a.output:
        from retrctl import records

        with records.atomic_path(a.output) as tmp:
            Path(tmp).write_text(text + "\n")
    else:
        print(text)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("plan", help="Print the cost estimate.")
    s.add_argument("--backbone", action="append", default=[], help="NAME=SOURCE or NAME=SOURCE:DROP (repeatable).")
    for flag, default in (("--groups", 192), ("--group-size", 2), ("--max-len", 128), ("--docs", 300),
                          ("--queries", 50), ("--collections", 2)):
        s.add_argument(flag, type=int, default=default)
    s.add_argument("--cpu-flops", type=float, default=study.CPU_FLOPS)
    s.set_defaults(func=plan)
    s = sub.add_parser("slice", help="Cut a BEIR folder to a budget.")
    s.add_argument("data")
    s.add_argument("--docs", type=int, required=True)
    s.add_argument("--queries", type=int, required=True)
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cut)
    s = sub.add_parser("proxy", help="The base LM's loss on the corpus, bits per byte.")
    s.add_argument("--model", required=True)
    s.add_argument("--corpus", required=True)
    s.add_argument("--texts", type=int, default=64)
    s.add_argument("--max-len", type=int, default=128)
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=proxy)
    s = sub.add_parser("row", help="Write one backbone's row.")
    s.add_argument("name")
    s.add_argument("--model", required=True, help="The backbone trained (a dir, a GGUF file or a shipped name).")
    s.add_argument("--status", choices=["ok", "failed"], required=True)
    s.add_argument("--work", required=True, help="The backbone's work dir: COLLECTION.eval.json, *.secs.")
    s.add_argument("--collections", required=True)
    s.add_argument("--log", help="The steps' stderr (the reason of a failure is its last line).")
    s.add_argument("--tokens", type=float, help="Pretraining tokens where neither config nor card gives them.")
    s.add_argument("--family", default="", help="The backbones fitted together: one pretraining recipe at several "
                                                "sizes and lengths (default: none, fitted with the others without one).")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=row)
    s = sub.add_parser("report", help="Print the table and the fits; draw the plot.")
    s.add_argument("rows", nargs="+")
    s.add_argument("--collections", required=True)
    s.add_argument("--plot")
    s.add_argument("--note", default="")
    s.add_argument("-o", "--output")
    s.set_defaults(func=report)
    a = p.parse_args(argv)
    a.func(a)


if __name__ == "__main__":
    main()

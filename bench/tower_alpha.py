"""ADAPT=both's query tower delivered at another point of the line from the base to the trained tower: the table the
tower's α is chosen on.

    python bench/tower_alpha.py NEW --from SRC --alpha 0.5 [--only NAME …]     # α > 1 extrapolates past the tower

SRC: a finished `bench/recipe_suite.py SRC` suite (ADAPT=both). Each of its collections is copied to NEW as hard
links, the copy's tower/ replaced by α·tower + (1 − α)·base (`retrctl.guard.interpolate`, what the guard scores; the
base named in tower-guard/guard.json), and the recipe remade from it: the tower's index (the base's vectors, nothing
encoded), the held-out sweep, the delivered fusion, the evaluation. Then prints `recipe_suite.py NEW --against SRC
--table-only`: each delivered run against SRC's, paired, beside both controls. One real-model job at a time: it holds
/tmp/retrctl-bench.lock."""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

from _run import ROOT
from recipe_suite import COLLECTIONS, SUITE, folder, run_recipe
from wise_alpha import save_interpolated


def move_tower(w: Path, alpha: float) -> None:
    """Replace ``w/tower`` (hard links to the source suite's) by a real copy holding the α point's weights."""
    base = json.loads((w / "tower-guard" / "guard.json").read_text())["base_model"]
    save_interpolated(w / "tower", base, alpha, w / "tower.moved")
    shutil.rmtree(w / "tower")
    (w / "tower.moved").rename(w / "tower")


def derive(name: str, src: Path, new: Path, alpha: float) -> None:
    """``new/name``: ``src/name`` linked, its tower moved to α, its evaluation left to be remade (once)."""
    w = new / name
    if w.exists():
        return
    tmp = new / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["cp", "-al", str(src / name), str(tmp)], check=True)
    move_tower(tmp, alpha)
    (tmp / "eval.txt").unlink()
    tmp.rename(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new", type=Path)
    ap.add_argument("--from", dest="src", type=Path, required=True, help="a finished ADAPT=both suite's WORK")
    ap.add_argument("--alpha", type=float, required=True, help="the tower's point: 0 the base, 1 the trained tower")
    ap.add_argument("--only", action="append", choices=list(COLLECTIONS), help="these collections only")
    a = ap.parse_args()
    src, new = a.src.resolve(), a.new.resolve()
    names = [n for n in (a.only or SUITE) if (src / n / "tower").is_dir() and (src / n / "eval.txt").exists()]
    if not names:
        sys.exit(f"{src}: no finished collection with a query tower (run recipe_suite.py with ADAPT=both)")
    new.mkdir(parents=True, exist_ok=True)
    if (src / "demo-data").is_dir() and not (new / "demo-data").exists():
        subprocess.run(["cp", "-al", str(src / "demo-data"), str(new / "demo-data")], check=True)
    settings = new / "makevars.txt"
    settings.unlink(missing_ok=True)
    settings.write_text(f"the query tower at α = {a.alpha:g}, from {src}\n")
    with open("/tmp/retrctl-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in names:
            derive(name, src, new, a.alpha)
            run_recipe(name, folder(name, new), new, [])
    only = [x for n in names for x in ("--only", n)]
    subprocess.run([sys.executable, str(ROOT / "bench" / "recipe_suite.py"), str(new), "--against", str(src),
                    "--table-only", *only], check=True)


if __name__ == "__main__":
    main()

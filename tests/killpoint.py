"""Run the retrctl CLI and SIGKILL it at the N-th file-system step (a real kill -9, no cleanup runs).

    python tests/killpoint.py N COUNTFILE -- index corpus.jsonl -o idx ...
    python tests/killpoint.py np.save:4 COUNTFILE -- ...     (the 4th np.save only)

Every call of the steps an index update is made of (creating dirs, writing arrays/Parquet/faiss/JSON, fsync,
rename, delete) counts as one step; at step N the process kills itself before the call. N = 0 never kills and
writes the number of steps taken to COUNTFILE, so a test can aim at every point between two steps.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import signal
import sys


def main() -> None:
    only, _, target = sys.argv[1].rpartition(":")
    target, countfile = int(target), sys.argv[2]
    args = sys.argv[sys.argv.index("--") + 1 :]
    steps = [0]
    write_count = pathlib.Path.write_text

    def step(fn, name):
        @functools.wraps(fn)
        def wrapped(*a, **kw):
            if not only or name == only:
                steps[0] += 1
                if steps[0] == target:
                    os.kill(os.getpid(), signal.SIGKILL)
            return fn(*a, **kw)

        return wrapped

    import faiss
    import numpy as np
    import pyarrow.parquet as pq

    os.replace, os.rename, os.fsync = step(os.replace, "os.replace"), step(os.rename, "os.rename"), step(os.fsync, "os.fsync")
    shutil.rmtree = step(shutil.rmtree, "shutil.rmtree")
    np.save = step(np.save, "np.save")
    faiss.write_index = step(faiss.write_index, "faiss.write_index")
    pq.write_table = step(pq.write_table, "pq.write_table")
    pathlib.Path.mkdir = step(pathlib.Path.mkdir, "Path.mkdir")
    pathlib.Path.write_text = step(pathlib.Path.write_text, "Path.write_text")

    from retrctl.cli import main as cli

    try:
        cli(args)
    finally:
        write_count(pathlib.Path(countfile), str(steps[0]))


if __name__ == "__main__":
    main()

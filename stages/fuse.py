"""fuse: combine runs from any retrievers (e.g. BM25 + dense) into one run: RRF or a weighted sum of normalised scores.

Methods (retrctl.fusion, which states the order of operations and the score of a doc missing from one list):
reciprocal rank fusion (Cormack, Clarke & Büttcher 2009, SIGIR; k = 60) and linear interpolation of per-query
normalised scores (CombSUM with weights; Pyserini's hybrid searcher, ranx's ``wsum``). Runs may come from
anywhere: TREC, JSONL or Parquet, ``.gz``/``.zst``, read by ``records.read_run``.

| knob                                  | flag                           | default   |
|---------------------------------------|--------------------------------|-----------|
| method                                | ``--fusion rrf|linear``         | linear    |
| RRF constant k                        | ``--rrf-k``                     | 60        |
| weight per run, in the runs' order    | ``--weights 0.3,0.7`` (two runs: ``0.3`` = 0.3,0.7) | 1 each |
| weights from a sweep's best row       | ``--weights-from SWEEP --weights-by nDCG@10`` | off |
| score normalisation (linear)          | ``--norm none|minmax|zscore``   | minmax    |
| results per query kept from each run  | ``--depth``                     | all       |
| results per query written             | ``--hits``                      | 1000      |
| output                                | ``--output-format``, ``--run-tag`` | by ``-o`` extension, else TREC; ``fused-<method>`` |

A JSONL or Parquet run also carries ``run_scores`` in each row: the doc's raw score in each input run, in the
runs' order (null where that run did not retrieve it), so a threshold can be set on what a retriever said
rather than on a fused score that says little by itself (RRF scores sit in 0.014-0.017 whatever the fit).

``--weights-from SWEEP`` reads the weights from a table of ``retrctl eval A B --sweep 0:1:0.1 --json`` (one row
per weight): the best row by ``--weights-by`` (nDCG@10), ties to the weight nearer 0.5; the fusion settings the
sweep used become this fusion's, and a flag given that contradicts them is refused (the weights were chosen for
that fusion). ranx splits the same step into ``optimize_fusion`` (the sweep) and ``fuse(params=…)``.

A run written to a file gets ``<run>.manifest.json`` beside it: the input runs (and the run tag and index of
each, from their own manifests when present) and the fusion settings, so the numbers can be re-derived.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from retrctl import fusion, records
from retrctl.options import options, swept_fusion
from retrctl.stage import Output, stage

log = logging.getLogger("retrctl.fuse")


def fuse(runs: list[dict], *, fusion_method: str = fusion.METHOD, rrf_k: float = fusion.RRF_K,
         weights: list[float] | None = None, norm: str = fusion.NORM, depth: int | None = None, hits: int = 1000, run_scores: bool = False):
    """Run rows {query_id, doc_id, score, rank} of the fused runs, best first per query; with ``run_scores`` each
    row also carries ``run_scores``: the doc's raw score in each input run (None where that run lacks it)."""
    fused = fusion.fuse(runs, fusion_method, rrf_k, weights, norm, depth, hits)
    if not run_scores:
        return records.run_rows(fused)
    lookups = [{q: dict(lst) for q, lst in run.items()} for run in runs]
    return ({**row, "run_scores": [lk.get(row["query_id"], {}).get(row["doc_id"]) for lk in lookups]}
            for row in records.run_rows(fused))


def _input_summary(path: str) -> dict:
    """An input run's path and, from the manifest beside it when there is one, what made it."""
    out = {"path": path if path == "-" else str(Path(path).resolve())}
    side = Path(f"{path}.manifest.json")
    if path != "-" and side.is_file():
        try:
            m = json.loads(side.read_text())
        except (OSError, ValueError):
            return out
        out.update({k: m[k] for k in ("stage", "run_tag", "index", "index_version") if k in m})
    return out


@stage(fuse, writes="run")
@options("input_format", "fusion", "weights", "weights_from")
@click.argument("runs", nargs=-1, required=True)
@options("hits", "run_format", "run_tag")
def command(runs, output, input_format, fusion_method, rrf_k, weights, norm, depth, hits, output_format, run_tag,
            weights_from, weights_by):
    """Fuse two or more runs (TREC, JSONL, Parquet) into one run: RRF or a weighted sum of normalised scores."""
    if weights_from is not None:  # the sweep's weights, and its fusion settings where no flag sets them
        chosen = swept_fusion(click.get_current_context(), weights_from, weights_by)
        fusion_method, norm, depth = chosen.get("fusion_method", fusion_method), chosen.get("norm", norm), chosen.get("depth", depth)
        rrf_k, weights = chosen.get("rrf_k", rrf_k), chosen["weights"]
    weights = fusion.check(len(runs), fusion_method, rrf_k, weights, norm, depth, hits)
    if fusion_method == "rrf" and click.get_current_context().get_parameter_source("norm").name == "COMMANDLINE":
        log.warning("--norm is ignored by --fusion rrf (it uses ranks only)")
    loaded = [records.read_run(p, input_format) for p in runs]
    tag = run_tag or f"fused-{fusion_method}"
    settings = {"fusion": fusion_method, "weights": weights, "depth": depth, "hits": hits,
                **({"rrf_k": rrf_k} if fusion_method == "rrf" else {"norm": norm})}
    name = output.lower().removesuffix(".gz").removesuffix(".zst")
    keyed = output_format in ("jsonl", "parquet") or (output_format is None and name.endswith((".jsonl", ".parquet")))
    rows = fuse(loaded, fusion_method=fusion_method, rrf_k=rrf_k, weights=weights, norm=norm, depth=depth, hits=hits,
                run_scores=keyed)
    return Output(rows, fmt=output_format, tag=tag,
                  finish=lambda n: {"stage": "fuse", "runs": [_input_summary(p) for p in runs], "run_tag": tag,
                                    "rows": n, "settings": settings})

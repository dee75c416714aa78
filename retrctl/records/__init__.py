"""Record kinds, canonical field names, and their readers and writers.

Every stage reads and writes through this package, so one stage's output is the next stage's input
(see FORMATS.md). Readers accept the aliases of BEIR, Tevatron, FlagEmbedding and Pyserini and always
yield canonical names; writers always write canonical names. Bad input raises RecordError, which the CLI
turns into one line naming file, line and field, with exit status 2.

Where each part lives (import from ``retrctl.records``; the modules are the layout, not the API):

RecordError (bad input, exit 2) and BusyError (output locked by another run, exit 75) live in ``retrctl.errors``
with the core's other errors and are re-exported here.

- ``containers``  .jsonl/.gz/.zst/.parquet detection, opening, line reading; atomic writes of a file
                  (``atomic_path``, ``open_output``) or a directory (``atomic_dir``, ``sweep_dir``); ``link_tree``
                  (hard links, else copies, of files never changed once written);
                  ``check_outputs`` (an output may not be, be inside or contain an input), ``check_own_dir``.
- ``streams``     (line, object) pairs from JSONL or Parquet; ``write`` of records as JSONL or Parquet.
- ``fields``      record kinds, canonical names and aliases, id checks (no whitespace), ``normalize_*``,
                  BEIR folders (``resolve``), ``passage_text``, ``text_id``, ``content_hash``.
- ``trec``        runs and qrels: TREC, BEIR TSV, JSONL, Parquet; trec_eval's tie order.
- ``reader``      ``read(path, kind)`` and ``read_corpus``: the canonical records of one kind.
- ``provenance``  library ``versions()`` and the ``<output>.manifest.json`` beside a run or query file.

Imports go one way (containers <- streams, fields <- trec <- reader; provenance uses containers),
and none imports torch or pyarrow at import time.
"""

from __future__ import annotations

from retrctl.errors import BusyError, RecordError
from retrctl.records.containers import (
    atomic_dir,
    atomic_path,
    check_outputs,
    check_own_dir,
    is_parquet,
    link_tree,
    open_output,
    open_text,
    sweep_dir,
    temp_target,
)
from retrctl.records.fields import (
    ALIASES,
    BEIR_FILES,
    ID_FIELD,
    KINDS,
    NORMALIZERS,
    beir_qrels,
    content_hash,
    normalize_doc,
    normalize_group,
    normalize_query,
    passage_text,
    resolve,
    text_id,
)
from retrctl.records.provenance import versions, write_manifest_beside
from retrctl.records.reader import read, read_corpus
from retrctl.records.streams import batched, dumps, read_jsonl, read_objects, read_parquet, write
from retrctl.records.trec import read_qrels, read_run, run_rows, trec_order, write_run

__all__ = [
    "ALIASES",
    "BEIR_FILES",
    "ID_FIELD",
    "KINDS",
    "NORMALIZERS",
    "BusyError",
    "RecordError",
    "atomic_dir",
    "atomic_path",
    "batched",
    "beir_qrels",
    "check_outputs",
    "check_own_dir",
    "content_hash",
    "dumps",
    "is_parquet",
    "link_tree",
    "normalize_doc",
    "normalize_group",
    "normalize_query",
    "open_output",
    "open_text",
    "passage_text",
    "read",
    "read_corpus",
    "read_jsonl",
    "read_objects",
    "read_parquet",
    "read_qrels",
    "read_run",
    "resolve",
    "run_rows",
    "sweep_dir",
    "temp_target",
    "text_id",
    "trec_order",
    "versions",
    "write",
    "write_manifest_beside",
    "write_run",
]

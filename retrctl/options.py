"""The shared flags, each declared once: the options several stages take (``options("model", "encoder", …)``), the
callbacks that parse their values (rank ranges, sizes, fusion weights, a sweep's best weights), a ``TrainConfig``
field as a flag (``config_flag``), a backend's declared flag as a click option (``flag_option``), and a renamed
flag's old name, hidden and warned about for one release (``renamed``). Part of the CLI layer with stage.py: no
other core module imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import click

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.models.config import ENCODER_FLAGS, flag_fields

log = logging.getLogger("retrctl")


# ---------------------------------------------------------------- rank ranges ("30-100")


def parse_range(value: str, what: str = "range") -> tuple[int, int]:
    """LO-HI, 1-based and inclusive, as (LO, HI); ValueError naming ``what`` unless 1 <= LO <= HI."""
    try:
        lo, hi = (int(x) for x in str(value).split("-"))
    except ValueError:
        raise ValueError(f"{what} must look like LO-HI (e.g. 30-100), got {value!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{what} must have 1 <= LO <= HI, got {value!r}")
    return lo, hi


class Size(click.ParamType):
    """A click type for memory sizes (``retrctl.memory.parse_size``): junk or zero is a usage error naming the flag."""

    name = "size"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        from retrctl.memory import parse_size

        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class ShardIds(click.ParamType):
    """A click type for ``--shard-id``: one shard's index (``3``, an int) or an inclusive range of them (``1-9``, a
    range: range(1, 10)); junk is a usage error naming the flag (the bounds against --shard-num: stage.check_shard)."""

    name = "I|I-J"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, (int, range)):
            return value
        try:
            lo, sep, hi = str(value).partition("-")
            ids = range(int(lo), int(hi if sep else lo) + 1)
        except ValueError:
            self.fail(f"must be a shard's index or a range I-J of them (e.g. 0 or 1-9), got {value!r}", param, ctx)
        if not ids or ids.start < 0:
            self.fail(f"must have 0 <= I <= J, got {value!r}", param, ctx)
        return ids if len(ids) > 1 else ids.start


def check_range(ctx, param, value):
    """click callback: a bad LO-HI flag value exits 2 naming the flag; the text is kept as given."""
    if value is not None:
        try:
            parse_range(value, param.name.replace("_", " "))
        except ValueError as e:
            raise UsageError(str(e), flag=param.opts[-1]) from None
    return value


def swept_fusion(ctx: click.Context, weights_from: str, weights_by: str) -> dict:
    """--weights-from: {fusion_method, norm, rrf_k, depth, weights} of the sweep's best row (retrctl.fusion.weights_from),
    the fusion flags given on the command line kept where they agree with the sweep's (a UsageError where not)."""
    if ctx.params.get("weights") is not None:
        raise UsageError("give --weights or --weights-from, not both", flag="--weights-from")
    weights, swept = fusion.weights_from(weights_from, weights_by)
    given = {n: ctx.params[n] for n in fusion.SWEPT.values()
             if n in ctx.params and ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE}
    chosen = fusion.swept_settings(weights_from, swept, given)
    log.info("weights %s from %s (its best %s)", ",".join(f"{w:g}" for w in weights), weights_from, weights_by)
    return {**chosen, "weights": weights}


def check_weights(ctx, param, value):
    """click callback: '0.3,0.7' as [0.3, 0.7] (retrctl.fusion.parse_weights); junk exits 2 naming the flag."""
    if value is None:
        return None
    try:
        return fusion.parse_weights(value)
    except ValueError as e:
        raise UsageError(str(e), flag=param.opts[-1]) from None


# ---------------------------------------------------------------- shared options (each spelled once)


def _opt(*decls, **kw):
    return click.option(*decls, **kw)


def _encoder_option(field):
    """A shared encoder flag from its declaration (retrctl/models/config.py: flag, help, choices, min)."""
    m = field.metadata
    if m["choices"]:
        kind = click.Choice(list(m["choices"]))
    elif m["min"] is not None:
        kind = click.IntRange(min=m["min"])
    else:
        kind = None
    if "/" in m["flag"]:  # --on/--off: unset (None) means the model's own
        return _opt(m["flag"], field.name, default=None, help=m["help"])
    return _opt(m["flag"], field.name, type=kind, help=m["help"])


# the help of --qrels, which eval declares itself (several, NAME=PATH across collections)
QRELS_HELP = "Judgments: TREC, BEIR TSV, JSONL, or a BEIR folder."
# the value types of flags that a stage defines from its config (train's --train-batch-size, from TrainConfig)
SHARED_TYPES = {"batch_size": click.IntRange(min=1)}
OPTIONS: dict[str, Callable] = {
    "output": _opt("-o", "--output", default="-", show_default=True, help="Output path ('-' = stdout); written atomically."),
    "output_dir": _opt("-o", "--output", required=True, help="Output directory; built beside it and renamed on success."),
    "input_format": _opt(
        "--input-format", type=click.Choice(["jsonl", "parquet"]), default=None, help="Input container (default: from the extension)."
    ),
    "shard": lambda f: _opt("--shard-id", type=ShardIds(), default=0, show_default=True,
                            help="This shard's index, or a range I-J of shards (1-9: all but shard 0 of 10).")(
        _opt("--shard-num", type=click.IntRange(min=1), default=1, show_default=True,
             help="Number of shards (stable hash of the record id).")(f)
    ),
    "batch_size": _opt("--batch-size", type=SHARED_TYPES["batch_size"], help="Texts per forward pass."),
    "seed": _opt("--seed", type=int, help="Random seed."),
    "model": _opt("--model", help="Encoder: directory (sentence-transformers or Hugging Face), GGUF file, or 'minilm' / 'smollm2'."),
    "corpus": _opt("--corpus", help="Corpus (JSONL/Parquet/BEIR folder) beside the main input."),
    "qrels": _opt("--qrels", help=QRELS_HELP),
    "retriever": _opt("--retriever", help="Retriever: an index dir, 'bm25', a model (see --model), or a run file."),
    "per_doc": _opt("--per-doc", type=click.IntRange(min=1), help="Queries to make per document."),
    "sample": _opt("--sample", type=click.IntRange(min=1), help="Only N documents of this shard (or range of shards): "
                   "those with the smallest stable hash of (--seed, docid), the same N in any input order. [default: all]"),
    "top_k": _opt("--top-k", type=click.IntRange(min=1), help="Candidates retrieved (or reranked) per query."),
    "llm": lambda f: _opt("--llm", help="Language model: a directory, GGUF file, 'smollm2', or a served model name.")(
        _opt("--llm-backend", type=click.Choice(["hf", "openai"]),
             help="Generation client: hf (in-process transformers) or openai (a served model). [default: openai "
                  "with --base-url, else hf]")(
            _opt("--base-url", help="OpenAI-compatible server URL (implies --llm-backend openai).")(
                _opt("--backend", "encoder_runtime_misplaced", hidden=True, expose_value=False, callback=_llm_backend_moved)(f)
            )
        )
    ),
    "llm_server": lambda f: _opt("--concurrency", type=click.IntRange(min=1),
                                 help="Parallel requests to the server (backend openai; default 4).")(
        _opt("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per request (backend openai; default 120).")(
            _opt("--max-retries", type=click.IntRange(min=0), help="Retries with exponential backoff on connection errors, 429, 5xx (default 5).")(f)
        )
    ),
    "fusion": lambda f: _opt("--fusion", "fusion_method", type=click.Choice(list(fusion.METHODS)),
                             help=f"Reciprocal rank fusion (rrf) or a weighted sum of per-query normalised scores "
                                  f"(linear). [default: {fusion.METHOD}]")(
        _opt("--norm", type=click.Choice(list(fusion.NORMS)),
             help=f"Per-query score normalisation before weighting (linear only). [default: {fusion.NORM}]")(
            _opt("--rrf-k", type=click.FloatRange(min=0), help=f"RRF constant k in 1/(k + rank). [default: {fusion.RRF_K:g}]")(
                _opt("--depth", type=click.IntRange(min=1), help="Fuse only each list's top N per query. "
                     "[default: fuse and eval --sweep: all; search: 100, or --hits if larger]")(f)
            )
        )
    ),
    "weights": _opt("--weights", callback=check_weights,
                    help="One weight per list fused, comma-separated (e.g. 0.3,0.7): fuse, in the runs' order; search, "
                         "and index (recorded as the search's default), in dense,sparse,colbert,bm25 order. "
                         "[default: 1 each, or the index's; search with colbert: BGE-M3's 1,0.3,1]"),
    # what a run written is like (search, fuse)
    "hits": _opt("--hits", type=click.IntRange(min=1), help="Results per query written."),
    "run_format": _opt("--output-format", type=click.Choice(["trec", "jsonl", "parquet"]),
                       help="Run format. [default: by -o extension, else trec]"),
    "run_tag": _opt("--run-tag", help="TREC tag column. [default: search: names the retriever; fuse: fused-<method>]"),
    # the length bounds of a query (crop cuts none outside them, qgen drops generated ones outside them)
    "query_words": lambda f: _opt("--min-words", type=click.IntRange(min=1),
                                  help="Shortest query, in words: crop cuts none shorter, qgen drops shorter ones "
                                       "(crop counts a Han character or ~4 Thai graphemes as a word).")(
        _opt("--max-words", type=click.IntRange(min=1),
             help="Longest query, in words: crop cuts a longer sentence to a random window of this many, qgen drops "
                  "longer ones.")(f)),
    "weights_from": lambda f: _opt("--weights-from", metavar="SWEEP",
                                    help="Take --weights (and the fusion settings) from the best row of SWEEP, the "
                                         "output of `retrctl eval A B --sweep … --json`; ties go to the weight nearer 0.5. A sweep "
                                         "made with --sweep-prior keeps its prior unless a row beats it significantly.")(
        _opt("--weights-by", metavar="MEASURE", default="nDCG@10", show_default=True,
             help="The measure that picks --weights-from's row.")(f)
    ),
    "runtime": _opt("--backend", "runtime", type=click.Choice(["torch", "onnx"]),
                    help="Dense: run the encoder on torch or onnxruntime [default: what the model path holds; torch when both]."),
    "encoder": lambda f: functools.reduce(lambda g, o: o(g), [_encoder_option(fl) for fl in flag_fields()], f),
    # the execution layer (retrctl/distributed.py); Ray is imported only when --ray is given
    "ray": lambda f: functools.reduce(lambda g, o: o(g), [
        _opt("--ray", metavar="auto|local|HOST:PORT", help="Run the model's work on a Ray cluster: auto (a running one), "
             "local (a new one here), or the head's HOST:PORT. Needs pip install 'retrctl[ray]'."),
        _opt("--workers", type=click.IntRange(min=1), help="Ray workers (actors), each holding the model once; train: one training process "
             "each. [default: 1]"),
        _opt("--worker-cpus", type=click.FloatRange(min=0), help="CPUs per Ray worker (and its torch threads). [default: 1]"),
        _opt("--worker-gpus", type=click.FloatRange(min=0), help="GPUs per Ray worker. [default: 0]"),
        _opt("--ray-timeout", type=click.FloatRange(min=0, min_open=True),
             help="Seconds without a finished unit (the workers' start and model load included) before a Ray job "
                  "fails, e.g. on a hung node; train: the workers' start, and each wait for the other workers when "
                  "given (else 1800). [default: 600]"),
    ], f),
}


def config_flag(config, name: str, dest: str | None = None, **kw):
    """The flag of a field of a config dataclass (``TrainConfig``): ``metadata["flag"]`` or ``--name-with-dashes``,
    its help the field's ``metadata["help"]``. train builds all its flags from its fields; a stage that runs the
    trainer too (prune's healing) takes the same flags from them, so they read alike. ``dest``: the parameter's
    name, when not the field's; ``kw``: the click type, the default."""
    field = next(f for f in dataclasses.fields(config) if f.name == name)
    return _opt(config_flag_name(field), dest or name, help=field.metadata["help"], **kw)


def config_flag_name(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def _llm_backend_moved(ctx, param, value):
    """qgen/rerank: --backend names the encoder runtime (index, search); the LLM client has its own flag."""
    if value is not None:
        raise UsageError("--backend is the encoder runtime of index and search (torch|onnx); the LLM client of qgen "
                         "and rerank is --llm-backend hf|openai")


# a flag renamed (so that one name has one meaning across stages) keeps its old name, hidden, for one release
RENAMED = "renamed_to__"


def renamed(old: str, new: str, **kw):
    """The old name of the flag ``new``, hidden: given, its value is ``new``'s, with a warning on stderr; both
    given is a usage error. ``kw``: the new flag's type (and callback), so the old name checks values alike."""
    return _opt(old, RENAMED + new.lstrip("-").replace("-", "_"), hidden=True, default=None,
                help=f"The old name of {new}.", **kw)


def take_renamed(cmd: click.Command, kw: dict) -> None:
    """Move the values given under old flag names (``renamed``) to their new names in ``kw``."""
    ctx = click.get_current_context()
    for key in [k for k in kw if k.startswith(RENAMED)]:
        value = kw.pop(key)
        if value is None:
            continue
        old_flag = next(p.opts[0] for p in cmd.params if p.name == key)
        new_flag = "--" + key[len(RENAMED):].replace("_", "-")
        new = next(p.name for p in cmd.params if new_flag in p.opts)  # the parameter may be named otherwise
        if ctx.get_parameter_source(new) is click.core.ParameterSource.COMMANDLINE:
            raise UsageError(f"{old_flag} is the old name of {new_flag}: give {new_flag} alone", flag=old_flag)
        log.warning("%s is now %s; the old name goes in the next release", old_flag, new_flag)
        kw[new] = value


def options(*names: str):
    """Attach shared options by name: ``@options("model", "encoder", "batch_size")``."""

    def deco(f):
        for name in reversed(names):
            f = OPTIONS[name](f)
        return f

    return deco


def encoder_overrides(opts: dict) -> dict:
    """Pop the encoder flags from a command's options, keeping only those the user set (``--backend``, the
    "runtime" option, as the loader's ``backend``)."""
    out = {k: v for k in ENCODER_FLAGS if (v := opts.pop(k, None)) is not None}
    if (runtime := opts.pop("runtime", None)) is not None:
        out["backend"] = runtime
    return out


@functools.cache
def flag_option(flag) -> click.Option:
    """A backend's flag declaration (``retrctl.indexes.base.Flag``) as a click option: its type, bounds, default
    and parser, a bad value a usage error naming the flag. One option per declaration, so every parse of a command
    sees the same objects."""
    kind, bounds = flag.type, {"min": flag.low, "max": flag.high, "min_open": flag.low_open}
    if isinstance(kind, tuple):
        kind = click.Choice(list(kind))
    elif kind in (int, float) and (flag.low is not None or flag.high is not None):
        kind = click.IntRange(**bounds) if kind is int else click.FloatRange(**bounds)

    def parse(ctx, param, value):
        if value is None or flag.parse is None:
            return value
        try:
            return flag.parse(value)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=flag.option) from None

    return click.Option([flag.option], type=kind, default=flag.default, show_default=flag.default is not None,
                        help=flag.help, callback=parse)

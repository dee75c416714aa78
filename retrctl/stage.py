"""The shared stage base: common flags (each defined once) and the run wrapper.

A stage module holds its method as a plain function and a few-line click command. ``stage()`` turns that
command into a full subcommand: it adds the input argument and the common flags, opens and shards the input
(handing the body its shard as ``shard_id``/``shard_num``), shows progress on stderr, writes what the body
returns atomically (records, a run, or a directory built beside its target; an ``Output`` adds the manifest
and the checkpoints to remove), refuses an output that would overwrite one of the command's inputs (before
anything is read), and copies the function's defaults onto the matching options so ``--help`` shows them
(defaults are written once, in the function's signature).

A stage's command is a ``StageCommand``: the core's ``UsageError``, raised by a flag's callback or by the body,
becomes click's own usage error there, where click's context gives the usage line (exit 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import click

from retrctl import fusion, records
from retrctl.errors import UsageError
from retrctl.hashing import shard
from retrctl.models.config import ENCODER_FLAGS, flag_fields

log = logging.getLogger("retrctl")
STATE = {"quiet": False}


# ---------------------------------------------------------------- logging and progress


def setup_logging(level: str = "info", quiet: bool = False) -> None:
    STATE["quiet"] = quiet
    lvl = logging.WARNING if quiet else getattr(logging, level.upper())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(lvl)
    for noisy in ("transformers", "sentence_transformers", "bm25s", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))
    if quiet or not sys.stderr.isatty():
        # the libraries' own bars ("Loading weights") follow ours: off in logs and pipelines
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()


def progress(iterable: Iterable, desc: str = "", total: int | None = None, unit: str = "rec"):
    """tqdm on stderr, off with --quiet or when stderr is not a terminal."""
    from tqdm.auto import tqdm

    disable = STATE["quiet"] or not sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, disable=disable, dynamic_ncols=True)


# ---------------------------------------------------------------- sharding (which record is in which shard: retrctl.hashing)


def check_shard(shard_id: int, shard_num: int) -> None:
    if shard_num < 1 or not 0 <= shard_id < shard_num:
        raise UsageError(f"--shard-id must be in [0, {shard_num}) and --shard-num >= 1")


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
    "shard": lambda f: _opt("--shard-id", type=click.IntRange(min=0), default=0, show_default=True, help="This shard's index.")(
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
    "sample": _opt("--sample", type=click.IntRange(min=1), help="Only N documents of this shard: those with the smallest "
                   "stable hash of (--seed, docid), the same N in any input order. [default: all]"),
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
                                         "output of `retrctl eval A B --sweep … --json`; ties go to the weight nearer 0.5.")(
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


def _take_renamed(cmd: click.Command, kw: dict) -> None:
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


# ---------------------------------------------------------------- the stage wrapper

# parameters that name files a command reads (besides its arguments, which are always inputs) or writes:
# an output may not be, be inside, or contain any of them (records.check_outputs)
INPUT_OPTIONS = ("corpus", "qrels", "retriever", "queries", "examples", "config_file", "weights_from", "copy_from")
OUTPUT_OPTIONS = ("output", "candidates")


@contextlib.contextmanager
def click_usage(ctx: click.Context):
    """The core's UsageError as click's own usage error in ``ctx`` (click prints the usage line and exits 2)."""
    try:
        yield
    except UsageError as e:
        if e.flag:
            raise click.BadParameter(str(e), ctx, param_hint=f"'{e.flag}'") from None
        raise click.UsageError(str(e), ctx) from None


class StageCommand(click.Command):
    """A stage's click command: a UsageError raised while its flags are read (a callback) or while it runs is
    shown as click shows a usage error, whether the command runs under ``retrctl`` or on its own."""

    def parse_args(self, ctx, args):
        with click_usage(ctx):
            return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with click_usage(ctx):
            return super().invoke(ctx)


def _copy_defaults(cmd: click.Command, func: Callable | None) -> None:
    if func is None:
        return
    sig = inspect.signature(func).parameters
    for p in cmd.params:
        # click >= 8.3 marks "no default" with a sentinel instead of None
        if isinstance(p, click.Option) and p.name in sig and (p.default is None or p.default is getattr(click.core, "UNSET", None)):
            default = sig[p.name].default
            if default is not inspect.Parameter.empty and default is not None:
                p.default = default
                p.show_default = "[default:" not in (p.help or "")  # a shared flag's help may state it already


RECORD_KINDS = ("doc", "query", "group", "run")
NOUNS = {"doc": "doc records", "query": "query records", "group": "group records", "run": "run rows"}


@dataclass
class Output:
    """What a stage body returns when its records need more than ``writes`` says.

    kind: the records' kind when it differs from ``writes`` (rerank relabels groups but reranks runs);
    fmt: the container (default: from the output's extension; runs: TREC); tag: a TREC run's sixth column;
    finish: called with the count once the output is in place, returns the manifest written beside it (None:
    none); remove: files (checkpoints) removed once output and manifest are in place."""

    records: Iterable[dict]
    kind: str | None = None
    fmt: str | None = None
    tag: str = "retrctl"
    finish: Callable[[int], dict | None] | None = None
    remove: tuple = ()


def write_output(result, output: str, writes: str) -> int | None:
    """Write what a body returned (records, or an ``Output``) to ``output`` atomically; None writes nothing."""
    if result is None:  # e.g. rerank --dry-run: there is nothing to write, and an old output stays as it is
        return None
    res = result if isinstance(result, Output) else Output(result)
    kind = res.kind or writes
    if kind == "run":
        n = records.write_run(res.records, output, res.fmt, tag=res.tag)
    else:
        n = records.write(res.records, output, res.fmt)
    log.info("wrote %d %s to %s", n, NOUNS[kind], "stdout" if output == "-" else output)
    manifest = res.finish(n) if res.finish is not None else None
    if manifest is not None:
        records.write_manifest_beside(output, manifest)
    if output != "-":
        for path in res.remove:
            Path(path).unlink(missing_ok=True)
    return n


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


class RegistryOptions(StageCommand):
    """A command whose options include flags read from a registry (``more_options``) each time it parses or shows
    --help, so an entry registered after the command was built (a plugin, a test) brings its own flags."""

    more_options: Callable[[], Iterable[click.Option]] = staticmethod(lambda: ())

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        have = {p.name for p in params}
        extra = [o for o in self.more_options() if o.name not in have]
        return [*self.params, *extra, *params[len(self.params):]]  # before --help


def stage(func: Callable | None = None, *, reads: str | None = None, writes: str | None = None, atomic: bool = True,
          name: str | None = None, more_options: Callable[[], Iterable[click.Option]] | None = None):
    """Make a click command of a stage.

    reads:  a record kind: adds an INPUT argument ('-' = stdin, the default) and --shard-id/--shard-num, and
            passes the records of this shard, as an iterator, as the body's first argument.
    writes: a record kind ('doc', 'query', 'group') or 'run': adds ``-o`` (default stdout); the body returns
            the records (or an ``Output``, or None to write nothing), written atomically: JSONL/Parquet, and
            for 'run' TREC (the default), JSONL or Parquet.
            'dir': ``-o`` is a required directory, built at ``<dir>.partial`` (kept on failure, to resume
            from) and swapped into place when the body returns (records.atomic_dir); the body gets the partial
            directory as ``output``. With ``atomic=False`` the body gets ``-o`` as given and makes the directory
            safe itself (index: versioned store; train: its own resumable partial, written by rank 0 only).

    A body that names ``output`` gets the output path; one that names ``shard_id``/``shard_num`` gets the
    shard (checked here: 0 <= id < num), whether the records were sharded here or the body shards its own
    input. A ``UsageError`` from the body (a flag that cannot work, a checkpoint made with other settings) exits 2
    with the command's usage line (``StageCommand``). ``more_options``: options read from a registry at each
    parse (the index backends' flags), passed to the body with the others.
    """

    def deco(body: Callable) -> click.Command:
        wants = inspect.signature(body).parameters

        @functools.wraps(body)
        def run(**kw):
            setup_logging(kw.pop("log_level"), kw.pop("quiet"))
            _take_renamed(cmd, kw)
            arguments = [p.name for p in cmd.params if isinstance(p, click.Argument)]
            records.check_outputs([kw.get(o) for o in OUTPUT_OPTIONS], [kw.get(i) for i in (*arguments, *INPUT_OPTIONS)],
                                  dir_output=writes == "dir")
            shard_id, shard_num = kw.pop("shard_id", 0), kw.pop("shard_num", 1)
            check_shard(shard_id, shard_num)
            kw.update({k: v for k, v in (("shard_id", shard_id), ("shard_num", shard_num)) if k in wants})
            args = []
            if reads:
                path, fmt = kw.pop("input"), kw.pop("input_format")
                recs = shard(records.read(path, reads, fmt), shard_id, shard_num, records.ID_FIELD[reads])
                args.append(progress(recs, desc=cmd.name, unit=reads))
            if writes in RECORD_KINDS:
                out = kw["output"] if "output" in wants else kw.pop("output")
                return write_output(body(*args, **kw), out, writes)
            if writes == "dir" and atomic:
                with records.atomic_dir(kw["output"]) as partial:
                    kw["output"] = str(partial)
                    return body(*args, **kw)
            return body(*args, **kw)

        if writes == "dir":
            run = OPTIONS["output_dir"](run)
        elif writes in RECORD_KINDS:
            run = OPTIONS["output"](run)
        elif writes is not None:
            raise ValueError(f"writes must be one of {RECORD_KINDS} or 'dir', got {writes!r}")
        if reads:
            run = OPTIONS["shard"](OPTIONS["input_format"](run))
            run = click.argument("input", default="-", required=False)(run)
        run = click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors on stderr; no progress bars.")(run)
        run = click.option(
            "--log-level",
            type=click.Choice(["debug", "info", "warning", "error"]),
            default="info",
            show_default=True,
            help="Logging on stderr; 'debug' also shows tracebacks.",
        )(run)
        doc = body.__doc__ or (func.__doc__ if func is not None else "") or ""
        cmd = click.command(name=name or (func.__name__ if func else body.__name__), help=doc.strip(),
                            cls=RegistryOptions if more_options else StageCommand)(run)
        if more_options:
            cmd.more_options = more_options
        _copy_defaults(cmd, func)
        return cmd

    return deco


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")

"""The shared stage base: the run wrapper (the common flags it adds are declared in retrctl/options.py).

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
import functools
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import click

from retrctl import records
from retrctl.errors import UsageError
from retrctl.hashing import shard, shard_ids
from retrctl.options import OPTIONS, take_renamed

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


PROGRESS_LOG_SECONDS = 60.0  # a log line at most this often where stderr is a file (no bar)


def progress(iterable: Iterable, desc: str = "", total: int | None = None, unit: str = "rec"):
    """tqdm on stderr; where stderr is not a terminal (a log file, cron), an info line at most once a minute with
    the count, the rate and the time left; nothing with --quiet."""
    from tqdm.auto import tqdm

    if STATE["quiet"] or sys.stderr.isatty():
        return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, disable=STATE["quiet"],
                    dynamic_ncols=True)
    return _logged_progress(iterable, desc or "progress", total, unit)


def _logged_progress(iterable: Iterable, desc: str, total: int | None, unit: str):
    start = last = time.monotonic()
    n = 0
    for n, item in enumerate(iterable, 1):
        yield item
        now = time.monotonic()
        if now - last >= PROGRESS_LOG_SECONDS:
            last, rate = now, n / (now - start)
            left = f", ~{(total - n) / rate / 60:.0f} min left" if total and rate > 0 else ""
            log.info("%s: %d%s %s done, %.2f %s/s%s", desc, n, f" of {total}" if total else "", unit, rate, unit, left)


# ---------------------------------------------------------------- sharding (which record is in which shard: retrctl.hashing)


def check_shard(shard_id: int | range, shard_num: int) -> None:
    ids = shard_ids(shard_id)
    if shard_num < 1 or not ids or ids.start < 0 or ids.stop > shard_num:
        raise UsageError(f"--shard-id must be in [0, {shard_num}) (a range's both ends) and --shard-num >= 1")


# ---------------------------------------------------------------- the stage wrapper

# parameters that name files a command reads (besides its arguments, which are always inputs) or writes:
# an output may not be, be inside, or contain any of them (records.check_outputs)
INPUT_OPTIONS = ("corpus", "qrels", "retriever", "queries", "examples", "config_file", "weights_from", "copy_from",
                 "vectors_from")
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
            take_renamed(cmd, kw)
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

"""The `retrctl` click group.

Stages are referred to by name only and imported on first use (click's lazy-loading group pattern), so
`retrctl --help` starts without importing torch. Each error's exit status is decided here, once: usage errors
exit 2 as click shows them (the core's retrctl.errors.UsageError arrives as one: the stage's command,
retrctl.stage.StageCommand, converts it where click's context gives the usage line); RecordError exits 2 with
one line; an output locked by another run (BusyError) exits 75 (EX_TEMPFAIL: retry later, cron can skip
quietly); anything else exits 1 with one line (the traceback with --log-level debug: logged at debug, so it shows
where the stage's logging setup lets debug messages through).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import signal
import sys

import click

from retrctl import __version__
from retrctl.errors import BusyError, RecordError

EX_TEMPFAIL = 75

# subcommand -> one line of help, in pipeline order; the module is stages.<name> and exposes `command`
STAGES = {
    "crop": "Sentence-crop pseudo-queries from documents.",
    "qgen": "LLM-written queries for documents.",
    "mine": "Hard negatives for queries: groups for training.",
    "rerank": "Listwise / pointwise LLM reranking of runs or groups.",
    "prune": "Drop the least important layers of a decoder (EffiR).",
    "train": "Contrastive training (InfoNCE, DeepSpeed ZeRO, GradCache, LoRA).",
    "export": "Ship a model: sentence-transformers dir, ONNX fp32/int8, card.",
    "index": "Build (or update) a dense or BM25 index of a corpus.",
    "search": "Search an index with queries: write a run.",
    "fuse": "Fuse runs (RRF or weighted normalised scores): hybrid search.",
    "eval": "Score runs against judgments (trec_eval semantics).",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [name for name in STAGES if importlib.util.find_spec(f"stages.{name}") is not None]

    def get_command(self, ctx, name):
        if name not in STAGES or importlib.util.find_spec(f"stages.{name}") is None:
            return None
        return importlib.import_module(f"stages.{name}").command

    def format_commands(self, ctx, formatter):
        rows = [(name, STAGES[name]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Stages"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="retrctl")
def cli():
    """retrctl: LLM to small, fast retriever. Every stage reads and writes records (JSONL, .gz/.zst,
    Parquet, TREC) on files or stdin/stdout, so pipelines are built in shell and Make."""


def main(argv=None) -> None:
    # `retrctl search … | head` ends quietly instead of raising BrokenPipeError. Only as the program itself
    # (argv None): called in-process (tests, notebooks) it must not change the host's signal handling.
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args and not args[0].startswith("-") else ""
    prog = f"retrctl {name}".strip()
    try:
        cli.main(args=args, prog_name="retrctl", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:  # click turns Ctrl-C into Abort when not standalone
        click.echo("Aborted!", err=True)
        sys.exit(130 if isinstance(e.__cause__, KeyboardInterrupt) else 1)
    except click.ClickException as e:  # a usage error (the core's UsageError among them): exit 2
        e.show()
        sys.exit(e.exit_code)
    except RecordError as e:
        click.echo(f"{prog}: {e}", err=True)
        sys.exit(2)
    except BusyError as e:  # another run holds the output's lock: a retry later will do (sysexits EX_TEMPFAIL)
        click.echo(f"{prog}: {e}", err=True)
        sys.exit(EX_TEMPFAIL)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        # the traceback is a debug message: shown when the stage set --log-level debug, by logging's own level
        logging.getLogger("retrctl").debug("failed", exc_info=True)
        click.echo(f"{prog}: {type(e).__name__}: {e}", err=True)
        sys.exit(1)

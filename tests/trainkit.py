"""Tiny training data shared by the training tests (test_train, test_train_safety, test_memory).

A 40-doc random-word corpus and groups whose negatives come from the docs no group is positive for; tiny models
come from conftest.py. Plumbing data, never quality data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = "cat dog tea coffee rust python memory safety bean leaf wolf purr language code water hot".split()
FAST = {"batch_size": 4, "train_group_size": 3, "lr": 1e-3, "query_max_len": 16, "passage_max_len": 24, "logging_steps": 1}


def corpus(n=40):
    rng = np.random.default_rng(0)
    return {f"d{i}": {"title": f"t{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(4, 20))))} for i in range(n)}


def groups(n=16, negatives=5):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        negs = [f"d{j}" for j in rng.choice(range(n, 40), negatives, replace=False)]
        out.append({"query_id": f"q{i}", "query_text": f"query about {WORDS[i % len(WORDS)]} {i}",
                    "positive_document_ids": [f"d{i}"], "negative_document_ids": negs})
    return out


def losses(out):
    return [json.loads(line)["loss"] for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path

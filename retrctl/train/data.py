"""Training groups as batches: validation, seeded sampling of each query's group, length-grouped global batches.

A *group* record (FORMATS.md) names a query, its positives and its mined negatives; passage text comes from the
group itself (legacy formats) or from the corpus. Each step takes one *global* batch: ``batch_size × processes``
examples, each 1 positive + ``group_size − 1`` negatives; process r trains on rows [r·B, (r+1)·B) and sees every
row's passages as candidates.

Everything here is a pure function of (input stream, seed, epoch): the positive and negatives of the i-th group
in epoch e are drawn from ``default_rng([seed, e, i])`` and batches are cut from fixed buffers, so resuming
only has to skip the batches already trained (no sampler state to save), and N processes see exactly the batches
one process sees.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

import numpy as np

from retrctl import records
from retrctl.hashing import json_lines_hex

log = logging.getLogger("retrctl.train")


@dataclasses.dataclass
class Example:
    query_id: str
    query: str
    passages: list[str]  # positive first, then group_size - 1 negatives
    keys: list[tuple[str, str]]  # (docid, text hash) of each passage
    positive_keys: set  # doc ids and text hashes of ALL the query's positives (false-negative masking)
    teacher: list[float] | None  # teacher scores aligned with passages, when the group carries them
    padded: int = 0  # negatives resampled because the group had fewer than group_size - 1
    drawn: int = 0  # negatives drawn at random from the corpus because the group had none

    def cost(self) -> int:
        return len(self.query) + sum(len(p) for p in self.passages)


class GroupSource:
    """Re-iterable groups from a path ('-' = stdin, kept in memory, never on disk) or an in-memory list.

    ``validate()`` makes one pass first: every group parses and every doc id it names has text, so bad
    input fails before any model is loaded (exit 2, no output). The same pass fingerprints what training reads
    (``fingerprint``): the normalized groups in order and the text of every corpus doc they name, so a resume can
    tell changed data from the same data in another container (file or stdin, JSONL or Parquet, compressed or not).
    """

    def __init__(self, groups: str | Iterable[dict], corpus: dict[str, dict] | None):
        self.corpus = corpus or {}
        self.path = groups if isinstance(groups, str) else "<groups>"
        self._cached: list | None = None
        self.fingerprint: str | None = None  # set by validate()
        self.without_negatives = 0  # groups whose negatives are drawn from the whole corpus
        if not isinstance(groups, str):
            self._cached = [(i, records.normalize_group(g, self.path, i)) for i, g in enumerate(groups, 1)]
        elif groups == "-":
            self._cached = list(self._read())

    def _read(self) -> Iterator[tuple[int, dict]]:
        for line, obj in records.read_objects(self.path):
            yield line, records.normalize_group(obj, self.path, line)

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        return iter(self._cached) if self._cached is not None else self._read()

    def doc(self, group: dict, docid: str, line: int, field: str) -> dict:
        d = group.get("passages", {}).get(docid) or self.corpus.get(docid)
        if d is None:
            hint = "" if self.corpus else " (give --corpus)"
            raise records.RecordError(self.path, line, field, f"doc {docid!r} is not in the corpus{hint}")
        return d

    def validate(self) -> int:
        n = 0
        from_corpus: set[str] = set()

        def lines():  # checked as hashed: one pass
            nonlocal n
            for line, g in self:
                for field in ("positive_document_ids", "negative_document_ids"):
                    for docid in g[field]:
                        self.doc(g, docid, line, field)
                        if docid not in g.get("passages", {}):
                            from_corpus.add(docid)
                yield g
                self.without_negatives += not g["negative_document_ids"]
                n += 1
            if n == 0:
                raise records.RecordError(self.path, message="empty input: no group records")
            yield from self._docs(sorted(from_corpus))  # each named doc once, whatever the number of groups naming it

        self.fingerprint = json_lines_hex(lines())
        return n

    def _docs(self, docids):
        return ([docid, records.passage_text(self.corpus[docid])] for docid in docids)

    def corpus_fingerprint(self) -> str:
        """The whole corpus (ids and texts): groups without negatives draw theirs from all of it."""
        return json_lines_hex(self._docs(sorted(self.corpus)))


class Batches:
    """Global batches of Examples for one epoch, deterministic in (seed, epoch)."""

    def __init__(self, source: GroupSource, *, group_size: int = 8, global_batch: int = 32, seed: int = 0,
                 drop_last: bool = False, group_by_length: bool = True, buffer_batches: int = 16):
        if group_size < 1:
            raise ValueError("train group size must be at least 1 (the positive)")
        self.source, self.group_size, self.global_batch, self.seed = source, group_size, global_batch, seed
        self.drop_last, self.group_by_length, self.buffer_batches = drop_last, group_by_length, buffer_batches
        self._hash: dict[str, str] = {}
        self._ids: list[str] | None = None

    def per_epoch(self, n_groups: int) -> int:
        full, rest = divmod(n_groups, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def _key(self, docid: str, doc: dict) -> tuple[str, str]:
        h = self._hash.get(docid)
        if h is None:
            h = self._hash[docid] = records.content_hash("", records.passage_text(doc).strip().lower())
        return docid, h

    def example(self, line: int, g: dict, rng: np.random.Generator) -> Example:
        pos_ids, neg_ids = g["positive_document_ids"], g["negative_document_ids"]
        want = self.group_size - 1
        pi = int(rng.integers(len(pos_ids)))
        padded = drawn = 0
        positive_keys = set()
        for docid in pos_ids:
            positive_keys.update(self._key(docid, self.source.doc(g, docid, line, "positive_document_ids")))
        if len(neg_ids) >= want:
            ni = [int(i) for i in rng.choice(len(neg_ids), want, replace=False)]
        elif neg_ids:
            ni = list(range(len(neg_ids))) + [int(i) for i in rng.choice(len(neg_ids), want - len(neg_ids))]
            padded = want - len(neg_ids)
        else:
            ni = None
        if ni is None and want:
            negs = [(d, self.source.corpus[d]) for d in self._random_negatives(set(pos_ids), want, rng, line)]
            drawn = want
        else:
            negs = [(neg_ids[i], self.source.doc(g, neg_ids[i], line, "negative_document_ids")) for i in (ni or [])]
        docs = [(pos_ids[pi], self.source.doc(g, pos_ids[pi], line, "positive_document_ids")), *negs]
        teacher = None
        if "positive_scores" in g and "negative_scores" in g and ni is not None:
            teacher = [g["positive_scores"][pi]] + [g["negative_scores"][i] for i in ni]
        return Example(
            query_id=g["query_id"], query=g["query_text"], passages=[records.passage_text(d) for _, d in docs],
            keys=[self._key(i, d) for i, d in docs], positive_keys=positive_keys, teacher=teacher, padded=padded, drawn=drawn,
        )

    def _random_negatives(self, positives: set, want: int, rng: np.random.Generator, line: int) -> list[str]:
        if self._ids is None:
            self._ids = sorted(self.source.corpus)
        if len(self._ids) <= len(positives):
            raise records.RecordError(self.source.path, line, "negative_document_ids", "no negatives, and no other --corpus docs to draw them from")
        out: list[str] = []
        while len(out) < want:
            d = self._ids[int(rng.integers(len(self._ids)))]
            if d not in positives:
                out.append(d)
        return out

    def epoch(self, epoch: int) -> Iterator[list[Example]]:
        """Global batches of one epoch, in order."""
        size = self.global_batch * self.buffer_batches
        buffer: list[Example] = []
        n_buf = 0
        for index, (line, g) in enumerate(self.source):
            buffer.append(self.example(line, g, np.random.default_rng([self.seed, epoch, index])))
            if len(buffer) == size:
                yield from self._cut(buffer, epoch, n_buf, last=False)
                buffer, n_buf = [], n_buf + 1
        if buffer:
            yield from self._cut(buffer, epoch, n_buf, last=True)

    def _cut(self, buffer: list[Example], epoch: int, n_buf: int, last: bool) -> Iterator[list[Example]]:
        rng = np.random.default_rng([self.seed, epoch, n_buf, 1])
        if self.group_by_length:
            buffer = sorted(buffer, key=lambda e: -e.cost())
        else:
            buffer = [buffer[i] for i in rng.permutation(len(buffer))]
        batches = [buffer[i : i + self.global_batch] for i in range(0, len(buffer), self.global_batch)]
        tail = batches.pop() if last and len(batches[-1]) < self.global_batch else None
        if self.group_by_length:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        yield from batches
        if tail is not None:
            if self.drop_last:
                log.warning("dropped the last %d groups of epoch %d: processes need equal batches", len(tail), epoch)
            else:
                yield tail

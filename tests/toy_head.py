"""A toy index head, whole in this one module: the distinct words a doc shares with the query, kept beside a dense
index's other heads, with one `index` flag of its own. tests/test_index_toy_head.py registers it with one line and
drives it through the CLI."""

import json

import numpy as np
from toy_backend import words

from retrctl.indexes import base, store
from retrctl.indexes.heads import Head

FILE = "overlap.json"


class OverlapStore:
    """Each doc's distinct words, row-aligned with the index's docs; fed the texts, not the encoded rows."""

    reads_text = True
    knobs = ()

    def __init__(self, min_len: int):
        self.min_len = min_len
        self.words: list[list[str]] = []

    def rows(self, texts):
        return [words(t, self.min_len) for t in texts]

    def append(self, rows):
        self.words.extend(rows)

    def apply(self, replaced, removed, n=None):
        for pos, row in replaced.items():
            self.words[pos] = row
        gone = set(removed)
        self.words = [w for i, w in enumerate(self.words) if i not in gone]

    def finish(self):
        """Nothing waits: rows are searchable once appended."""

    @classmethod
    def joined(cls, stores, counts=None):
        out = cls(stores[0].min_len)
        out.words = [w for s in stores for w in s.words]
        return out

    def scores(self, text: str) -> np.ndarray:
        asked = set(words(text, self.min_len))
        return np.array([len(asked.intersection(w)) for w in self.words], dtype=np.float32)

    def search(self, texts, k, key, docids):
        out = []
        for text in texts:
            s = self.scores(text)
            rows = [r for r in base.top_k(s, key, k) if s[r] > 0] if len(s) else []
            out.append([(docids[r], float(s[r])) for r in rows])
        return out

    def write(self, directory, n=None):
        (directory / FILE).write_text(json.dumps(self.words))

    @classmethod
    def read(cls, directory, min_len: int, n: int):
        out = cls(min_len)
        with base.reading(directory / FILE):
            out.words = json.loads((directory / FILE).read_text())
        if len(out.words) != n:
            raise store.damaged(directory / FILE, f"{len(out.words)} rows for {n} ids")
        return out


class OverlapHead(Head):
    """Scores a doc by the number of distinct query words it holds; words shorter than ``min_len`` are not kept (a
    stored setting: changing it rebuilds the index)."""

    name = "overlap"
    index_flags = (base.Flag("overlap_min_len", "Overlap head: the shortest word kept.", int, low=1, default=1),)

    def __init__(self, encoder, settings):
        self.min_len = (settings.get("overlap") or {}).get("min_len", 1)

    @classmethod
    def settings_from(cls, options):
        return {"overlap": {"min_len": options.get("overlap_min_len") or 1}}

    def settings(self):
        return {"overlap": {"min_len": self.min_len}}

    @classmethod
    def content(cls, settings):
        return {"overlap": settings.get("overlap")}

    def new_store(self, idx):
        return OverlapStore(self.min_len)

    def section(self, st):
        return {"min_len": self.min_len, "files": {"words": FILE}}

    def read(self, idx, directory, manifest, n):
        return OverlapStore.read(directory, self.min_len, n)

    def describe(self, st):
        return f"overlap of words from {self.min_len} letters"

    def run(self, idx, queries, k):
        found = idx.search_store(self.name, [q["query_text"] for q in queries], k)
        return {q["query_id"]: hits for q, hits in zip(queries, found, strict=True)}

    def score(self, idx, query, docids):
        found = idx.positions(docids)
        s = idx.stores[self.name].scores(query["query_text"])
        return {d: float(s[row]) for d, row in found.items()}

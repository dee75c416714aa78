"""A toy index backend, whole in this one module: word overlap, with one `index` flag and one `search` flag of its
own, and the scores it must give (``expected``). tests/test_index_toy_backend.py registers it with one line and
drives it through the CLI; tests/toy_head.py keeps the same words as a head of a dense index."""

import json
import re
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.indexes import base, store


def words(text: str, min_len: int) -> list[str]:
    return sorted({w for w in re.findall(r"\w+", text.lower()) if len(w) >= min_len})


def expected(docs, queries, min_len: int, boost: float = 1.0) -> dict[str, dict[str, float]]:
    """What word overlap must return, computed from the texts: boost × distinct shared words, zero left out (a run
    file has no line for a query without hits)."""
    out = {}
    for q in queries:
        asked = set(words(q["query_text"], min_len))
        hits = {d["docid"]: boost * len(asked & set(words(f"{d['title']} {d['text']}", min_len))) for d in docs}
        if any(hits.values()):
            out[q["query_id"]] = {d: s for d, s in hits.items() if s > 0}
    return out


class OverlapIndex(base.Index):
    """A doc scores ``boost`` × the number of distinct query words it holds; words shorter than ``min_len`` are not
    indexed (a stored setting: changing it rebuilds)."""

    name = "overlap"
    summary = "word overlap (a test backend)"
    flags = ("min_len",)
    search_knobs = ("boost",)
    index_flags = (base.Flag("min_len", "Overlap: the shortest word indexed.", int, low=1, default=1),)
    search_flags = (base.Flag("boost", "Overlap: score per shared word. [default: 1]", float, low=0, low_open=True,
                              refused="--{flag}: a {backend} index has no boost"),)
    boost = 1.0

    def __init__(self, min_len: int = 1):
        super().__init__()
        self.min_len = int(min_len)
        self.words: list[list[str]] = []

    @classmethod
    def create(cls, encoder=None, *, min_len: int = 1):
        return cls(min_len)

    def config(self) -> dict:
        return {"min_len": self.min_len}

    def sync(self, docs, delete=True):
        stats, seen = base.new_stats(), set()
        for doc, h, pos in list(self._classify(docs, seen, stats)):
            doc_words = words(records.passage_text(doc), self.min_len)
            if pos is not None:
                self._hash[pos], self.words[pos] = h, doc_words
            else:
                self._append_ids([doc["docid"]], [h])
                self.words.append(doc_words)
        gone = set(self._missing_rows(seen)) if delete else set()
        stats["removed"] = len(gone)
        if gone:
            keep = np.array([i not in gone for i in range(len(self.docids))])
            self.words = [w for w, k in zip(self.words, keep, strict=True) if k]
            self._keep_rows(keep)
        self._invalidate()
        return stats

    def _scores(self, query) -> np.ndarray:
        asked = set(words(query["query_text"], self.min_len))
        return np.array([self.boost * len(asked.intersection(w)) for w in self.words], dtype=np.float32)

    def search(self, queries, k):
        out = {}
        for q in queries:
            s = self._scores(q)
            rows = [r for r in base.top_k(s, self.order_key(), k) if s[r] > 0] if len(s) else []
            out[q["query_id"]] = [(self.docids[r], float(s[r])) for r in rows]
        return out

    def score(self, query, docids):
        s = self._scores(query)
        return {d: float(s[self._pos[d]]) for d in docids if d in self._pos}

    def manifest(self) -> dict:
        return {"backend": self.name, "settings": self.config(), "doc_count": len(self),
                "files": {"docids": base.DOCIDS, "words": "words.json"}, **self.meta}

    def write_files(self, directory: Path) -> None:
        (directory / "words.json").write_text(json.dumps(self.words))
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, self.manifest())

    def save(self, directory, keep=store.KEEP) -> None:
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    @classmethod
    def load(cls, directory, **_ignored):
        version = store.resolved(directory)
        idx = cls(**version.manifest["settings"])
        idx._set_ids(*base.read_docids(version.path))
        with base.reading(version.path / "words.json"):
            idx.words = json.loads((version.path / "words.json").read_text())
        idx.meta = {k: version.manifest[k] for k in ("source", "shard") if k in version.manifest}
        idx.version = version
        return idx

    @classmethod
    def merge(cls, parts):
        out = cls(parts[0].min_len)
        out._set_ids([d for p in parts for d in p.docids], [h for p in parts for h in p._hash])
        out.words = [w for p in parts for w in p.words]
        return out

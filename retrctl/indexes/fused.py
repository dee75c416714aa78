"""Fused index: several indexes of one corpus searched as one retriever, their lists fused.

``retrctl index --fuse IDX1 IDX2 … -o OUT`` publishes the current version of each index given as a member of OUT
(``members/0``, ``members/1``, …: each a complete index version, its files shared as hard links, nothing encoded),
with the fusion flags given (``--weights`` one per member, in the order given; ``--weights-from``, ``--fusion``,
``--norm``) recorded as OUT's search defaults. `retrctl search OUT` searches each member with its own settings (its
model, its heads and their recorded weights), each member's top ``--depth`` (100, or ``--hits`` if larger), and fuses
the lists with ``retrctl.fusion``, exactly as `retrctl fuse` fuses the members' runs: Pyserini's hybrid searcher
(a dense and a sparse searcher, their lists fused), saved as an index, so an ensemble of models, or of a model with
BM25, is one directory searched with no flag. A member may be any index, a fused one too.

Every member must hold the same doc ids (fusion of lists over different corpora ranks docs one member lacks at its
floor). A fused index is not updated in place: each member is updated (`retrctl index CORPUS -o MEMBER`), then fused
again; `index` on a fused index says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base, store

MEMBERS = "members"
NOT_UPDATED = ("a fused index is made from indexes (retrctl index --fuse IDX1 IDX2 … -o OUT), not from a corpus, "
               "and is not updated in place: update each member (retrctl index CORPUS -o MEMBER), then fuse them again")


class FusedIndex(base.Index):
    name = "fused"
    summary = "indexes of one corpus searched together, their lists fused (index --fuse)"
    from_corpus = False
    search_knobs = ("batch_size", "fusion", "norm", "weights", "rrf_k", "depth", "remove_query")
    fusion, norm, weights, rrf_k, depth = fusion.METHOD, fusion.NORM, None, fusion.RRF_K, 100
    remove_query = False  # search --remove-query: each member's list drops the query's own doc before fusion
    batch_size = None  # search --batch-size: passed on to the members that encode queries
    refuses = ("--{flag}: a fused index searches each member with the settings recorded in it; search a member with "
               "--{flag}, or fuse indexes made with the settings wanted")

    def __init__(self, members: list[base.Index]):
        super().__init__()
        if len(members) < 2:
            raise UsageError("--fuse needs two or more index directories")
        self.members = members
        self._set_ids(members[0].docids, members[0]._hash)
        self.search_defaults = {}

    @classmethod
    def of(cls, members: list[base.Index], names: list[str]) -> FusedIndex:
        """A fused index of opened ``members`` (``names``: how errors name them), checked to hold the same doc ids."""
        first = set(members[0].docids)
        for member, name in zip(members[1:], names[1:], strict=True):
            docids = set(member.docids)
            if docids != first:
                raise UsageError(f"--fuse: {name} holds {len(docids - first)} doc ids that {names[0]} lacks and lacks "
                                 f"{len(first - docids)} of its {len(first)}: fuse indexes of one corpus")
        return cls(members)

    @classmethod
    def create(cls, encoder=None, **options):
        raise UsageError(NOT_UPDATED)

    def prepare_update(self, workdir: Path, **options) -> None:
        raise UsageError(NOT_UPDATED)

    def sync(self, docs, delete: bool = True) -> dict:
        raise UsageError(NOT_UPDATED)

    def remove(self, docids) -> int:
        raise UsageError(NOT_UPDATED)

    @classmethod
    def merge(cls, parts):
        raise ValueError("cannot merge fused indexes: merge their members' shards, then fuse the members again")

    def record_search_defaults(self, defaults: dict) -> None:
        """Keep `index`'s fusion flags (over those recorded) as the search defaults, checked against the members."""
        out = {k: v for k, v in {**self.search_defaults, **defaults}.items() if v is not None}
        unknown = set(out) - {"fusion", "norm", "weights", "rrf_k", "depth"}
        if unknown:
            raise UsageError(f"search defaults {', '.join(sorted(unknown))}: only the fusion flags are recorded")
        if "weights" in out:
            out["weights"] = fusion.complement([float(x) for x in out["weights"]], len(self.members))
        try:
            fusion.check(len(self.members), out.get("fusion", fusion.METHOD), out.get("rrf_k", fusion.RRF_K),
                         out.get("weights"), out.get("norm", fusion.NORM), out.get("depth"))
        except ValueError as e:
            raise UsageError(f"{e} (one weight per member index, in the order given to --fuse)") from None
        self.search_defaults = out
        for name, value in out.items():
            setattr(self, name, value)

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        depth = max(k, self.depth)
        weights = fusion.check(len(self.members), self.fusion, self.rrf_k, self.weights, self.norm)  # UsageError
        read = fusion.read_by(weights)
        runs = []
        for i, member in enumerate(self.members):
            if i not in read:  # weighted 0: the fusion leaves its list out, so it is not searched
                runs.append({})
                continue
            if self.batch_size is not None and "batch_size" in member.search_knobs:
                member.batch_size = self.batch_size
            run = member.search(queries, depth + 1 if self.remove_query else depth)
            if self.remove_query:  # as `fuse` of runs searched with --remove-query
                run = {q: [(d, s) for d, s in hits if d != q][:depth] for q, hits in run.items()}
            runs.append(run)
        try:
            return fusion.fuse(runs, method=self.fusion, k=self.rrf_k, weights=weights, norm=self.norm, hits=k)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def describe(self) -> str:
        members = "; ".join(f"{m.name}: {m.describe()}" for m in self.members)
        defaults = f"; search defaults {self.search_defaults}" if self.search_defaults else ""
        return f"{len(self)} docs; {len(self.members)} members ({members}){defaults}"

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        return f"fused({len(manifest.get('settings', {}).get('members', []))})"

    def config(self) -> dict:
        return {"members": [str(i) for i in range(len(self.members))]}

    def manifest(self) -> dict:
        out = {"backend": self.name, "settings": self.config(), "doc_count": len(self), **self.meta}
        if self.search_defaults:
            out["search_defaults"] = self.search_defaults
        return out

    @classmethod
    def load(cls, directory, **kw) -> FusedIndex:
        """Open each member (``kw``: open_index's; a member ignores what it has no use for)."""
        from retrctl.indexes import open_index

        version = store.resolved(directory)
        settings = version.manifest.get("settings") or {}
        names = settings.get("members")
        if not isinstance(names, list) or len(names) < 2:
            raise store.damaged(version.path / store.MANIFEST, "settings.members: not a list of two or more members")
        idx = cls([open_index(version.path / MEMBERS / str(name), **kw) for name in names])
        idx.version = version
        idx.record_search_defaults(version.manifest.get("search_defaults") or {})
        return idx


def publish(sources: list[store.Version], output, defaults: dict, keep: int = store.KEEP, **kw) -> FusedIndex:
    """The versions ``sources`` published as the members of a new version of ``output`` with the fusion ``defaults``
    recorded (files shared as hard links, nothing encoded); returns the fused index, opened to check them."""
    from retrctl.indexes import open_index

    idx = FusedIndex.of([open_index(v, **kw) for v in sources], [str(v.root) for v in sources])
    idx.record_search_defaults(defaults)
    with store.new_version(output, keep) as tmp:
        (tmp / MEMBERS).mkdir()
        for i, version in enumerate(sources):
            member = tmp / MEMBERS / str(i)
            member.mkdir()
            store.link_files(version, member)
            (member / store.MANIFEST).write_text(json.dumps(version.manifest, indent=2, ensure_ascii=False) + "\n")
        base.write_manifest(tmp, idx.manifest())
    return idx

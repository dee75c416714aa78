"""Query-side adaptation over a frozen index: only the query tower trains, against the stored passage vectors.

``train GROUPS --model M --passage-index IDX``: the documents were encoded once by ``M`` into the dense index
``IDX``; each step encodes the batch's queries with the model being trained and scores them against the index's
vectors of the group's passages (read by doc id, never re-encoded), so a step costs a few short queries' forward
and backward passes, not a corpus slice's. The loss is the run's usual one (``losses.group_loss``: the teacher's
scores distilled by KL or MarginMSE over each group, InfoNCE over the batch's passages), its passage side the
fixed vectors. The model saved is the query tower; the passage side stays the index's, which
``retrctl index IDX --query-model M`` records so that ``search`` encodes queries with it (LightRetriever's
asymmetric towers, Ma et al. 2025, arXiv:2505.12260: documents by one encoder, queries by another, one space).

Refused with exit 2 before any model is loaded: an index built by another model, a group naming a doc the index
lacks, a head other than dense (sparse, colbert, token lookup) or embedding distillation (their passage side is not
in the index); after loading, a model whose width or normalization differs from the index's.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from retrctl import records
from retrctl.errors import UsageError
from retrctl.train import losses
from retrctl.train.config import TrainConfig, parse_train_heads
from retrctl.train.loop import Trainer

log = logging.getLogger("retrctl.train")


def check_settings(cfg: TrainConfig) -> None:
    """What a query-side run cannot train: any part whose passage side the index does not hold."""
    if parse_train_heads(cfg.heads) != ["dense"] or cfg.query_encoder != "full":
        raise UsageError("--passage-index trains the dense query side only: drop --heads and --query-encoder",
                         flag="--passage-index")
    for flag, value in (("--embed-distill-weight", cfg.embed_distill_weight), ("--token-distill-weight",
                        cfg.token_distill_weight), ("--layer-distill-weight", cfg.layer_distill_weight)):
        if value:
            raise UsageError(f"{flag} regresses passages onto a teacher's; with --passage-index they are the index's",
                             flag="--passage-index")


class PassageVectors:
    """A dense index's stored vectors by doc id, as a tensor on the training device (read once, held all run)."""

    def __init__(self, directory: str, device: str):
        from retrctl.indexes.dense import stored_vectors

        manifest, docids, vectors = stored_vectors(directory)
        self.directory, self.dim, self.normalized = directory, int(manifest["dim"]), manifest.get("normalized")
        self.pos = {d: i for i, d in enumerate(docids)}
        self.vectors = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(device)

    def rows(self, docids: list[str]) -> torch.Tensor:
        return self.vectors[torch.tensor([self.pos[d] for d in docids], dtype=torch.long, device=self.vectors.device)]

    def check_groups(self, source) -> None:
        """Every doc a group names, and the corpus when negatives are drawn from it, is in the index (exit 2)."""
        for line, g in source:
            for field in ("positive_document_ids", "negative_document_ids"):
                missing = [d for d in g[field] if d not in self.pos]
                if missing:
                    raise records.RecordError(source.path, line, field, f"doc {missing[0]!r} is not in the passage "
                                              f"index {self.directory} (index the corpus the groups were mined from)")
        if source.without_negatives:
            missing = [d for d in source.corpus if d not in self.pos]
            if missing:
                raise UsageError(f"groups without negatives draw them from --corpus, but {len(missing)} of its docs "
                                 f"(e.g. {missing[0]!r}) are not in {self.directory}", flag="--passage-index")


class QuerySideTrainer(Trainer):
    """``Trainer`` with the passage side read from a dense index: each step encodes its queries only."""

    ENCODES_PASSAGES = False

    @classmethod
    def check(cls, cfg: TrainConfig, output, **kw) -> None:
        """What a query tower cannot train, an index built by another model, then ``Trainer``'s checks."""
        check_settings(cfg)
        from retrctl.indexes.encoded import manifest_model

        built_by = cls._index_model(cfg.passage_index) if cfg.model else None
        if cfg.model and manifest_model(cfg.model) != built_by:
            raise UsageError(f"{cfg.passage_index} was built by {built_by}, not {manifest_model(cfg.model)}: the query "
                             "tower starts from the model that encoded the passages", flag="--passage-index")
        super().check(cfg, output, **kw)

    @staticmethod
    def _index_model(directory: str) -> str:
        from retrctl.indexes import store

        return str(store.resolved(directory).manifest.get("encoder", {}).get("model"))

    def _read_data(self, groups, corpus) -> int:
        per_epoch = super()._read_data(groups, corpus)
        self.passages = PassageVectors(self.cfg.passage_index, self.dist.device)
        self.passages.check_groups(self.source)
        log.info("passage side: %d stored vectors of %s (dim %d), never re-encoded", len(self.passages.pos),
                 self.cfg.passage_index, self.passages.dim)
        return per_epoch

    def _plan_memory(self):
        if self.enc.dim != self.passages.dim or bool(self.enc.config.normalize) != bool(self.passages.normalized):
            raise UsageError(f"{self.cfg.passage_index} holds {self.passages.dim}-dim vectors (normalized: "
                             f"{self.passages.normalized}); the model gives {self.enc.dim} (normalized: "
                             f"{self.enc.config.normalize})", flag="--passage-index")
        return super()._plan_memory()

    def step(self, batch: list, first: bool) -> dict:
        cfg, rank = self.cfg, self.dist.rank
        queries, _, loss_fn, mask = self.objective(batch)
        b = len(batch) // self.dist.world
        passages = self.passages.rows([key[0] for e in batch[rank * b : (rank + 1) * b] for key in e.keys])
        pad = first and cfg.first_step_max_len
        qc, qinv = losses.sorted_chunks(self._tokenize(queries, "query", pad), self.plan.chunk_size, not pad)
        embed_q = functools.partial(self.engine.forward, kind="query", layout=self.layout)

        def query_loss(q, _p=None):
            return loss_fn(self.layout.split(q[qinv.to(q.device)], passages))

        if self.plan.grad_cache:
            loss, parts = losses.grad_cache_step(embed_q, qc, [], query_loss, self.engine.backward)
        else:
            loss, parts = query_loss(torch.cat([embed_q(c) for c in qc]))
            self.engine.backward(loss)
            loss = loss.detach()
        return self.finish_step(loss, parts, mask)

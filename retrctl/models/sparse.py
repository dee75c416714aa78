"""The sparse head: SPLADE term weights over the model's vocabulary (Formal et al. 2021, "SPLADE v2",
arXiv:2109.10086), as LightRetriever (arXiv:2505.12260) uses it for the document side.

A text's weight for vocabulary term j is ``max_i log(1 + ReLU(h_i · E_j))`` over its real, non-special tokens i,
where ``E`` is the model's input embedding matrix: for a decoder with tied embeddings (SmolLM2) that *is* its LM
head; an encoder without an MLM head (all-MiniLM-L6-v2 ships none) gets the MLM head tied to its input embeddings,
so the head starts from the model's own token geometry, never from random weights. Special tokens (CLS/SEP, BOS
— an attention sink that otherwise dominates every doc) are left out of the max and get weight 0.

Because ``log1p∘ReLU`` is monotone, the max is taken over the logits first and the projection is computed one
vocabulary slice at a time: memory holds [batch, tokens, slice], not [batch, tokens, vocab] (``chunk`` columns).

Queries: ``query="tokens"`` (LightRetriever's asymmetric mode) — a query's vector is the count of each of its
tokens, no encoder at all; ``query="encoder"`` (symmetric SPLADE) — queries go through the head like documents.
Encoded doc vectors keep their ``top_k`` largest terms (0 = all).

``weights="lexical"``: BGE-M3's lexical head (arXiv:2402.03216, Eq. 2) instead of SPLADE's: each real, non-special
token i gets one weight w_i = ReLU(W_lex^T h_i) (``Linear(hidden, 1)``), placed at its own token id, the max kept
when a term repeats; s_lex = Σ over shared terms of w_qt·w_pt. No vocabulary projection, no expansion; queries go
through the head too (symmetric). Same rows, index and search as SPLADE's weights.

The SPLADE head has no weights of its own (the projection is the backbone's embedding matrix, saved with it); the
lexical head's ``Linear`` is ``sparse/lexical.safetensors``. Settings are ``sparse/config.json`` in the model dir,
which stock sentence-transformers loading ignores; the head writes both and rebuilds itself from them (``save`` /
``load``, the pair every head has: models/heads.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from retrctl.models.config import EncoderConfig
from retrctl.models.heads import Head, real_tokens

SPARSE_DIR = "sparse"
QUERY_MODES = ("tokens", "encoder")
WEIGHTS = ("splade", "lexical")
LEXICAL_FILE = "lexical.safetensors"


class MaxOverTokens(torch.autograd.Function):
    """``max_t (h @ W.T)[b, t, j]`` over the kept tokens, one vocabulary slice of ``chunk`` terms at a time. Only the
    winning token of each (text, term) is kept for backward ([B, vocab] indices), where autograd's ``amax`` would
    keep every slice's [B, T, chunk] logits — the whole [B, T, vocab] again. Backward spreads each term's gradient
    to its winning token one slice at a time, so neither pass holds more than one slice."""

    @staticmethod
    def forward(ctx, h, weight, keep, chunk: int):
        tops, winners = [], []
        for start in range(0, weight.size(0), chunk):
            logits = (h @ weight[start : start + chunk].T).masked_fill(~keep[:, :, None], float("-inf"))
            top, winner = logits.max(dim=1)
            tops.append(top)
            winners.append(winner)
        ctx.save_for_backward(h, weight, torch.cat(winners, dim=1))
        ctx.chunk = chunk
        return torch.cat(tops, dim=1)

    @staticmethod
    def backward(ctx, grad):
        h, weight, winners = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[:2]
        grad_h = torch.zeros_like(h) if want_h else None
        grad_w = torch.zeros_like(weight) if want_w else None
        flat_h = h.reshape(-1, h.size(-1))
        for start in range(0, weight.size(0), ctx.chunk):
            end = start + ctx.chunk
            g = grad[:, start:end].to(h.dtype)  # each (text, term)'s gradient, placed at its winning token
            spread = h.new_zeros(h.size(0), h.size(1), g.size(1)).scatter_(1, winners[:, None, start:end], g[:, None, :])
            if want_h:
                grad_h += spread @ weight[start:end]
            if want_w:
                grad_w[start:end] = spread.reshape(-1, g.size(1)).T @ flat_h
        return grad_h, grad_w, None, None


class SparseHead(Head):
    name = "sparse"

    def __init__(self, config: EncoderConfig, embeddings: torch.nn.Embedding, special_ids, *, top_k: int = 256,
                 query: str = "tokens", chunk: int = 8192, weights: str = "splade"):
        super().__init__(config)
        if query not in QUERY_MODES:
            raise ValueError(f"sparse query mode must be one of {', '.join(QUERY_MODES)}, got {query!r}")
        if weights not in WEIGHTS:
            raise ValueError(f"sparse weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        self.weights = weights
        if weights == "lexical":  # BGE-M3's sparse_linear; zero bias, small weights: every term starts near 0
            self.linear = torch.nn.Linear(embeddings.weight.size(1), 1)
            torch.nn.init.normal_(self.linear.weight, std=embeddings.weight.size(1) ** -0.5)
            torch.nn.init.constant_(self.linear.bias, 0.0)
        if top_k < 0:
            raise ValueError(f"sparse top-k must be 0 (all terms) or positive, got {top_k}")
        self._embeddings = [embeddings]  # a list: the backbone owns (and saves) these weights, not the head
        self.special_ids = sorted({int(i) for i in special_ids if i is not None})
        self.top_k, self.query, self.chunk = int(top_k), query, int(chunk)

    @property
    def weight(self) -> torch.Tensor:
        return self._embeddings[0].weight

    @property
    def vocab(self) -> int:
        return self.weight.size(0)

    def dim(self, hidden_size: int) -> int:
        return self.vocab

    def settings(self) -> dict:
        if self.weights == "lexical":
            return {"top_k": self.top_k, "query": self.query, "weights": "lexical"}
        return {"top_k": self.top_k, "query": self.query, "projection": "input-embeddings"}

    def term_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Positions that may give a term weight: real tokens that are not special tokens."""
        return real_tokens(input_ids, attention_mask, self.special_ids)

    def forward(self, hidden_states, attention_mask, input_ids=None):
        """[B, vocab] float32 term weights, with gradients; the projection one vocabulary slice at a time."""
        keep = self.term_mask(input_ids, attention_mask)
        if self.weights == "lexical":
            return self.lexical(hidden_states, keep, input_ids)
        empty = ~keep.any(1)
        top = MaxOverTokens.apply(hidden_states.to(self.weight.dtype), self.weight, keep, self.chunk).float()
        top = top.masked_fill(empty[:, None], 0.0)  # a text of special tokens only: no terms
        weights = torch.log1p(torch.relu(top))
        if self.special_ids:
            weights = weights.index_fill(1, torch.tensor(self.special_ids, device=weights.device), 0.0)
        return weights

    def lexical(self, hidden_states, keep, input_ids):
        """BGE-M3: ReLU(W_lex^T h_i) per kept token, scattered to its token id, max over repeats ([B, vocab])."""
        w = torch.relu(self.linear(hidden_states.to(self.linear.weight.dtype))).squeeze(-1).float() * keep
        out = torch.zeros((w.size(0), self.vocab), dtype=w.dtype, device=w.device)
        return out.scatter_reduce(1, input_ids, w, reduce="amax", include_self=True)

    def naive(self, hidden_states, attention_mask, input_ids):
        """The textbook formula, [B, T, vocab] at once: what ``forward`` must equal (tests)."""
        keep = self.term_mask(input_ids, attention_mask)
        w = torch.log1p(torch.relu(hidden_states.float() @ self.weight.float().T)) * keep[:, :, None]
        w = w.amax(dim=1)
        return w.index_fill(1, torch.tensor(self.special_ids), 0.0) if self.special_ids else w

    def similarity(self, q, p):
        return q @ p.T  # dot product of term weights

    # -- sparse rows as (term ids, weights), top-k per row

    def keep_top(self, weights: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """[B, vocab] weights → (terms [B, k] int32, weights [B, k] float32), largest first, zero-padded."""
        k = self.vocab if not self.top_k else min(self.top_k, self.vocab)
        w, t = torch.topk(weights.float(), k, dim=1)
        return t.to(torch.int32).cpu().numpy(), w.cpu().numpy()

    def counts(self, tokenizer, texts: list[str], max_len: int) -> torch.Tensor:
        """[N, vocab] token counts of ``texts`` (the ``tokens`` query side, as a training target)."""
        return torch.from_numpy(to_csr(*token_counts(tokenizer, texts, max_len, self.special_ids), self.vocab).toarray())

    # -- saving: settings (and the lexical head's Linear) in its own folder, which stock loaders ignore

    def save(self, out: Path) -> dict:
        d = Path(out) / SPARSE_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(self.settings(), indent=2) + "\n")
        if self.weights == "lexical":
            from safetensors.torch import save_file

            save_file({k: v.detach().float().cpu().contiguous() for k, v in self.linear.state_dict().items()},
                      str(d / LEXICAL_FILE))
        return {}

    @classmethod
    def load(cls, root: Path, enc) -> SparseHead | None:
        path = Path(root) / SPARSE_DIR / "config.json"
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        head = enc.add_sparse_head(**{k: saved[k] for k in ("top_k", "query", "weights") if k in saved})
        if head.weights == "lexical":
            from safetensors.torch import load_file

            head.linear.load_state_dict(load_file(str(path.parent / LEXICAL_FILE)))
        return head


def token_counts(tokenizer, texts: list[str], max_len: int, special_ids) -> tuple[np.ndarray, np.ndarray]:
    """LightRetriever's sparse query: each text's token ids (no prompt, no special tokens, at most ``max_len``)
    counted; as (terms [N, k], counts [N, k]) rows, zero-padded. No model runs."""
    special = set(special_ids)
    rows = []
    for ids in tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_len)["input_ids"]:
        terms, counts = np.unique([i for i in ids if i not in special], return_counts=True)
        rows.append((terms, counts))
    k = max((len(t) for t, _ in rows), default=0) or 1
    terms = np.zeros((len(rows), k), np.int32)
    weights = np.zeros((len(rows), k), np.float32)
    for r, (t, c) in enumerate(rows):
        terms[r, : len(t)], weights[r, : len(t)] = t, c
    return terms, weights


def to_csr(terms: np.ndarray, weights: np.ndarray, vocab: int):
    """(terms, weights) rows → a scipy CSR matrix [N, vocab] (zero weights dropped)."""
    from scipy import sparse

    n = len(terms)
    m = sparse.csr_matrix((weights.ravel(), (np.repeat(np.arange(n), terms.shape[1]), terms.ravel())), shape=(n, vocab),
                          dtype=np.float32)
    m.eliminate_zeros()
    return m


def flops(weights: torch.Tensor) -> torch.Tensor:
    """SPLADE's FLOPS regulariser (Paria et al. 2020, arXiv:2004.05665): Σ_j (mean over the batch of w_j)²."""
    return weights.abs().mean(dim=0).pow(2).sum()

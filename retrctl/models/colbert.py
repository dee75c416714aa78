"""The multi-vector head: ColBERT's late interaction (Khattab & Zaharia 2020, arXiv:2004.12832) as BGE-M3 trains
it beside the dense and lexical heads (Chen et al. 2024, arXiv:2402.03216, Eq. 3).

Every real token i of a text gets E_i = norm(W^T h_i) (``Linear(hidden, dim)``, bias as BGE-M3's
``colbert_linear``; ``dim`` 128 as ColBERT by default); padding and special tokens (CLS/SEP, BOS/EOS) get no vector.
A query scores a passage by MaxSim averaged over the query's tokens: s_mul = (1/N) Σ_i max_j E_q[i]·E_p[j].

Saved as ``colbert/`` in the model dir: sentence-transformers' own ``Dense`` module layout (config.json +
model.safetensors, ``linear.weight``/``linear.bias``) plus ``retrctl_colbert.json`` (the dim and the skipped special
tokens), written and read back by the head itself (``save`` / ``load``, the pair every head has: models/heads.py), so ``retrctl export --format multi-vector-encoder`` assembles a stock ``MultiVectorEncoder`` from stock
modules (Transformer → Dense on token_embeddings → MultiVectorMask → Normalize). Stock ``SentenceTransformer(dir)``
ignores the folder (it is not in modules.json).

In training the head's output is a fixed-width block per text, [cap × dim] flattened with zero rows for padding
and masked tokens (``cap`` = the side's max length), so GradCache caches and splits it like one vector; the loss
tells real tokens from padding by their norm (real rows are unit vectors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from retrctl.models.config import EncoderConfig
from retrctl.models.heads import Head, real_tokens

COLBERT_DIR = "colbert"
SETTINGS_FILE = "retrctl_colbert.json"


class ColbertHead(Head):
    name = "colbert"

    def __init__(self, config: EncoderConfig, hidden_size: int, special_ids, dim: int = 128):
        super().__init__(config)
        if dim < 1:
            raise ValueError(f"the colbert dim must be positive, got {dim}")
        self.linear = torch.nn.Linear(hidden_size, dim)
        torch.nn.init.orthogonal_(self.linear.weight)  # keeps the backbone's token geometry (up to dim) from step 0
        torch.nn.init.zeros_(self.linear.bias)
        self.special_ids = sorted({int(i) for i in special_ids if i is not None})

    @property
    def out_dim(self) -> int:
        return self.linear.out_features

    def dim(self, hidden_size: int) -> int:
        return self.out_dim

    def token_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Positions that get a token vector: real tokens that are not special tokens."""
        return real_tokens(input_ids, attention_mask, self.special_ids)

    def forward(self, hidden_states, attention_mask, input_ids=None):
        """[B, T, dim] float32 unit token vectors, zero at padding and special tokens."""
        keep = self.token_mask(input_ids, attention_mask)
        vecs = torch.nn.functional.normalize(self.linear(hidden_states.to(self.linear.weight.dtype)).float(), dim=-1)
        return vecs * keep[:, :, None]

    def block(self, vecs: torch.Tensor, cap: int) -> torch.Tensor:
        """[B, T, dim] → [B, cap × dim]: the fixed-width training output (zero rows after the text's width)."""
        if vecs.size(1) > cap:
            raise ValueError(f"{vecs.size(1)} tokens exceed the colbert block's {cap}")
        return torch.nn.functional.pad(vecs, (0, 0, 0, cap - vecs.size(1))).flatten(1)

    def similarity(self, q, p):
        return maxsim(q, p)

    # -- saving: a stock sentence-transformers Dense module dir + our settings

    def save(self, out: Path) -> dict:
        from safetensors.torch import save_file

        d = Path(out) / COLBERT_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({
            "in_features": self.linear.in_features, "out_features": self.out_dim, "bias": True,
            "activation_function": "torch.nn.modules.linear.Identity", "module_input_name": "token_embeddings",
            "module_output_name": "token_embeddings"}, indent=2) + "\n")
        save_file({"linear.weight": self.linear.weight.detach().float().cpu().contiguous(),
                   "linear.bias": self.linear.bias.detach().float().cpu().contiguous()}, str(d / "model.safetensors"))
        (d / SETTINGS_FILE).write_text(json.dumps({"dim": self.out_dim, "special_ids": self.special_ids}, indent=2) + "\n")
        return {}  # not in modules.json: stock SentenceTransformer(dir) stays the dense model

    @classmethod
    def load(cls, root: Path, enc) -> ColbertHead | None:
        from safetensors.torch import load_file

        d = Path(root) / COLBERT_DIR
        if not (d / SETTINGS_FILE).exists():
            return None
        head = enc.add_colbert_head(dim=int(json.loads((d / SETTINGS_FILE).read_text())["dim"]))
        state = load_file(str(d / "model.safetensors"))
        with torch.no_grad():
            head.linear.weight.copy_(state["linear.weight"])
            head.linear.bias.copy_(state["linear.bias"])
        return head


def maxsim(q: torch.Tensor, p: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """[Q, Tq, d] query tokens × [P, Tp, d] passage tokens → [Q, P] MaxSim scores averaged over each query's real
    tokens. Zero rows are padding: they never win a max and do not count in the average. Passages one slice of
    ``chunk`` at a time, so memory holds [Q, Tq, chunk, Tp]."""
    q_real = q.norm(dim=-1) > 0  # [Q, Tq]
    p_real = p.norm(dim=-1) > 0  # [P, Tp]
    n = q_real.sum(1).clamp(min=1).to(q.dtype)
    out = []
    for s in range(0, p.size(0), chunk):
        tok = torch.einsum("qic,pjc->qipj", q, p[s : s + chunk])
        tok = tok.masked_fill(~p_real[s : s + chunk][None, None], float("-inf")).amax(-1)  # [Q, Tq, chunk]
        tok = torch.where(torch.isinf(tok), torch.zeros_like(tok), tok)  # a passage with no real token scores 0
        out.append((tok * q_real[:, :, None]).sum(1) / n[:, None])
    return torch.cat(out, dim=1) if out else q.new_zeros((q.size(0), 0))


def unflatten(block: torch.Tensor, dim: int) -> torch.Tensor:
    """[B, cap × dim] → [B, cap, dim]."""
    return block.view(block.size(0), -1, dim)


def maxsim_numpy(q: np.ndarray, docs: list[np.ndarray]) -> np.ndarray:
    """One query's token vectors [Tq, d] against each doc's [n_i, d]: the MaxSim scores (the reference for index
    code and tests). A doc with no tokens scores 0."""
    out = np.zeros(len(docs), np.float32)
    if not len(q):
        return out
    for i, d in enumerate(docs):
        if len(d):
            out[i] = float((q.astype(np.float32) @ d.astype(np.float32).T).max(1).mean())
    return out

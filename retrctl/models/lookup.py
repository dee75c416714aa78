"""LightRetriever's token-lookup query encoder (Ma et al., 2025): the full model encodes documents; a query is
the mean of per-token vectors looked up in a table, so serving a query loads no transformer at all.

Each query token is encoded **with the query instruction and nothing else**: in one forward pass over
``[prefix] + query tokens`` a 4-D mask lets every query token see the prefix and itself only, and every query
token sits at the same position (right after the prefix), so token t's vector depends on t alone — exactly what
encoding ``[prefix, t]`` gives. The token's own last hidden state is its vector (the paper's per-token last
pooling); the query vector is their mean, then the dense head's finish (Matryoshka cut, L2 norm).

- ``prefix``: the tokens a query starts with before its text (BOS/[CLS] + the query prompt), taken from the same
  tokenization the full encoder uses, so training, the table and serving cut queries alike.
- ``token_vectors``: the masked forward (training, and the table in chunks of the vocabulary).
- ``build_table`` / ``save_table``: every vocabulary token once, into ``token_lookup/table.npy`` [vocab, hidden]
  (float32: the served vector equals the masked forward to 1e-5) + ``token_lookup/config.json``. The dense-only
  layout beside it is untouched, so stock ``SentenceTransformer(dir)`` still loads the full model.
- ``TokenLookup``: the table as one of an encoder's heads (``Encoder.token_lookup``, set when loaded with a table or
  trained for one), with the ``save`` / ``load`` pair every head has (models/heads.py): ``Encoder.save`` writes the
  table through it, from the weights as saved, and ``Encoder.load`` finds it again.
- ``TokenLookupEncoder``: tokenize → look up → average → finish; the surface the dense index uses to encode
  queries (``encode``, ``describe``, ``dim``, ``config``, ``report_truncation``).

The prefix attends to itself only (never to the query token), causal or bidirectional as the model runs, so one
prefix pass is shared by every token of a query and the table needs nothing per token but its own row.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from pathlib import Path

import numpy as np

from retrctl.errors import UsageError
from retrctl.models.config import EncoderConfig

log = logging.getLogger("retrctl.models")

TABLE_DIR = "token_lookup"
TABLE_FILE = "table.npy"


def has_table(model_dir) -> bool:
    return (Path(str(model_dir)) / TABLE_DIR / TABLE_FILE).is_file()


def suffix_len(tok, eos: bool) -> int:
    """Tokens ``backbone.Tokenizer`` puts after a text: the tokenizer's own specials (BERT's [SEP]), + EOS for eos
    pooling when they do not end with it."""
    n = len(tok.suffix)
    eos_id = tok.tokenizer.eos_token_id
    return n + (1 if eos and eos_id is not None and (not tok.suffix or tok.suffix[-1] != eos_id) else 0)


def prefix_and_tokens(tok, prompt: str, max_len: int, eos: bool, texts: list[str],
                      prefix: list[int] | None = None) -> tuple[list[int], list[list[int]]]:
    """(prefix ids, each text's query token ids) as the full encoder tokenizes ``prompt + text``
    (``backbone.Tokenizer``: the same cut, counted in ``tok.truncated``) minus the prefix, the suffix and any
    special token. No tensors: this is the whole of a token-lookup query's tokenization. ``prefix``: known
    already (the empty text's tokens), so it is not tokenized again."""
    n_own, n_suffix = len(tok.suffix), suffix_len(tok, eos)
    ids = token_ids(tok.tokenizer, [prompt + t for t in [*texts, *([""] if prefix is None else [])]], max_len + 1)
    bodies = []
    for row in ids:
        body = row[: len(row) - n_own] if n_own else row
        if len(body) + n_suffix > max_len:
            tok.truncated["query"] += 1
            body = body[: max_len - n_suffix]
        bodies.append(body)
    if prefix is None:
        prefix = bodies.pop()  # the empty text's
    return prefix, query_tokens(tok, prefix, bodies)


def token_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """``tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]``, read straight from the Rust tokenizer
    once such a call has left it set up so (that truncation, no padding): on short queries the Python BatchEncoding
    costs more than the tokenizing itself, and a token-lookup query is little else."""
    from transformers import PreTrainedTokenizerBase

    backend = getattr(tokenizer, "_tokenizer", None) if isinstance(tokenizer, PreTrainedTokenizerBase) else None
    fast = getattr(backend, "encode_batch_fast", None)
    want = {"max_length": max_length, "stride": 0, "strategy": "longest_first",
            "direction": getattr(tokenizer, "truncation_side", "right")}
    trunc = getattr(backend, "truncation", None) or {}
    if (fast is None or backend.padding is not None or {k: trunc.get(k) for k in want} != want
            or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))):
        return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    return [e.ids for e in fast(texts)]


def query_tokens(tok, prefix: list[int], bodies: list[list[int]]) -> list[list[int]]:
    """Each row's ids after the prefix, special tokens left out (rows already cut of their suffix)."""
    special = set(tok.tokenizer.all_special_ids)
    return [[t for t in b[len(prefix):] if t not in special] for b in bodies]


def prefix_sees_itself(model, bidirectional: bool) -> bool:
    """The prefix's attention among itself: full for encoders and bidirectional decoders, causal otherwise."""
    from retrctl.models.backbone import is_decoder

    return bidirectional or not is_decoder(model.config)


def masked_batch(prefix: list[int], tokens: list[list[int]], pad_id: int, full_prefix: bool, dtype, device):
    """Inputs for the per-token forward: ids [B, P+N], a 4-D additive mask [B, 1, L, L] (prefix → prefix, causal
    unless ``full_prefix``; query token → prefix + itself; padding → itself), positions (query tokens all at P),
    and the [B, N] mask of real query tokens."""
    import torch

    p, n = len(prefix), max((len(t) for t in tokens), default=0)
    length = p + max(n, 1)
    ids = torch.full((len(tokens), length), pad_id, dtype=torch.long)
    real = torch.zeros(len(tokens), max(n, 1), dtype=torch.bool)
    for i, t in enumerate(tokens):
        ids[i, :p] = torch.tensor(prefix, dtype=torch.long)
        if t:
            ids[i, p : p + len(t)] = torch.tensor(t, dtype=torch.long)
            real[i, : len(t)] = True
    allowed = torch.eye(length, dtype=torch.bool)
    allowed[:p, :p] = True if full_prefix else torch.ones(p, p, dtype=torch.bool).tril()
    allowed[p:, :p] = True
    mask = torch.zeros(length, length, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = torch.cat([torch.arange(p), torch.full((length - p,), p)])
    return {"input_ids": ids.to(device), "attention_mask": mask.expand(len(tokens), 1, length, length).to(device),
            "position_ids": positions.expand(len(tokens), length).to(device)}, real.to(device)


def token_vectors(model, batch: dict, prefix_len: int):
    """[B, N, H] float32 hidden states of the query tokens (each as if encoded alone with the prefix)."""
    return model(**batch).last_hidden_state[:, prefix_len:].float()


def mean_of_tokens(vectors, real):
    m = real.unsqueeze(-1).to(vectors.dtype)
    return (vectors * m).sum(1) / m.sum(1).clamp(min=1.0)


def lookup_forward(enc, batch: dict):
    """The token-lookup query vectors (raw: not yet cut or normalized) of a query batch tokenized by ``enc``
    for the full encoder, with gradients: what training's auxiliary query encoder computes."""
    rows = [ids[m.bool()].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
    prefix = query_prefix(enc)
    n_suffix = suffix_len(enc._tok, enc.config.pooling == "eos")
    tokens = query_tokens(enc._tok, prefix, [r[: len(r) - n_suffix] for r in rows])
    inputs, real = masked_batch(prefix, tokens, enc.tokenizer.pad_token_id, prefix_sees_itself(enc.model, enc.config.bidirectional),
                                _float(enc), enc.device)
    return mean_of_tokens(token_vectors(enc.model, inputs, len(prefix)), real)


def query_prefix(enc) -> list[int]:
    return prefix_and_tokens(enc._tok, enc.config.query_prompt, enc.config.query_max_len, enc.config.pooling == "eos", [])[0]


def check_prefix(enc) -> None:
    """ValueError when a query token would see nothing but itself: with no prompt and no BOS/CLS (SmolLM2's tokenizer
    adds none) each table row is a token's state at position 0, which a decoder makes nearly the same for every
    token (SmolLM2: mean pairwise cosine 0.985; a lent-H100 run reached nDCG@10 0.0011). LightRetriever always
    encodes the tokens under its instruction."""
    if not query_prefix(enc):
        raise ValueError("--query-encoder token-lookup: this model's queries have no prefix (no --query-prompt, and its "
                         "tokenizer adds no BOS/CLS), so each query token would be encoded alone; give the instruction "
                         "as LightRetriever does, e.g. --query-prompt 'Given a claim, find documents that support or refute it. Query: '")


def _float(enc):
    import torch

    dtype = next(enc.model.parameters()).dtype
    return dtype if dtype.is_floating_point else torch.float32


def build_table(enc, batch_size: int = 16, tokens_per_row: int = 256, progress=None) -> np.ndarray:
    """[vocab, hidden] float32: every vocabulary token's vector, computed by the masked forward in rows of
    ``tokens_per_row`` tokens (one row = one prefix pass shared by its tokens)."""
    import torch

    prefix = query_prefix(enc)
    vocab = min(len(enc.tokenizer), enc.model.get_input_embeddings().num_embeddings)
    ids = list(range(vocab))
    rows = [ids[i : i + tokens_per_row] for i in range(0, vocab, tokens_per_row)]
    table = np.zeros((vocab, enc.model.config.hidden_size), dtype=np.float32)
    full_prefix = prefix_sees_itself(enc.model, enc.config.bidirectional)
    starts = range(0, len(rows), batch_size)
    if progress is not None:
        starts = progress(starts, total=len(starts))
    was = enc.training
    enc.eval()
    with torch.inference_mode():
        for s in starts:
            chunk = rows[s : s + batch_size]
            inputs, _ = masked_batch(prefix, chunk, enc.tokenizer.pad_token_id, full_prefix, _float(enc), enc.device)
            vecs = token_vectors(enc.model, inputs, len(prefix))
            for r, toks in zip(vecs, chunk, strict=True):
                table[toks] = r[: len(toks)].cpu().numpy()
    enc.train(was)
    return table


def save_table(enc, out: Path, progress=None) -> Path:
    """Write ``out/token_lookup/`` (table.npy + config.json) for a trained model dir ``out``."""
    import time

    t0 = time.perf_counter()
    table = build_table(enc, progress=progress)
    d = Path(out) / TABLE_DIR
    d.mkdir(exist_ok=True)
    np.save(d / TABLE_FILE, table)
    prefix = query_prefix(enc)
    (d / "config.json").write_text(json.dumps({
        "method": "LightRetriever token lookup", "vocab": int(table.shape[0]), "hidden": int(table.shape[1]),
        "prefix_ids": prefix, "query_prompt": enc.config.query_prompt, "bidirectional": enc.config.bidirectional,
        "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    log.info("token-lookup table %s: %d tokens × %d in %.0f s", d, table.shape[0], table.shape[1], time.perf_counter() - t0)
    return d


class TokenLookup:
    """The token-lookup table of the encoder ``enc`` as one of its heads: nothing in memory (the table is computed
    from the backbone's weights), its own folder of a model dir to write and to find again."""

    def __init__(self, enc):
        self.enc = enc

    def save(self, out: Path) -> dict:
        """Build the table from the model dir ``out`` as saved (its weights and settings, written first) and reloaded
        by the encoder's own class, so it is the table a reader of ``out`` serves, never one of unsaved weights."""
        save_table(type(self.enc).load(out, device="cpu"), out)
        return {}

    @classmethod
    def load(cls, root: Path, enc) -> TokenLookup | None:
        return cls(enc) if has_table(root) else None


class TokenLookupEncoder:
    """Queries by table lookup (no transformer); a model dir's ``token_lookup/`` + its tokenizer and settings."""

    def __init__(self, path: Path, tokenizer, config: EncoderConfig, table: np.ndarray, source: str = ""):
        from retrctl.models import backbone

        self.path, self.config, self.table, self.source = path, config, table, source or str(path)
        self.tokenizer = tokenizer
        self._tok = backbone.Tokenizer(tokenizer)
        self.truncated = self._tok.truncated
        self.prefix = query_prefix(self)  # tokenized once: every query starts with it

    @classmethod
    def load(cls, model_dir, **overrides) -> TokenLookupEncoder:
        from transformers import AutoTokenizer

        from retrctl.models import loading

        root = loading.resolve(model_dir)
        if not has_table(root):
            raise ValueError(f"{model_dir}: no token-lookup table ({TABLE_DIR}/{TABLE_FILE}); train with "
                             "--query-encoder token-lookup, or search with --query-encoder full")
        weights, settings = loading.saved_settings(root)
        settings.update({k: v for k, v in overrides.items() if v is not None})
        config = EncoderConfig.from_settings(settings)
        # read into memory, not mapped: a mapped table is page cache, which a memory-hungry neighbour (a full
        # encoder's batch) evicts, and every query then pays the disk again
        table = np.load(root / TABLE_DIR / TABLE_FILE)
        enc = cls(root, AutoTokenizer.from_pretrained(str(weights)), config, table, source=str(model_dir))
        built = json.loads((root / TABLE_DIR / "config.json").read_text())
        if built.get("prefix_ids") != enc.prefix:  # every token vector was computed under the prompt it was built with
            raise UsageError(f"{model_dir}: its token table was built with query prompt {built.get('query_prompt')!r}, "
                             f"not {config.query_prompt!r} (search with --query-encoder full to use another prompt)")
        return enc

    @property
    def dim(self) -> int:
        return self.config.dims or self.table.shape[1]

    def encode(self, texts: list[str], kind: str = "query", batch_size: int = 0, progress=None) -> np.ndarray:
        if kind != "query":
            raise ValueError("a token-lookup encoder encodes queries only (documents need the full model)")
        _, tokens = prefix_and_tokens(self._tok, self.config.query_prompt, self.config.query_max_len,
                                      self.config.pooling == "eos", list(texts), self.prefix)
        if len(tokens) == 1:  # one online query: a gather and a mean (building a CSR matrix costs more)
            ids = [t for t in tokens[0] if t < self.table.shape[0]]
            out = self.table[ids].mean(0, keepdims=True) if ids else np.zeros((1, self.table.shape[1]), np.float32)
        else:  # one sparse × dense product: 8× numpy's segmented sum at 300 queries
            out = np.asarray(self.bag(tokens) @ self.table, dtype=np.float32)
        if self.config.dims:
            out = out[:, : self.config.dims]
        if self.config.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def bag(self, tokens: list[list[int]]):
        """[queries, vocab] CSR of each query's mean over its tokens (ids past the table, added tokens, left out)."""
        from scipy import sparse

        rows = self.table.shape[0]
        counts = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=int(counts.sum()))
        row = np.repeat(np.arange(len(tokens)), counts)
        keep = flat < rows
        flat, row = flat[keep], row[keep]
        counts = np.bincount(row, minlength=len(tokens))
        weights = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)
        return sparse.csr_matrix((weights, flat, np.concatenate([[0], np.cumsum(counts)])), shape=(len(tokens), rows))

    def describe(self) -> dict:
        return {"model": self.source, **dataclasses.asdict(self.config), "dim": self.dim, "query_encoder": "token-lookup"}

    def report_truncation(self, total: dict | None = None) -> None:
        if self.truncated["query"]:
            log.warning("%d queries cut to %d tokens", self.truncated["query"], self.config.query_max_len)

"""The backbone: a transformer and its tokenizer. Token ids in, hidden states out, attention mode set.

Tokenizing keeps the special tokens the tokenizer appends (BERT's [SEP]) when a text is cut, counts every cut
(silent truncation is a peer bug, ST#4060), and appends EOS explicitly for ``eos`` pooling (ST#2591, mteb#5237).
Bidirectional attention for decoders (DRAMA, LLM2Vec) is transformers' ``config.is_causal``. The pad-token fix
and the padding helper are shared with the LLM backends (llm.py).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("retrctl.models")


def ensure_pad_token(tokenizer):
    """Decoders (Llama) often ship without a pad token: pad with EOS (or UNK); the mask hides it."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def pad_ids(rows: list[list[int]], pad_id: int, left: bool, width: int | None = None) -> dict:
    """Lists of token ids as {"input_ids", "attention_mask"} (long tensors), padded on the left or right to the
    longest row, or to ``width`` when that is longer."""
    width = max([len(r) for r in rows] + [width or 0])
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if left else slice(0, len(r))
        input_ids[i, sl] = torch.tensor(r, dtype=torch.long)
        mask[i, sl] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def is_decoder(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return bool(getattr(config, "is_decoder", False)) or any(a.endswith("ForCausalLM") for a in archs)


def set_bidirectional(model_config, on: bool, source: str = "") -> None:
    """Bidirectional attention for decoders: transformers reads config.is_causal."""
    if is_decoder(model_config) or hasattr(model_config, "is_causal"):
        model_config.is_causal = not on
    elif on:
        log.debug("%s is an encoder; attention is already bidirectional", source)


def set_attention_dropout(model, p: float) -> int:
    """Dropout on the attention probabilities of every attention module set to ``p`` in place (the config, which
    the saved model keeps, is left alone); returns the modules set. Decoders and ModernBERT pass a float
    ``attention_dropout`` to the attention function; BERT-family self-/cross-attention applies its ``dropout``.
    With dropout on, CPU attention falls back from the fused kernel to the math path."""
    n = 0
    for m in model.modules():
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = float(p)
        elif type(m).__name__.endswith(("SelfAttention", "CrossAttention")) and isinstance(getattr(m, "dropout", None), torch.nn.Dropout):
            m.dropout.p = float(p)
        else:
            continue
        n += 1
    return n


def hidden_states(model, batch: dict) -> torch.Tensor:
    return model(**batch).last_hidden_state


def every_hidden_state(model, batch: dict) -> tuple[torch.Tensor, ...]:
    """The embeddings' output, then each block's (the last one as ``hidden_states`` gives it): [B, T, H] each."""
    return model(**batch, output_hidden_states=True).hidden_states


class Tokens(dict):
    """A tokenized batch ({"input_ids", "attention_mask"}) that remembers the side it was made for."""

    def __init__(self, tensors: dict, kind: str):
        super().__init__(tensors)
        self.kind = kind


def with_cls_every(body: list[int], every: int, cls: int) -> list[int]:
    """``body`` (starting with CLS, as BERT tokenizes) with another CLS after every ``every`` text tokens."""
    head, text = (body[:1], body[1:]) if body and body[0] == cls else ([cls], body)
    out = list(head)
    for i in range(0, len(text), every):
        if i:
            out.append(cls)
        out.extend(text[i : i + every])
    return out


class Tokenizer:
    """Texts to padded token ids under a prompt and a length cap, cuts counted per side."""

    def __init__(self, tokenizer):
        self.tokenizer = ensure_pad_token(tokenizer)
        self.suffix = self._suffix()
        self.truncated = {"query": 0, "passage": 0}

    def _suffix(self) -> list[int]:
        """Special tokens the tokenizer appends after the text (e.g. BERT's [SEP]), kept when cutting."""
        ids = self.tokenizer("a")["input_ids"]
        special = set(self.tokenizer.all_special_ids)
        n = 0
        while n < len(ids) and ids[len(ids) - 1 - n] in special:
            n += 1
        return ids[len(ids) - n :] if n else []

    def __call__(self, texts: list[str], kind: str, prompt: str, max_len: int, eos: bool, width: int | None = None,
                 mcls: int | None = None) -> Tokens:
        """Token ids, cut to ``max_len`` (counted), EOS appended when ``eos``, padded on the tokenizer's side (to the
        longest text, or to ``width`` when that is longer). ``mcls``: a CLS token after every ``mcls`` tokens of the
        text (BGE-M3's MCLS), the inserted ones counted in ``max_len``."""
        suffix = list(self.suffix)
        if eos:
            eos_id = self.tokenizer.eos_token_id
            if eos_id is None:
                raise ValueError("pooling 'eos' needs a tokenizer with an EOS token")
            if not suffix or suffix[-1] != eos_id:
                suffix = suffix + [eos_id]
        cls = self.tokenizer.cls_token_id
        if mcls and cls is None:
            raise ValueError("--mcls needs a tokenizer with a CLS token")
        enc = self.tokenizer([prompt + t for t in texts], truncation=not mcls, max_length=max_len + 1)
        rows = []
        for ids in enc["input_ids"]:
            body = ids[: len(ids) - len(self.suffix)] if self.suffix else ids
            if mcls:
                body = with_cls_every(body, mcls, cls)
            if len(body) + len(suffix) > max_len:
                self.truncated[kind] += 1
                body = body[: max_len - len(suffix)]
            rows.append(body + suffix)
        return Tokens(pad_ids(rows, self.tokenizer.pad_token_id, self.tokenizer.padding_side == "left", width), kind)

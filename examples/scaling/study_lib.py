"""The scaling study (Portes et al.): the same minimal retrieval recipe applied to backbones of several sizes and
pretraining lengths, and average nDCG@10 set against parameters, pretraining tokens and FLOPs ≈ 6·N·D.

What this folder's study.py (called by its Makefile) needs besides the stages it runs, on retrctl's core: each backbone's parameter counts (total and
non-embedding, counted from the model's architecture), its pretraining tokens (from its config or card where
given, else a value the user sets), FLOPs, the cost estimate printed before a run, the collections cut to a
budget, one row per backbone (a failed backbone keeps its row, marked with the reason), the table, the
least-squares log-linear fit of average nDCG@10 on FLOPs and on parameters, and the plot of both.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

# ---------------------------------------------------------------- parameters, tokens, FLOPs


@dataclasses.dataclass(frozen=True)
class Params:
    total: int
    non_embedding: int  # total minus the embedding tables (token, position, token type), Kaplan et al.'s N
    layers: int


def count_parameters(model) -> Params:
    """The parameter counts of a model dir, a GGUF file or a shipped name, from its architecture alone.

    The backbone (``AutoModel``, no LM head) is built from its config on torch's meta device, so no weight is
    read and no memory is taken; tied tensors count once. A sentence-transformers dir counts its transformer."""
    import torch
    from transformers import AutoConfig, AutoModel

    from retrctl.models.loading import resolve, saved_settings

    weights, _ = saved_settings(resolve(model))
    config = AutoConfig.from_pretrained(str(weights))
    with torch.device("meta"):
        backbone = AutoModel.from_config(config)
    total = sum(p.numel() for p in backbone.parameters())
    embedding = sum(p.numel() for m in backbone.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False))
    return Params(total=total, non_embedding=total - embedding, layers=int(getattr(config, "num_hidden_layers", 0) or 0))


# config.json keys some model releases use for their pretraining budget, in tokens
TOKEN_KEYS = ("pretraining_tokens", "pretrain_tokens", "num_pretraining_tokens", "training_tokens")
_SCALE = {"t": 1e12, "trillion": 1e12, "b": 1e9, "billion": 1e9, "m": 1e6, "million": 1e6}
_CARD_TOKENS = re.compile(r"(?:pre-?trained|trained)\s+on\s+(?:about\s+|approximately\s+|~\s*)?([\d][\d.,]*)\s*"
                          r"(trillion|billion|million|T|B|M)\s+tokens", re.IGNORECASE)


def pretraining_tokens(model, fallback: float | None = None) -> tuple[float | None, str]:
    """(tokens, where the value came from): the model's config.json, then its card (README.md, "trained on 2
    trillion tokens"), else ``fallback`` (a value the user sets: "variable"), else (None, "unknown")."""
    from retrctl.models.loading import read_json, resolve, saved_settings

    try:
        root = resolve(model)
        weights, _ = saved_settings(root)
    except (FileNotFoundError, ValueError):
        root = weights = None
    if weights is not None:
        config = read_json(weights / "config.json")
        for key in TOKEN_KEYS:
            if isinstance(config.get(key), (int, float)) and config[key] > 0:
                return float(config[key]), "config"
        for card in {root / "README.md", weights / "README.md"}:
            if card.is_file():
                found = _CARD_TOKENS.search(card.read_text(errors="replace"))
                if found:
                    return float(found.group(1).replace(",", "")) * _SCALE[found.group(2).lower()], "card"
    if fallback:
        return float(fallback), "variable"
    return None, "unknown"


def training_flops(non_embedding: int | None, tokens: float | None) -> float | None:
    """Pretraining compute ≈ 6·N·D (N non-embedding parameters, D tokens); None when either is unknown."""
    return 6.0 * non_embedding * tokens if non_embedding and tokens else None


# ---------------------------------------------------------------- a cheap proxy: the base LM's loss on the corpus


def is_causal_lm(config) -> bool:
    """A family with a causal LM head and no masked-LM head (Llama, Qwen2, Mistral, …): its next-token loss is
    the loss it was pretrained on. BERT-family encoders (MiniLM) were pretrained on another loss and get none."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", "")
    return kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def lm_bits_per_byte(model, texts: list[str], max_len: int = 128, batch_size: int = 8) -> tuple[float | None, str]:
    """(bits per UTF-8 byte, ""), the untrained backbone's next-token loss on ``texts`` (each cut to ``max_len``
    tokens, run causally as pretrained): per byte, so models with different tokenizers compare; or (None, why) for
    a model that is no causal LM or whose checkpoint has no LM head (and ties none)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from retrctl.models.backbone import ensure_pad_token
    from retrctl.models.loading import resolve, saved_settings

    weights, _ = saved_settings(resolve(model))
    config = AutoConfig.from_pretrained(str(weights))
    if not is_causal_lm(config):
        return None, f"{config.model_type} is not a causal LM"
    lm, info = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32, output_loading_info=True)
    if any(k.startswith("lm_head") for k in info.get("missing_keys", ())) and not getattr(config, "tie_word_embeddings", False):
        return None, "no LM head in the checkpoint"
    tok = ensure_pad_token(AutoTokenizer.from_pretrained(str(weights)))
    tok.padding_side = "right"
    lm.eval()
    nats, n_bytes = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tok(texts[start:start + batch_size], truncation=True, max_length=max_len, padding=True, return_tensors="pt")
            logits = lm(**batch).logits[:, :-1].float()
            target, mask = batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:].bool()
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
            nats += float(loss[mask].sum())
            for ids, keep in zip(target, mask, strict=True):  # the bytes of the predicted tokens
                n_bytes += len(tok.decode(ids[keep], skip_special_tokens=True).encode("utf-8"))
    return (nats / math.log(2) / n_bytes, "") if n_bytes else (None, "no text to score")


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None with fewer than three pairs or a constant side."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if not sx or not sy:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


# ---------------------------------------------------------------- the cost estimate


@dataclasses.dataclass(frozen=True)
class Budget:
    """The reduced sizes of a run: what the estimate and the run read."""

    groups: int  # training groups (one epoch)
    group_size: int  # passages per group (a positive and its BM25 negatives)
    max_len: int  # token cap of queries and passages
    docs: int  # docs per collection
    queries: int  # queries per collection
    collections: int


# A GradCache step of 16 SmolLM2-135M groups at 128 tokens takes ~40 s on the 2-core CPU (bench/RESULTS.md), i.e.
# ~1e11 FLOP/s at 8·N FLOPs per trained token; each stage process also spends ~20 s importing torch and loading.
CPU_FLOPS = 1e11
STAGE_SECONDS = 20.0


def estimate_seconds(non_embedding: int, budget: Budget, flops_per_second: float = CPU_FLOPS,
                     stage_seconds: float = STAGE_SECONDS) -> float:
    """Seconds to train, index and search one backbone: 8·N FLOPs per trained token (forward, backward and
    GradCache's extra forward), 2·N per encoded token, passages at the cap and queries at half of it, attention
    ignored (short texts), plus the start of each stage process (train, then index and search per collection)."""
    query_tokens = budget.max_len / 2
    trained = budget.groups * (query_tokens + budget.group_size * budget.max_len)
    encoded = budget.collections * (budget.docs * budget.max_len + budget.queries * query_tokens)
    flops = 8 * non_embedding * trained + 2 * non_embedding * encoded
    return flops / flops_per_second + stage_seconds * (1 + 2 * budget.collections)


# ---------------------------------------------------------------- the collections, cut to the budget


def slice_collection(data: Path, out: Path, max_docs: int, max_queries: int, split: str = "test") -> Path:
    """A BEIR folder cut to its first ``max_queries`` judged queries (sorted ids), every doc they judge, then other
    docs in corpus order up to ``max_docs``: corpus.jsonl, queries.jsonl and qrels/test.tsv under ``out``."""
    from retrctl import records

    qrels = records.read_qrels(data, split)
    qids = sorted(qrels)[:max_queries]
    judged = {d for q in qids for d in qrels[q]}
    docs = list(records.read(data, "doc"))
    keep = [d for d in docs if d["docid"] in judged]
    keep += [d for d in docs if d["docid"] not in judged][: max(0, max_docs - len(keep))]
    wanted = set(qids)
    with records.atomic_dir(out, resume=False) as tmp:
        (tmp / "qrels").mkdir()
        records.write(keep, tmp / "corpus.jsonl")
        records.write([q for q in records.read(data, "query") if q["query_id"] in wanted], tmp / "queries.jsonl")
        rows = [f"{q}\t{d}\t{r}" for q in qids for d, r in qrels[q].items()]
        (tmp / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return out


# ---------------------------------------------------------------- rows


@dataclasses.dataclass
class Row:
    """One backbone's line of the table."""

    backbone: str
    status: str = "ok"  # ok | failed
    family: str = ""  # backbones fitted together (one pretraining recipe at several sizes and lengths); "" = the rest
    reason: str = ""
    params_total: int | None = None
    params_non_embedding: int | None = None
    tokens: float | None = None
    tokens_source: str = "unknown"
    flops: float | None = None
    ndcg: dict[str, float] = dataclasses.field(default_factory=dict)  # nDCG@10 per collection
    seconds: float | None = None  # wall time of train, index and search
    proxy: float | None = None  # the untrained backbone's LM loss on the corpus, bits per byte (lm_bits_per_byte)
    proxy_note: str = ""  # why there is none

    @property
    def average(self) -> float | None:
        return sum(self.ndcg.values()) / len(self.ndcg) if self.ndcg else None

    def write(self, path: Path) -> None:
        from retrctl import records

        with records.atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> Row:
        return cls(**json.loads(Path(path).read_text()))


def failure_reason(log: Path) -> str:
    """The last line a failed step wrote to stderr (retrctl's one-line error), make's own lines skipped."""
    if not log.is_file():
        return "no log"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    lines = [ln for ln in lines if not re.match(r"make(\[\d+\])?:", ln)]
    return lines[-1][:300] if lines else "failed with no message"


def nDCG_from_eval(path: Path) -> float:
    """nDCG@10 from `retrctl eval --json`'s one line."""
    return float(json.loads(Path(path).read_text().splitlines()[0])["nDCG@10"])


def build_row(backbone: str, model, *, status: str, work: Path, collections: list[str], log: Path | None = None,
              tokens_fallback: float | None = None, family: str = "") -> Row:
    """A backbone's row from its work dir (``COLLECTION.eval.json`` per collection, ``*.secs`` per timed step,
    ``proxy.json`` when the proxy was computed) and its model (counts and tokens). A failed backbone keeps what
    could be measured, and the reason."""
    row = Row(backbone=backbone, status=status, family=family)
    if status != "ok":
        row.reason = failure_reason(log) if log else "failed"
    try:
        params = count_parameters(model)
        row.params_total, row.params_non_embedding = params.total, params.non_embedding
    except Exception as err:  # a backbone that does not load keeps its row; the reason says why
        row.status, row.reason = "failed", row.reason or f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    row.tokens, row.tokens_source = pretraining_tokens(model, tokens_fallback)
    row.flops = training_flops(row.params_non_embedding, row.tokens)
    for name in collections:
        result = work / f"{name}.eval.json"
        if result.is_file():
            row.ndcg[name] = nDCG_from_eval(result)
    if row.status == "ok" and len(row.ndcg) < len(collections):
        row.status, row.reason = "failed", "no evaluation of " + ", ".join(c for c in collections if c not in row.ndcg)
    if (work / "proxy.json").is_file():
        proxy = json.loads((work / "proxy.json").read_text())
        row.proxy, row.proxy_note = proxy.get("bits_per_byte"), proxy.get("note", "")
    secs = [float(p.read_text()) for p in sorted(work.glob("*.secs"))]
    row.seconds = sum(secs) if secs else None
    return row


# ---------------------------------------------------------------- the table and the fit


def _sci(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}".replace("e+", "e")


def _si(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def table(rows: list[Row], collections: list[str]) -> str:
    """The study's table in Markdown: one line per backbone, failed ones included with their reason."""
    head = ["backbone", "status", "params (non-emb.)", "params (total)", "pretraining tokens", "FLOPs 6·N·D",
            "LM bits/byte", *[f"nDCG@10 {c}" for c in collections], "average", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        status = r.status if r.status == "ok" else f"failed: {r.reason}".replace("|", "/")
        tokens = f"{_sci(r.tokens)} ({r.tokens_source})" if r.tokens else r.tokens_source
        cells = [r.backbone, status, _si(r.params_non_embedding), _si(r.params_total), tokens, _sci(r.flops),
                 f"{r.proxy:.3f}" if r.proxy is not None else "—",
                 *[f"{r.ndcg[c]:.4f}" if c in r.ndcg else "—" for c in collections],
                 f"{r.average:.4f}" if r.average is not None and r.status == "ok" else "—",
                 f"{r.seconds:.0f}" if r.seconds is not None else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Fit:
    """average nDCG@10 = intercept + slope · log10(x), least squares over ``n`` backbones."""

    axis: str
    slope: float  # nDCG@10 gained per tenfold x
    intercept: float
    r2: float
    n: int

    def line(self, family: str = "") -> str:
        return (f"fit on {self.axis}{f' ({family})' if family else ''}: avg nDCG@10 = {self.intercept:+.4f} {self.slope:+.4f}·log10({self.axis}) "
                f"(slope {self.slope:+.4f} per decade, R² {self.r2:.3f}, {self.n} backbones)")


def _points(rows: list[Row], axis: str) -> list[tuple[float, float, str]]:
    value = {"FLOPs": lambda r: r.flops, "params": lambda r: r.params_non_embedding}[axis]
    return [(value(r), r.average, r.backbone) for r in rows if r.status == "ok" and value(r) and r.average is not None]


def loglinear_fit(rows: list[Row], axis: str) -> Fit | None:
    """Least-squares fit of average nDCG@10 on log10 of ``axis`` ("FLOPs" or "params", non-embedding) over the
    backbones that finished; None with fewer than two distinct x."""
    pts = _points(rows, axis)
    xs = [math.log10(x) for x, _, _ in pts]
    ys = [y for _, y, _ in pts]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return Fit(axis, slope, intercept, 1 - ss_res / ss_tot if ss_tot > 0 else 1.0, len(xs))


def families(rows: list[Row]) -> dict[str, list[Row]]:
    """The rows by family, in order of first appearance. A fit holds within one family only (Portes et al. fit one
    model family over its sizes and pretraining lengths): a finished retriever or another family's model beside
    them says nothing about the slope."""
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r.family, []).append(r)
    return out


def fit_lines(rows: list[Row]) -> list[str]:
    """The two fits of each family that has them, then the proxy's rank correlation with average nDCG@10 over every
    backbone (lower loss ranks higher)."""
    lines = []
    for axis in ("FLOPs", "params"):
        fits = [(name, fit) for name, members in families(rows).items() if (fit := loglinear_fit(members, axis))]
        lines += [fit.line(name) for name, fit in fits] or [
            f"fit on {axis}: needs two finished backbones of one family with different {axis}"]
    alone = [name for name, members in families(rows).items() if name and len(_points(members, "params")) == 1]
    if alone:
        lines.append("no fit for a family of one backbone: " + ", ".join(alone))
    both = [r for r in rows if r.status == "ok" and r.proxy is not None and r.average is not None]
    rho = spearman([-r.proxy for r in both], [r.average for r in both])
    lines.append(f"LM proxy (bits/byte, lower first) vs average nDCG@10: Spearman rho {rho:+.3f} over {len(both)} backbones"
                 if rho is not None else f"LM proxy vs average nDCG@10: needs three finished backbones with a proxy "
                 f"and some spread ({len(both)} with one)")
    return lines


# ---------------------------------------------------------------- the plot


def plot(rows: list[Row], path: Path, note: str = "") -> Path | None:
    """Average nDCG@10 against FLOPs and against non-embedding parameters (log x), each backbone labelled, one
    colour and one log-linear fit per family; written through plots.save_figure. None when no backbone finished."""
    if not any(_points(rows, axis) for axis in ("FLOPs", "params")):
        return None
    from retrctl import plots

    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    for ax, axis, label in ((axes[0], "FLOPs", "pretraining FLOPs ≈ 6·N·D"), (axes[1], "params", "non-embedding parameters N")):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("average nDCG@10")
        ax.grid(True, which="both", alpha=0.3)
        for k, (family, members) in enumerate(families(rows).items()):
            pts = _points(members, axis)
            if not pts:
                continue
            color = f"C{k}"
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o", color=color, label=family or None)
            for x, y, name in pts:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
            fit = loglinear_fit(members, axis)
            if fit:
                lo, hi = min(x for x, _, _ in pts), max(x for x, _, _ in pts)
                xs = [lo * (hi / lo) ** (i / 20) for i in range(21)]
                ax.plot(xs, [fit.intercept + fit.slope * math.log10(x) for x in xs], "--", color=color,
                        label=f"{family + ': ' if family else ''}slope {fit.slope:+.3f}/decade, R² {fit.r2:.2f}")
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=8)
    if note:
        import textwrap

        fig.suptitle(textwrap.fill(note, 130), fontsize=9)
    plots.save_figure(fig, path)
    return Path(path)

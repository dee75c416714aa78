"""Contrastive losses for retrieval training, reusable by any stage that trains an encoder (train, prune/heal).

- InfoNCE over in-batch negatives plus each query's hard negatives (Karpukhin et al. 2020, DPR, arXiv:2004.04906;
  the temperature-scaled cosine form of Wang et al. 2022, E5, arXiv:2212.03533). Query i's label is the column of
  its own positive among all candidates of the global batch.
- Cross-process negatives: :func:`gather` is an all_gather whose backward sums the gradient of every process's loss
  into the local slice (all_reduce, then slice), so N processes with batch B give exactly the gradient of one
  process with batch N·B. Peers that keep only the local slice's gradient and multiply by the world size drop the
  cross terms (tevatron#143, lightly#1528).
- False-negative masking: candidates that are another positive of the same query (same doc id or same text
  hash) are removed from the softmax instead of being pushed away (ST#3189, #3453).
- Matryoshka (Kusupati et al. 2022, arXiv:2205.13147): the loss is summed over truncated, re-normalized prefixes.
- Distillation: KL(teacher || student) over each query's own group, teacher scores as given by a reranker.
- Embedding distillation (sentence-transformers' model distillation; TinyBERT/MiniLM distil hidden states): the
  student's vector of a text regresses onto a frozen teacher's vector of the same text (squared distance or 1 − cos).
- GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
  arXiv:2101.06983): embeddings without a graph, the loss gradient w.r.t. the embeddings cached, then a chunked
  re-forward (same RNG state, so dropout matches) and backward of <embedding, cached gradient>.

The objectives a run composes (``train/objective.py``) take one ``StepOutputs`` (models/layout.py): the step's
outputs split once into each side's parts by name. A loss wrapping another reads its own parts and hands the same
``StepOutputs`` down; ``group_loss`` and the terms under it take plain tensors.

Nothing here reads files or knows about click; the functions take tensors and return tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from retrctl.models.layout import StepOutputs


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        rank, size = world()
        ctx.rank, ctx.rows = rank, x.size(0)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        # every process's loss depends on our rows: sum their gradients, keep ours (works on gloo and nccl)
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (same shape on every process) across processes, in rank order, with gradient."""
    return x if world()[1] == 1 else _Gather.apply(x)


def false_negative_mask(positive_keys: Sequence[set], candidate_keys: Sequence[Sequence], labels: Sequence[int]) -> torch.Tensor:
    """[Q, C] bool: True where candidate c is another positive of query q (any shared key: doc id or text hash)
    and is not q's own labelled positive. Masked candidates are left out of q's softmax."""
    where: dict = {}
    for c, ck in enumerate(candidate_keys):
        for k in ck:
            where.setdefault(k, set()).add(c)
    mask = torch.zeros((len(positive_keys), len(candidate_keys)), dtype=torch.bool)
    for q, keys in enumerate(positive_keys):
        cols = set().union(*(where.get(k, ()) for k in keys)) - {labels[q]}
        if cols:
            mask[q, sorted(cols)] = True
    return mask


def scores(q: torch.Tensor, p: torch.Tensor, *, dims: int | None = None, normalize: bool = True) -> torch.Tensor:
    """Similarity matrix of (optionally truncated, then re-normalized) embeddings."""
    if dims:
        q, p = q[:, :dims], p[:, :dims]
    if normalize:
        q, p = F.normalize(q, dim=-1), F.normalize(p, dim=-1)
    return q @ p.T


def info_nce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of each row's label column; masked columns are excluded from the softmax."""
    if mask is not None:
        logits = logits.masked_fill(mask.to(logits.device), float("-inf"))
    return F.cross_entropy(logits, labels.to(logits.device))


def distill_kl(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, teacher_temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) over each query's own group. ``student``: [Q, G] logits (already / temperature),
    ``teacher``: [Q, G] raw teacher scores, ``valid``: [Q] rows that carry teacher scores. -inf entries
    (masked candidates) get zero probability on both sides."""
    valid = valid.to(student.device)
    if not bool(valid.any()):
        return student.new_zeros(())
    s, t = student[valid], teacher.to(student)[valid] / teacher_temperature
    t = t.masked_fill(torch.isinf(s), float("-inf"))
    log_s, log_t = F.log_softmax(s, -1), F.log_softmax(t, -1)
    p_t = log_t.exp()
    terms = torch.where(p_t > 0, p_t * (log_t - log_s), torch.zeros_like(p_t))
    return terms.sum(-1).mean()


def margin_mse(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, teacher_temperature: float = 1.0) -> torch.Tensor:
    """GPL's MarginMSE (Wang et al. 2022, arXiv:2112.07577; Hofstätter et al. 2020, arXiv:2010.02666): the mean
    squared difference between the student's margins s_pos − s_neg and the teacher's, over each group's negatives.
    ``student``: [Q, G] logits, positive first; ``teacher``: [Q, G] raw scores (÷ ``teacher_temperature``);
    ``valid``: [Q] rows with teacher scores. Masked (-inf) negatives are left out."""
    valid = valid.to(student.device)
    if not bool(valid.any()):
        return student.new_zeros(())
    s, t = student[valid], teacher.to(student)[valid] / teacher_temperature
    keep = torch.isfinite(s[:, 1:])
    if not bool(keep.any()):
        return student.new_zeros(())
    diff = (s[:, :1] - s[:, 1:]) - (t[:, :1] - t[:, 1:])
    return diff[keep].pow(2).mean()


DISTILL = {"kl": distill_kl, "margin-mse": margin_mse}


def group_loss(
    q: torch.Tensor,
    p: torch.Tensor,
    *,
    group_size: int,
    temperature: float = 0.02,
    normalize: bool = True,
    mrl_dims: Sequence[int] | None = None,
    mask: torch.Tensor | None = None,
    teacher: torch.Tensor | None = None,
    teacher_valid: torch.Tensor | None = None,
    distill_weight: float = 0.0,
    teacher_temperature: float = 1.0,
    distill_loss: str = "kl",
    contrastive_weight: float = 1.0,
) -> tuple[torch.Tensor, dict]:
    """InfoNCE (+ distillation) of this process's queries against the candidates of all processes.

    q: [B, D] this process's query embeddings; p: [B*G, D] its passages, group-major (positive first, then
    G-1 negatives). mask: [B, N*B*G] false negatives against the gathered candidates. teacher: [B, G] scores,
    distilled by ``distill_loss`` (``DISTILL``: kl or margin-mse). Loss = contrastive_weight·InfoNCE +
    distill_weight·distillation. Returns (loss, {"ce": …, "kl"/"margin_mse": …} at full dimension, for logging).
    """
    rank, _ = world()
    b = q.size(0)
    candidates = gather(p)
    labels = (torch.arange(b, device=q.device) + rank * b) * group_size
    parts: dict = {}
    total = q.new_zeros(())
    for dims in list(mrl_dims or []) or [None]:
        logits = scores(q, candidates, dims=dims, normalize=normalize) / temperature
        ce = info_nce(logits, labels, mask)
        loss = contrastive_weight * ce
        if distill_weight and teacher is not None:
            if mask is not None:
                logits = logits.masked_fill(mask.to(logits.device), float("-inf"))
            cols = labels[:, None] + torch.arange(group_size, device=q.device)
            term = DISTILL[distill_loss](logits.gather(1, cols), teacher, teacher_valid, teacher_temperature)
            loss = loss + distill_weight * term
            parts.setdefault(distill_loss.replace("-", "_"), term.detach())
        parts.setdefault("ce", ce.detach())
        total = total + loss
    return total, parts


def dense_loss(out: StepOutputs, *, loss) -> tuple[torch.Tensor, dict]:
    """``loss`` (group_loss with its settings) of the step's dense query and passage vectors: the dense objective of
    a run without a second query encoder."""
    return loss(out.query["dense"], out.passage["dense"])


def joint_lookup_loss(out: StepOutputs, *, loss, kl_weight: float, temperature: float, normalize: bool = True,
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """LightRetriever's objective: the full query encoder's vectors (``dense`` part) and the token-lookup ones
    (``lookup`` part, models/lookup.py) each get the contrastive ``loss`` (group_loss with its settings) against the
    passages' ``dense`` part, plus ``kl_weight`` × KL(full || lookup) over the same candidates (in-batch + hard
    negatives, false negatives masked), the full encoder as the teacher (no gradient through it: it is trained by
    its own term)."""
    full, light, p = out.query["dense"], out.query["lookup"], out.passage["dense"]
    l_full, parts = loss(full, p)
    l_light, light_parts = loss(light, p)
    candidates = gather(p)
    s_full = scores(full, candidates, normalize=normalize) / temperature
    s_light = scores(light, candidates, normalize=normalize) / temperature
    if mask is not None:
        s_full = s_full.masked_fill(mask.to(full.device), float("-inf"))
        s_light = s_light.masked_fill(mask.to(full.device), float("-inf"))
    kl = distill_kl(s_light, s_full.detach(), torch.ones(full.size(0), dtype=torch.bool))
    parts = {**parts, "ce_lookup": light_parts["ce"], "kl_lookup": kl.detach()}
    return l_full + l_light + kl_weight * kl, parts


def sparse_loss(out: StepOutputs, *, loss, group_size: int, flops_weight: float, query_terms: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """SPLADE's sparse head trained beside the dense one (models/sparse.py): the dense objective ``loss`` of ``out``
    as usual, plus the same InfoNCE over dot products of the ``sparse`` parts' term weights at temperature 1 (SPLADE)
    and ``flops_weight`` × the FLOPS regulariser of the doc weights (and of encoded query weights), summed over this
    process's rows. ``query_terms``: LightRetriever's token-count queries, read instead of a query ``sparse`` part."""
    from retrctl.models.sparse import flops

    p_sparse = out.passage["sparse"]
    q_sparse = out.query["sparse"] if query_terms is None else query_terms.to(p_sparse.device, p_sparse.dtype)
    total, parts = loss(out)
    ce, _ = group_loss(q_sparse, p_sparse, group_size=group_size, temperature=1.0, normalize=False, mask=mask)
    reg = flops(p_sparse) + (flops(q_sparse) if query_terms is None else 0.0)
    parts = {**parts, "ce_sparse": ce.detach(), "flops": reg.detach()}
    return total + ce + flops_weight * reg, parts


def embed_distill(student: torch.Tensor, teacher: torch.Tensor, *, kind: str = "mse", normalize: bool = True) -> torch.Tensor:
    """Mean over rows of the distance of the student's vectors [N, D] to the teacher's [N, D] of the same texts:
    ``mse``, the squared L2 distance (the per-element MSE of sentence-transformers' MSELoss × D, so the term does not
    shrink with the width); ``cosine``, 1 − cos. ``normalize``: the teacher's vectors are unit, so the student's are
    normalized first (its finished vectors are compared). No rows: 0."""
    if student.size(0) == 0:
        return student.sum() * 0.0
    s = F.normalize(student.float(), dim=-1) if normalize else student.float()
    t = teacher.to(s)
    if kind == "cosine":
        return (1 - F.cosine_similarity(s, t, dim=-1)).mean()
    return (s - t).pow(2).sum(-1).mean()


def token_distill(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """The student's token states against the teacher's of the same tokens, both [N, cap, H] blocks with zero rows
    after each text (``models.layout.token_block``): Σ‖s − t‖² / Σ‖t‖² over every token, the squared error relative
    to the teacher's states, so the term does not depend on the width or the scale of the hidden states. No rows: 0."""
    t = teacher.to(student.device, torch.float32)
    return (student.float() - t).pow(2).sum() / t.pow(2).sum().clamp_min(1e-12)


def layer_distill(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """The student's states after its blocks against the teacher's after the blocks they were cut from, both
    [N, cap, blocks, H] with zero rows after each text: ‖s − t‖² / ‖t‖² of each token at each block, averaged over
    the real ones. Each token's error is relative to its own state because a decoder's residual stream carries a
    few states hundreds of times the others' norm (massive activations), which would outweigh every other token in
    one sum. No rows: 0."""
    t = teacher.to(student.device, torch.float32)
    norm = t.pow(2).sum(-1)
    real = norm > 0
    if not real.any():
        return student.sum() * 0
    return ((student.float() - t).pow(2).sum(-1)[real] / norm[real]).mean()


HIDDEN_TERMS = {"tokens": (token_distill, "token_mse"), "layers": (layer_distill, "layer_mse")}


def hidden_distill_loss(out: StepOutputs, *, loss, teacher_q: dict, teacher_p: dict,
                        weights: dict[str, float]) -> tuple[torch.Tensor, dict]:
    """``loss(out)`` plus, for each part ``weights`` names (``tokens``: ``token_distill``; ``layers``:
    ``layer_distill``), its weight × the distillation of the queries' and the passages' part against the teacher's
    blocks of the same texts (``teacher_q`` / ``teacher_p`` by part name), the two sides' terms averaged
    (``token_mse``, ``layer_mse``)."""
    total, parts = loss(out)
    for name, weight in weights.items():
        term_of, key = HIDDEN_TERMS[name]
        sq, sp = out.query[name], out.passage[name]
        term = (term_of(sq, teacher_q[name].view_as(sq)) + term_of(sp, teacher_p[name].view_as(sp))) / 2
        total, parts = total + weight * term, {**parts, key: term.detach()}
    return total, parts


def embed_distill_loss(out: StepOutputs, *, teacher_q: torch.Tensor, teacher_p: torch.Tensor, weight: float,
                       kind: str = "mse", normalize: bool = True, loss=None) -> tuple[torch.Tensor, dict]:
    """Embedding distillation beside the step's other terms: the student's ``projected`` part (a teacher of
    another width) or its ``dense`` part, of queries and passages, regressed onto the teacher's vectors of the
    same rows (``teacher_q``, ``teacher_p``), ``weight`` × the mean over every text (``embed_distill``). ``loss``:
    the rest of the objective, of the same ``out`` (it reads its own parts, never ``projected``); None when embedding
    distillation is the whole objective (a corpus without groups)."""
    read = "projected" if "projected" in out.passage else "dense"
    sq, sp = out.query[read], out.passage[read]
    total, parts = loss(out) if loss is not None else (sq.new_zeros(()), {})
    rows = sq.size(0) + sp.size(0)
    term = (embed_distill(sq, teacher_q, kind=kind, normalize=normalize) * sq.size(0)
            + embed_distill(sp, teacher_p, kind=kind, normalize=normalize) * sp.size(0)) / max(1, rows)
    return total + weight * term, {**parts, f"embed_{kind}": term.detach()}


def _soft_ce(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over rows of −Σ softmax(teacher)·log softmax(student) (BGE-M3's Eq. 5); −inf columns (masked false
    negatives) carry no probability on either side."""
    target = F.softmax(teacher, -1)
    log_s = F.log_softmax(student, -1)
    return -torch.where(target > 0, target * log_s, torch.zeros_like(log_s)).sum(-1).mean()


def m3_loss(out: StepOutputs, *, loss, group_size: int, temperature: float, normalize: bool = True,
            query_terms: torch.Tensor | None = None, weights=(1.0, 0.3, 1.0), lambdas=(1.0, 0.1, 1.0),
            self_distill: bool = True, flops_weight: float = 0.0,
            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """BGE-M3's multi-head objective (Chen et al. 2024, arXiv:2402.03216, Eq. 4–6) over the same in-batch + hard
    negative candidates, from the ``dense``, ``sparse`` (term weights) and ``colbert`` (token blocks) parts of
    ``out``, each head present when its part is; the query's sparse part is ``query_terms`` instead when given
    (token counts). Scores / ``temperature``: s_dense (cosine), s_lex (dot of term weights), s_mul (MaxSim); s_inter =
    Σ w·s. L = (Σ λ·L_head + L_inter) / (heads + 1), each L an InfoNCE, the dense one ``loss(out)`` (the dense
    objective with its own settings: Matryoshka, distillation, the token-lookup query encoder); with
    ``self_distill`` L' = Σ λ·CE(softmax(s_inter), s_head) / heads and the result is (L + L') / 2.
    ``flops_weight``: SPLADE's FLOPS on encoded sparse weights (0 for the lexical head, as BGE-M3)."""
    from retrctl.models.colbert import maxsim
    from retrctl.models.sparse import flops

    qs, ps = dict(out.query), out.passage
    if query_terms is not None and "sparse" in ps:
        qs["sparse"] = query_terms.to(qs["dense"].device, qs["dense"].dtype)
    rank, _ = world()
    b = qs["dense"].size(0)
    labels = (torch.arange(b, device=qs["dense"].device) + rank * b) * group_size
    # the dense loss and s_dense read the one dense part, so autograd sums their gradients there
    loss_dense, parts = loss(out)
    s = {"dense": scores(qs["dense"], gather(ps["dense"]), normalize=normalize) / temperature}
    if "sparse" in qs:
        s["sparse"] = qs["sparse"] @ gather(ps["sparse"]).T / temperature
    if "colbert" in qs:
        s["colbert"] = maxsim(qs["colbert"], gather(ps["colbert"].contiguous())) / temperature
    w = dict(zip(("dense", "sparse", "colbert"), weights, strict=True))
    lam = dict(zip(("dense", "sparse", "colbert"), lambdas, strict=True))
    if mask is not None:
        s = {h: v.masked_fill(mask.to(v.device), float("-inf")) for h, v in s.items()}
    head_loss = {"dense": loss_dense, **{h: F.cross_entropy(v, labels) for h, v in s.items() if h != "dense"}}
    inter = sum(w[h] * v for h, v in s.items() if w[h])  # a zero weight leaves the head out (0 × −inf is nan)
    l_inter = F.cross_entropy(inter, labels)
    total = (sum(lam[h] * head_loss[h] for h in s) + l_inter) / (len(s) + 1)
    parts = {**parts, **{f"ce_{h}": head_loss[h].detach() for h in s if h != "dense"}, "ce_inter": l_inter.detach()}
    if self_distill:
        teacher = inter.detach()
        distill = sum(lam[h] * _soft_ce(v, teacher) for h, v in s.items()) / len(s)
        total = (total + distill) / 2
        parts["self_distill"] = distill.detach()
    if flops_weight and "sparse" in ps:
        reg = flops(ps["sparse"]) + (flops(qs["sparse"]) if query_terms is None else 0.0)
        total = total + flops_weight * reg
        parts["flops"] = reg.detach()
    return total, parts


def flops_weight_at(step: int, weight: float, warmup: int) -> float:
    """SPLADE's schedule: the FLOPS weight grows quadratically to ``weight`` over ``warmup`` steps."""
    return weight if not warmup or step >= warmup else weight * (step / warmup) ** 2


# ---------------------------------------------------------------- GradCache


class RngState:
    """CPU and CUDA generator states captured before a forward, restored to replay it (same dropout masks)."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def restore(self):
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def grad_cache_step(
    encode: Callable[[dict], torch.Tensor],
    query_chunks: Sequence[dict],
    passage_chunks: Sequence[dict],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]],
    backward: Callable[[torch.Tensor, bool], None] = lambda t, last: t.backward(),
    encode_passage: Callable[[dict], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict]:
    """One GradCache step: the gradient of ``loss_fn(encode(all queries), encode(all passages))`` accumulated
    into the parameters, with only one chunk's graph alive at a time.

    ``backward(tensor, is_last)`` runs each chunk's backward (a DeepSpeed engine needs to know the last one).
    ``encode_passage`` encodes the passage chunks when the passage side differs (default: ``encode``).
    Returns the loss (detached) and its parts.
    """
    chunks = [*query_chunks, *passage_chunks]
    encoders = [encode] * len(query_chunks) + [encode_passage or encode] * len(passage_chunks)
    states, embs = [], []
    with torch.no_grad():
        for c, enc in zip(chunks, encoders, strict=True):
            states.append(RngState())
            embs.append(enc(c))
    after = RngState()
    nq = len(query_chunks)
    q = torch.cat(embs[:nq]).detach().requires_grad_()
    p = torch.cat(embs[nq:]).detach().requires_grad_() if passage_chunks else None  # None: the loss holds its passages
    loss, parts = loss_fn(q, p)
    loss.backward()  # d loss / d embeddings only: q and p are leaves
    grads = [*q.grad.split([e.size(0) for e in embs[:nq]]), *(p.grad.split([e.size(0) for e in embs[nq:]]) if p is not None else ())]
    for i, (c, enc, state, g) in enumerate(zip(chunks, encoders, states, grads, strict=True)):
        state.restore()
        emb = enc(c)
        backward(torch.dot(emb.flatten(), g.flatten().to(emb.dtype)), i == len(chunks) - 1)
    after.restore()
    return loss.detach(), parts


def chunks(batch: dict, size: int) -> list[dict]:
    """Split a tokenized batch into row chunks of at most ``size``."""
    n = batch["input_ids"].size(0)
    return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, n, size)]


def sorted_chunks(batch: dict, size: int, trim: bool = True) -> tuple[list[dict], torch.Tensor]:
    """Rows sorted longest first, cut into chunks of at most ``size``, each cut to its own longest row (either
    padding side), so little compute goes to padding; and ``inverse``: ``torch.cat(outputs)[inverse]`` puts the
    rows back in input order."""
    mask = batch["attention_mask"]
    order = torch.argsort(mask.sum(1), descending=True, stable=True)
    inverse = torch.argsort(order)
    out = []
    for i in range(0, mask.size(0), size):
        c = {k: v[order[i : i + size]] for k, v in batch.items()}
        if trim:
            width = int(c["attention_mask"].sum(1).max())
            left = bool(c["attention_mask"][:, -1].all())  # every row ends with a real token: padded on the left
            c = {k: (v[:, -width:] if left else v[:, :width]) for k, v in c.items()}
        out.append(c)
    return out, inverse

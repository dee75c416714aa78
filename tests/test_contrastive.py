"""The loss core: InfoNCE against a hand computation, false-negative masking, Matryoshka, distillation,
cross-process gather (2 gloo processes = 1 process with the whole batch), GradCache = uncached gradient."""

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from retrctl.train import losses as contrastive
from retrctl.train.losses import distill_kl, false_negative_mask, grad_cache_step, group_loss, margin_mse


def _unit(*rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.norm(dim=1, keepdim=True)


def test_info_nce_matches_hand_computation():
    q = _unit([1.0, 0.0], [0.6, 0.8])
    p = _unit([1.0, 0.1], [0.0, 1.0], [0.5, 0.5], [1.0, -1.0])  # group size 2: q0 -> (p0, p1), q1 -> (p2, p3)
    tau = 0.5
    loss, parts = group_loss(q, p, group_size=2, temperature=tau)
    expected = 0.0
    for i, label in ((0, 0), (1, 2)):
        s = [sum(a * b for a, b in zip(q[i].tolist(), p[c].tolist(), strict=True)) / tau for c in range(4)]
        expected += -s[label] + math.log(sum(math.exp(x) for x in s))
    assert loss.item() == pytest.approx(expected / 2, rel=1e-9)
    assert parts["ce"].item() == pytest.approx(expected / 2, rel=1e-9)


def test_false_negative_mask_by_id_and_text():
    # q0's positives: d1 (labelled, column 0) and d9; q1's positive d5 whose text equals d1's text
    pos = [{"d1", "h1", "d9", "h9"}, {"d5", "h1"}]
    cands = [("d1", "h1"), ("d2", "h2"), ("d5", "h1"), ("d9", "h9")]
    mask = false_negative_mask(pos, cands, labels=[0, 2])
    assert mask.tolist() == [[False, False, True, True], [True, False, False, False]]


def test_masked_duplicate_positive_is_left_out_of_the_softmax():
    torch.manual_seed(0)
    q, p = torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    p[2] = p[0]  # q1's positive is the same doc as q0's positive
    mask = false_negative_mask([{"a"}, {"a"}], [("a",), ("x",), ("a",), ("y",)], labels=[0, 2])
    masked, _ = group_loss(q, p, group_size=2, temperature=0.1, mask=mask)
    unmasked, _ = group_loss(q, p, group_size=2, temperature=0.1)
    keep0, keep1 = [0, 1, 3], [1, 2, 3]  # the same losses with the duplicate column removed by hand
    s = contrastive.scores(q, p) / 0.1
    by_hand = (torch.nn.functional.cross_entropy(s[0:1, keep0], torch.tensor([0]))
               + torch.nn.functional.cross_entropy(s[1:2, keep1], torch.tensor([1]))) / 2
    assert masked.item() == pytest.approx(by_hand.item(), rel=1e-9)
    assert unmasked.item() > masked.item()


def test_matryoshka_is_the_sum_over_truncated_dims():
    torch.manual_seed(1)
    q, p = torch.randn(3, 16), torch.randn(9, 16)
    total, _ = group_loss(q, p, group_size=3, mrl_dims=[4, 16])
    parts = [group_loss(q[:, :d], p[:, :d], group_size=3)[0] for d in (4, 16)]
    assert total.item() == pytest.approx(sum(x.item() for x in parts), rel=1e-6)


def test_distillation_kl():
    student = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    teacher = torch.tensor([[4.0, 2.0, 0.0], [9.0, 9.0, 9.0]])
    valid = torch.tensor([True, False])
    pt = torch.softmax(teacher[0] / 2.0, -1)
    ps = torch.softmax(student[0], -1)
    assert distill_kl(student, teacher, valid, 2.0).item() == pytest.approx((pt * (pt / ps).log()).sum().item(), rel=1e-6)
    assert distill_kl(student, teacher, torch.tensor([False, False])).item() == 0.0
    # a masked (-inf) student column carries no teacher mass either
    masked = torch.tensor([[2.0, float("-inf"), 0.0]])
    kl = distill_kl(masked, torch.tensor([[4.0, 2.0, 0.0]]), torch.tensor([True]), 2.0)
    assert torch.isfinite(kl)


def test_margin_mse_by_hand():
    student = torch.tensor([[3.0, 1.0, float("-inf")], [0.0, 0.0, 0.0]])
    teacher = torch.tensor([[8.0, 2.0, 0.0], [9.0, 9.0, 9.0]])
    valid = torch.tensor([True, False])
    # margins: student 2 (the masked negative is left out), teacher (8 - 2) / 2 = 3
    assert margin_mse(student, teacher, valid, 2.0).item() == pytest.approx((2.0 - 3.0) ** 2)
    assert margin_mse(student, teacher, torch.tensor([False, False])).item() == 0.0


def test_margin_mse_alone_when_the_contrastive_weight_is_zero():
    torch.manual_seed(3)
    q, p = torch.randn(2, 8), torch.randn(6, 8)
    teacher = torch.tensor([[3.0, 1.0, 0.0], [2.0, 2.5, 0.0]])
    valid = torch.ones(2, dtype=torch.bool)
    loss, parts = group_loss(q, p, group_size=3, temperature=0.1, teacher=teacher, teacher_valid=valid,
                             distill_weight=2.0, distill_loss="margin-mse", contrastive_weight=0.0)
    assert "margin_mse" in parts and loss.item() == pytest.approx(2.0 * parts["margin_mse"].item(), rel=1e-6)
    both, parts = group_loss(q, p, group_size=3, temperature=0.1, teacher=teacher, teacher_valid=valid,
                             distill_weight=2.0, distill_loss="margin-mse")
    assert both.item() == pytest.approx(parts["ce"].item() + 2.0 * parts["margin_mse"].item(), rel=1e-6)


def test_distillation_enters_the_loss():
    torch.manual_seed(2)
    q, p = torch.randn(2, 8), torch.randn(6, 8)
    teacher = torch.randn(2, 3)
    base, _ = group_loss(q, p, group_size=3)
    with_kl, parts = group_loss(q, p, group_size=3, teacher=teacher, teacher_valid=torch.tensor([True, True]), distill_weight=0.5)
    assert with_kl.item() == pytest.approx(base.item() + 0.5 * parts["kl"].item(), rel=1e-6)


# ---------------------------------------------------------------- GradCache


class _Tiny(torch.nn.Module):
    """Embedding + dropout + linear: a model whose forward consumes RNG (dropout)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.drop = torch.nn.Dropout(0.2)
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, batch):
        h = self.drop(self.emb(batch["input_ids"])).mean(1)
        return self.lin(h)


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("dropout", [False, True])
def test_grad_cache_equals_uncached_gradient(dropout):
    model = _Tiny()
    model.train(dropout)
    g = torch.Generator().manual_seed(3)
    qb = {"input_ids": torch.randint(0, 50, (8, 5), generator=g)}
    pb = {"input_ids": torch.randint(0, 50, (24, 7), generator=g)}
    loss_fn = lambda q, p: group_loss(q, p, group_size=3, temperature=0.05, mrl_dims=[4, 8])  # noqa: E731
    qc, pc = contrastive.chunks(qb, 3), contrastive.chunks(pb, 5)

    torch.manual_seed(7)
    cached, _ = grad_cache_step(model, qc, pc, loss_fn)
    g_cached = _grads(model)
    state_after = torch.get_rng_state()

    model.zero_grad()
    torch.manual_seed(7)
    # uncached: the same chunks forwarded with their graphs (same dropout draws), one backward
    q = torch.cat([model(c) for c in qc])
    p = torch.cat([model(c) for c in pc])
    full, _ = loss_fn(q, p)
    full.backward()
    assert cached.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(g_cached, _grads(model), atol=1e-5)
    assert torch.equal(state_after, torch.get_rng_state())  # the RNG stream continues as if uncached
    if not dropout:  # and, without dropout, equal to one forward of the whole batch
        model.zero_grad()
        whole, _ = loss_fn(model(qb), model(pb))
        whole.backward()
        assert torch.allclose(g_cached, _grads(model), atol=1e-5)


# ---------------------------------------------------------------- 2 processes = 1 process with the whole batch


def _batch():
    g = torch.Generator().manual_seed(11)
    return torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(12, 6, generator=g, dtype=torch.float64)


def _loss_and_grad(x_q, x_p, lin, mask):
    loss, _ = group_loss(lin(x_q), lin(x_p), group_size=3, temperature=0.1, mask=mask)
    loss.backward()
    return loss.detach(), lin.weight.grad.clone()


def _mask(rank, world):
    # query 0's second positive "d0b" is query 2's labelled positive: masked for query 0 only
    keys = [("d0",), ("n0",), ("n1",), ("d1",), ("n2",), ("n3",), ("d0b",), ("n4",), ("n5",), ("d3",), ("n6",), ("n7",)]
    pos = [{"d0", "d0b"}, {"d1"}, {"d0b"}, {"d3"}]
    b = 4 // world
    return false_negative_mask(pos[rank * b : (rank + 1) * b], keys, [(rank * b + j) * 3 for j in range(b)])


def _worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x_q, x_p = _batch()
        torch.manual_seed(0)
        lin = torch.nn.Linear(6, 5, dtype=torch.float64)
        b = 4 // world
        loss, grad = _loss_and_grad(x_q[rank * b : (rank + 1) * b], x_p[rank * b * 3 : (rank + 1) * b * 3], lin, _mask(rank, world))
        torch.distributed.all_reduce(grad)  # what DDP / DeepSpeed do: average the gradients
        torch.distributed.all_reduce(loss)
        out[rank] = (loss / world, grad / world)
    finally:
        torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process_with_the_whole_batch():
    x_q, x_p = _batch()
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5, dtype=torch.float64)
    loss1, grad1 = _loss_and_grad(x_q, x_p, lin, _mask(0, 1))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        results = dict(out)
    for rank in (0, 1):
        loss2, grad2 = results[rank]
        assert loss2.item() == pytest.approx(loss1.item(), rel=1e-12)
        assert torch.allclose(grad2, grad1, atol=1e-12), (grad2 - grad1).abs().max()


@pytest.mark.parametrize("left", [False, True])
def test_sorted_chunks_trim_padding_and_restore_order(left):
    lengths = [3, 7, 1, 5, 7, 2]
    width = 9
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, (width - n if left else 0) : (width if left else n)] = 1
    ids = torch.arange(len(lengths) * width).view(len(lengths), width) * mask
    parts, inverse = contrastive.sorted_chunks({"input_ids": ids, "attention_mask": mask}, size=2)
    assert [c["input_ids"].shape for c in parts] == [(2, 7), (2, 5), (2, 2)]
    # each row keeps all its real tokens; their sums put back in input order equal the originals
    sums = torch.cat([c["input_ids"].sum(1) for c in parts])[inverse]
    assert torch.equal(sums, ids.sum(1))
    assert all(int(c["attention_mask"].sum()) == sum(sorted(lengths, reverse=True)[2 * i : 2 * i + 2]) for i, c in enumerate(parts))

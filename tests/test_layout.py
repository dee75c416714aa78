"""The head layout: the named parts of a training step's output (models/layout.py), joined by the encoder's
forward, split by the losses, sized for GradCache's cache; an inference Encoder carries no training state."""

from __future__ import annotations

import pytest
import torch

from retrctl import memory
from retrctl.models.layout import HeadLayout, TrainedEncoder, TrainingLayout


def test_a_layout_joins_and_splits_named_parts_in_order():
    layout = HeadLayout.of(("dense", 4), ("lookup", 0), ("sparse", 3), ("colbert", (2, 5)))
    assert layout.names == ("dense", "sparse", "colbert") and layout.width == 4 + 3 + 10
    assert layout.slices == {"dense": slice(0, 4), "sparse": slice(4, 7), "colbert": slice(7, 17)}
    parts = {"colbert": torch.randn(3, 2, 5), "dense": torch.randn(3, 4), "sparse": torch.rand(3, 3)}
    joined = layout.join(parts)
    assert joined.shape == (3, 17)
    back = layout.split(joined)
    assert list(back) == ["dense", "sparse", "colbert"]
    for name, t in parts.items():
        assert torch.equal(back[name], t), name
    assert back["colbert"].data_ptr() == joined[:, 7:].data_ptr()  # views, not copies


def test_a_layout_refuses_outputs_that_do_not_fit_it():
    layout = HeadLayout.of(("dense", 4), ("sparse", 3))
    with pytest.raises(ValueError, match="width 8 does not match"):
        layout.split(torch.zeros(2, 8))
    with pytest.raises(ValueError, match="part 'sparse': expected 3 floats"):
        layout.join({"dense": torch.zeros(2, 4), "sparse": torch.zeros(2, 5)})
    with pytest.raises(ValueError, match="has the parts"):
        layout.join({"dense": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="each part once"):
        HeadLayout.of(("dense", 4), ("dense", 4))


def test_a_step_is_split_once_into_both_sides_named_parts():
    layout = TrainingLayout(HeadLayout.of(("dense", 4), ("lookup", 4)), HeadLayout.of(("dense", 4), ("sparse", 3)))
    q, p = torch.randn(2, 8), torch.randn(6, 7)
    out = layout.split(q, p)
    assert list(out.query) == ["dense", "lookup"] and list(out.passage) == ["dense", "sparse"]
    assert torch.equal(out.query["lookup"], q[:, 4:]) and torch.equal(out.passage["sparse"], p[:, 4:])
    assert out.passage["sparse"].data_ptr() == p[:, 4:].data_ptr()  # views: gradients reach the joined tensors


def test_the_training_forward_follows_the_layout_and_the_encoder_keeps_no_training_state(tiny_bert):
    from retrctl.models import Encoder
    from retrctl.train import TrainConfig
    from retrctl.train.loop import build_encoder

    cfg = TrainConfig(model=str(tiny_bert), heads="dense,sparse", query_encoder="token-lookup", query_prompt="q: ",
                      device="cpu", query_max_len=16, passage_max_len=24)
    cfg.check()
    trained = build_encoder(cfg, "cpu")
    assert isinstance(trained, TrainedEncoder) and isinstance(trained.encoder, Encoder)
    layout, vocab = trained.layout, trained.sparse.vocab
    assert layout.query == HeadLayout.of(("dense", 32), ("lookup", 32))  # token-count queries: no sparse part
    assert layout.passage == HeadLayout.of(("dense", 32), ("sparse", vocab)) and layout.token_queries
    trained.eval()  # no dropout: the two forwards below must agree
    qb, pb = trained.tokenize(["tea and coffee"], "query"), trained.tokenize(["tea coffee water", "a dog"], "passage")
    q, p = trained(qb, raw=True), trained(pb, raw=True)
    assert q.shape == (1, 64) and p.shape == (2, 32 + vocab)
    parts = layout.passage.split(p)
    assert torch.equal(parts["dense"], trained.encoder(pb, raw=True))  # the dense part is the plain raw forward
    assert trained.train_sparse and not trained.train_colbert
    assert memory.cached_outputs(layout, 4, 12, world=2) == 3 * 4 * 2 * (4 * 64 + 12 * (32 + vocab))

    plain = Encoder.load(tiny_bert, device="cpu")
    assert not {"train_sparse", "train_colbert", "joint_lookup", "layout"} & set(vars(plain))
    assert plain(plain.tokenize(["tea"], "query"), raw=True).shape == (1, 32)

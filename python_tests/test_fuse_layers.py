"""The MTP head's fused input (HeadConfig.fuse_layers, EAGLE-3's idea): the backbone's
features (Backbone.features: its final hidden state and the residual streams of chosen layers,
from one pass), the head's first hidden input built from them, its config and file, training
and decoding with it (still exactly greedy)."""

import json

import pytest
import torch

from mtp_kernels import decoding, reference, train
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.config import ConfigError
from mtp_kernels.models.head import HeadConfig, MTPHead
from tiny_model import TINY, tiny_backbone


def _fused_head(layers=(0, 1), seed=0, zero=False, **kw):
    torch.manual_seed(seed)
    head = MTPHead(HeadConfig.for_backbone(TINY, fuse_layers=layers, **kw))
    if layers and not zero:  # a trained head's fuse weights are not zero
        with torch.no_grad():
            head.fuse.normal_(0, 0.5)
            head.fuse_norm.uniform_(0.5, 1.5)
    return head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_features_are_the_pass_and_its_layers_residual_streams(dtype):
    """Backbone.features: the hidden states of forward() itself and, per tapped layer, the
    residual stream of the op-by-op composition (reference.decoder_layers with the kernels)."""
    from mtp_kernels import ops

    model = tiny_backbone(dtype)
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    plain = model(tokens, model.new_cache(2, 16))
    h, feats = model.features(tokens, model.new_cache(2, 16), layers=(0, 1))
    assert feats.shape == (2, 4, 3, TINY.hidden_size) and feats.dtype == dtype
    assert torch.equal(h, plain) and torch.equal(feats[:, :, 0], plain)
    weights, scales = model.decoder_weights()
    cache = model.new_cache(2, 16)
    taps = torch.empty(2, 2, 4, TINY.hidden_size, dtype=dtype)
    reference.decoder_layers(
        model.embed(tokens), cache.k, cache.v, cache.lens, model.rope_cos, model.rope_sin, weights, scales,
        TINY.num_heads, TINY.rms_norm_eps, taps=[0, 1], tap_out=taps, ops=ops.KERNELS,
    )  # fmt: skip
    assert torch.equal(feats[:, :, 1:], taps.permute(1, 2, 0, 3))
    assert not torch.equal(feats[:, :, 1], feats[:, :, 2])  # two layers, two streams
    h1, f1 = model.features(tokens, model.new_cache(2, 16))  # no layers: the hidden states alone
    assert f1.shape == (2, 4, 1, TINY.hidden_size) and torch.equal(f1[:, :, 0], plain)


def test_a_zero_fuse_head_drafts_as_the_plain_head():
    """fuse starts at zero: the fused head's first input is the hidden state, bit for bit."""
    model = tiny_backbone(torch.bfloat16)
    plain = _fused_head(layers=(), seed=3)
    fused = _fused_head(layers=(0, 1), seed=3, zero=True)
    fused.load_state_dict(plain.state_dict(), strict=False)
    cache = model.new_cache(2, 32)
    h, feats = model.features(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache, layers=(0, 1))
    token = model.logits(h[:, -1]).argmax(-1)
    want = plain.draft(model, cache, h[:, -1], token, 4)
    assert torch.equal(fused.draft(model, cache, feats[:, -1], token, 4), want)
    assert torch.equal(plain.draft(model, cache, feats[:, -1, :1], token, 4), want)  # features [B, 1, H]


def test_first_hidden_reads_the_layers_and_refuses_other_features():
    head = _fused_head()
    feats = torch.randn(2, 3, TINY.hidden_size)
    got = head.first_hidden(feats)
    normed = reference.rms_norm(feats[:, 1:], head.fuse_norm, TINY.rms_norm_eps)
    assert torch.equal(got, feats[:, 0] + normed.flatten(-2) @ head.fuse.T)
    assert not torch.equal(got, feats[:, 0])
    model = tiny_backbone()
    cache = model.new_cache(1, 16)
    h = model(torch.tensor([[1, 2, 3]]), cache)
    for bad in (h[:, -1], h[:, -1, None]):  # the hidden state alone, or features without the layers
        with pytest.raises(
            ValueError, match=r"fuses 2 backbone layer\(s\) \[0, 1\]: its features are \[\.\.\., 3, H\]"
        ):
            head.draft(model, cache, bad, torch.tensor([4]), 2)


@pytest.mark.parametrize("quantize", [False, True])
def test_decoding_with_a_fused_head_is_greedy(quantize):
    model = tiny_backbone(torch.bfloat16, quantize=quantize)
    prompts = [[5, 6, 7, 8, 9], [10, 11], list(range(20, 50))]
    want = [g.tokens for g in decoding.generate(model, prompts, 16)]
    head = _fused_head(num_blocks=2)
    for branches, lookup in ((1, 0), (3, 0), (1, 4)):
        got = decoding.generate(model, prompts, 16, head=head, k=3, branches=branches, lookup=lookup)
        assert [g.tokens for g in got] == want


def test_config_checks_and_file_round_trip(tmp_path):
    for bad, match in (
        ((1, 0), "strictly increasing"),
        ((0, 0), "strictly increasing"),
        ((-1,), "fuse_layers"),
        ("01", "list of layer indices"),
        ((0.5,), "fuse_layers"),
    ):
        with pytest.raises(ConfigError, match=match):
            HeadConfig.for_backbone(TINY, fuse_layers=bad)
    head = _fused_head()
    assert head.cfg.shapes()["fuse"] == (TINY.hidden_size, 2 * TINY.hidden_size)
    head.save(tmp_path / "h")
    assert json.loads((tmp_path / "h" / "config.json").read_text())["fuse_layers"] == [0, 1]
    loaded = MTPHead.load(tmp_path / "h", backbone_cfg=TINY)
    assert loaded.cfg == head.cfg and torch.equal(loaded.fuse, head.fuse)
    # A head fusing a layer the backbone does not have is refused before anything is read.
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["fuse_layers"] = [0, TINY.num_layers]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"fuses layer {TINY.num_layers}; the backbone has {TINY.num_layers}"):
        MTPHead.load(tmp_path / "h", backbone_cfg=TINY)
    # A file whose fuse weights do not match its config.
    cfg["fuse_layers"] = [1]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="weight 'fuse_norm' has shape"):
        MTPHead.load(tmp_path / "h")


def test_training_features_and_unrolled_head_match_drafting():
    """Distillation keeps the tapped layers' streams (those of one teacher-forced pass), and
    the unrolled head picks what MTPHead.draft drafts from the same features."""
    model = tiny_backbone()
    head = _fused_head()
    prompt = [5, 9, 3, 7, 11, 2, 8]
    seqs = train.distill(model, [prompt], 6, (), kv_layer=-1, log=lambda m: None, fuse_layers=(0, 1))
    s = seqs[0]
    r = train.sequence_from_backbone(model, s.tokens.tolist(), len(prompt), -1, (0, 1))
    assert s.taps.shape == (len(s.tokens), 2, TINY.hidden_size)
    assert torch.equal(s.taps, r.taps) and torch.equal(s.hidden, r.hidden)
    cache = model.new_cache(1, 64)
    h, feats = model.features(torch.tensor([prompt]), cache, layers=(0, 1))
    token = model.logits(h[:, -1]).argmax(-1)
    drafts = head.draft(model, cache, feats[:, -1], token, 4)[0].tolist()
    seq = prompt + [int(token)] + drafts
    t = train.sequence_from_backbone(model, seq, len(prompt), -1, (0, 1))
    logits = train.unrolled_logits(head, model, [t], train.answer_anchors([t]), 4, model.lm_head)
    assert [int(lg[0, 0].argmax()) for lg in logits] == drafts


def test_training_a_fused_head_learns_and_moves_the_fuse_weights():
    model = tiny_backbone()
    seqs = []
    for i in range(6):
        prompt = torch.randint(4, TINY.vocab_size, (6,), generator=torch.Generator().manual_seed(i)).tolist()
        answer = [10 + (i + j) % 5 for j in range(24)]
        seqs.append(train.sequence_from_backbone(model, prompt + answer, len(prompt), -1, (0,)))
    head = _fused_head(layers=(0,), seed=3, zero=True)
    train.init_from_backbone(head, model)
    tc = train.TrainConfig(steps=3, batch=3, lr=3e-3, max_steps=30, minutes=10, seed=7)
    log = train.train_head(head, model, seqs, seqs[:2], tc, log=lambda m: None)
    assert log["last_loss"] < 0.5 * log["first_loss"]
    assert head.fuse.abs().max() > 0  # the gradient reaches the zero-initialised projection


def test_check_fuse_layers_names_the_option():
    train.check_fuse_layers((1, 14, 26), 30)
    for bad in ((14, 1), (1, 1), (30,), (-1,)):
        with pytest.raises(ValueError, match=r"--fuse-layers .*: distinct layers 0\.\.29, in increasing order"):
            train.check_fuse_layers(bad, 30)

"""bench/head_gap.py measures what the training's validation measures: on the tiny backbone
with a briefly trained head over half the vocabulary, its per-anchor first drafts give
train.evaluate's first-step accuracy exactly, a target outside the draft vocabulary is
never counted right, and its one-token lookup copies what followed the token's last use."""

import os
import sys

import torch

from mtp_kernels import train
from mtp_kernels.models.head import HeadConfig, MTPHead
from tiny_model import TINY, tiny_backbone

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import head_gap  # noqa: E402


def test_copied_is_what_followed_the_latest_earlier_occurrence():
    t = [1, 2, 3, 1, 2, 4, 2]
    assert head_gap.copied(t, 2) == 2  # token 3 is 1: it was followed by 2
    assert head_gap.copied(t, 3) == 3  # token 4 is 2: followed by 3 the time before
    assert head_gap.copied(t, 4) == -1  # token 5 (4) is new
    assert head_gap.copied(t, 0) == -1  # token 1 (2) has no earlier occurrence
    assert head_gap.copied(t, 5) == 4  # token 6 is 2: its latest earlier use (4) was followed by 4


def test_first_drafts_match_the_trainings_validation():
    model = tiny_backbone()
    seqs = []
    for i in range(6):
        g = torch.Generator().manual_seed(i)
        prompt = torch.randint(4, TINY.vocab_size, (6,), generator=g).tolist()
        answer = [10 + (i + j) % 5 for j in range(20)]  # 11 and 13: outside the draft vocabulary
        seqs.append(train.sequence_from_backbone(model, prompt + answer, len(prompt), -1))
    torch.manual_seed(0)
    vocab = torch.arange(0, TINY.vocab_size, 2)
    head = MTPHead(HeadConfig.for_backbone(TINY, draft_vocab_size=len(vocab)))
    head.set_draft_vocab(vocab)
    train.init_from_backbone(head, model)
    tc = train.TrainConfig(steps=2, batch=3, lr=3e-3, max_steps=30, minutes=10, seed=1)
    train.train_head(head, model, seqs, seqs[:2], tc, log=lambda m: None)

    f = head_gap.first_drafts(head, model, model, seqs)
    rows = model.lm_head[vocab].float()
    index = torch.full((TINY.vocab_size,), train.IGNORE, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    want = train.evaluate(head, model, seqs, 1, rows, index)["acc_by_step"][0]
    assert want > 0.2 and round(f["right"].float().mean().item(), 4) == want
    targets = torch.cat([s.tokens[s.prompt_len + 1 :] for s in seqs])  # anchor p's target is token p + 2
    assert len(f["right"]) == len(targets) == len(f["conf"]) == len(f["copy"])
    assert torch.equal(f["in_vocab"], targets % 2 == 0)
    assert not (f["right"] & ~f["in_vocab"]).any()
    assert ((f["conf"] > 0) & (f["conf"] <= 1)).all()
    # The answers repeat with period 5: after the first period a one-token lookup is always right.
    assert f["copy"].float().mean() > 0.7

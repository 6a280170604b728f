"""bench/tree_bound.py's replay is a bound only if its chain reproduces real decoding: on the
tiny backbone with a random head, the chain (2,) replays exactly the passes `generate` made
(head and prompt-lookup passes alike), and every tree's first branch is the head's chain."""

import os
import sys

import torch

from mtp_kernels import decoding
from mtp_kernels.models.head import HeadConfig, MTPHead
from tiny_model import TINY, tiny_backbone

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import tree_bound  # noqa: E402


def test_chain_replay_counts_the_passes_generate_made():
    model = tiny_backbone()
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    g = torch.Generator().manual_seed(3)
    items, passes, made = [], 0, 0
    for n in (5, 11, 8):
        prompt = torch.randint(4, TINY.vocab_size, (n,), generator=g).tolist()
        gen = decoding.generate(model, [prompt], 24, head=head, k=2, lookup=6)[0]
        out, trees = tree_bound.collect(model, head, prompt, (), max_new_tokens=24)  # asserts the first branches
        assert out == gen.tokens
        assert all(len(t) == tree_bound.M and all(len(b) == tree_bound.D for b in t) for t in trees)
        items.append((prompt, out, trees))
        passes, made = passes + gen.passes, made + len(out) - 1
    tau, drafts, sizes = tree_bound.replay(items, (2,))
    assert len(sizes) == passes and tau == made / passes
    # A wider tree never accepts less at a position than the chain, so it never needs more passes.
    assert len(tree_bound.replay(items, (2, 1, 1))[2]) <= passes

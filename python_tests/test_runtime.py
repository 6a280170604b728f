"""The runtime: a verify pass is bitwise K+1 one-token steps; speculative generation is
bitwise plain greedy; the head drafts through the backbone's cache in place."""

import math

import pytest
import torch

from mtp_kernels import decoding
from mtp_kernels.models.head import HeadConfig, MTPHead
from tiny_model import TINY, OracleHead, assert_verify_pass_equals_steps, tiny_backbone

# (activation dtype, Q8 weights, quantized activations too): the plain backbones, the
# quantized ones.
VARIANTS = [
    (torch.float32, False, False),
    (torch.bfloat16, False, False),
    (torch.bfloat16, True, False),
    (torch.bfloat16, True, True),
    (torch.float32, True, True),
]


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
def test_verify_pass_equals_one_token_steps_bitwise(dtype, quantize, int8_dot):
    assert_verify_pass_equals_steps(tiny_backbone(dtype, quantize=quantize, int8_dot=int8_dot), 3, 11, 6)


def greedy_reference(model, prompts, max_new):
    return [g.tokens for g in decoding.generate(model, prompts, max_new, eos_token_ids=TINY.eos_token_ids)]


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_equals_greedy_on_20_prompts(dtype, quantize, int8_dot, k):
    model = tiny_backbone(dtype, quantize=quantize, int8_dot=int8_dot)
    g = torch.Generator().manual_seed(2)
    prompts = [
        torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 30, (20,), generator=g)
    ]
    max_new = 24
    want = greedy_reference(model, prompts, max_new)
    # Batched, ragged prompts; each request accepts a different number of drafts.
    futures = {b: prompts[b] + want[b] for b in range(len(prompts))}
    got = decoding.generate(
        model, prompts, max_new, head=OracleHead(futures, TINY.vocab_size), k=k, eos_token_ids=TINY.eos_token_ids
    )
    for b in range(len(prompts)):
        assert got[b].tokens == want[b], b
    lengths = {a for r in got for a in r.accepted}
    assert sum(r.passes for r in got) < sum(len(w) for w in want)  # drafts were accepted
    assert len(lengths) > 1
    # One request at a time gives the same tokens.
    single = decoding.generate(
        model,
        [prompts[5]],
        max_new,
        head=OracleHead({0: futures[5]}, TINY.vocab_size),
        k=k,
        eos_token_ids=TINY.eos_token_ids,
    )
    assert single[0].tokens == want[5]


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
@pytest.mark.parametrize("k,branches,lookup", [(1, 2, 0), (3, 3, 0), (2, 4, 3)])
def test_tree_drafts_equal_greedy_on_20_prompts(dtype, quantize, int8_dot, k, branches, lookup):
    """The head's chain and branches - 1 leaves per pass (batched, ragged; beside prompt
    lookup's chains too): the tokens of plain greedy, with leaves accepted."""
    model = tiny_backbone(dtype, quantize=quantize, int8_dot=int8_dot)
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist() * (1 + int(n) % 2)
        for n in torch.randint(1, 20, (20,), generator=g)
    ]
    max_new = 24
    want = greedy_reference(model, prompts, max_new)
    futures = {b: prompts[b] + want[b] for b in range(len(prompts))}
    got = decoding.generate(
        model,
        prompts,
        max_new,
        head=OracleHead(futures, TINY.vocab_size),
        k=k,
        eos_token_ids=TINY.eos_token_ids,
        branches=branches,
        lookup=lookup,
    )
    assert [r.tokens for r in got] == want
    assert sum(r.leaves_accepted for r in got) > 0
    assert sum(r.passes for r in got) < sum(len(w) for w in want)  # drafts were accepted
    single = decoding.generate(
        model,
        [prompts[5]],
        max_new,
        head=OracleHead({0: futures[5]}, TINY.vocab_size),
        k=k,
        eos_token_ids=TINY.eos_token_ids,
        branches=branches,
        lookup=lookup,
    )
    assert single[0].tokens == want[5]


def test_tree_drafts_of_a_trained_shape_head_equal_greedy():
    """A real MTPHead (random weights) through mtp.head_draft's alternatives: greedy's tokens."""
    model = tiny_backbone(torch.bfloat16)
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    g = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 30, (6,), generator=g)
    ]
    want = greedy_reference(model, prompts, 16)
    got = decoding.generate(model, prompts, 16, head=head, k=2, branches=3, eos_token_ids=TINY.eos_token_ids)
    assert [r.tokens for r in got] == want


def test_tree_drafts_bad_input():
    model = tiny_backbone()
    head = MTPHead(HeadConfig.for_backbone(TINY))

    class Standalone(OracleHead):
        def begin(self, prompts, capacity):
            pass

    with pytest.raises(ValueError, match=r"branches \(first drafts per head pass\) must be >= 1, got 0"):
        decoding.generate(model, [[1, 2]], 4, head=head, branches=0)
    for kwargs in [
        dict(head=None),
        dict(head=Standalone({0: [1, 2]}, 97)),
        dict(head=head, temperature=0.5),
        dict(head=head, lenient=(2, 0.5)),
    ]:
        with pytest.raises(ValueError, match=r"branches > 1 \(tree drafts\) needs the MTP head and greedy"):
            decoding.generate(model, [[1, 2]], 4, branches=2, **kwargs)


@pytest.mark.parametrize("quantize,int8_dot", [(False, False), (True, False), (True, True)])
def test_mtp_head_drafts_from_the_cache_in_place_and_keeps_greedy_output(quantize, int8_dot):
    model = tiny_backbone(quantize=quantize, int8_dot=int8_dot)
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY, num_blocks=2))
    head.check_fits(TINY)
    prompts = [[5, 6, 7, 8, 9], [10, 11], list(range(20, 50))]
    want = greedy_reference(model, prompts, 16)
    got = decoding.generate(model, prompts, 16, head=head, k=4, eos_token_ids=TINY.eos_token_ids)
    assert [r.tokens for r in got] == want
    # The head reads the cache but never writes it.
    cache = model.new_cache(1, 64)
    h = model(torch.tensor([[5, 6, 7]]), cache)
    k_before, v_before, lens = cache.k.clone(), cache.v.clone(), cache.lens.clone()
    drafts = head.draft(model, cache, h[:, -1], torch.tensor([8]), 4)
    assert drafts.shape == (1, 4) and drafts.dtype == torch.int64
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before) and torch.equal(cache.lens, lens)


def test_quantized_backbone_is_close_to_the_plain_one_and_half_its_size():
    plain, q8 = tiny_backbone(torch.bfloat16), tiny_backbone(torch.bfloat16, quantize=True)
    assert q8.w("model.layers.0.qkv").dtype == torch.int8 and q8.scale("model.layers.0.qkv") is not None
    assert plain.scale("model.layers.0.qkv") is None
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    a = plain.logits(plain(tokens, plain.new_cache(1, 16))).float()
    b = q8.logits(q8(tokens, q8.new_cache(1, 16))).float()
    assert (a - b).abs().max() < 0.05 * a.abs().max()  # int8 rounding of every weight: close, not equal
    assert torch.equal(q8.embed(tokens), q8.lm_head_rows(tokens.flatten()).view(1, 6, -1))  # tied table
    fused = ("qkv", "gate_up", "qkv__scale", "gate_up__scale")  # the fused projections and their scales

    def matrices(m):
        return sum(t.nbytes for n, t in m.named_buffers() if "layers" in n and n.endswith(fused))

    assert matrices(q8) < 0.6 * matrices(plain)


def test_head_draft_vocab_and_save_load(tmp_path):
    model = tiny_backbone()
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY, draft_vocab_size=10))
    head.set_draft_vocab(torch.arange(40, 50))
    cache = model.new_cache(2, 32)
    h = model(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache)
    drafts = head.draft(model, cache, h[:, -1], torch.tensor([7, 8]), 3)
    assert ((drafts >= 40) & (drafts < 50)).all()
    head.save(tmp_path / "head")
    loaded = MTPHead.load(tmp_path / "head")
    assert loaded.cfg == head.cfg and torch.equal(loaded.draft_vocab, head.draft_vocab)
    assert torch.equal(loaded.draft(model, cache, h[:, -1], torch.tensor([7, 8]), 3), drafts)


def test_eos_and_max_new_tokens():
    model = tiny_backbone()
    prompts = [[5, 6, 7], [8, 9]]
    for max_new in (1, 2, 7):
        want = greedy_reference(model, prompts, max_new)
        assert all(len(w) <= max_new for w in want)
        futures = {b: prompts[b] + want[b] for b in range(2)}
        got = decoding.generate(
            model, prompts, max_new, head=OracleHead(futures, TINY.vocab_size), k=4, eos_token_ids=TINY.eos_token_ids
        )
        assert [r.tokens for r in got] == want
    # An EOS id that greedy produces stops generation right after it.
    full = greedy_reference(model, prompts, 20)[0]
    stop = full[4]
    out = decoding.generate(model, [prompts[0]], 20, eos_token_ids=(stop,))[0].tokens
    assert out == full[: full.index(stop) + 1]


@pytest.mark.parametrize("k", [1, 3])
def test_sampled_speculative_equals_sampled_plain_for_the_same_seed(k):
    """The RNG is keyed by (seed, request, position): a head's drafts change how many
    passes it takes, never the tokens."""
    model = tiny_backbone()
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 20, (6,), generator=g)
    ]
    max_new = 20
    for temperature, seed in [(1.0, 0), (0.6, 123)]:
        plain = decoding.generate(
            model, prompts, max_new, eos_token_ids=TINY.eos_token_ids, temperature=temperature, seed=seed
        )
        want = [r.tokens for r in plain]
        # An oracle that knows the sampled continuation (corrupting a quarter of its drafts),
        # and a random head.
        futures = {b: prompts[b] + want[b] for b in range(len(prompts))}
        oracle = decoding.generate(
            model,
            prompts,
            max_new,
            head=OracleHead(futures, TINY.vocab_size),
            k=k,
            eos_token_ids=TINY.eos_token_ids,
            temperature=temperature,
            seed=seed,
        )
        assert [r.tokens for r in oracle] == want
        assert sum(r.passes for r in oracle) < sum(r.passes for r in plain)  # drafts were accepted
        torch.manual_seed(0)
        head = MTPHead(HeadConfig.for_backbone(TINY))
        rand = decoding.generate(
            model,
            prompts,
            max_new,
            head=head,
            k=k,
            eos_token_ids=TINY.eos_token_ids,
            temperature=temperature,
            seed=seed,
        )
        assert [r.tokens for r in rand] == want
    # Sampling differs from greedy and between seeds; temperature 0 is greedy.
    other = [r.tokens for r in decoding.generate(model, prompts, max_new, temperature=1.0, seed=1)]
    assert other != want
    assert (
        [r.tokens for r in decoding.generate(model, prompts, max_new, temperature=0.0, seed=5)]
        == greedy_reference(model, prompts, max_new)
        != want
    )


def test_bad_generation_input():
    model = tiny_backbone()
    with pytest.raises(ValueError, match="does not fit the model's context of 256 tokens"):
        decoding.generate(model, [[1] * 250], 10)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        decoding.generate(model, [[1], []], 4)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        decoding.generate(model, [[1]], 0)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        decoding.generate(model, [[1]], 4, temperature=-0.1)
    with pytest.raises(ValueError, match="k \\(drafts per pass\\) must be >= 1"):
        decoding.generate(model, [[1]], 4, head=OracleHead({0: [1]}, 97), k=0)
    bad = MTPHead(HeadConfig.for_backbone(TINY, kv_layer=5))
    with pytest.raises(ValueError, match="does not fit the backbone"):
        bad.check_fits(TINY)


def test_int8_dot_backbone_is_close_to_the_q8_one():
    q8, dot = tiny_backbone(torch.bfloat16, quantize=True), tiny_backbone(torch.bfloat16, quantize=True, int8_dot=True)
    assert dot.int8_dot and not q8.int8_dot
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    a = q8.logits(q8(tokens, q8.new_cache(1, 16))).float()
    b = dot.logits(dot(tokens, dot.new_cache(1, 16))).float()
    assert not torch.equal(a, b)  # the activations are quantized too
    assert (a - b).abs().max() < 0.05 * a.abs().max()
    with pytest.raises(ValueError, match="int8_dot=True .* needs quantize=True"):
        tiny_backbone(torch.bfloat16, int8_dot=True)


def test_lookup_drafts_follow_the_latest_earlier_occurrence():
    assert decoding.lookup_drafts([1, 2, 3, 4, 5, 9, 2, 3], 3) == [4, 5, 9]  # after the earlier "2 3"
    assert decoding.lookup_drafts([7, 2, 3, 8, 1, 2, 3, 4, 1, 2, 3], 2) == [4, 1]  # the latest "1 2 3" wins
    assert decoding.lookup_drafts([1, 2, 3, 5, 9, 2, 3], 6) == [5, 9, 2, 3]  # the context's end caps them
    assert decoding.lookup_drafts([5, 5, 5, 5], 3) == [5]
    assert decoding.lookup_drafts([1, 2, 3, 4], 3) == []  # no repeated 2-gram
    assert decoding.lookup_drafts([4, 1, 2, 4], 3) == []  # one repeated token is not enough
    assert decoding.lookup_drafts([1, 2, 9, 1, 2], 0) == []
    assert decoding.lookup_drafts([], 4) == []


def test_lookup_drafts_grow_with_the_match():
    """A match offers `start` drafts, one more per token it also matches before the searched
    suffix, at most max_drafts."""
    # "1 2 3" recurs at 4, and the 3 tokens before it match too ("11 12 13"), the 4th not.
    ctx = [10, 11, 12, 13, 1, 2, 3, 20, 21, 22, 23, 24, 25, 26, 27, 11, 12, 13, 1, 2, 3]
    assert decoding.lookup_drafts(ctx, 8, 2) == [20, 21, 22, 23, 24]  # 2 + 3
    assert decoding.lookup_drafts(ctx, 4, 2) == [20, 21, 22, 23]  # at most max_drafts
    assert decoding.lookup_drafts(ctx, 8, 6) == [20, 21, 22, 23, 24, 25, 26, 27]
    assert decoding.lookup_drafts(ctx, 3) == decoding.lookup_drafts(ctx, 3, 3) == [20, 21, 22]  # no start: all
    assert decoding.lookup_drafts(ctx, 3, 9) == [20, 21, 22]  # a start past the most: the most
    # No token before the suffix matches: start drafts; the match at the context's start: none before it.
    assert decoding.lookup_drafts([7, 1, 2, 3, 20, 21, 22, 23, 24, 8, 1, 2, 3], 8, 2) == [20, 21]
    assert decoding.lookup_drafts([1, 2, 3, 20, 21, 22, 23, 1, 2, 3], 8, 2) == [20, 21]
    # A 2-token match: the 3-token search would have found a longer one, so it never grows.
    assert decoding.lookup_drafts([1, 2, 5, 6, 7, 8, 9, 2, 5], 8, 2) == [6, 7]


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS[:2] + VARIANTS[3:4])
@pytest.mark.parametrize("with_head", [False, True])
def test_lookup_drafts_keep_greedy_output(dtype, quantize, int8_dot, with_head):
    """Prompt lookup alone or beside the head (batched, ragged, repetitive prompts): the tokens
    of plain greedy, in fewer passes."""
    model = tiny_backbone(dtype, quantize=quantize, int8_dot=int8_dot)
    g = torch.Generator().manual_seed(4)
    prompts = []
    for n in torch.randint(2, 8, (8,), generator=g):  # a random phrase said three times
        phrase = torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist()
        prompts.append(phrase * 3)
    max_new = 20
    want = greedy_reference(model, prompts, max_new)
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY)) if with_head else None
    for lookup, start in ((1, None), (4, None), (8, 1), (8, 3)):  # (8, start): drafts growing with the match
        got = decoding.generate(
            model,
            prompts,
            max_new,
            head=head,
            k=2,
            eos_token_ids=TINY.eos_token_ids,
            lookup=lookup,
            lookup_start=start,
        )
        assert [r.tokens for r in got] == want
        assert len(got[0].drafted) == max(lookup, 2 if with_head else 0)
        if not with_head:  # every accepted draft came from the lookup
            assert sum(r.passes for r in got) < sum(len(w) for w in want)
            assert sum(sum(r.accepted) for r in got) > 0
    # Sampling with lookup drafts gives the tokens of plain sampling for the seed.
    plain = decoding.generate(model, prompts, max_new, eos_token_ids=TINY.eos_token_ids, temperature=0.8, seed=7)
    drafted = decoding.generate(
        model, prompts, max_new, head=head, k=2, eos_token_ids=TINY.eos_token_ids, temperature=0.8, seed=7, lookup=3
    )
    assert [r.tokens for r in drafted] == [r.tokens for r in plain]


def test_confident_drafts_cut_the_chain_where_the_head_is_unsure():
    assert decoding.confident_drafts([5, 6, 7], [0.9, 0.5, 0.6], 0.3) == [5, 6]  # 0.9, 0.45, 0.27
    assert decoding.confident_drafts([5, 6, 7], [0.9, 0.3, 0.9], 0.3) == [5]  # 0.27 < 0.3
    assert decoding.confident_drafts([5, 6], [0.2, 1.0], 0.25) == []
    assert decoding.confident_drafts([5, 6], [0.2, 1.0], 0.0) == [5, 6]  # 0: every draft
    assert decoding.confident_drafts([5, 6], [1.0, 1.0], 1.0) == [5, 6]
    assert decoding.confident_drafts([5, 6], [float("nan"), 1.0], 0.0) == []  # NaN: not confident
    assert decoding.confident_drafts([], [], 0.5) == []


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS[:2] + VARIANTS[3:4])
def test_draft_confidence_keeps_greedy_output(dtype, quantize, int8_dot):
    """The head's chain cut where it is unsure (batched, ragged, with and without lookup, every
    threshold from keeping all to cutting all): the tokens of plain greedy; sampling keeps
    plain sampling's tokens for the seed."""
    model = tiny_backbone(dtype, quantize=quantize, int8_dot=int8_dot)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, TINY.vocab_size, (int(n),), generator=g).tolist() for n in (3, 9, 5, 12)]
    prompts[1] = prompts[1] * 2  # something for lookup to find
    max_new = 16
    want = greedy_reference(model, prompts, max_new)
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    passes = {}
    for confidence in (0.0, 0.02, 0.05, 0.5, 1.0):
        for lookup in (0, 4):
            got = decoding.generate(
                model,
                prompts,
                max_new,
                head=head,
                k=3,
                branches=1,
                eos_token_ids=TINY.eos_token_ids,
                lookup=lookup,
                draft_confidence=confidence,
            )
            assert [r.tokens for r in got] == want, (confidence, lookup)
            passes[confidence, lookup] = sum(r.passes for r in got)
            drafted = sum(sum(r.drafted) for r in got)
            if confidence == 1.0 and lookup == 0:  # a random head is never sure: no drafts at all
                assert drafted == 0 and passes[confidence, lookup] == sum(len(w) - 1 for w in want)
    assert passes[0.0, 0] <= passes[1.0, 0]
    plain = decoding.generate(model, prompts, max_new, eos_token_ids=TINY.eos_token_ids, temperature=0.8, seed=7)
    cut = decoding.generate(
        model,
        prompts,
        max_new,
        head=head,
        k=3,
        eos_token_ids=TINY.eos_token_ids,
        temperature=0.8,
        seed=7,
        draft_confidence=0.05,
    )
    assert [r.tokens for r in cut] == [r.tokens for r in plain]


def test_draft_confidence_bad_input():
    model = tiny_backbone()
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="draft_confidence \\(a probability\\) must be in \\[0, 1\\]"):
            decoding.generate(model, [[1, 2]], 4, head=head, draft_confidence=p)
    for kw in ({"head": None}, {"head": OracleHead({2: [1, 2, 3, 4, 5, 6]}, 97)}, {"head": head, "branches": 2}):
        with pytest.raises(ValueError, match="draft_confidence cuts the MTP head's chain"):
            decoding.generate(model, [[1, 2]], 4, draft_confidence=0.3, **kw)


def test_lookup_bad_input():
    model = tiny_backbone()
    with pytest.raises(ValueError, match="lookup \\(most drafts by prompt lookup\\) must be >= 0, got -1"):
        decoding.generate(model, [[1, 2]], 4, lookup=-1)
    with pytest.raises(ValueError, match="lookup_start \\(drafts of a short lookup match\\) must be >= 1, got 0"):
        decoding.generate(model, [[1, 2]], 4, lookup=3, lookup_start=0)

    class Standalone(OracleHead):
        def begin(self, prompts, capacity):
            pass

    with pytest.raises(ValueError, match="lookup drafts go with the MTP head or alone"):
        decoding.generate(model, [[1, 2]], 4, head=Standalone({0: [1, 2]}, 97), lookup=2)


def test_decode_config_resolves_the_cli_defaults():
    """config.DecodeConfig.resolve: trees of K=3 with 3 first drafts where they go (the MTP
    head, greedy, not lenient) and pay (the bf16 backbone over float weights, not loaded as
    stored), else chains of K=2; prompt lookup beside the MTP head only, of 6 where wide passes
    pay (the same backbones as trees), else of 3 growing to 8 with a longer match; given values
    kept."""
    from mtp_kernels.config import (
        NARROW_DRAFT_CONFIDENCE,
        NARROW_SAMPLING_LOOKUP_ALONE_FROM,
        DecodeConfig,
        head_left_out,
    )

    head = MTPHead(HeadConfig.for_backbone(TINY))

    class Standalone(OracleHead):
        def begin(self, prompts, capacity):
            pass

    bf16, fp32, q8 = tiny_backbone(torch.bfloat16), tiny_backbone(), tiny_backbone(torch.bfloat16, quantize=True)
    as_stored = tiny_backbone(torch.bfloat16)
    as_stored.loaded_as_stored = True

    def picked(model, h, **kw):
        c = DecodeConfig.resolve(model, h, **kw)
        return c.k, c.branches, c.lookup, c.lookup_start

    def cut(model, h, **kw):  # draft_confidence: the chain cut where an MTPHead is unsure, narrow passes only
        return DecodeConfig.resolve(model, h, **kw).draft_confidence

    assert cut(bf16, head) == 0 and cut(bf16, head, branches=1) == 0  # wide passes: every draft
    for model in (fp32, q8, as_stored):
        assert cut(model, head) == NARROW_DRAFT_CONFIDENCE == cut(model, head, temperature=0.25)
        assert cut(model, head, branches=2) == 0  # trees keep their chain
        assert cut(model, OracleHead({0: [1]}, 97)) == 0  # a drafter without probabilities
        assert cut(model, Standalone({0: [1]}, 97)) == 0 and cut(model, None) == 0
    assert cut(fp32, head, draft_confidence=0.5) == 0.5 and cut(bf16, head, draft_confidence=0.1) == 0.1
    assert picked(bf16, head, draft_confidence=0.1) == (2, 1, 6, 6)  # a chain cut asked for: a chain, not a tree
    assert picked(bf16, head, draft_confidence=0) == (3, 3, 6, 6)

    assert picked(bf16, head) == (3, 3, 6, 6)
    for model in (fp32, q8, as_stored):
        assert picked(model, head) == (2, 1, 8, 3)
    assert picked(bf16, head, temperature=0.5) == (2, 1, 6, 6)  # no trees when sampling; lookup as the backbone's
    assert picked(bf16, head, lenient=(2, 0.5)) == (2, 1, 6, 6)
    assert picked(fp32, head, temperature=0.25) == (2, 1, 8, 3)
    # Sampling hot over narrow passes: lookup alone unless the head is asked for (config.head_drafts_pay).
    for model in (fp32, q8, as_stored):
        for t in (NARROW_SAMPLING_LOOKUP_ALONE_FROM, 1.5):
            assert picked(model, head, temperature=t) == (0, 1, 8, 3) and cut(model, head, temperature=t) == 0
        assert picked(model, head, temperature=math.nextafter(NARROW_SAMPLING_LOOKUP_ALONE_FROM, 0)) == (2, 1, 8, 3)
        assert picked(model, head, temperature=0.9, lookup=4, lookup_start=2) == (0, 1, 4, 2)  # lookup's own
        assert picked(model, head, temperature=0.9, lookup=0) == (0, 1, 0, 0)  # plain sampling
        assert picked(model, head, temperature=0.9, k=2) == (2, 1, 8, 3)  # the head asked for: the other defaults
        assert picked(model, head, temperature=0.9, branches=1) == (2, 1, 8, 3)
        assert picked(model, head, temperature=0.9, draft_confidence=0.5) == (2, 1, 8, 3)
        assert picked(model, Standalone({0: [1]}, 97), temperature=0.9) == (2, 1, 0, 0)  # a drafter asked for
        # mtp=True without a head, what `mtp generate` resolves rather than load a head it leaves out
        for kw in ({}, dict(lookup=4), dict(lookup=0), dict(lookup_start=2)):
            assert DecodeConfig.resolve(model, head, temperature=0.9, **kw) == DecodeConfig.resolve(
                model, None, temperature=0.9, mtp=True, **kw
            )
        assert head_left_out(model, 0.9) and not head_left_out(model, 0.25) and not head_left_out(model, 0.9, k=2)
    assert not head_left_out(bf16, 0.9)
    assert picked(bf16, head, temperature=1.5) == (2, 1, 6, 6)  # wide passes: drafts pay
    assert picked(bf16, None) == (2, 1, 0, 0)
    assert picked(bf16, Standalone({0: [1]}, 97)) == (2, 1, 0, 0)
    assert picked(fp32, head, branches=2) == (3, 2, 8, 3)  # a tree asked for: the tree's K
    assert picked(bf16, head, k=5, branches=1, lookup=0) == (5, 1, 0, 0)
    assert picked(as_stored, head, lookup=2) == (2, 1, 2, 2)  # a start past the most asked for: the most
    assert picked(as_stored, None, lookup=5) == (2, 1, 5, 3)  # lookup alone grows as well
    assert picked(bf16, head, lookup=8, lookup_start=2) == (3, 3, 8, 2)
    c = DecodeConfig.resolve(bf16, head, temperature=0.25, seed=9, lenient=None)
    assert (c.temperature, c.seed, c.lenient) == (0.25, 9, None)
    with pytest.raises(AttributeError):
        c.k = 1  # frozen: one resolved configuration per call


def test_generate_with_defaults_equals_the_resolved_configuration():
    """decoding.generate with k / branches / lookup left out decodes as with the resolved values."""
    from mtp_kernels.config import DecodeConfig

    model = tiny_backbone(torch.bfloat16)
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 10, 11, 12]]
    c = DecodeConfig.resolve(model, head)
    a = decoding.generate(model, prompts, 12, head=head, eos_token_ids=TINY.eos_token_ids)
    b = decoding.generate(
        model,
        prompts,
        12,
        head=head,
        k=c.k,
        branches=c.branches,
        lookup=c.lookup,
        lookup_start=c.lookup_start,
        eos_token_ids=TINY.eos_token_ids,
    )
    stats = [[(g.tokens, g.passes, g.drafted, g.accepted, g.leaves_accepted) for g in r] for r in (a, b)]
    assert stats[0] == stats[1] and len(a[0].drafted) == 6
    assert [g.tokens for g in a] == greedy_reference(model, prompts, 12)


def test_sampling_hot_over_narrow_passes_decodes_without_the_head():
    """Over narrow passes (fp32 here), sampling from NARROW_SAMPLING_LOOKUP_ALONE_FROM with the
    head's settings left out: prompt lookup alone (the same drafts as asking for it without the
    head); k asked for drafts with the head again; all give plain sampling's tokens; k = 0 asked
    for is refused."""
    from mtp_kernels.config import NARROW_SAMPLING_LOOKUP_ALONE_FROM

    model = tiny_backbone()
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY))
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12]]
    kw = dict(eos_token_ids=TINY.eos_token_ids, temperature=NARROW_SAMPLING_LOOKUP_ALONE_FROM + 0.3, seed=3)
    plain = decoding.generate(model, prompts, 12, **kw)
    default = decoding.generate(model, prompts, 12, head=head, **kw)
    alone = decoding.generate(model, prompts, 12, lookup=8, lookup_start=3, **kw)
    asked = decoding.generate(model, prompts, 12, head=head, k=2, draft_confidence=0, **kw)  # a random head: no cut
    assert [g.tokens for g in default] == [g.tokens for g in plain] == [g.tokens for g in asked]
    stats = [[(g.tokens, g.passes, g.drafted, g.accepted) for g in r] for r in (default, alone)]
    assert stats[0] == stats[1] and len(default[0].drafted) == 8  # lookup's, not the head's
    assert sum(g.drafted[0] for g in asked) > sum(g.drafted[0] for g in default)  # the head drafts every pass
    with pytest.raises(ValueError, match=r"k \(drafts per pass\) must be >= 1, got 0"):
        decoding.generate(model, prompts, 12, head=head, k=0, **kw)


def test_kv_cache_move_and_truncate():
    """KVCache.move: one request's entries at src copied to dst in every layer, its length
    dst + 1, the other requests untouched; truncate sets the lengths and moves nothing."""
    model = tiny_backbone()
    cache = model.new_cache(2, 16)
    model(torch.randint(4, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1)), cache)
    k, v = cache.k.clone(), cache.v.clone()
    cache.move(1, 7, 4)
    assert cache.lens.tolist() == [9, 5]
    assert torch.equal(cache.k[:, 1, :, 4], k[:, 1, :, 7]) and torch.equal(cache.v[:, 1, :, 4], v[:, 1, :, 7])
    changed = torch.zeros_like(k, dtype=torch.bool)
    changed[:, 1, :, 4] = True
    assert torch.equal(cache.k[~changed], k[~changed]) and torch.equal(cache.v[~changed], v[~changed])
    cache.truncate(torch.tensor([3, 5]))
    assert cache.lens.tolist() == [3, 5] and torch.equal(cache.k[~changed], k[~changed])

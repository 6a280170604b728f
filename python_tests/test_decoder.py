"""mtp.decoder_layers: a whole decoder pass in one call gives, bitwise, the op-by-op
composition of reference.decoder_layers run with the kernels (mtp.linear, mtp.rope_, ...),
and is close to the same composition of the reference ops. Across dtypes, float / Q8 /
int8-dot weights, ragged cache lengths, every instruction set, thread counts, strided cache
views, T=0, zero layers and NaN rows; the caches it writes; opcheck; and bad input.
mtp.head_draft likewise against reference.head_draft (the MTP head's draft steps)."""

import dataclasses
import os
import re

import pytest
import torch

from mtp_kernels import ops, reference
from mtp_kernels.models.head import HeadConfig, MTPHead
from test_rowwise import assert_bitwise
from tiny_model import TINY, tiny_backbone


KERNEL_OPS = ops.KERNELS  # the kernels one op at a time
VARIANTS = [
    (torch.float32, False, False),
    (torch.float32, True, False),
    (torch.float32, True, True),
    (torch.bfloat16, False, False),
    (torch.bfloat16, True, False),
    (torch.bfloat16, True, True),
]
# (cache lengths before the pass, T): one-token steps, a verify pass, ragged requests, empty caches,
# and a prefill of >= 16 rows (its row-local steps split over the threads).
CASES = [([5], 1), ([3, 7], 5), ([0, 4, 9], 1), ([0, 0], 3), ([0, 4], 12)]


class Pass:
    """The arguments of one decoder pass of the tiny backbone, with caches holding random
    history, so that several calls can start from the same state."""

    def __init__(self, dtype, quantize, int8_dot, lens, T, seed=0, capacity=32, layers=TINY.num_layers):
        g = torch.Generator().manual_seed(seed)
        # same weights (layers: a deeper stack of the same kind)
        cfg = dataclasses.replace(TINY, max_position=max(TINY.max_position, capacity), num_layers=layers)
        self.model = m = tiny_backbone(dtype, cfg, quantize=quantize, int8_dot=int8_dot)
        self.cache = m.new_cache(len(lens), capacity)
        self.cache.k.copy_(torch.randn(self.cache.k.shape, generator=g))
        self.cache.v.copy_(torch.randn(self.cache.v.shape, generator=g))
        self.cache.lens.copy_(torch.tensor(lens))
        self.x = m.embed(torch.randint(0, TINY.vocab_size, (len(lens), T), generator=g))
        self.weights, self.scales = m.decoder_weights()
        self.quantize_x = int8_dot

    def args(self, k=None, v=None, x=None):
        m = self.model
        return (
            self.x if x is None else x,
            self.cache.k.clone() if k is None else k,
            self.cache.v.clone() if v is None else v,
            self.cache.lens.clone(),
            m.rope_cos,
            m.rope_sin,
            self.weights,
            self.scales,
            m.cfg.num_heads,
            m.cfg.rms_norm_eps,
        )

    def fused(self, *args):
        args = args or self.args()
        return torch.ops.mtp.decoder_layers(*args, quantize_x=self.quantize_x), args

    def composed(self, op_set=KERNEL_OPS, x=None):
        args = self.args(x=x)
        return reference.decoder_layers(*args, quantize_x=self.quantize_x, ops=op_set), args


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
@pytest.mark.parametrize("lens,T", CASES)
def test_one_call_equals_the_op_by_op_composition_bitwise(isa, dtype, quantize, int8_dot, lens, T):
    p = Pass(dtype, quantize, int8_dot, lens, T)
    got, (_, k, v, got_lens, *_) = p.fused()
    want, (_, k_want, v_want, *_) = p.composed()
    assert_bitwise(got, want)
    assert torch.equal(k, k_want) and torch.equal(v, v_want)  # the same keys/values, at the same places
    assert torch.equal(got_lens, torch.tensor(lens))  # the lengths are the caller's to advance
    changed = (k != p.cache.k).any(dim=(0, 2, 4))  # [B, L]: the positions written
    for b, n in enumerate(lens):
        assert changed[b, n : n + T].all() and not changed[b, :n].any() and not changed[b, n + T :].any()


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
def test_close_to_the_reference_ops(dtype, quantize, int8_dot):
    """The composition of the reference ops (fp64 linear and attention): the kernels' fp32
    rounding apart, the same pass (a bf16 activation may round to its neighbour, and the
    difference travels through the layers)."""
    p = Pass(dtype, quantize, int8_dot, [3, 7], 5)
    got, _ = p.fused()
    want, _ = p.composed(op_set=None)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=0.1, atol=0.1)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("lens,T", [([3, 7], 5), ([0, 4], 12)])
def test_thread_counts_give_the_same_bits(threads, lens, T):
    p = Pass(torch.bfloat16, True, True, lens, T)
    results = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        results.append(p.fused()[0])
    assert all(torch.equal(r, results[0]) for r in results)


def test_strided_cache_views_are_written_in_place():
    """A request's view of a batched cache (KVCache.select: strided [layers, 1, ...]) gives the
    bits of a contiguous cache and writes into the batched buffers."""
    p = Pass(torch.float32, False, False, [3, 7], 2)
    k, v = p.cache.k.clone(), p.cache.v.clone()
    args = list(p.args(k=k[:, 1:2], v=v[:, 1:2], x=p.x[1:2]))
    args[3] = p.cache.lens[1:2].clone()
    got, _ = p.fused(*args)
    alone = p.args(k=k[:, 1:2].contiguous(), v=v[:, 1:2].contiguous(), x=p.x[1:2])
    alone = alone[:3] + (args[3],) + alone[4:]
    want, (_, k_alone, *_) = p.fused(*alone)
    assert torch.equal(got, want) and torch.equal(k[:, 1:2], k_alone)
    assert torch.equal(k[:, 0], p.cache.k[:, 0])  # the other request's cache untouched


def test_a_nan_request_leaves_the_others_alone():
    p = Pass(torch.bfloat16, False, False, [3, 7], 3)
    x = p.x.clone()
    x[0, 1, 5] = float("nan")
    got, _ = p.fused(*p.args(x=x))
    want, _ = p.composed(x=x)
    assert_bitwise(got, want)
    assert got[0, 1:].isnan().all() and not got[0, 0].isnan().any()  # causal: token 0 never sees token 1
    assert torch.equal(got[1], p.fused()[0][1])


def test_empty_pass_and_zero_layers():
    p = Pass(torch.float32, False, False, [3, 7], 0)
    got, (_, k, *_) = p.fused()
    assert got.shape == (2, 0, TINY.hidden_size) and torch.equal(k, p.cache.k)
    # No layers: the final norm of the embeddings.
    p = Pass(torch.float32, False, False, [3, 7], 2)
    final = p.weights[-1]
    empty = p.cache.k[:0]
    got, _ = p.fused(
        p.x,
        empty,
        empty.clone(),
        p.cache.lens,
        p.model.rope_cos,
        p.model.rope_sin,
        [final],
        [],
        TINY.num_heads,
        TINY.rms_norm_eps,
    )
    assert torch.equal(got, ops.rms_norm(p.x, final, TINY.rms_norm_eps))


@pytest.mark.parametrize("quantize,int8_dot", [(False, False), (True, True)])
def test_opcheck(quantize, int8_dot):
    p = Pass(torch.float32, quantize, int8_dot, [3, 7], 2)
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, p.args(), {"quantize_x": int8_dot})


def _bad(
    p,
    message,
    x=None,
    k=None,
    v=None,
    lens=None,
    cos=None,
    sin=None,
    weights=None,
    scales=None,
    heads=None,
    quantize_x=None,
):
    args = list(p.args(k=k, v=v, x=x))
    for i, value in ((3, lens), (4, cos), (5, sin), (6, weights), (7, scales), (8, heads)):
        if value is not None:
            args[i] = value
    before = (args[1].clone(), args[2].clone())
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.mtp.decoder_layers(*args, quantize_x=p.quantize_x if quantize_x is None else quantize_x)
    assert torch.equal(args[1], before[0]) and torch.equal(args[2], before[1])  # nothing written


def test_bad_input_raises_clear_errors():
    p = Pass(torch.float32, False, False, [3, 7], 2)
    w, k = p.weights, p.cache.k
    _bad(p, "mtp.decoder_layers: x must be 3-D [B, T, H]", x=p.x[0])
    _bad(p, "k_cache must have x's dtype", k=k.bfloat16())
    _bad(p, "k_cache must be 5-D [layers, B, Hkv, L, D]", k=k[0])
    _bad(p, "v_cache must have k_cache's shape", v=p.cache.v[:, :, :, :8])
    _bad(p, "k_cache.size(1) must equal B (x.size(0))", x=p.x[:1])
    _bad(p, "weights must hold 6 tensors per layer", weights=w[:-1])
    _bad(p, "weights[7] (layer 1's qkv).size(0) must equal (Hq + 2 Hkv) D", weights=w[:7] + [w[7][:-1]] + w[8:])
    _bad(p, "weights[9] (layer 1's post_norm) must have x's dtype", weights=w[:9] + [w[9].bfloat16()] + w[10:])
    _bad(p, "weights[12] (the final norm).size(0) must equal H", weights=w[:12] + [w[12][:-1]])
    _bad(p, "weight rows must be contiguous", weights=w[:1] + [w[1].t().contiguous().t()] + w[2:])
    strided = torch.stack([w[3], w[3]], dim=1)[:, 0]  # layer 0's post_norm, stride 2
    _bad(
        p,
        "weights[3] (layer 0's post_norm): norm weights must be contiguous (stride 1), got stride 2",
        weights=w[:3] + [strided] + w[4:],
    )
    _bad(p, "q's head count Hq = 3 must be a multiple of k_cache's head count Hkv = 2", heads=3)
    _bad(p, "request 1 would pass the cache capacity: cache_lens[1] + T = 31 + 2 > L = 32", lens=torch.tensor([3, 31]))
    _bad(p, "cache_lens must lie in [0, L (k_cache.size(3))]", lens=torch.tensor([3, -1]))
    _bad(
        p,
        "would pass the RoPE tables: cache_lens[0] + T = 3 + 2 > P = 4",
        cos=p.model.rope_cos[:4],
        sin=p.model.rope_sin[:4],
    )
    _bad(p, "rope_sin must have rope_cos's shape [256, 16], got [4, 16]", sin=p.model.rope_sin[:4])
    _bad(p, "rope_cos must be Float", cos=p.model.rope_cos.double())
    _bad(p, "quantize_x=True needs int8 weights with their scales", quantize_x=True)
    q = Pass(torch.float32, True, False, [3, 7], 2)
    _bad(q, "weight_scales must be empty (float weights) or hold the Q8 scales", scales=q.scales[:-1])
    _bad(q, "weights[1] (layer 0's qkv) is Char but weight_scales is empty", scales=[])
    _bad(
        q,
        "weights[2] (layer 0's o_proj)'s scales.size(1) must equal ceil(K/32)",
        scales=[q.scales[0], q.scales[1][:, :1]] + q.scales[2:],
    )
    _bad(p, "weights[1] (layer 0's qkv) is Float but weight_scales is not empty", scales=q.scales)
    _bad(
        q,
        "weights[7] (layer 1's qkv) is Float but weight_scales is not empty",
        weights=q.weights[:7] + [q.weights[7].float()] + q.weights[8:],
    )


# ---- mtp.head_draft -------------------------------------------------------------------------


class Draft:
    """The arguments of the tiny backbone's MTP head drafting k tokens after a prefill."""

    def __init__(self, dtype, quantize, lens, blocks=1, vocab=0, seed=0):
        torch.manual_seed(seed)
        self.model = m = tiny_backbone(dtype, quantize=quantize)
        self.head = MTPHead(HeadConfig.for_backbone(TINY, num_blocks=blocks, kv_layer=1))
        if vocab:
            self.head.set_draft_vocab(
                torch.randperm(TINY.vocab_size, generator=torch.Generator().manual_seed(seed))[:vocab]
            )
        g = torch.Generator().manual_seed(seed)
        self.cache = m.new_cache(len(lens), 32)
        for b, n in enumerate(lens):
            m(torch.randint(0, TINY.vocab_size, (1, n), generator=g), self.cache.select(b))
        self.hidden = torch.randn(len(lens), TINY.hidden_size, generator=g).to(dtype)
        self.token = torch.randint(0, TINY.vocab_size, (len(lens),), generator=g)

    def args(self, k, **changes):
        args = self.head.draft_args(self.model, self.cache, self.hidden, self.token, k)
        args.update(changes)
        return args


DRAFT_CASES = [
    (torch.float32, False, [5], 1, 0),
    (torch.bfloat16, True, [3, 9], 1, 40),
    (torch.float32, True, [4, 1, 7], 2, 0),
    (torch.bfloat16, False, [6, 2], 2, 40),
]


@pytest.mark.parametrize("dtype,quantize,lens,blocks,vocab", DRAFT_CASES)
@pytest.mark.parametrize("k", [1, 4])
def test_head_draft_equals_the_op_by_op_composition(isa, dtype, quantize, lens, blocks, vocab, k):
    d = Draft(dtype, quantize, lens, blocks, vocab)
    k_before, v_before = d.cache.k.clone(), d.cache.v.clone()
    got = torch.ops.mtp.head_draft(**d.args(k))
    want = reference.head_draft(**d.args(k), ops=KERNEL_OPS)
    assert got.dtype == torch.int64 and got.shape == (len(lens), k)
    assert torch.equal(got, want)
    assert torch.equal(d.cache.k, k_before) and torch.equal(d.cache.v, v_before)  # the cache is only read
    assert torch.equal(d.head.draft(d.model, d.cache, d.hidden, d.token, k), got)  # MTPHead.draft is this call


@pytest.mark.parametrize("dtype,quantize,lens,blocks,vocab", [c for c in DRAFT_CASES if c[-1]])
def test_head_draft_lm_head_as_the_draft_rows_or_read_through_them(isa, dtype, quantize, lens, blocks, vocab):
    """MTPHead.draft_args gives lm_head as the draft vocabulary's rows [Vd, H] (gathered once):
    the same drafts as the backbone's LM head [V, H] read through draft_vocab, alternatives
    included; a full-size draft vocabulary (Vd == V, a permutation) reads lm_head [V, H] through it."""
    d = Draft(dtype, quantize, lens, blocks, vocab)
    name = d.model.lm_head_name
    rows = d.args(3)
    full = d.args(3, lm_head=d.model.w(name), lm_head_scale=d.model.scale(name))
    assert rows["lm_head"].shape[0] == vocab and full["lm_head"].shape[0] == TINY.vocab_size
    got = torch.ops.mtp.head_draft(**rows, alternatives=2)
    assert torch.equal(got, torch.ops.mtp.head_draft(**full, alternatives=2))
    assert torch.equal(reference.head_draft(**rows, alternatives=2, ops=KERNEL_OPS), got)
    assert d.head.draft_lm_head(d.model)[0] is rows["lm_head"]  # cached: gathered once
    other = torch.randperm(TINY.vocab_size, generator=torch.Generator().manual_seed(9))[:vocab]
    d.head.set_draft_vocab(other)  # a new vocabulary (same size): gathered again
    assert torch.equal(d.head.draft_lm_head(d.model)[0], d.model.w(name)[other])
    with torch.no_grad():
        d.model.w(name)[other[0]] += 1  # the LM head changed in place: gathered again
    assert torch.equal(d.head.draft_lm_head(d.model)[0], d.model.w(name)[other])
    perm = d.args(3, **{k: full[k] for k in ("lm_head", "lm_head_scale")}, draft_vocab=torch.randperm(TINY.vocab_size))
    assert torch.equal(torch.ops.mtp.head_draft(**perm), reference.head_draft(**perm, ops=KERNEL_OPS))


@pytest.mark.parametrize("mats,code", [("q8_0", 8), ("q4_1", 3)])
@pytest.mark.parametrize("dtype,quantize,lens,blocks,vocab", DRAFT_CASES)
def test_head_draft_block_type_matrices_equal_the_op_by_op_composition(
    isa, dtype, quantize, lens, blocks, vocab, mats, code
):
    """MTPHead.matrix_dtype = "q8_0" / "q4_1": the head's own matrices as those GGUF blocks (x8
    where the rows come in 8s, the file layout else), their types in weight_types; the drafts
    are the composition's bitwise, the x8 and file layouts give the same, and the values are
    gguf's quantizer's (bitwise its dequantizer's), within half a step of the float matrices
    (plus the fp16 rounding of the block's scale and offset)."""
    import gguf

    d = Draft(dtype, quantize, lens, blocks, vocab)
    d.head.matrix_dtype = torch.float32  # the parameters' own values, which the blocks are made from
    floats = d.args(3)["weights"]
    d.head.matrix_dtype = mats
    args = dict(d.args(3), **d.head.draft_types(d.model))  # weight_types: keyword-only, as draft_types gives it
    types = args["weight_types"]
    assert len(types) == 1 + 4 * blocks and set(types) <= {code, code + 100} and code + 100 in types
    got = torch.ops.mtp.head_draft(**args, alternatives=2)
    assert torch.equal(got, reference.head_draft(**args, alternatives=2, ops=KERNEL_OPS))
    matrices = [2] + [3 + 6 * i + j for i in range(blocks) for j in (1, 2, 4, 5)]
    file_layout = list(args["weights"])
    qtype = gguf.GGMLQuantizationType(code)
    for t, i in zip(types, matrices):
        w = args["weights"][i]
        assert w.dtype == torch.uint8
        rows = reference.x8_file_rows(w, t) if t == code + 100 else w
        file_layout[i] = rows
        values = reference.gguf_dequantize(rows, code)
        want = gguf.quants.dequantize(gguf.quants.quantize(floats[i].float().numpy(), qtype), qtype)
        assert torch.equal(values, torch.from_numpy(want))
        block = floats[i].float().reshape(values.shape[0], -1, 32)
        if code == 3:  # Q4_1: 15 steps from the block's min to its max
            step, levels = (block.amax(-1, keepdim=True) - block.amin(-1, keepdim=True)) / 15, 15
        else:  # Q8_0: 127 steps to its largest magnitude
            step, levels = block.abs().amax(-1, keepdim=True) / 127, 127
        slack = block.abs().amax(-1, keepdim=True) * 2**-10  # the fp16 scale's and offset's rounding
        assert ((values.reshape(block.shape) - block).abs() <= step * (0.5 + levels / 2048) + slack).all()
    same = torch.ops.mtp.head_draft(**dict(args, weights=file_layout, weight_types=[code] * len(types)), alternatives=2)
    assert torch.equal(same, got)
    assert torch.equal(d.head.draft(d.model, d.cache, d.hidden, d.token, 3, alternatives=2), got)
    d.head.matrix_dtype = None  # back to float: the float weights and no types again
    assert d.head.draft_types(d.model) == {} and torch.equal(d.args(3)["weights"][2], floats[2].to(dtype))


def test_head_draft_weight_types_bad_input_raises_clear_errors():
    d = Draft(torch.float32, False, [3, 9], 1, 40)
    d.head.matrix_dtype = "q8_0"
    args = dict(d.args(2), **d.head.draft_types(d.model))

    def bad(message, **changes):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            torch.ops.mtp.head_draft(**dict(args, **changes))

    bad(
        "weight_types must hold one GGML type number (or -1: a float or Q8 matrix) per matrix, proj, then 4 per "
        "block (qkv, o_proj, gate_up, down_proj): 5 values, got 4",
        weight_types=args["weight_types"][:4],
    )
    bad("weight_types[1]: ", weight_types=[108, 99, 108, 108, 108])
    floats = args["weights"][:2] + [torch.zeros(64, 128)] + args["weights"][3:]
    bad(
        "weights[2] (proj) of GGML type 108 (Q8_0_X8) must be its uint8 bytes [N, row bytes], got Float", weights=floats
    )
    bad("weights[2] (proj) must be Float or BFloat16 or Char, got Byte", weight_types=None)
    torch.library.opcheck(torch.ops.mtp.head_draft.default, tuple(d.args(2).values()), d.head.draft_types(d.model))
    with pytest.raises(ValueError, match="matrix_dtype 'q4_0': a torch dtype or one of"):
        d.head.matrix_dtype = "q4_0"
        d.args(2)


def test_q8_0_matrices_need_whole_blocks():
    """A head whose rows are not whole Q8_0 blocks (H = 48): matrix_dtype "q8_0" is refused
    with a clear error, and load_head drafts in the backbone's dtype instead, with a note."""
    import dataclasses

    from mtp_kernels.models import loading

    cfg = dataclasses.replace(TINY, hidden_size=48, num_heads=3, num_kv_heads=1)
    model = tiny_backbone(torch.bfloat16, cfg)
    head = MTPHead(HeadConfig.for_backbone(cfg, kv_layer=1))
    assert not head.fits_block_type("q8_0") and Draft(torch.float32, False, [3]).head.fits_block_type("q8_0")
    head.matrix_dtype = "q8_0"
    with pytest.raises(ValueError, match=r"matrix_dtype 'q8_0': this head's matrices have rows of \[48, 96\] values"):
        head.draft_weights(torch.bfloat16)
    notes = []
    head = loading.load_head(None, model, notes.append, default_model=False)
    assert head.matrix_dtype == torch.bfloat16 and head.draft_types(model) == {}
    assert any("do not fit q4_1 blocks; it drafts in bfloat16" in n for n in notes)  # the family default


def test_load_head_freezes_a_q8_0_head_for_drafting(tmp_path):
    """load_head with Q8_0 matrices makes the head drafting_only: its first draft makes them
    and frees the float matrices (freeze_for_drafting does it at once): the same draft weights
    and drafts as a head that keeps them; another dtype or matrix type and save are refused
    with a clear error; the quantizer, run a few rows at a time, gives the bytes of one call
    over the whole matrix."""
    import gguf

    from mtp_kernels.models import head as head_module
    from mtp_kernels.models import loading

    model = tiny_backbone(torch.bfloat16)
    frozen = loading.load_head(None, model, lambda m: None, default_model=False, matrices="q8_0")
    assert frozen.drafting_only and frozen.proj.numel() > 0  # not before its first draft
    torch.manual_seed(0)  # load_head's untrained head, kept whole
    kept = MTPHead(HeadConfig.for_backbone(TINY, kv_layer=-1)).to(torch.bfloat16)
    kept.matrix_dtype = "q8_0"
    assert frozen.matrix_dtype == "q8_0" and frozen.draft_weight_types(model.dtype) == kept.draft_weight_types(
        model.dtype
    )
    for a, b in zip(frozen.draft_weights(model.dtype), kept.draft_weights(model.dtype)):
        assert torch.equal(a, b)
    assert frozen.proj.numel() == 0 and all(b.gate_proj.numel() == 0 for b in frozen.blocks)
    assert kept.proj.numel() > 0
    eager = MTPHead(HeadConfig.for_backbone(TINY, kv_layer=-1)).to(torch.bfloat16)
    eager.matrix_dtype = "q8_0"
    eager.freeze_for_drafting(model.dtype)
    assert eager.proj.numel() == 0 and eager.draft_weight_types(model.dtype) == kept.draft_weight_types(model.dtype)
    cache = model.new_cache(2, 32)
    hidden = model(torch.randint(0, TINY.vocab_size, (2, 9)), cache)[:, -1]
    token = torch.tensor([3, 5])
    assert torch.equal(frozen.draft(model, cache, hidden, token, 3), kept.draft(model, cache, hidden, token, 3))
    with pytest.raises(ValueError, match="this head drafts only with q8_0 matrices and torch.bfloat16 norms"):
        frozen.draft_weights(torch.float32)
    frozen.matrix_dtype = torch.bfloat16
    with pytest.raises(ValueError, match="its float matrices were freed"):
        frozen.draft_weights(torch.bfloat16)
    with pytest.raises(ValueError, match="frozen for drafting"):
        frozen.save(str(tmp_path / "head"))
    floats = loading.load_head(None, model, lambda m: None, default_model=False, matrices="bfloat16")
    assert floats.matrix_dtype == torch.bfloat16 and floats.proj.numel() > 0  # float matrices: nothing freed
    w = torch.randn(2 * head_module._QUANTIZE_ROWS + 24, 64)
    whole = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0)
    got, code = head_module._gguf_matrix([w[:100], w[100:]], 8)
    assert code == 108 and torch.equal(reference.x8_file_rows(got, 108), torch.from_numpy(whole))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings (Linux)")
def test_a_frozen_head_unmaps_its_file(tmp_path):
    """MTPHead.load in the file's dtype maps the matrices in place, but copies what a frozen head
    keeps (norms, draft_vocab): once freeze_for_drafting frees the matrices the file is unmapped
    (a view left on it kept all of it mapped, its pages read by the first draft resident). A head
    that keeps its float matrices keeps them as mapped."""
    import gc

    torch.manual_seed(0)
    folder = str(tmp_path / "head")
    MTPHead(HeadConfig.for_backbone(TINY, kv_layer=-1)).save(folder, torch.bfloat16)
    path = os.path.join(folder, "head.safetensors")

    def mapped() -> bool:
        gc.collect()
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith(path) for line in f)

    head = MTPHead.load(folder, dtype=torch.bfloat16, backbone_cfg=TINY)
    assert mapped()  # the matrices: views of the file
    head.matrix_dtype = "q8_0"
    head.freeze_for_drafting(torch.bfloat16)
    assert not mapped()
    assert head.embed_norm.numel() == TINY.hidden_size and head.draft_vocab.numel() == head.cfg.draft_vocab_size
    kept = MTPHead.load(folder, dtype=torch.bfloat16, backbone_cfg=TINY)
    kept.draft_weights(torch.bfloat16)
    assert mapped() and kept.proj.numel() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_head_draft_picks_the_reference_ops_drafts(seed):
    """fp32: the reference ops (fp64 linear and attention) pick the same drafts (no near-ties
    in these random heads)."""
    d = Draft(torch.float32, False, [5, 8], 2, 0, seed=seed)
    assert torch.equal(torch.ops.mtp.head_draft(**d.args(4)), reference.head_draft(**d.args(4)))


@pytest.mark.parametrize("dtype,quantize,lens,blocks,vocab", DRAFT_CASES)
def test_head_draft_probs_out_is_the_heads_softmax_at_its_drafts(isa, dtype, quantize, lens, blocks, vocab):
    """probs_out [B, k]: each draft's probability under the head, the composition's softmax at
    the draft to rounding (a sum of exponentials in another order: not on the exact path); the
    drafts unchanged by asking; any strides."""
    d = Draft(dtype, quantize, lens, blocks, vocab)
    B, k = len(lens), 3
    got_p, want_p = torch.full((B, k), float("nan")), torch.full((B, k), float("nan"))
    got = torch.ops.mtp.head_draft(**d.args(k), probs_out=got_p)
    want = reference.head_draft(**d.args(k), probs_out=want_p, ops=KERNEL_OPS)
    assert torch.equal(got, want) and torch.equal(got, torch.ops.mtp.head_draft(**d.args(k)))
    torch.testing.assert_close(got_p, want_p, rtol=2e-6, atol=0)
    Vd = vocab or TINY.vocab_size
    assert bool(((got_p >= 1 / Vd * (1 - 1e-6)) & (got_p <= 1)).all())  # the largest of Vd probabilities
    strided = torch.full((k, B), float("nan")).t()  # [B, k], strides (1, B)
    assert torch.equal(torch.ops.mtp.head_draft(**d.args(k), probs_out=strided), got)
    assert torch.equal(strided, got_p)
    assert torch.equal(d.head.draft(d.model, d.cache, d.hidden, d.token, k, probs_out=strided), got)


def test_head_draft_probs_out_edge_values():
    """A NaN or infinite hidden state: NaN logits, NaN probabilities (as torch.softmax gives);
    k = 0 and one-token draft vocabularies."""
    d = Draft(torch.float32, False, [3, 9], 1, 40)
    hidden = d.hidden.clone()
    hidden[1] = float("nan")
    got_p, want_p = torch.zeros(2, 2), torch.zeros(2, 2)
    got = torch.ops.mtp.head_draft(**d.args(2, hidden=hidden), probs_out=got_p)
    assert torch.equal(got, reference.head_draft(**d.args(2, hidden=hidden), probs_out=want_p, ops=KERNEL_OPS))
    assert bool(got_p[1].isnan().all()) and bool(want_p[1].isnan().all()) and not bool(got_p[0].isnan().any())
    torch.testing.assert_close(got_p, want_p, rtol=2e-6, atol=0, equal_nan=True)
    empty = torch.empty(2, 0)
    assert torch.ops.mtp.head_draft(**d.args(0), probs_out=empty).shape == (2, 0)
    one = d.head.draft_vocab[:1]
    p = torch.zeros(2, 2)
    torch.ops.mtp.head_draft(**d.args(2, draft_vocab=one, lm_head=d.model.w(d.model.lm_head_name)), probs_out=p)
    assert torch.equal(p, torch.ones(2, 2))  # one candidate: certain


def test_head_draft_zero_steps_and_opcheck():
    d = Draft(torch.float32, True, [3, 9], 1, 40)
    assert torch.ops.mtp.head_draft(**d.args(0)).shape == (2, 0)
    a = d.args(3)
    torch.library.opcheck(torch.ops.mtp.head_draft.default, tuple(a.values()))
    torch.library.opcheck(torch.ops.mtp.head_draft.default, tuple(a.values()), {"probs_out": torch.zeros(2, 3)})


def test_head_draft_bad_input_raises_clear_errors():
    d = Draft(torch.float32, False, [3, 9], 1, 40)
    w = d.args(2)["weights"]

    def bad(message, **changes):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            torch.ops.mtp.head_draft(**d.args(changes.pop("k", 2), **changes))

    bad("mtp.head_draft: hidden must be 2-D [B, H]", hidden=d.hidden[0])
    bad("k_cache must have hidden's dtype", hidden=d.hidden.bfloat16())
    bad("k_cache must be 4-D [B, Hkv, L, D]", k_cache=d.cache.k)
    bad(
        "k_cache.size(0) must equal B (hidden.size(0))",
        hidden=d.hidden[:1],
        token=d.token[:1],
        cache_lens=d.cache.lens[:1],
    )
    bad(
        "token must hold token ids in [0, V (embedding.size(0))) = [0, 97), got token[1] = 97",
        token=torch.tensor([0, 97]),
    )
    bad(
        "draft_vocab must hold token ids in [0, V (embedding.size(0))) = [0, 97), got draft_vocab[0] = -1",
        draft_vocab=torch.cat([torch.tensor([-1]), d.head.draft_vocab[1:]]),
    )
    lm_head = d.model.w(d.model.lm_head_name)  # [V, H]; d.args gives the draft vocabulary's rows [40, H]
    assert d.args(2)["lm_head"].shape[0] == 40
    bad(
        "lm_head.size(0) must equal V (embedding.size(0)) or Vd (draft_vocab.size(0)) = 97, got 39",
        lm_head=lm_head[:39],
    )
    bad("lm_head.size(0) must equal V (embedding.size(0)) = 97, got 40", lm_head=lm_head[:40], draft_vocab=None)
    bad("lm_head must be 2-D [V, H] or [Vd, H]", lm_head=lm_head[0])
    bad("lm_head.size(1) must equal H (hidden.size(1))", lm_head=lm_head[:, :-1])
    bad("lm_head: weight rows must be contiguous (stride 1 along K)", lm_head=lm_head.t().contiguous().t())
    bad("lm_head is Char but lm_head_scale is empty", lm_head=lm_head.to(torch.int8))
    bad("lm_head is Float but lm_head_scale is not empty", lm_head_scale=torch.ones(97, 1))
    bad("draft_vocab must hold at least one token id", draft_vocab=d.head.draft_vocab[:0])
    bad("draft_vocab must be 1-D", draft_vocab=d.head.draft_vocab[None])
    bad("weights must hold embed_norm, hidden_norm, proj, then 6 tensors per block", weights=w[:-1])
    bad("weights[4] (block 0's qkv).size(0) must equal (Hq + 2 Hkv) D", weights=w[:4] + [w[4][:-1]] + w[5:])
    bad("weights[2] (proj).size(1) must equal 2H", weights=w[:2] + [w[2][:, :-1]] + w[3:])
    bad("weights[9] (out_norm) must have hidden's dtype", weights=w[:9] + [w[9].bfloat16()])
    bad(
        "request 1's drafts would pass the RoPE tables: cache_lens[1] + k = 9 + 2 > P = 10",
        rope_cos=d.model.rope_cos[:10],
        rope_sin=d.model.rope_sin[:10],
    )
    bad("k (draft steps) must be >= 0, got -1", k=-1)
    bad("probs_out must be Float", probs_out=torch.zeros(2, 2, dtype=torch.float64))
    bad("probs_out must be 2-D [B, k]", probs_out=torch.zeros(4))
    bad("probs_out.size(0) must equal B (hidden.size(0))", probs_out=torch.zeros(3, 2))
    bad("probs_out.size(1) must equal k", probs_out=torch.zeros(2, 3))
    bad("cache_lens must lie in [0, L (k_cache.size(2))]", cache_lens=torch.tensor([3, 33]))
    bad(
        "embedding is Char but embedding_scale is empty",
        embedding=d.model.w("model.embed_tokens.weight").to(torch.int8),
    )


# ---- taps: the residual stream after chosen layers ------------------------------------------

TAP_VARIANTS = [VARIANTS[0], VARIANTS[2], VARIANTS[3], VARIANTS[5]]  # float and int8-dot weights, fp32 and bf16
# (lens, T, taps) over a 3-layer stack: one-token steps, a verify pass, ragged requests with an
# empty cache, a prefill of >= 16 rows; every layer, the first and the last, a middle one.
TAP_CASES = [([5], 1, [0, 1, 2]), ([3, 7], 5, [0, 2]), ([0, 4, 9], 1, [1]), ([0, 4], 12, [0, 2])]


def with_taps(p, taps, fn=torch.ops.mtp.decoder_layers, **kwargs):
    """fn's pass with taps: (hidden, tap_out, args); tap_out starts as NaN, so an entry left
    unwritten shows."""
    args = p.args()
    tap_out = torch.full((len(taps), *p.x.shape), float("nan")).to(p.x.dtype)
    hidden = fn(*args, quantize_x=p.quantize_x, taps=taps, tap_out=tap_out, **kwargs)
    return hidden, tap_out, args


def composed_with_taps(*args, **kwargs):
    return reference.decoder_layers(*args, **kwargs, ops=KERNEL_OPS)


@pytest.mark.parametrize("dtype,quantize,int8_dot", TAP_VARIANTS)
@pytest.mark.parametrize("lens,T,taps", TAP_CASES)
def test_taps_are_the_op_by_op_composition_residuals_bitwise(isa, dtype, quantize, int8_dot, lens, T, taps):
    p = Pass(dtype, quantize, int8_dot, lens, T, layers=3)
    got, tap_out, (_, k, v, *_) = with_taps(p, taps)
    want, want_out, _ = with_taps(p, taps, composed_with_taps)
    assert torch.equal(tap_out, want_out) and torch.equal(got, want)
    plain, (_, k_plain, v_plain, *_) = p.fused()  # asking for taps changes nothing else
    assert torch.equal(got, plain) and torch.equal(k, k_plain) and torch.equal(v, v_plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_split_at_a_tap_continues_from_it(isa, dtype):
    """A tap is the residual the pass carries on: layers 0..i with taps=[i], then layers i+1..
    from tap_out[0] (as their x), give the whole pass's hidden states and cache entries bitwise;
    the last layer's tap is what the final norm normalizes."""
    p = Pass(dtype, False, False, [3, 7], 4, layers=3)
    whole, (_, k, v, *_) = p.fused()
    for i in range(2):
        x, k2, v2, lens, cos, sin, w, s, heads, eps = p.args()
        n = 6 * (i + 1)
        tap = torch.empty(1, *x.shape, dtype=dtype)
        first = (x, k2[: i + 1], v2[: i + 1], lens, cos, sin, w[:n] + w[-1:], s, heads, eps)
        torch.ops.mtp.decoder_layers(*first, taps=[i], tap_out=tap)
        rest = torch.ops.mtp.decoder_layers(tap[0], k2[i + 1 :], v2[i + 1 :], lens, cos, sin, w[n:], s, heads, eps)
        assert torch.equal(rest, whole) and torch.equal(k2, k) and torch.equal(v2, v), i
    _, last, args = with_taps(p, [2])
    assert torch.equal(ops.rms_norm(last[0], args[6][-1], args[9]), whole)


@pytest.mark.parametrize("dtype,quantize,int8_dot", TAP_VARIANTS)
def test_taps_with_tree_parents(isa, dtype, quantize, int8_dot):
    """Rows in storage order (b*T + t): the composition's bits, and each row the taps of the
    chain of its path."""
    p = Pass(dtype, quantize, int8_dot, [5, 0], 6, layers=3)
    tree = torch.tensor([[-1, 0, 1, 2, 0, 0], [-1, 0, 0, 2, 1, 4]])
    got, tap_out, _ = with_taps(p, [0, 2], tree_parents=tree)
    want, want_out, _ = with_taps(p, [0, 2], composed_with_taps, tree_parents=tree)
    assert torch.equal(tap_out, want_out) and torch.equal(got, want)
    assert torch.equal(got, torch.ops.mtp.decoder_layers(*p.args(), quantize_x=p.quantize_x, tree_parents=tree))
    for b, rows in enumerate(reference.tree_paths(tree)):
        for t, path in enumerate(rows):
            chain = list(p.args(x=p.x[b : b + 1, path]))
            chain[1], chain[2], chain[3] = chain[1][:, b : b + 1], chain[2][:, b : b + 1], chain[3][b : b + 1]
            chain_out = torch.empty(2, 1, len(path), TINY.hidden_size, dtype=dtype)
            torch.ops.mtp.decoder_layers(*chain, quantize_x=p.quantize_x, taps=[0, 2], tap_out=chain_out)
            assert torch.equal(tap_out[:, b, t], chain_out[:, 0, -1]), (b, t)


def test_empty_taps_and_empty_passes():
    """An empty list with a [0, B, T, H] tap_out taps nothing; T = 0 and zero layers work."""
    p = Pass(torch.float32, False, False, [3, 7], 2, layers=3)
    got, tap_out, _ = with_taps(p, [])
    assert tap_out.shape == (0, 2, 2, TINY.hidden_size) and torch.equal(got, p.fused()[0])
    p = Pass(torch.float32, False, False, [3, 7], 0, layers=3)
    got, tap_out, (_, k, *_) = with_taps(p, [1, 2])
    assert got.shape == (2, 0, TINY.hidden_size) and tap_out.shape == (2, 2, 0, TINY.hidden_size)
    assert torch.equal(k, p.cache.k)
    p = Pass(torch.float32, False, False, [3, 7], 2)
    empty = p.cache.k[:0]
    args = (p.x, empty, empty.clone(), p.cache.lens, p.model.rope_cos, p.model.rope_sin, p.weights[-1:], [])
    got = torch.ops.mtp.decoder_layers(
        *args, TINY.num_heads, TINY.rms_norm_eps, taps=[], tap_out=torch.empty(0, *p.x.shape)
    )
    assert torch.equal(got, ops.rms_norm(p.x, p.weights[-1], TINY.rms_norm_eps))


@pytest.mark.parametrize("quantize,int8_dot", [(False, False), (True, True)])
def test_opcheck_with_taps(quantize, int8_dot):
    p = Pass(torch.float32, quantize, int8_dot, [3, 7], 2, layers=3)
    kwargs = {"quantize_x": int8_dot, "taps": [0, 2], "tap_out": torch.empty(2, 2, 2, TINY.hidden_size)}
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, p.args(), kwargs)


def test_bad_taps_raise_clear_errors():
    """Checked before any write (the caches and tap_out untouched), with the same words in the
    CUDA fallback (run here on CPU tensors)."""
    from mtp_kernels import fallback

    p = Pass(torch.float32, False, False, [3, 7], 2, layers=3)
    shape = (2, *p.x.shape)

    def bad(message, taps=(0, 2), tap_out=None, fns=(torch.ops.mtp.decoder_layers, fallback.decoder_layers), **kw):
        for fn in fns:
            args = p.args(x=kw.get("x"), k=kw.get("k"))
            out = torch.zeros(shape) if tap_out is None else tap_out
            before = out.clone() if out is not False and not out.is_meta else None
            with pytest.raises(RuntimeError, match=re.escape(message)):
                fn(*args, taps=None if taps is None else list(taps), tap_out=None if out is False else out)
            assert torch.equal(args[1], p.cache.k) and torch.equal(args[2], p.cache.v)  # nothing written
            assert before is None or torch.equal(out, before)

    op = "mtp.decoder_layers: "
    bad(op + "taps and tap_out go together, got only taps", tap_out=False)
    bad(op + "taps and tap_out go together, got only tap_out", taps=None)
    bad(op + "taps must hold layer indices in [0, layers (k_cache.size(0))) = [0, 3), got taps[1] = 3", taps=(0, 3))
    bad(op + "taps must hold layer indices in [0, layers (k_cache.size(0))) = [0, 3), got taps[0] = -1", taps=(-1, 2))
    bad(op + "taps must be strictly increasing, got taps[0] = 1 then taps[1] = 1", taps=(1, 1))
    bad(op + "taps must be strictly increasing, got taps[0] = 2 then taps[1] = 0", taps=(2, 0))
    bad(op + "tap_out must have x's dtype Float, got BFloat16", tap_out=torch.zeros(shape, dtype=torch.bfloat16))
    bad(op + "tap_out must be 4-D [len(taps), B, T, H], got shape [2, 2, 64]", tap_out=torch.zeros(shape[1:]))
    bad(op + "tap_out.size(0) must equal len(taps) = 2, got 1", tap_out=torch.zeros(1, *shape[1:]))
    bad(op + "tap_out.size(1) must equal B (x.size(0)) = 2, got 1", tap_out=torch.zeros(2, 1, 2, 64))
    bad(op + "tap_out.size(2) must equal T (x.size(1)) = 2, got 3", tap_out=torch.zeros(2, 2, 3, 64))
    bad(op + "tap_out.size(3) must equal H (x.size(2)) = 64, got 32", tap_out=torch.zeros(2, 2, 2, 32))
    bad(
        op + "tap_out must be contiguous (it is written in place), got strides [1, 2, 4, 8]",
        tap_out=torch.zeros(64, 2, 2, 2).permute(3, 2, 1, 0),
    )
    bad(op + "tap_out must be on", tap_out=torch.zeros(shape, device="meta"), fns=(torch.ops.mtp.decoder_layers,))
    # written in place: no memory shared with any other argument
    k = p.cache.k.clone()
    bad(op + "tap_out and k_cache overlap in memory", tap_out=k.view(-1)[: 2 * 2 * 2 * 64].view(shape), k=k)
    both = torch.zeros(shape)
    both[1] = p.x
    bad(op + "tap_out and x overlap in memory", tap_out=both, x=both[1])
    qkv = p.weights[1]
    bad(
        op + "tap_out and weights[1] (layer 0's qkv) overlap in memory",
        tap_out=qkv.view(-1)[: 2 * 2 * 2 * 64].view(shape),
    )


def test_cuda_fallbacks_are_the_kernel_composition_on_cpu_tensors():
    """On CUDA both ops run fallback.py's composition of the kernels; here on CPU tensors it
    gives the fused ops' bits."""
    from mtp_kernels import fallback

    p = Pass(torch.bfloat16, False, False, [3, 7], 3)
    assert torch.equal(fallback.decoder_layers(*p.args()), p.fused()[0])
    d = Draft(torch.float32, True, [3, 9], 1, 40)
    assert torch.equal(fallback.head_draft(**d.args(3)), torch.ops.mtp.head_draft(**d.args(3)))
    got_p, want_p = torch.zeros(2, 3), torch.zeros(2, 3)
    assert torch.equal(fallback.head_draft(**d.args(3), probs_out=got_p), torch.ops.mtp.head_draft(**d.args(3)))
    torch.ops.mtp.head_draft(**d.args(3), probs_out=want_p)
    torch.testing.assert_close(got_p, want_p, rtol=2e-6, atol=0)
    with pytest.raises(RuntimeError, match=re.escape("mtp.head_draft: probs_out.size(1) must equal k")):
        fallback.head_draft(**d.args(3), probs_out=torch.zeros(2, 2))
    p = Pass(torch.bfloat16, False, False, [3, 7], 3, layers=3)
    got, tap_out, _ = with_taps(p, [0, 2], fallback.decoder_layers)
    want, want_out, _ = with_taps(p, [0, 2])
    assert torch.equal(got, want) and torch.equal(tap_out, want_out)


def to_cuda(args) -> list:
    """A pass's arguments with every tensor (and tensor list) on the GPU."""
    return [
        t.cuda() if isinstance(t, torch.Tensor) else [w.cuda() for w in t] if isinstance(t, list) else t for t in args
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: needs CUDA")
def test_cuda_pass_is_shape_invariant():
    """On a GPU: a pass over 3 tokens equals 3 one-token passes bitwise, close to the CPU's."""
    p = Pass(torch.float32, False, False, [3, 7], 3)
    c = to_cuda(p.args())
    whole = torch.ops.mtp.decoder_layers(*c)
    steps = []
    lens = c[3].clone()
    for t in range(3):
        steps.append(torch.ops.mtp.decoder_layers(c[0][:, t : t + 1].contiguous(), c[1], c[2], lens, *c[4:]))
        lens += 1
    assert torch.equal(whole, torch.cat(steps, dim=1))
    torch.testing.assert_close(whole.cpu(), p.fused()[0], rtol=1e-4, atol=1e-4)

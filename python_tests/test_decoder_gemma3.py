"""mtp.decoder_layers(layer="gemma3"): Gemma 3's layer stack in one call gives, bitwise, the
op-by-op composition of reference.decoder_layers(layer="gemma3") run with the kernels (the
per-head q/k norms, the sliding window with its own RoPE tables, the attention scale, the
post-attention / post-feedforward norms, mtp.gelu_tanh_mul), and is close to the same
composition of the reference ops. Float and GGUF block-type weights, fp32 and bf16, sliding
and global layers with windows smaller than the cache, ragged batches, a pass of T tokens
against T one-token steps, trees, every instruction set; the caches it writes; opcheck; the
CUDA fallback's composition (on CPU tensors); bad input. The Gemma 3 backbone's use of it is
tested in test_gemma3_backbone.py."""

import re

import pytest
import torch

from mtp_kernels import fallback, ops, reference
from test_gguf import random_rows

H, HQ, HKV, D, I = 64, 2, 1, 64, 96
WINDOWS = [4, 0, 3]  # sliding, global, sliding: windows smaller than the caches below
EPS = 1e-6
SCALE = 0.3  # not 1/sqrt(D): Gemma's query_pre_attn_scalar
L = 24
Q8_0, Q4_0 = 8, 2


def tables(base: float, n: int = L):
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()


def case(dtype, lens, T, block=False, windows=WINDOWS, seed=0):
    """(args, kwargs) of one pass: random weights (float, or GGUF Q8_0 / Q4_0 blocks), random
    cache history."""
    g = torch.Generator().manual_seed(seed)
    layers = len(windows)

    def norm(n):
        return (1 + 0.3 * torch.randn(n, generator=g)).to(dtype)

    def mat(N, K, code):
        return random_rows(g, code, N, K) if block else (torch.randn(N, K, generator=g) / K**0.5).to(dtype)

    weights, types = [], []
    for i in range(layers):
        codes = (Q8_0, Q4_0, Q8_0, Q4_0) if i % 2 == 0 else (Q4_0, Q8_0, Q4_0, Q8_0)
        weights += [
            norm(H),
            mat((HQ + 2 * HKV) * D, H, codes[0]),
            norm(D),
            norm(D),
            mat(H, HQ * D, codes[1]),
            norm(H),
            norm(H),
            mat(2 * I, H, codes[2]),
            mat(H, I, codes[3]),
            norm(H),
        ]
        types += list(codes)
    weights.append(norm(H))
    B = len(lens)
    k = torch.randn(layers, B, HKV, L, D, generator=g).to(dtype)
    v = torch.randn(layers, B, HKV, L, D, generator=g).to(dtype)
    x = torch.randn(B, T, H, generator=g).to(dtype)
    cos, sin = tables(1e6)
    cos_l, sin_l = tables(1e4)
    args = (x, k, v, torch.tensor(lens), cos, sin, weights, [], HQ, EPS)
    kwargs = dict(
        layer="gemma3",
        windows=list(windows),
        rope_cos_local=cos_l,
        rope_sin_local=sin_l,
        attention_scale=SCALE,
        weight_types=types if block else None,
    )
    return args, kwargs


def fresh(args):
    """The same pass with its own copies of the caches and lengths."""
    return (args[0], args[1].clone(), args[2].clone(), args[3].clone(), *args[4:])


def run_both(args, kwargs, op_set=ops.KERNELS):
    a1, a2 = fresh(args), fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs)
    want = reference.decoder_layers(*a2, **kwargs, ops=op_set)
    return got, want, a1, a2


CASES = [([5], 1), ([3, 9], 4), ([0, 4, 9], 1), ([0, 2], 17)]  # ragged, empty caches, a prefill of > 16 rows


@pytest.mark.parametrize("block", [False, True], ids=["float", "gguf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,T", CASES)
def test_one_call_equals_the_op_by_op_composition_bitwise(isa, dtype, block, lens, T):
    if T > 4 and block:
        lens = [0, 2]
    args, kwargs = case(dtype, lens, T, block)
    got, want, a1, a2 = run_both(args, kwargs)
    assert torch.equal(got, want) and not got.isnan().any()
    assert torch.equal(a1[1], a2[1]) and torch.equal(a1[2], a2[2])  # the same keys/values at the same places
    assert torch.equal(a1[3], torch.tensor(lens))  # the lengths are the caller's to advance
    changed = (a1[1] != args[1]).any(dim=(0, 2, 4))  # [B, L]
    for b, n in enumerate(lens):
        assert changed[b, n : n + T].all() and not changed[b, :n].any() and not changed[b, n + T :].any()


@pytest.mark.parametrize("block", [False, True], ids=["float", "gguf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_equals_one_token_steps_bitwise(isa, dtype, block):
    """The verify property across the windows: T tokens in one pass give each token the hidden
    state and cache entries of T one-token steps; each request of a batch its bits alone."""
    lens, T = [3, 9], 6
    args, kwargs = case(dtype, lens, T, block)
    a1 = fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs)
    a2 = fresh(args)
    for t in range(T):
        step = torch.ops.mtp.decoder_layers(a2[0][:, t : t + 1].contiguous(), *a2[1:], **kwargs)
        assert torch.equal(step, got[:, t : t + 1]), t
        a2[3].add_(1)
    assert torch.equal(a1[1], a2[1]) and torch.equal(a1[2], a2[2])
    for b in range(len(lens)):  # a request alone
        alone = (args[0][b : b + 1], args[1][:, b : b + 1].clone(), args[2][:, b : b + 1].clone(), args[3][b : b + 1])
        out = torch.ops.mtp.decoder_layers(*alone, *args[4:], **kwargs)
        assert torch.equal(out[0], got[b])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_close_to_the_reference_ops(dtype):
    """The reference ops (fp64 linear and attention): the kernels' fp32 rounding apart."""
    args, kwargs = case(dtype, [3, 9], 4)
    got, want, _, _ = run_both(args, kwargs, op_set=None)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=0.1, atol=0.1)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_the_window_and_the_local_tables_matter():
    """Each Gemma argument reaches the pass: no window, the global tables on every layer, or
    the default scale each change the result (and each is still the composition's bits)."""
    args, kwargs = case(torch.float32, [3, 9], 2)
    base, *_ = run_both(args, kwargs)
    for change in (
        dict(windows=[0, 0, 0]),
        dict(rope_cos_local=args[4], rope_sin_local=args[5]),
        dict(attention_scale=None),
    ):
        got, want, _, _ = run_both(args, {**kwargs, **change})
        assert torch.equal(got, want) and not torch.equal(got, base), change


def test_trees_give_the_chains_bits(isa):
    """tree_parents with Gemma's layer (windows across the cache and the path): the
    composition's bits, and a token the bits of the chain of its path."""
    args, kwargs = case(torch.float32, [6], 4)
    parents = torch.tensor([[-1, 0, 0, 2]])  # paths 0; 0-1; 0-2; 0-2-3
    a1, a2 = fresh(args), fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs, tree_parents=parents)
    want = reference.decoder_layers(*a2, **kwargs, tree_parents=parents, ops=ops.KERNELS)
    assert torch.equal(got, want)
    chain = fresh(args)
    path = [0, 2, 3]
    out = torch.ops.mtp.decoder_layers(args[0][:, path].contiguous(), *chain[1:], **kwargs)
    assert torch.equal(out[0, -1], got[0, 3]) and torch.equal(out[0, 1], got[0, 2])


def test_zero_layers_and_empty_pass():
    args, kwargs = case(torch.float32, [3, 9], 0)
    got = torch.ops.mtp.decoder_layers(*fresh(args), **kwargs)
    assert got.shape == (2, 0, H)
    args, kwargs = case(torch.float32, [3], 2, windows=[])
    x, _, _, lens, cos, sin, weights, *rest = args
    empty = torch.empty(0, 1, HKV, L, D)
    got = torch.ops.mtp.decoder_layers(x, empty, empty.clone(), lens, cos, sin, weights, *rest, **kwargs)
    assert torch.equal(got, torch.ops.mtp.rms_norm(x, weights[-1], EPS))


@pytest.mark.parametrize("block", [False, True], ids=["float", "gguf"])
def test_opcheck(block):
    args, kwargs = case(torch.float32, [3, 9], 2, block)
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, fresh(args), kwargs)


def test_cuda_fallback_is_the_kernel_composition_on_cpu_tensors():
    args, kwargs = case(torch.bfloat16, [3, 9], 3)
    a1, a2 = fresh(args), fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k != "weight_types"}
    assert torch.equal(fallback.decoder_layers(*a2, **kw), got) and torch.equal(a1[1], a2[1])


# ---- taps: the residual stream after chosen layers ------------------------------------------


@pytest.mark.parametrize("block", [False, True], ids=["float", "gguf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,T,taps", [([5], 1, [0, 1, 2]), ([3, 9], 4, [0, 2]), ([0, 2], 17, [1, 2])])
def test_taps_are_the_op_by_op_composition_residuals_bitwise(isa, dtype, block, lens, T, taps):
    """Sliding and global layers: tap_out is the composition's residual stream bitwise; the
    hidden states and the caches are those of a pass without taps."""
    args, kwargs = case(dtype, lens, T, block)
    got_out, want_out = (torch.full((len(taps), *args[0].shape), float("nan")).to(dtype) for _ in range(2))
    a1, a2, a3 = fresh(args), fresh(args), fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs, taps=taps, tap_out=got_out)
    want = reference.decoder_layers(*a2, **kwargs, taps=taps, tap_out=want_out, ops=ops.KERNELS)
    assert torch.equal(got_out, want_out) and torch.equal(got, want)
    plain = torch.ops.mtp.decoder_layers(*a3, **kwargs)
    assert torch.equal(got, plain) and torch.equal(a1[1], a3[1]) and torch.equal(a1[2], a3[2])


def test_a_pass_split_at_a_tap_continues_from_it(isa):
    """Layers 0..i with taps=[i], then layers i+1.. from tap_out[0]: the whole pass's bits."""
    args, kwargs = case(torch.bfloat16, [3, 9], 4)
    whole_args = fresh(args)
    whole = torch.ops.mtp.decoder_layers(*whole_args, **kwargs)
    for i in range(2):
        x, k, v, lens, cos, sin, w, *rest = fresh(args)
        n = 10 * (i + 1)
        tap = torch.empty(1, *x.shape, dtype=x.dtype)
        kw1 = {**kwargs, "windows": WINDOWS[: i + 1], "taps": [i], "tap_out": tap}
        torch.ops.mtp.decoder_layers(x, k[: i + 1], v[: i + 1], lens, cos, sin, w[:n] + w[-1:], *rest, **kw1)
        kw2 = {**kwargs, "windows": WINDOWS[i + 1 :]}
        out = torch.ops.mtp.decoder_layers(tap[0], k[i + 1 :], v[i + 1 :], lens, cos, sin, w[n:], *rest, **kw2)
        assert torch.equal(out, whole) and torch.equal(k, whole_args[1]) and torch.equal(v, whole_args[2]), i


def test_taps_with_trees(isa):
    args, kwargs = case(torch.float32, [6], 4)
    parents = torch.tensor([[-1, 0, 0, 2]])
    got_out, want_out = torch.empty(2, 1, 4, H), torch.empty(2, 1, 4, H)
    a1, a2 = fresh(args), fresh(args)
    got = torch.ops.mtp.decoder_layers(*a1, **kwargs, tree_parents=parents, taps=[0, 2], tap_out=got_out)
    want = reference.decoder_layers(*a2, **kwargs, tree_parents=parents, taps=[0, 2], tap_out=want_out, ops=ops.KERNELS)
    assert torch.equal(got_out, want_out) and torch.equal(got, want)
    chain_out = torch.empty(2, 1, 3, H)
    torch.ops.mtp.decoder_layers(
        args[0][:, [0, 2, 3]].contiguous(), *fresh(args)[1:], **kwargs, taps=[0, 2], tap_out=chain_out
    )
    assert torch.equal(chain_out[:, 0, -1], got_out[:, 0, 3]) and torch.equal(chain_out[:, 0, 1], got_out[:, 0, 2])


@pytest.mark.parametrize("block", [False, True], ids=["float", "gguf"])
def test_opcheck_with_taps(block):
    args, kwargs = case(torch.float32, [3, 9], 2, block)
    kwargs = {**kwargs, "taps": [1], "tap_out": torch.empty(1, 2, 2, H)}
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, fresh(args), kwargs)


def test_bad_taps_raise_clear_errors():
    args, kw = case(torch.float32, [3, 9], 2)
    op = "mtp.decoder_layers: "
    for fn in (torch.ops.mtp.decoder_layers, fallback.decoder_layers):
        kw_f = kw if fn is torch.ops.mtp.decoder_layers else {k: v for k, v in kw.items() if k != "weight_types"}
        out = torch.zeros(2, 2, 2, H)
        _raises(args, {**kw_f, "taps": [0, 3], "tap_out": out}, op + "taps must hold layer indices in [0, layers", fn)
        _raises(args, {**kw_f, "taps": [2, 1], "tap_out": out}, op + "taps must be strictly increasing", fn)
        _raises(args, {**kw_f, "tap_out": out}, op + "taps and tap_out go together, got only tap_out", fn)
        _raises(args, {**kw_f, "taps": [0, 2], "tap_out": out[:1]}, op + "tap_out.size(0) must equal len(taps) = 2", fn)


def _raises(args, kwargs, message, fn=torch.ops.mtp.decoder_layers):
    a = fresh(args)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        fn(*a, **kwargs)
    assert torch.equal(a[1], args[1]) and torch.equal(a[2], args[2])  # nothing written


def test_bad_input_raises_clear_errors():
    args, kw = case(torch.float32, [3, 9], 2)
    op = "mtp.decoder_layers: "
    _raises(args, {**kw, "layer": "gemma2"}, op + 'layer must be "llama" or "gemma3", got "gemma2"')
    for fn in (torch.ops.mtp.decoder_layers, fallback.decoder_layers):
        _raises(args, {**kw, "windows": [4, 0]}, "windows must hold one sliding window per layer", fn)
        _raises(args, {**kw, "windows": [4, -1, 0]}, "windows[1]: window must be >= 0", fn)
        _raises(args, {**kw, "rope_sin_local": None}, "rope_cos_local and rope_sin_local go together", fn)
        _raises(
            args,
            {**kw, "rope_cos_local": None, "rope_sin_local": None},
            "a layer with a window (windows holds values > 0) takes its RoPE angles from rope_cos_local",
            fn,
        )
        _raises(
            args,
            {**kw, "rope_cos_local": kw["rope_cos_local"][:10], "rope_sin_local": kw["rope_sin_local"][:10]},
            "request 1 would pass the RoPE tables: cache_lens[1] + T = 9 + 2 > P = 10 (rope_cos_local.size(0))",
            fn,
        )
    _raises(
        args,
        {**kw, "rope_cos_local": kw["rope_cos_local"][:, :32]},
        "rope_cos_local.size(1) must equal D (k_cache.size(4)) = 64, got 32",
    )
    _raises(
        args,
        {**kw, "rope_sin_local": kw["rope_sin_local"][:20]},
        "rope_sin_local must have rope_cos_local's shape [24, 64], got [20, 64]",
    )
    _raises(args, {**kw, "rope_cos_local": kw["rope_cos_local"].double()}, "rope_cos_local must be")
    _raises(args, {**kw, "attention_scale": float("inf")}, op + "attention_scale must be finite, got inf")
    # a weight count not the Gemma layer's
    short = (*args[:6], args[6][:-2], *args[7:])
    _raises(short, kw, op + "weights must hold 10 tensors per layer (input_norm, qkv, q_norm, k_norm, o_proj,")
    _raises(short, kw, 'for the 3 layers of k_cache (layer="gemma3"), then the final norm: 31 tensors, got 29')
    bad = list(args[6])
    bad[12] = bad[12][:32]  # layer 1's q_norm
    _raises((*args[:6], bad, *args[7:]), kw, op + "weights[12] (layer 1's q_norm).size(0) must equal D = 64, got 32")
    bad = list(args[6])
    bad[15] = bad[15].double()  # layer 1's post_attention_norm
    _raises((*args[:6], bad, *args[7:]), kw, "weights[15] (layer 1's post_attention_norm)")
    bad = list(args[6])
    bad[17] = bad[17][:, :32]  # layer 1's gate_up
    _raises((*args[:6], bad, *args[7:]), kw, "weights[17] (layer 1's gate_up)")
    # the Gemma arguments are refused for the Llama layer
    llama = {"layer": "llama"}
    for fn in (torch.ops.mtp.decoder_layers, fallback.decoder_layers):
        _raises(args, {**llama, "windows": [0, 0, 0]}, op + 'windows goes with layer="gemma3" only', fn)
        _raises(args, {**llama, "attention_scale": 0.5}, op + 'attention_scale goes with layer="gemma3" only', fn)
        _raises(args, {**kw, "layer": "gemma2"}, op + 'layer must be "llama" or "gemma3", got "gemma2"', fn)
    _raises(
        args,
        {**llama, "rope_cos_local": kw["rope_cos_local"]},
        'rope_cos_local / rope_sin_local go with layer="gemma3"',
    )
    _raises(args, {**llama, "attention_scale": 0.5}, op + 'attention_scale goes with layer="gemma3" only')
    _raises(args, {}, op + "weights must hold 6 tensors per layer")

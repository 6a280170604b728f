"""mtp.head_attention and mtp.cache_append against reference.py, on every CPU instruction set.

Exactness claims (shape, batch, stride and thread invariance) are checked with torch.equal;
agreement with the fp64 reference within a tolerance per dtype (TOL).
"""

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# |kernel - fp64 reference| on outputs of magnitude <~ 1: fp32 accumulation error for fp32,
# about two units in the last place of the output format for bf16/fp16.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def make_cache(B, Hkv, L, D, dtype, layout, gen, device="cpu"):
    """[B, Hkv, L, D] views in the layouts a caller hands over, filled with N(0, 1). The buffer
    is moved to `device` before the view is taken (.to() of a view would make it contiguous)."""

    def buffer(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    if layout == "contiguous":
        view = buffer(B, Hkv, L, D)
    elif layout == "layer":  # layer 1 of a [layers, B, Hkv, Lmax, D] buffer, Lmax > L
        return buffer(3, B, Hkv, L + 5, D).to(dtype)[1, :, :, :L]
    elif layout == "permuted":  # a [B, Lmax, Hkv, D] buffer seen as [B, Hkv, Lmax, D]
        view = buffer(B, L, Hkv, D).permute(0, 2, 1, 3)
    elif layout == "d_strided":  # element stride 2 along D (the packing path)
        view = buffer(B, Hkv, L, 2 * D)[..., ::2]
    else:
        raise ValueError(layout)
    return view.to(dtype) if dtype != torch.float32 else view


def inputs(
    B=2,
    T=3,
    Hq=6,
    Hkv=2,
    L=300,
    D=64,
    dtype=torch.float32,
    layout="contiguous",
    S=0,
    seed=0,
    lens=None,
    cache_device="cpu",
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype)
    k = make_cache(B, Hkv, L, D, dtype, layout, gen, cache_device)
    v = make_cache(B, Hkv, L, D, dtype, layout, gen, cache_device)
    if lens is None:
        lens = torch.randint(T, L + 1, (B,), generator=gen)
    lens = torch.as_tensor(lens)
    kl = vl = None
    if S:
        kl = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
        vl = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
    return q, k, v, lens, kl, vl


def attn(q, k, v, lens, kl=None, vl=None, scale=None, causal=False, window=None):
    return mtp_kernels.head_attention(q, k, v, lens, kl, vl, scale, causal, window)


def close(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype
    err = (out.double() - ref.double()).abs().max().item()
    assert err <= TOL[dtype], f"max |kernel - reference| = {err} > {TOL[dtype]}"


# ---------------------------------------------------------------- against the reference
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 40])
@pytest.mark.parametrize("causal,S", [(False, 0), (True, 0), (False, 4), (True, 3)])
def test_matches_reference(isa, dtype, D, causal, S):
    # L = 600: three chunks of 256 keys, the last one partial; lengths ragged.
    q, k, v, lens, kl, vl = inputs(B=3, T=4, Hq=6, Hkv=2, L=600, D=D, dtype=dtype, S=S, lens=[600, 4, 257])
    close(
        attn(q, k, v, lens, kl, vl, causal=causal),
        reference.head_attention(q, k, v, lens, kl, vl, causal=causal),
        dtype,
    )


@pytest.mark.parametrize("layout", ["layer", "permuted", "d_strided"])
def test_strided_layouts_match_reference(isa, layout):
    q, k, v, lens, kl, vl = inputs(L=400, layout=layout, S=2)
    assert not k.is_contiguous()
    close(attn(q, k, v, lens, kl, vl), reference.head_attention(q, k, v, lens, kl, vl), torch.float32)


def test_scale_and_gqa_ratios(isa):
    for Hq, Hkv in [(4, 4), (8, 1), (9, 3)]:
        q, k, v, lens, _, _ = inputs(Hq=Hq, Hkv=Hkv, T=2, L=100)
        close(attn(q, k, v, lens, scale=0.3), reference.head_attention(q, k, v, lens, scale=0.3), torch.float32)


def test_large_magnitudes(isa):
    # Scores in the thousands: the max subtraction keeps exp finite; no inf anywhere.
    q, k, v, lens, kl, vl = inputs(L=600, S=2, lens=[600, 517])
    q, k, v = q * 30, k * 30, v * 1e4
    out = attn(q, k, v, lens, kl, vl)
    ref = reference.head_attention(q, k, v, lens, kl, vl)
    assert torch.isfinite(out).all()
    # fp32 scores of size ~|s| carry ~|s| * 2^-24 of error into the exponent: relative
    # weight error ~1e-3 at |s| ~ 1e4 (the reference computes them in fp64).
    s_max = torch.einsum("bthd,bhld->bthl", q.double(), k.double().repeat_interleave(3, dim=1)).abs().max() / 8
    assert ((out - ref).abs() / 1e4).max().item() <= 4 * s_max * 2.0**-24


def test_single_key_and_rounding_exact(isa):
    # With q = 0 every weight is exactly 1/n: out = (sum of values) / n, rounded once into the
    # output format, bitwise as torch rounds it (fp16 subnormals, bf16 ties included).
    for dtype in DTYPES:
        gen = torch.Generator().manual_seed(1)
        v = (torch.randn(1, 1, 2, 64, generator=gen) * torch.logspace(-7, 3, 64)).to(dtype)
        q = torch.zeros(1, 1, 1, 64, dtype=dtype)
        k = torch.randn(1, 1, 2, 64, generator=gen).to(dtype)
        one = attn(q, k, v, torch.tensor([1]))
        assert torch.equal(one[0, 0, 0], v[0, 0, 0])
        two = attn(q, k, v, torch.tensor([2]))
        assert torch.equal(two[0, 0, 0], ((v[0, 0, 0].float() + v[0, 0, 1].float()) / 2).to(dtype))


def test_no_visible_key_gives_zeros(isa):
    q, k, v, _, kl, vl = inputs(B=3, L=50, S=2)
    lens = torch.tensor([0, 50, 0])
    out = attn(q, k, v, lens)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert out[1].abs().sum() > 0
    # Local entries alone are still attended.
    close(attn(q, k, v, lens, kl, vl), reference.head_attention(q, k, v, lens, kl, vl), torch.float32)


def test_only_first_cache_lens_keys_are_read(isa):
    q, k, v, lens, _, _ = inputs(L=600, lens=[300, 513])
    want = attn(q, k, v, lens)
    for b, n in enumerate(lens.tolist()):  # poison everything past each request's length
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    assert torch.equal(attn(q, k, v, lens), want)
    # causal: query t must not see key cache_lens - T + t + 1 (poison it per row)
    q, k, v, lens, _, _ = inputs(T=3, L=40, lens=[40, 10])
    want = attn(q, k, v, lens, causal=True)
    k2 = k.clone()
    for b, n in enumerate(lens.tolist()):
        k2[b, :, n - 1] = 1e30  # visible only to the last query
    got = attn(q, k2, v, lens, causal=True)
    assert torch.equal(got[:, :2], want[:, :2])


# ---------------------------------------------------------------- extreme values
# The contract (reference.head_attention): a row that sees no key is zeros; a row that sees a
# non-finite score (scale * <q, k_j> in fp32; -inf included) or a non-finite value element is
# all NaN; every other row is finite. The base problem makes every finite row exact on every
# path, so rows are compared bitwise: q = 0 (every score 0, equal weights) and values that do
# not depend on the key (v[b, h, j, :] = v[b, h, 0, :], small integers).
INF, NAN = float("inf"), float("nan")


def extreme_base(D, S=0):
    B, T, Hq, Hkv, L = 2, 2, 4, 2, 600  # 600: three chunks of 256 keys (merged partials)
    gen = torch.Generator().manual_seed(7)
    col = ((torch.arange(B)[:, None, None] * 7 + torch.arange(Hkv)[:, None] * 3 + torch.arange(D)) % 9 - 4).float()
    return dict(
        q=torch.zeros(B, T, Hq, D),
        k=torch.randn(B, Hkv, L, D, generator=gen),
        v=col[:, :, None].expand(B, Hkv, L, D).clone(),
        lens=torch.tensor([600, 300]),
        kl=torch.randn(B, Hkv, S, D, generator=gen) if S else None,
        vl=col[:, :, None].expand(B, Hkv, S, D).clone() if S else None,
    )


def _rows(b, hk, T=2, G=2):  # every row (b, t, h) of kv head hk
    return {(b, t, h) for t in range(T) for h in range(hk * G, hk * G + G)}


def _set(x, index, value):
    x[index] = value


# name: (S, needs the fp32 range (not run in fp16), poison(a) -> the rows (b, t, h) that must be NaN)
EXTREME = {
    "finite": (0, False, lambda a: set()),
    "q_inf": (0, False, lambda a: (_set(a["q"], (0, 1, 2, 5), INF), {(0, 1, 2)})[1]),
    "q_nan": (0, False, lambda a: (_set(a["q"], (1, 0, 0, 3), NAN), {(1, 0, 0)})[1]),
    # every score of row (0, 0, 1) is -inf (q_0 = -inf, k_0 = 1): NaN, not zeros
    "every_score_neg_inf": (
        0,
        False,
        lambda a: (_set(a["q"], (0, 0, 1, 0), -INF), _set(a["k"], (0, 0, Ellipsis, 0), 1.0), {(0, 0, 1)})[2],
    ),
    # the same through fp32 overflow of the products (1e30 * -1e30); the q = 0 rows get 0
    "every_score_overflows_neg": (
        0,
        True,
        lambda a: (_set(a["q"], (0, 0, 1, 0), 1e30), _set(a["k"], (0, 0, Ellipsis, 0), -1e30), {(0, 0, 1)})[2],
    ),
    "one_score_overflows_neg": (
        0,
        True,
        lambda a: (_set(a["q"], (1, 1, 3, 0), 1e30), _set(a["k"], (1, 1, 17, 0), -1e30), {(1, 1, 3)})[2],
    ),
    "dot_overflows_pos": (
        0,
        True,
        lambda a: (_set(a["q"], (0, 1, 0), 1e20), _set(a["k"], (0, 0, 5), 1e20), {(0, 1, 0)})[2],
    ),
    # +1e40 and -1e40 in one dot: NaN on one path, -inf on another (lanes, fma): NaN everywhere
    "dot_overflows_mixed_signs": (
        0,
        True,
        lambda a: (
            _set(a["q"], (1, 0, 2, [0, 16]), 1e20),
            _set(a["k"], (1, 1, 3, [0, 16]), torch.tensor([-1e20, 1e20])),
            {(1, 0, 2)},
        )[2],
    ),
    # a non-finite key reaches every row that sees it (0 * -inf = NaN for the q = 0 rows)
    "k_neg_inf": (
        0,
        False,
        lambda a: (_set(a["q"], (1, 1, 3, 0), 1.0), _set(a["k"], (1, 1, 17, 0), -INF), _rows(1, 1))[2],
    ),
    "k_nan": (0, False, lambda a: (_set(a["k"], (1, 0, 100, 7), NAN), _rows(1, 0))[1]),
    "v_inf": (0, False, lambda a: (_set(a["v"], (0, 1, 599, 3), INF), _rows(0, 1))[1]),
    "v_nan": (0, False, lambda a: (_set(a["v"], (1, 0, 0, 0), NAN), _rows(1, 0))[1]),
    # past cache_lens[1] = 300: never read
    "unseen_poison": (
        0,
        False,
        lambda a: (
            _set(a["k"], (1, Ellipsis, slice(300, None), slice(None)), NAN),
            _set(a["v"], (1, Ellipsis, slice(300, None), slice(None)), INF),
            set(),
        )[2],
    ),
    # no visible key: zeros, whatever q holds
    "no_key": (0, False, lambda a: (_set(a["lens"], 1, 0), _set(a["q"], 1, INF), set())[2]),
    # query t sees local entries s <= t (S = T = 2): only t = 1 sees entry 1
    "local_v_nan": (2, False, lambda a: (_set(a["vl"], (0, 0, 1, 4), NAN), {(0, 1, 0), (0, 1, 1)})[1]),
    # products up to 1e36, summed over D <= 128: finite scores in any order, one key dominates
    "huge_finite_scores": (0, True, lambda a: (_set(a["q"], (0, 0, 2), 1e18), _set(a["k"], (0, 1, 9), 1e18), set())[2]),
    "huge_finite_values": (0, True, lambda a: (_set(a["v"], (0, 0), 2.0**100), set())[1]),
}


def extreme_case(name, D, dtype):
    """(args of head_attention, expected [B, T, Hq, D]: NaN rows, zeros, or the exact values)."""
    S, _, poison = EXTREME[name]
    a = extreme_base(D, S)
    nan_rows = poison(a)
    B, T, Hq, _ = a["q"].shape
    Hkv = a["k"].shape[1]
    want = a["v"][:, :, 0].repeat_interleave(Hq // Hkv, dim=1)[:, None].expand(B, T, Hq, D).clone()
    want[a["lens"] == 0] = 0  # (S = 0 there)
    for b, t, h in nan_rows:
        want[b, t, h] = NAN
    args = (
        [None if x is None else x.to(dtype) for x in (a["q"], a["k"], a["v"])]
        + [a["lens"]]
        + [None if x is None else x.to(dtype) for x in (a["kl"], a["vl"])]
    )
    return args, want.to(dtype)


def assert_equal_nan(got, want):
    """torch.equal with NaN == NaN: the same NaN positions, the same numbers elsewhere."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), torch.isnan(got).any(-1).nonzero().tolist()
    assert torch.equal(got[~nan], want[~nan])


def extreme_dtypes(name):
    return [torch.float32, torch.bfloat16] + ([] if EXTREME[name][1] else [torch.float16])


@pytest.mark.parametrize("name", list(EXTREME))
def test_extreme_values(isa, threads, name):
    for dtype in extreme_dtypes(name):
        for D in (64, 128, 40):  # 40: the generic path on every isa
            args, want = extreme_case(name, D, dtype)
            ref = reference.head_attention(*args)
            assert_equal_nan(ref, want)  # the spec itself
            for n in (1, 3):  # 3: few (b, kv head) pairs, chunks spread over threads and merged
                torch.set_num_threads(n)
                assert_equal_nan(attn(*args), want)
            # rows alone: one request, one query
            for b in range(2):
                for t in range(2):
                    one = [x if x is None else x[b : b + 1] for x in args]
                    one[0] = one[0][:, t : t + 1]
                    if one[4] is not None:  # query t of 2 sees local entries 0..t
                        one[4], one[5] = one[4][:, :, : t + 1], one[5][:, :, : t + 1]
                    assert_equal_nan(attn(*one), want[b : b + 1, t : t + 1])


def test_extreme_values_causal(isa):
    # causal: query t sees keys [0, cache_lens - T + t]; key 599 of request 0 only by t = 1
    args, _ = extreme_case("finite", 64, torch.float32)
    args[2][0, 1, 599, 3] = INF
    args[1][1, 0, 298, 0] = NAN  # request 1 (cache_lens 300): key 298 seen by both queries
    got = attn(*args, causal=True)
    nan = torch.zeros(2, 2, 4, dtype=torch.bool)
    nan[0, 1, 2:] = True
    nan[1, :, :2] = True
    assert torch.equal(torch.isnan(got).all(-1), nan) and torch.equal(torch.isnan(got).any(-1), nan)
    assert_equal_nan(got, reference.head_attention(*args, causal=True))


# ---------------------------------------------------------------- exactness (torch.equal)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 40])
def test_rows_equal_single_query_calls(isa, dtype, D):
    q, k, v, lens, _, _ = inputs(B=3, T=5, L=700, D=D, dtype=dtype, lens=[700, 0, 290])
    full = attn(q, k, v, lens)
    for t in range(q.shape[1]):
        assert torch.equal(attn(q[:, t : t + 1], k, v, lens)[:, 0], full[:, t])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 40])
def test_causal_rows_equal_decode_steps(isa, dtype, D):
    # Verify pass == one-token decoding: row t with cache_lens = L equals the 1-query call
    # with cache_lens = L - T + t + 1.
    T = 5
    q, k, v, lens, _, _ = inputs(B=3, T=T, L=700, D=D, dtype=dtype, lens=[700, 5, 260])
    full = attn(q, k, v, lens, causal=True)
    for t in range(T):
        step = attn(q[:, t : t + 1], k, v, lens - T + t + 1, causal=True)
        assert torch.equal(step[:, 0], full[:, t])
        assert torch.equal(attn(q[:, t : t + 1], k, v, lens - T + t + 1)[:, 0], full[:, t])


def test_local_rows_equal_prefix_calls(isa):
    # Draft step t sees local entries 0..t: row t equals the last row of the (t+1)-query call
    # over the first t+1 local entries, and the one-query call (a recurrent draft step) over them.
    T = 4
    q, k, v, lens, kl, vl = inputs(T=T, L=520, S=T, lens=[520, 30])
    full = attn(q, k, v, lens, kl, vl)
    for t in range(T):
        part = attn(q[:, : t + 1], k, v, lens, kl[:, :, : t + 1], vl[:, :, : t + 1])
        assert torch.equal(part[:, t], full[:, t])
        step = attn(q[:, t : t + 1], k, v, lens, kl[:, :, : t + 1], vl[:, :, : t + 1])
        assert torch.equal(step[:, 0], full[:, t])


@pytest.mark.parametrize("T,S", [(1, 5), (2, 5), (3, 1), (2, 300)])  # S > 256: two local chunks
def test_local_segment_longer_or_shorter_than_T(isa, T, S):
    # The T queries are the last T local positions: query t sees s <= S - T + t.
    q, k, v, lens, kl, vl = inputs(T=T, L=300, S=S, lens=[300, 0])
    got = attn(q, k, v, lens, kl, vl)
    want = reference.head_attention(q, k, v, lens, kl, vl)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if S < T:  # the first T - S queries see no local entry; request 1 has no cache either
        assert torch.equal(got[1, : T - S], torch.zeros_like(got[1, : T - S]))


def test_request_alone_equals_batch(isa):
    q, k, v, lens, kl, vl = inputs(B=4, T=3, L=800, S=3, lens=[800, 1, 0, 333])
    for causal in (False, True):
        lens_c = lens.clamp_min(3) if causal else lens
        full = attn(q, k, v, lens_c, kl, vl, causal=causal)
        for b in range(4):
            s = slice(b, b + 1)
            assert torch.equal(attn(q[s], k[s], v[s], lens_c[s], kl[s], vl[s], causal=causal), full[s])
        # other requests' lengths do not matter
        other = lens_c.clone()
        other[1:] = lens_c[1:].flip(0)
        assert torch.equal(attn(q, k, v, other, kl, vl, causal=causal)[0], full[0])


@pytest.mark.parametrize("layout", ["layer", "permuted", "d_strided"])
def test_strided_equals_contiguous(isa, layout):
    q, k, v, lens, kl, vl = inputs(L=600, layout=layout, S=2, dtype=torch.bfloat16)
    want = attn(q, k.contiguous(), v.contiguous(), lens, kl, vl)
    assert torch.equal(attn(q, k, v, lens, kl, vl), want)
    assert torch.equal(attn(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, lens, kl, vl), want)


def test_thread_count_invariance(isa, threads):
    # B * Hkv = 3 < threads: the key range is split across threads (flash-decoding).
    q, k, v, lens, kl, vl = inputs(B=1, T=4, Hq=9, Hkv=3, L=4096, S=4, lens=[4000])
    outs = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        outs.append((attn(q, k, v, lens, kl, vl), attn(q, k, v, lens, causal=True)))
    for o in outs[1:]:
        assert torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1])


@pytest.mark.parametrize("S", [0, 9])
def test_token_slices_equal_decode_steps(isa, threads, S):
    # A verify pass over a short cache: one chunk per (b, hkv), fewer than twice the threads,
    # so the chunks are cut into slices of the tokens. Every row still equals its one-query
    # call, on any thread count.
    T = 9
    q, k, v, lens, kl, vl = inputs(B=1, T=T, Hq=9, Hkv=3, L=300, S=S, lens=[209])
    want = reference.head_attention(q, k, v, lens, kl, vl, causal=not S)
    outs = []
    for n in (1, 2, 3, 8):
        torch.set_num_threads(n)
        outs.append(attn(q, k, v, lens, kl, vl, causal=not S))
    torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-5)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    for t in range(T):
        if S:  # query t sees local entries 0..t
            step = attn(q[:, t : t + 1], k, v, lens, kl[:, :, : t + 1], vl[:, :, : t + 1])
        else:
            step = attn(q[:, t : t + 1], k, v, lens - T + t + 1, causal=True)
        assert torch.equal(step[:, 0], outs[-1][:, t])


def test_zero_copy_no_large_allocation():
    # A permuted layer view of a big buffer: no copy, no contiguous(), no allocation of its size.
    q, k, v, lens, _, _ = inputs(B=2, L=4096, layout="permuted")
    with torch.profiler.profile(profile_memory=True) as prof:
        attn(q, k, v, lens)
    (op,) = [e for e in prof.events() if e.name == "mtp::head_attention"]

    def under_op(e):
        while e is not None and e is not op:
            e = e.cpu_parent
        return e is op

    names = {e.name for e in prof.events() if under_op(e)}
    assert not names & {"aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy"}, names
    # what torch allocated inside the op: the output only
    assert op.cpu_memory_usage <= q.numel() * q.element_size() + 1024, op.cpu_memory_usage


# ---------------------------------------------------------------- sliding window
# Gemma 3's local layers: window 512, 4 query heads over one kv head, head dim 256. A row sees
# the last `window` of the cache keys it would see without one (causal: p - window < j <= p).
WINDOW_D = [64, 128, 40, 256]  # 40 and 256: the generic path


def window_inputs(D=256, dtype=torch.float32, T=4, lens=(1100, 4, 700), layout="contiguous", L=1100, Hkv=1):
    return inputs(B=len(lens), T=T, Hq=4, Hkv=Hkv, L=L, D=D, dtype=dtype, layout=layout, lens=list(lens))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", WINDOW_D)
@pytest.mark.parametrize("causal,window", [(True, 512), (True, 300), (False, 260), (True, 1)])
def test_window_matches_reference(isa, dtype, D, causal, window):
    q, k, v, lens, _, _ = window_inputs(D, dtype)
    close(
        attn(q, k, v, lens, causal=causal, window=window),
        reference.head_attention(q, k, v, lens, causal=causal, window=window),
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", WINDOW_D)
def test_window_verify_rows_equal_decode_steps(isa, dtype, D):
    # A verify pass with a window: row t equals the one-token step at its position (causal or
    # not: a one-query step sees the last `window` keys either way), whatever the thread split.
    T, W = 4, 300
    q, k, v, lens, _, _ = window_inputs(D, dtype, T=T, lens=(1100, 4, 700, 301, 557))
    full = attn(q, k, v, lens, causal=True, window=W)
    for t in range(T):
        step_lens = lens - T + t + 1
        assert torch.equal(attn(q[:, t : t + 1], k, v, step_lens, causal=True, window=W)[:, 0], full[:, t])
        assert torch.equal(attn(q[:, t : t + 1], k, v, step_lens, window=W)[:, 0], full[:, t])


def test_window_batch_and_thread_invariance(isa, threads):
    # Each request alone == in the batch; other requests' lengths and the thread count do not
    # matter (B * Hkv = 3 < threads: the chunks are spread over threads).
    q, k, v, lens, _, _ = window_inputs(D=128, T=3, lens=(1100, 3, 700), L=1100)
    outs = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        outs.append(attn(q, k, v, lens, causal=True, window=512))
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    full = outs[0]
    for b in range(3):
        s = slice(b, b + 1)
        assert torch.equal(attn(q[s], k[s], v[s], lens[s], causal=True, window=512), full[s])
    other = lens.clone()
    other[1:] = lens[1:].flip(0).clamp_min(3)
    assert torch.equal(attn(q, k, v, other, causal=True, window=512)[0], full[0])


@pytest.mark.parametrize("layout", ["layer", "permuted", "d_strided"])
def test_window_strided_equals_contiguous(isa, layout):
    q, k, v, lens, _, _ = window_inputs(D=64, layout=layout, Hkv=2)
    assert not k.is_contiguous()
    want = attn(q, k.contiguous(), v.contiguous(), lens, causal=True, window=300)
    assert torch.equal(attn(q, k, v, lens, causal=True, window=300), want)


def test_window_identities(isa):
    # window 0 or None: no window; a window as long as every cache: no window either (bitwise).
    q, k, v, lens, _, _ = window_inputs(D=256, lens=(1100, 4, 700))
    for causal in (False, True):
        plain = attn(q, k, v, lens, causal=causal)
        for window in (None, 0, 1100, 5000):
            assert torch.equal(attn(q, k, v, lens, causal=causal, window=window), plain), (causal, window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_one_is_the_own_value(isa, dtype):
    # window 1: each causal query sees its own key only, so its output is its own value row.
    T = 3
    q, k, v, lens, _, _ = window_inputs(D=64, dtype=dtype, T=T, lens=(600, 3, 257))
    out = attn(q, k, v, lens, causal=True, window=1)
    for b, n in enumerate(lens.tolist()):
        for t in range(T):
            assert torch.equal(out[b, t], v[b, 0, n - T + t].expand(4, -1))


def test_window_older_keys_are_not_read(isa):
    # NaN in every key and value older than each request's first window: the same bits.
    T, W = 3, 300
    q, k, v, lens, _, _ = window_inputs(D=128, T=T, lens=(1100, 3, 700, 520))
    want = attn(q, k, v, lens, causal=True, window=W)
    for b, n in enumerate(lens.tolist()):
        oldest = max(n - T + 1 - W, 0)  # query 0's first key
        k[b, :, :oldest] = float("nan")
        v[b, :, :oldest] = float("nan")
    got = attn(q, k, v, lens, causal=True, window=W)
    assert torch.equal(got, want) and torch.isfinite(got).all()


def test_head_dim_256_single_kv_head(isa):
    # Gemma 3's attention shape without a window: against the reference, rows == decode steps.
    for dtype in DTYPES:
        q, k, v, lens, _, _ = window_inputs(D=256, dtype=dtype)
        full = attn(q, k, v, lens, causal=True)
        close(full, reference.head_attention(q, k, v, lens, causal=True), dtype)
        for t in range(4):
            assert torch.equal(attn(q[:, t : t + 1], k, v, lens - 4 + t + 1, causal=True)[:, 0], full[:, t])


def test_opcheck_head_attention_window():
    q, k, v, lens, _, _ = inputs(L=40, layout="permuted")
    torch.library.opcheck(torch.ops.mtp.head_attention.default, (q, k, v, lens, None, None, None, True), {"window": 7})


# ---------------------------------------------------------------- cache_append
@pytest.mark.parametrize("layout", ["contiguous", "layer", "permuted", "d_strided"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_append_matches_reference(layout, dtype):
    gen = torch.Generator().manual_seed(3)
    B, T, Hkv, L, D = 3, 4, 2, 20, 64
    k = make_cache(B, Hkv, L, D, dtype, layout, gen)
    v = make_cache(B, Hkv, L, D, dtype, layout, gen)
    kn = torch.randn(B, T, Hkv, D, generator=gen).to(dtype)
    vn = torch.randn(B, Hkv, T, D, generator=gen).to(dtype).transpose(1, 2)  # strided new values too
    lens = torch.tensor([0, 7, 16], dtype=torch.int32)
    k_ref, v_ref = k.clone(), v.clone()
    ptr = k.data_ptr()
    mtp_kernels.cache_append(k, v, kn, vn, lens)
    reference.cache_append(k_ref, v_ref, kn, vn, lens)
    assert k.data_ptr() == ptr and torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert lens.tolist() == [0, 7, 16]  # the caller advances it


def test_cache_append_overflow_writes_nothing():
    q, k, v, _, _, _ = inputs(B=2, L=10)
    kn, vn = torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64)
    k0, v0 = k.clone(), v.clone()
    with pytest.raises(RuntimeError, match=r"mtp.cache_append: request 1 would pass the cache capacity.*L = 10"):
        mtp_kernels.cache_append(k, v, kn, vn, torch.tensor([0, 8]))
    assert torch.equal(k, k0) and torch.equal(v, v0)


def test_append_then_rollback_by_lowering_lens(isa):
    # Decode loop: append T drafts, verify (causal), keep n, roll back by lowering cache_lens;
    # the next append overwrites the rejected entries.
    gen = torch.Generator().manual_seed(4)
    B, Hkv, L, D, T = 2, 2, 64, 64, 3
    kbuf = torch.zeros(2, B, L, Hkv, D)  # [layers, B, Lmax, Hkv, D]
    vbuf = torch.zeros(2, B, L, Hkv, D)
    k, v = kbuf[1].permute(0, 2, 1, 3), vbuf[1].permute(0, 2, 1, 3)
    lens = torch.tensor([5, 9])
    k[:, :, :9] = torch.randn(B, Hkv, 9, D, generator=gen)
    v[:, :, :9] = torch.randn(B, Hkv, 9, D, generator=gen)
    mtp_kernels.cache_append(
        k, v, torch.randn(B, T, Hkv, D, generator=gen), torch.randn(B, T, Hkv, D, generator=gen), lens
    )
    lens = lens + 1  # accepted one of three
    kn, vn = torch.randn(B, 1, Hkv, D, generator=gen), torch.randn(B, 1, Hkv, D, generator=gen)
    mtp_kernels.cache_append(k, v, kn, vn, lens)
    lens = lens + 1
    q = torch.randn(B, 1, 2 * Hkv, D, generator=gen)
    out = attn(q, k, v, lens, causal=True)
    assert torch.equal(k[:, :, lens - 1][torch.arange(B), :, torch.arange(B)], kn[:, 0])
    close(out, reference.head_attention(q, k, v, lens, causal=True), torch.float32)


# ---------------------------------------------------------------- torch integration
def test_opcheck_head_attention():
    for causal, S in [(False, 0), (True, 2)]:
        q, k, v, lens, kl, vl = inputs(L=40, S=S, layout="permuted")
        torch.library.opcheck(torch.ops.mtp.head_attention.default, (q, k, v, lens, kl, vl, None, causal))
    q, k, v, lens, _, _ = inputs(L=40, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.mtp.head_attention.default, (q, k, v, lens), {"scale": 0.5})


def test_opcheck_cache_append():
    gen = torch.Generator().manual_seed(5)
    k = make_cache(2, 2, 16, 64, torch.float32, "layer", gen)
    v = make_cache(2, 2, 16, 64, torch.float32, "permuted", gen)
    kn, vn = torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64)
    torch.library.opcheck(torch.ops.mtp.cache_append.default, (k, v, kn, vn, torch.tensor([0, 4])))


def test_torch_compile_fullgraph():
    def step(q, k, v, kn, vn, lens):
        mtp_kernels.cache_append(k, v, kn, vn, lens)
        return mtp_kernels.head_attention(q, k, v, lens + kn.shape[1], causal=True) * 2

    q, k, v, lens, _, _ = inputs(T=2, L=64, lens=[10, 20])
    kn, vn = torch.randn(2, 2, 2, 64), torch.randn(2, 2, 2, 64)
    k2, v2 = k.clone(), v.clone()
    eager = step(q, k, v, kn, vn, lens)
    compiled = torch.compile(step, fullgraph=True, backend="inductor")(q, k2, v2, kn, vn, lens)
    assert torch.equal(compiled, eager) and torch.equal(k2, k) and torch.equal(v2, v)


# ---------------------------------------------------------------- bad inputs
def _bad(**change):
    q, k, v, lens, kl, vl = inputs(L=20, S=2)
    a = dict(q=q, k_cache=k, v_cache=v, cache_lens=lens, k_local=None, v_local=None, scale=None, causal=False)
    a.update({key: (val(a) if callable(val) else val) for key, val in change.items()})
    return a, (kl, vl)


BAD_ATTENTION = [
    (dict(q=lambda a: a["q"].long()), r"q must be Float or BFloat16 or Half, got Long"),
    (dict(q=lambda a: a["q"][0]), r"q must be 4-D \[B, T, Hq, D\]"),
    (dict(k_cache=lambda a: a["k_cache"].half()), r"k_cache must have q's dtype Float, got Half"),
    (dict(v_cache=lambda a: a["v_cache"][:, :, :10]), r"v_cache must have k_cache's shape"),
    (dict(q=lambda a: a["q"][:, :, :5]), r"Hq = 5 must be a multiple of .* Hkv = 2"),
    (dict(q=lambda a: a["q"][..., :32]), r"k_cache.size\(3\) must equal the head dim D \(q.size\(3\)\) = 32"),
    (dict(q=lambda a: a["q"][:1]), r"k_cache.size\(0\) must equal B \(q.size\(0\)\) = 1"),
    (
        dict(cache_lens=torch.tensor([3, -1])),
        r"cache_lens must lie in \[0, L \(k_cache.size\(2\)\)\] = \[0, 20\], got cache_lens\[1\] = -1",
    ),
    (
        dict(cache_lens=torch.tensor([3, 21])),
        r"cache_lens must lie in \[0, L \(k_cache.size\(2\)\)\] = \[0, 20\], got cache_lens\[1\] = 21",
    ),
    (dict(cache_lens=torch.tensor([3])), r"cache_lens.size\(0\) must equal B"),
    (dict(cache_lens=torch.tensor([3.0, 4.0])), r"cache_lens must be Int or Long, got Float"),
    (
        dict(cache_lens=torch.tensor([3, 2]), causal=True),
        r"causal=True needs cache_lens\[b\] >= T = 3 .*, got min\(cache_lens\) = 2",
    ),
    (dict(k_local=lambda a: torch.zeros(2, 2, 2, 64)), r"k_local and v_local must be given together"),
    (
        dict(k_local=lambda a: torch.zeros(2, 1, 2, 64), v_local=lambda a: torch.zeros(2, 1, 2, 64)),
        r"k_local.size\(1\) must equal Hkv \(k_cache.size\(1\)\) = 2",
    ),
    (
        dict(k_local=lambda a: torch.zeros(2, 2, 2, 64), v_local=lambda a: torch.zeros(2, 2, 3, 64)),
        r"v_local must have k_local's shape",
    ),
    (
        dict(k_local=lambda a: torch.zeros(2, 2, 2, 64).half(), v_local=lambda a: torch.zeros(2, 2, 2, 64).half()),
        r"k_local must have q's dtype Float, got Half",
    ),
    (dict(q=lambda a: a["q"].to("meta")), r"k_cache must be on q's device meta, got cpu"),
    (
        dict(window=-1),
        r"window must be >= 0 \(0: no window; else how many of the latest keys a query sees\), got window = -1",
    ),
    (
        dict(window=4, k_local=lambda a: torch.zeros(2, 2, 2, 64), v_local=lambda a: torch.zeros(2, 2, 2, 64)),
        r"window = 4 does not combine with a local segment \(k_local / v_local\)",
    ),
]


@pytest.mark.parametrize("change,message", BAD_ATTENTION)
def test_bad_attention_inputs(change, message):
    a, _ = _bad(**change)
    with pytest.raises(RuntimeError, match=message) as info:
        torch.ops.mtp.head_attention(**a)
    assert "mtp.head_attention: " in str(info.value)


BAD_APPEND = [
    (
        dict(k_new=torch.zeros(2, 3, 2, 64).half(), v_new=torch.zeros(2, 3, 2, 64).half()),
        r"k_cache must have k_new's dtype Half, got Float",
    ),
    (dict(k_new=torch.zeros(2, 3, 2, 64).half()), r"v_new must have k_new's dtype Half, got Float"),
    (dict(k_cache=torch.zeros(2, 2, 20, 64).to("meta")), r"k_cache must be on k_new's device cpu, got meta"),
    (dict(v_new=torch.zeros(2, 3, 2, 32)), r"v_new must have k_new's shape"),
    (dict(k_new=torch.zeros(2, 3, 1, 64), v_new=torch.zeros(2, 3, 1, 64)), r"k_cache.size\(1\) must equal Hkv"),
    (dict(cache_lens=torch.tensor([0, 21])), r"cache_lens must lie in \[0, L \(k_cache.size\(2\)\)\] = \[0, 20\]"),
    (dict(v_cache=torch.zeros(2, 2, 19, 64)), r"v_cache must have k_cache's shape"),
]


@pytest.mark.parametrize("change,message", BAD_APPEND)
def test_bad_append_inputs(change, message):
    a = dict(
        k_cache=torch.zeros(2, 2, 20, 64),
        v_cache=torch.zeros(2, 2, 20, 64),
        k_new=torch.zeros(2, 3, 2, 64),
        v_new=torch.zeros(2, 3, 2, 64),
        cache_lens=torch.tensor([0, 5]),
    )
    a.update(change)
    k0 = a["k_cache"].clone()
    with pytest.raises(RuntimeError, match=message) as info:
        torch.ops.mtp.cache_append(**a)
    assert "mtp.cache_append: " in str(info.value)
    assert a["k_cache"].is_meta or torch.equal(a["k_cache"], k0)

"""The row-local layer ops: mtp.rms_norm, mtp.add_rms_norm and mtp.rope_ give reference.py's
bits; mtp.silu_mul and mtp.gelu_tanh_mul are within a few ulp of reference.silu_mul /
reference.gelu_tanh_mul (gelu_tanh_mul also against an fp64 evaluation and torch's gelu); every
op gives the same bits on every instruction-set path, each row's bits do not depend on the other
rows (a verify pass equals one-token decoding), any strides, empty tensors, NaN / inf / zero
rows, opcheck, torch.compile, bad input, and the CUDA fallback (the reference, with the same
checks)."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import fallback, reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HIDDEN = [576, 1, 15, 16, 17, 100, 1536]  # whole lane chunks, tails, and a single element
EPS = 1e-5
# silu_mul against torch's silu (both within a few fp32 ulp of the exact value); bf16 / fp16:
# the two fp32 values may round to neighbouring values (one ulp of the result).
SILU_TOL = {
    torch.float32: dict(rtol=1e-6, atol=1e-30),
    torch.bfloat16: dict(rtol=2**-7, atol=1e-30),
    torch.float16: dict(rtol=2**-10, atol=2**-24),
}
# gelu_tanh_mul against reference.gelu_tanh_mul (the same fp32 steps with torch's exp): fp32
# within 8 ulp (measured: 3), bf16 / fp16 one ulp of the result where the two fp32 values round
# apart (rare: most outputs are bitwise equal, test_gelu_tanh_mul_is_close_to_the_reference).
GELU_TOL = {
    torch.float32: dict(rtol=2**-20, atol=1e-30),
    torch.bfloat16: dict(rtol=2**-7, atol=1e-30),
    torch.float16: dict(rtol=2**-10, atol=2**-24),
}


def assert_bitwise(got, want):
    """Equal values and signs of zero, NaN where want has NaN (torch and the kernels may give
    NaN different payloads)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    nan = got.isnan()
    assert torch.equal(nan, want.isnan())
    assert torch.equal(got[~nan], want[~nan]) and torch.equal(got[~nan].signbit(), want[~nan].signbit())


def rows(gen, shape, dtype, spread=True):
    """Random rows with magnitudes from 1e-3 to 1e3 (one per row) when spread."""
    x = torch.randn(shape, generator=gen)
    if spread:
        x = x * 10 ** (6 * torch.rand((*shape[:-1], 1), generator=gen) - 3)
    return x.to(dtype)


def torch_rope(x, cos, sin):
    """RoPE as the backbone computed it with torch ops before the fusion (rotate_half)."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


def rope(x, cos, sin):
    """mtp.rope_ on a copy."""
    y = x.clone()
    torch.ops.mtp.rope_(y, cos, sin)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_is_the_reference_bitwise(isa, gen, dtype):
    for H in HIDDEN:
        for lead in [(1,), (9,), (2, 5)]:
            x, r = rows(gen, (*lead, H), dtype), rows(gen, (*lead, H), dtype)
            for w_dtype in DTYPES:
                w = (1 + 0.1 * torch.randn(H, generator=gen)).to(w_dtype)
                assert_bitwise(torch.ops.mtp.rms_norm(x, w, EPS), reference.rms_norm(x, w, EPS))
                s, n = torch.ops.mtp.add_rms_norm(x, r, w, 1e-6)
                want_s, want_n = reference.add_rms_norm(x, r, w, 1e-6)
                assert_bitwise(s, want_s)
                assert_bitwise(n, want_n)
    # against a plain fp64 RMSNorm: only the rounding differs
    x, w = rows(gen, (4, 576), torch.float32), torch.randn(576, generator=gen)
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    torch.testing.assert_close(torch.ops.mtp.rms_norm(x, w, EPS).double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_is_the_reference_and_the_torch_composition_bitwise(isa, gen, dtype):
    for B, T, H, D in [(1, 1, 12, 64), (2, 9, 3, 64), (1, 5, 2, 128), (2, 3, 4, 2), (1, 2, 3, 40), (1, 1, 1, 34)]:
        x = rows(gen, (B, T, H, D), dtype)
        cos, sin = torch.randn(B, T, D, generator=gen), torch.randn(B, T, D, generator=gen)
        got = rope(x, cos, sin)
        assert_bitwise(got, reference.rope(x, cos, sin))
        assert_bitwise(got, torch_rope(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_close_to_the_reference(isa, gen, dtype):
    for I in [1536, 1, 7, 16, 33]:
        for lead in [(1,), (9,), (2, 3)]:
            g = (4 * torch.randn((*lead, 2 * I), generator=gen)).to(dtype)
            got = torch.ops.mtp.silu_mul(g)
            assert got.shape == (*lead, I) and got.dtype == dtype
            torch.testing.assert_close(got, reference.silu_mul(g), **SILU_TOL[dtype])


def gelu_arg(g):
    """a = 2 sqrt(2/pi) (g + 0.044715 g^3) in fp64: gelu_tanh(g) = g sigmoid(a)."""
    g = g.double()
    return 2 * (2 / torch.pi) ** 0.5 * (g + 0.044715 * g**3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_mul_is_close_to_the_reference(isa, gen, dtype):
    for I in [1536, 1, 7, 16, 33]:
        for lead in [(1,), (9,), (2, 3)]:
            g = (4 * torch.randn((*lead, 2 * I), generator=gen)).to(dtype)
            got = torch.ops.mtp.gelu_tanh_mul(g)
            assert got.shape == (*lead, I) and got.dtype == dtype
            torch.testing.assert_close(got, reference.gelu_tanh_mul(g), **GELU_TOL[dtype])
    # Many values: bf16 / fp16 give the reference's bits but where the two fp32 values (a few
    # ulp apart) round to neighbours; fp32 within 4 (1 + |a|) ulp of the value in fp64 (computing
    # a in fp32 costs |a| times its few ulp, up to 87 at the flush to 0: measured <= 2.9 (1 + |a|)).
    gate = torch.cat([torch.linspace(-10, 10, 20001), 4 * torch.randn(20000, generator=gen)])
    up = torch.randn(gate.shape, generator=gen)
    x = torch.cat([gate, up])[None].to(dtype)
    got, want = torch.ops.mtp.gelu_tanh_mul(x)[0], reference.gelu_tanh_mul(x)[0]
    torch.testing.assert_close(got, want, **GELU_TOL[dtype])
    g, u = x[0].double().chunk(2)
    a = gelu_arg(g)
    exact = g * torch.sigmoid(a) * u
    kept = a.abs() <= 87.3  # beyond, e^-|a| is 0 in the kernel: the value is below 1.3e-37
    if dtype != torch.float32:
        assert (got == want)[kept].float().mean() > 0.999
    if dtype == torch.float32:
        ulp = torch.finfo(torch.float32).eps * exact.abs()  # 2^-23 |x| >= one ulp of x
        assert ((got.double() - exact).abs() <= 4 * (1 + a.abs()) * ulp)[kept].all()
    else:
        torch.testing.assert_close(got[kept], exact[kept].to(dtype), **GELU_TOL[dtype])
    # torch's gelu: 0.5 g (1 + tanh) in fp32 is off by up to |g| 2^-24 (1 + tanh cancels for
    # negative g, 0 below g = -5.06); with that allowance, the same values
    tg = torch.nn.functional.gelu(g.float(), approximate="tanh").double() * u
    allow = (g * u).abs() * 2**-24 + GELU_TOL[dtype]["rtol"] * exact.abs() + 2**-24
    assert ((got.double() - tg).abs() <= allow).all()


def all_ops(gen, dtype):
    """One call of each op (add_rms_norm's two outputs, rope_ on a copy) on fixed inputs."""
    x, r, w = rows(gen, (9, 576 + 19), dtype), rows(gen, (9, 576 + 19), dtype), torch.randn(576 + 19, generator=gen)
    q = rows(gen, (2, 9, 12, 64), dtype)
    cos, sin = torch.randn(2, 9, 64, generator=gen), torch.randn(2, 9, 64, generator=gen)
    g = (6 * torch.randn(9, 2 * 1536 + 6, generator=gen)).to(dtype)
    return lambda: [
        torch.ops.mtp.rms_norm(x, w, EPS),
        *torch.ops.mtp.add_rms_norm(x, r, w, EPS),
        rope(q, cos, sin),
        torch.ops.mtp.silu_mul(g),
        torch.ops.mtp.gelu_tanh_mul(g),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_instruction_set_gives_the_same_bits(gen, dtype):
    run = all_ops(gen, dtype)
    before = mtp_kernels.get_isa()
    try:
        mtp_kernels.set_isa("generic")
        want = run()
        for isa in mtp_kernels.supported_isas():
            mtp_kernels.set_isa(isa)
            for got, w in zip(run(), want):
                assert_bitwise(got, w)
    finally:
        mtp_kernels.set_isa(before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_alone_gives_the_same_bits(isa, gen, dtype):
    H, I = 576 + 19, 1536 + 6
    x, r, w = rows(gen, (2, 9, H), dtype), rows(gen, (2, 9, H), dtype), torch.randn(H, generator=gen).to(dtype)
    q = rows(gen, (2, 9, 12, 64), dtype)
    cos, sin = torch.randn(2, 9, 64, generator=gen), torch.randn(2, 9, 64, generator=gen)
    g = (6 * torch.randn(2, 9, 2 * I, generator=gen)).to(dtype)
    norm, (s, n), rot, act, gelu = (
        torch.ops.mtp.rms_norm(x, w, EPS),
        torch.ops.mtp.add_rms_norm(x, r, w, EPS),
        rope(q, cos, sin),
        torch.ops.mtp.silu_mul(g),
        torch.ops.mtp.gelu_tanh_mul(g),
    )
    for b in range(2):
        for t in range(9):  # one-token decoding of position t of request b
            one = (slice(b, b + 1), slice(t, t + 1))
            assert_bitwise(torch.ops.mtp.rms_norm(x[one], w, EPS), norm[one])
            s1, n1 = torch.ops.mtp.add_rms_norm(x[one], r[one], w, EPS)
            assert_bitwise(s1, s[one])
            assert_bitwise(n1, n[one])
            assert_bitwise(rope(q[one], cos[one], sin[one]), rot[one])
            assert_bitwise(torch.ops.mtp.silu_mul(g[one]), act[one])
            assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g[one]), gelu[one])
        for T in (2, 5):  # a verify pass over the first T positions
            assert_bitwise(torch.ops.mtp.rms_norm(x[b : b + 1, :T], w, EPS), norm[b : b + 1, :T])
            assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g[b : b + 1, :T]), gelu[b : b + 1, :T])


def test_strided_inputs(gen):
    H = 576
    big = torch.randn(5, 3 * H, generator=gen)
    x = big[:, 7 : 7 + H]  # strided rows
    w_big = torch.randn(2 * H, generator=gen)
    w = w_big[::2]  # strided weight
    want = reference.rms_norm(x.contiguous(), w.contiguous(), EPS)
    assert_bitwise(torch.ops.mtp.rms_norm(x, w, EPS), want)
    xt = x.t().contiguous().t()  # element stride 5: copied
    assert_bitwise(torch.ops.mtp.rms_norm(xt, w, EPS), want)
    assert_bitwise(torch.ops.mtp.rms_norm(x[0].expand(4, H), w, EPS), want[0].expand(4, H))  # stride-0 rows
    r = torch.randn(H, 5, generator=gen).t()
    s, n = torch.ops.mtp.add_rms_norm(x, r, w, EPS)
    want_s, want_n = reference.add_rms_norm(x.contiguous(), r.contiguous(), w.contiguous(), EPS)
    assert_bitwise(s, want_s)
    assert_bitwise(n, want_n)
    assert s.is_contiguous() and n.is_contiguous()

    # rope_ on the q and k heads of a fused qkv output, in place; v untouched
    B, T, Hq, Hkv, D = 2, 5, 9, 3, 64
    qkv = torch.randn(B, T, Hq + 2 * Hkv, D, generator=gen).bfloat16()
    before = qkv.clone()
    cos, sin = torch.randn(T, D, generator=gen), torch.randn(T, D, generator=gen)
    cos_b, sin_b = cos.expand(B, T, D), sin.expand(B, T, D)  # stride 0 over B
    torch.ops.mtp.rope_(qkv[:, :, : Hq + Hkv], cos_b, sin_b)
    assert_bitwise(qkv[:, :, : Hq + Hkv], reference.rope(before[:, :, : Hq + Hkv], cos_b, sin_b))
    assert torch.equal(qkv[:, :, Hq + Hkv :], before[:, :, Hq + Hkv :])
    # permuted heads, an element stride of 2 in D, cos / sin strided in D
    buf = torch.randn(B, Hkv, T, 2 * D, generator=gen)
    xs = buf.permute(0, 2, 1, 3)[..., ::2]
    cs = torch.randn(B, T, 3 * D, generator=gen)[..., ::3]
    sn = torch.randn(B, T, 2 * D, generator=gen)[..., 1::2]
    want = reference.rope(xs, cs, sn)
    rest = buf[..., 1::2].clone()
    torch.ops.mtp.rope_(xs, cs, sn)
    assert_bitwise(xs, want)
    assert torch.equal(buf[..., 1::2], rest)

    I = 1536
    g_big = torch.randn(4, 2 * I + 10, generator=gen)
    g = g_big[:, 3 : 3 + 2 * I]
    want = torch.ops.mtp.silu_mul(g.contiguous())
    assert_bitwise(torch.ops.mtp.silu_mul(g), want)
    assert_bitwise(torch.ops.mtp.silu_mul(g.t().contiguous().t()), want)
    want = torch.ops.mtp.gelu_tanh_mul(g.contiguous())
    assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g), want)
    assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g.t().contiguous().t()), want)
    assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g[1].expand(3, 2 * I)), want[1].expand(3, I))  # stride-0 rows
    g3 = g_big[:, 1 : 1 + 2 * I].unflatten(0, (2, 2)).transpose(0, 1)  # 3-D, permuted leading dims
    assert_bitwise(torch.ops.mtp.gelu_tanh_mul(g3), torch.ops.mtp.gelu_tanh_mul(g3.contiguous()))


def test_empty():
    w = torch.ones(576)
    assert torch.ops.mtp.rms_norm(torch.randn(0, 576), w, EPS).shape == (0, 576)
    assert torch.ops.mtp.rms_norm(torch.randn(3, 0), torch.ones(0), EPS).shape == (3, 0)
    s, n = torch.ops.mtp.add_rms_norm(torch.randn(2, 0, 576), torch.randn(2, 0, 576), w, EPS)
    assert s.shape == n.shape == (2, 0, 576)
    for shape in [(0, 3, 4, 64), (1, 2, 0, 64), (1, 2, 3, 0)]:
        x = torch.randn(shape)
        torch.ops.mtp.rope_(x, torch.randn(shape[0], shape[1], shape[3]), torch.randn(shape[0], shape[1], shape[3]))
    assert torch.ops.mtp.silu_mul(torch.randn(0, 8)).shape == (0, 4)
    assert torch.ops.mtp.silu_mul(torch.randn(3, 0)).shape == (3, 0)
    for dtype in DTYPES:
        for shape, want in [((0, 8), (0, 4)), ((3, 0), (3, 0)), ((2, 0, 6), (2, 0, 3)), ((0,), (0,))]:
            out = torch.ops.mtp.gelu_tanh_mul(torch.randn(shape).to(dtype))
            assert out.shape == want and out.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_and_zero_rows(isa, gen, dtype):
    H = 37
    x = rows(gen, (8, H), dtype, spread=False)
    x[0] = 0.0
    x[1, 5] = float("nan")
    x[2, 3] = float("inf")
    x[3, 4] = float("-inf")
    x[4] = torch.finfo(dtype).max  # the squares overflow to inf
    x[5] = torch.finfo(dtype).tiny / 4  # subnormal (fp32 squares underflow to 0)
    x[6, ::2] = -0.0
    w = torch.randn(H, generator=gen)
    for eps in (EPS, 0.0):
        got = torch.ops.mtp.rms_norm(x, w, eps)
        assert_bitwise(got, reference.rms_norm(x, w, eps))
        for i in range(8):  # a bad row changes no other row
            assert_bitwise(torch.ops.mtp.rms_norm(x[i : i + 1], w, eps), got[i : i + 1])
    assert torch.equal(torch.ops.mtp.rms_norm(x[:1], w, EPS), torch.zeros(1, H, dtype=dtype))
    assert torch.ops.mtp.rms_norm(x[:1], w, 0.0).isnan().all()  # 0 / 0, as torch's formula gives
    assert torch.ops.mtp.rms_norm(x[1:2], w, EPS).isnan().all() and torch.isfinite(got[7]).all()
    r = rows(gen, (8, H), dtype)
    s, n = torch.ops.mtp.add_rms_norm(x, r, w, EPS)
    want_s, want_n = reference.add_rms_norm(x, r, w, EPS)
    assert_bitwise(s, want_s)
    assert_bitwise(n, want_n)

    q = rows(gen, (1, 2, 3, 8), dtype, spread=False)
    q[0, 0, 0, 1], q[0, 0, 1, 6], q[0, 1, 2, 0] = float("nan"), float("inf"), -0.0
    cos, sin = torch.randn(1, 2, 8, generator=gen), torch.randn(1, 2, 8, generator=gen)
    cos[0, 1, 3] = float("inf")
    assert_bitwise(rope(q, cos, sin), reference.rope(q, cos, sin))

    # silu(g) below g = -87.3 is 0 here (e^g < 2^-126: no subnormals) and ~1e-37 or 0 in torch:
    # inf / NaN ups only with gates away from that edge.
    special = [
        float("-inf"),
        -1e4,
        -100.0,
        -88.5,
        -87.4,
        -87.2,
        -20.0,
        -1e-30,
        -0.0,
        0.0,
        1e-30,
        1.0,
        20.0,
        88.5,
        100.0,
        1e4,
        float("inf"),
        float("nan"),
    ]
    finite_ups = [1.0, -2.0, 0.0]
    pairs = [(a, b) for a in special for b in finite_ups]
    pairs += [
        (a, b)
        for a in [float("-inf"), -20.0, -1.0, -0.0, 0.0, 1.0, 20.0, float("inf"), float("nan")]
        for b in [float("inf"), float("-inf"), float("nan")]
    ]
    g = torch.tensor([a for a, _ in pairs] + [b for _, b in pairs]).to(dtype)[None]
    got, want = torch.ops.mtp.silu_mul(g), reference.silu_mul(g)
    torch.testing.assert_close(got, want, equal_nan=True, **SILU_TOL[dtype])
    assert torch.equal(got.signbit() | got.isnan(), want.signbit() | want.isnan())

    # gelu_tanh_mul: gelu(g) below g = -9.9995 is -0 here (e^-|a| < 2^-126) and ~1e-37 or 0 in
    # the reference; inf / NaN ups only with gates away from that edge. The same specials (and
    # subnormal gates, fp16's smallest) as silu_mul's, against the reference and torch's gelu.
    tiny = torch.finfo(dtype).tiny
    special += [tiny / 4, -tiny / 4, tiny, -tiny, 2**-24, -(2**-24), -5.0, -9.9, -10.1]
    pairs = [(a, b) for a in special for b in finite_ups]
    pairs += [
        (a, b)
        for a in [float("-inf"), -9.9, -5.0, -1.0, -0.0, 0.0, 1.0, 20.0, float("inf"), float("nan")]
        for b in [float("inf"), float("-inf"), float("nan")]
    ]
    g = torch.tensor([a for a, _ in pairs] + [b for _, b in pairs]).to(dtype)[None]
    got, want = torch.ops.mtp.gelu_tanh_mul(g), reference.gelu_tanh_mul(g)
    torch.testing.assert_close(got, want, equal_nan=True, **GELU_TOL[dtype])
    assert torch.equal(got.signbit() | got.isnan(), want.signbit() | want.isnan())
    gate, up = g[0].float().chunk(2)
    fin = up.isfinite()  # torch's gelu(-9.9) is 0 (times inf: NaN), this one's -1e-36 (-inf)
    torch.testing.assert_close(
        got[0].float()[fin],
        (torch.nn.functional.gelu(gate, approximate="tanh") * up)[fin],
        equal_nan=True,
        rtol=GELU_TOL[dtype]["rtol"],
        atol=1e-6,  # torch's 1 + tanh cancels for negative gates
    )
    # The edges, decided: gelu(+-0) = +-0, gelu(+inf) = inf, gelu(-inf) = NaN (-inf * 0, as
    # torch's gelu gives), NaN propagates (gate or up), gelu(-100) = -0, gelu(100) = 100.
    e = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -100.0, 100.0, 1.0]
    out = torch.ops.mtp.gelu_tanh_mul(torch.tensor([e + [1.0] * 7 + [float("nan")]]).to(dtype))[0]
    assert torch.equal(out[:2], torch.tensor([0.0, -0.0], dtype=dtype)) and torch.equal(
        out[:2].signbit(), out.new_tensor([0, 1]).bool()
    )
    assert out[2] == float("inf") and out[3].isnan() and out[4].isnan() and out[7].isnan()
    assert out[5] == 0 and out[5].signbit() and out[6] == 100


def test_opcheck_and_compile(gen):
    x, r, w = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen), torch.randn(64, generator=gen)
    q = torch.randn(2, 3, 4, 16, generator=gen)
    cos, sin = torch.randn(2, 3, 16, generator=gen), torch.randn(2, 3, 16, generator=gen)
    g = torch.randn(2, 3, 40, generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(torch.ops.mtp.rms_norm.default, (x.to(dtype), w, EPS))
        torch.library.opcheck(torch.ops.mtp.add_rms_norm.default, (x.to(dtype), r.to(dtype), w.to(dtype), EPS))
        torch.library.opcheck(torch.ops.mtp.rope_.default, (q.to(dtype), cos, sin))
        torch.library.opcheck(torch.ops.mtp.silu_mul.default, (g.to(dtype),))
        torch.library.opcheck(torch.ops.mtp.gelu_tanh_mul.default, (g.to(dtype),))
    torch.library.opcheck(torch.ops.mtp.gelu_tanh_mul.default, (g.half(),))
    torch.library.opcheck(torch.ops.mtp.gelu_tanh_mul.default, (torch.randn(0, 6),))

    def layer(x, r, qkv):
        s, h = mtp_kernels.add_rms_norm(x, r, w, EPS)
        qkv = qkv * 1  # rotated in place: a view of a graph-internal tensor
        mtp_kernels.rope_(qkv[:, :, :3], cos, sin)
        return mtp_kernels.rms_norm(s, w, EPS), h, qkv, mtp_kernels.silu_mul(torch.cat([h, h], -1))

    qkv = torch.randn(2, 3, 5, 16, generator=gen)
    for got, want in zip(torch.compile(layer, fullgraph=True)(x, r, qkv), layer(x, r, qkv)):
        assert torch.equal(got, want)

    def mlp(h):
        return mtp_kernels.gelu_tanh_mul(torch.cat([h, h], -1)) * 2

    assert torch.equal(torch.compile(mlp, fullgraph=True)(x), mlp(x))


BAD = [
    (
        "rms_norm",
        lambda: (torch.randn(2, 3).double(), torch.ones(3), EPS),
        "x must be Float or BFloat16 or Half, got Double",
    ),
    (
        "rms_norm",
        lambda: (torch.randn(2, 3), torch.ones(3, dtype=torch.long), EPS),
        "weight must be Float or BFloat16 or Half, got Long",
    ),
    ("rms_norm", lambda: (torch.randn(2, 3), torch.ones(2, 3), EPS), "weight must be 1-D [H], got shape [2, 3]"),
    (
        "rms_norm",
        lambda: (torch.randn(2, 3), torch.ones(4), EPS),
        "weight.size(0) must equal H (x.size(-1)) = 3, got 4",
    ),
    (
        "rms_norm",
        lambda: (torch.tensor(1.0), torch.ones(1), EPS),
        "x must have at least 1 dimension [..., H], got a scalar",
    ),
    ("rms_norm", lambda: (torch.randn(2, 3), torch.ones(3), -1.0), "eps must be a finite number >= 0, got -1"),
    ("rms_norm", lambda: (torch.randn(2, 3), torch.ones(3), float("nan")), "eps must be a finite number >= 0, got nan"),
    (
        "rms_norm",
        lambda: (torch.randn(2, 3), torch.ones(3, device="meta"), EPS),
        "weight must be on x's device cpu, got meta",
    ),
    (
        "add_rms_norm",
        lambda: (torch.randn(2, 3), torch.randn(2, 3).bfloat16(), torch.ones(3), EPS),
        "residual must have x's dtype Float, got BFloat16",
    ),
    (
        "add_rms_norm",
        lambda: (torch.randn(2, 3), torch.randn(2, 4), torch.ones(3), EPS),
        "residual must have x's shape [2, 3], got [2, 4]",
    ),
    (
        "add_rms_norm",
        lambda: (torch.randn(2, 3), torch.randn(2, 3), torch.ones(5), EPS),
        "weight.size(0) must equal H (x.size(-1)) = 3, got 5",
    ),
    (
        "add_rms_norm",
        lambda: (torch.randn(2, 3), torch.randn(2, 3, device="meta"), torch.ones(3), EPS),
        "residual must be on x's device cpu, got meta",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4)),
        "x must be 4-D [B, T, H, D], got shape [1, 2, 4]",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4).long(), torch.randn(1, 2, 4), torch.randn(1, 2, 4)),
        "x must be Float or BFloat16 or Half, got Long",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 5), torch.randn(1, 2, 5), torch.randn(1, 2, 5)),
        "x.size(3) (the head dim D, rotated as two halves) must be even, got 5",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 1, 4).expand(1, 2, 3, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4)),
        "x must not have overlapping elements (it is rotated in place), got strides [8, 4, 0, 1]",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4).bfloat16(), torch.randn(1, 2, 4)),
        "cos must be Float, got BFloat16",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(2, 4), torch.randn(1, 2, 4)),
        "cos must be 3-D [B, T, D], got shape [2, 4]",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4), torch.randn(2, 2, 4)),
        "sin.size(0) must equal B (x.size(0)) = 1, got 2",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 2, 4)),
        "cos.size(1) must equal T (x.size(1)) = 2, got 3",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 6)),
        "sin.size(2) must equal D (x.size(3)) = 4, got 6",
    ),
    (
        "rope_",
        lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4, device="meta"), torch.randn(1, 2, 4)),
        "cos must be on x's device cpu, got meta",
    ),
    ("silu_mul", lambda: (torch.ones(2, 4, dtype=torch.int32),), "gate_up must be Float or BFloat16 or Half, got Int"),
    ("silu_mul", lambda: (torch.randn(2, 7),), "gate_up.size(-1) must be even [..., 2I] (gate, then up), got 7"),
    ("silu_mul", lambda: (torch.tensor(1.0),), "gate_up must have at least 1 dimension [..., 2I], got a scalar"),
    (
        "gelu_tanh_mul",
        lambda: (torch.ones(2, 4, dtype=torch.int32),),
        "gate_up must be Float or BFloat16 or Half, got Int",
    ),
    ("gelu_tanh_mul", lambda: (torch.randn(2, 4).double(),), "gate_up must be Float or BFloat16 or Half, got Double"),
    ("gelu_tanh_mul", lambda: (torch.randn(2, 7),), "gate_up.size(-1) must be even [..., 2I] (gate, then up), got 7"),
    (
        "gelu_tanh_mul",
        lambda: (torch.tensor(1.0),),
        "gate_up must have at least 1 dimension [..., 2I], got a scalar",
    ),
]


@pytest.mark.parametrize("name,args,message", BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_bad_input(name, args, message):
    with pytest.raises(RuntimeError, match=f"mtp.{name}: " + re.escape(message)):
        getattr(torch.ops.mtp, name)(*args())
    if "meta" not in message:  # the CUDA fallback's checks say the same (a device mismatch: meta kernels)
        with pytest.raises(RuntimeError, match=f"mtp.{name}: " + re.escape(message)):
            fallback.FALLBACKS[name](*args())


def test_cuda_fallback_is_registered_and_is_the_cpu_kernel(gen):
    for name in fallback.FALLBACKS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mtp::{name}", "CUDA"), name
    # The fallback on CPU tensors: the CPU kernels' bits (silu_mul: torch's exp, a few ulp off).
    x, r, w = rows(gen, (4, 576), torch.bfloat16), rows(gen, (4, 576), torch.bfloat16), torch.randn(576, generator=gen)
    assert_bitwise(fallback.rms_norm(x, w, EPS), torch.ops.mtp.rms_norm(x, w, EPS))
    for got, want in zip(fallback.add_rms_norm(x, r, w, EPS), torch.ops.mtp.add_rms_norm(x, r, w, EPS)):
        assert_bitwise(got, want)
    q = rows(gen, (1, 3, 4, 64), torch.bfloat16)
    cos, sin = torch.randn(1, 3, 64, generator=gen), torch.randn(1, 3, 64, generator=gen)
    y = q.clone()
    fallback.rope_(y, cos, sin)
    assert_bitwise(y, rope(q, cos, sin))
    g = torch.randn(3, 2 * 1536, generator=gen).bfloat16()
    torch.testing.assert_close(fallback.silu_mul(g), torch.ops.mtp.silu_mul(g), **SILU_TOL[torch.bfloat16])
    for dtype in DTYPES:
        gd = (4 * g).to(dtype)
        got = fallback.gelu_tanh_mul(gd)
        assert got.is_contiguous() and got.dtype == dtype
        assert_bitwise(got, reference.gelu_tanh_mul(gd))
        torch.testing.assert_close(got, torch.ops.mtp.gelu_tanh_mul(gd), **GELU_TOL[dtype])
    gt = (4 * torch.randn(2 * 1536, 3, generator=gen)).t()  # strided: the same values
    assert_bitwise(fallback.gelu_tanh_mul(gt), fallback.gelu_tanh_mul(gt.contiguous()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_gives_the_cpu_bits(gen, dtype):
    x, r, w = rows(gen, (9, 576), dtype), rows(gen, (9, 576), dtype), torch.randn(576, generator=gen)
    q = rows(gen, (2, 9, 12, 64), dtype)
    cos, sin = torch.randn(2, 9, 64, generator=gen), torch.randn(2, 9, 64, generator=gen)
    g = (4 * torch.randn(9, 2 * 1536, generator=gen)).to(dtype)
    c = lambda t: t.cuda()  # noqa: E731
    assert_bitwise(torch.ops.mtp.rms_norm(c(x), c(w), EPS).cpu(), torch.ops.mtp.rms_norm(x, w, EPS))
    for got, want in zip(torch.ops.mtp.add_rms_norm(c(x), c(r), c(w), EPS), torch.ops.mtp.add_rms_norm(x, r, w, EPS)):
        assert_bitwise(got.cpu(), want)
    y = c(q)
    torch.ops.mtp.rope_(y, c(cos), c(sin))
    assert_bitwise(y.cpu(), rope(q, cos, sin))
    torch.testing.assert_close(torch.ops.mtp.silu_mul(c(g)).cpu(), torch.ops.mtp.silu_mul(g), **SILU_TOL[dtype])
    torch.testing.assert_close(
        torch.ops.mtp.gelu_tanh_mul(c(g)).cpu(), torch.ops.mtp.gelu_tanh_mul(g), **GELU_TOL[dtype]
    )

"""mtp.linear(..., quantize_x=True): int8 weights times row-quantized int8 activations with
integer dot products. Bitwise where reference.py defines the bits (the quantized activations,
the integer block sums), within the documented bound of reference.linear's fp64 value
otherwise; bitwise shape-invariant on every instruction set; NaN/inf; opcheck; bad input."""

import math
import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import quantize_q8, reference

X_DTYPES = [torch.float32, torch.bfloat16]
# (N, K): K = 0, K < 32, at and across block and 64-element edges, the model's shapes.
SHAPES = [
    (37, 100),
    (5, 7),
    (3, 1),
    (64, 31),
    (33, 32),
    (17, 33),
    (1, 70),
    (9, 64),
    (8, 65),
    (4, 0),
    (192, 576),
    (70, 1000),
]


def linear_q8dot(x, q, bias, s):
    return torch.ops.mtp.linear(x, q, bias, s, quantize_x=True)


def q8_weight(gen, N, K):
    return quantize_q8(torch.randn(N, K, generator=gen) / max(K, 1) ** 0.5)


def bound(x, q, s, bias, out_dtype):
    """reference.linear's documented bound: (nb + 8) * 2^-24 * sum_b |sx_b * sw_b| * sum_{k in b}
    |xq_k * wq_k| + 2^-23 |y| (the bias added, the result rounded to fp32), 2^-8 |y| for a
    bf16 result. (The kernels add partial integer sums of a block as fp32 lanes.)"""
    K = x.shape[-1]
    xq, sx = reference.quantize_rows_q8(x)
    abs_sums = reference.q8_block_sums(xq.long().abs(), q.long().abs()).double()
    terms = abs_sums * (sx.double()[:, None, :] * s.double()[None, :, :])
    b = (-(-K // 32) + 8) * 2.0**-24 * terms.abs().sum(dim=-1)
    want = reference.linear(x.float(), q, bias, s, quantize_x=True).double()
    return b + want.abs() * (2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-23) + 1e-30


# ---- the quantization rule (reference.quantize_rows_q8)


def test_quantize_rows_rule():
    x = torch.zeros(4, 70)
    x[0, :32] = torch.tensor([127.0, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 126.5] + [0.0] * 24)  # sx = 1: ties to even
    x[0, 32:64] = 0.0  # a zero block
    x[0, 64:] = torch.tensor([1e-44, -1e-44, 0, 0, 0, 0])  # subnormal: amax / 127 underflows to 0
    x[1, :32] = 3e38  # huge: finite scale
    x[1, 32:] = torch.linspace(-1e-30, 1e-30, 38)
    x[2, 5] = float("nan")
    x[2, 40] = float("inf")
    x[3, 66] = float("-inf")
    xq, sx = reference.quantize_rows_q8(x)
    assert xq.dtype == torch.int8 and xq.shape == (4, 70) and sx.dtype == torch.float32 and sx.shape == (4, 3)
    assert sx[0, 0] == 1.0 and xq[0, :8].tolist() == [127, 4, -2, -4, 0, 2, 0, 126]
    assert sx[0, 1] == 0 and sx[0, 2] == 0 and not xq[0, 32:].any()
    assert sx[1, 0] == torch.tensor(3e38) / 127 and (xq[1, :32] == 127).all()
    assert sx[1, 1] == torch.tensor(1e-30) / 127 and xq[1, 32] == -127 and xq[1, 69] == 127
    assert torch.isnan(sx[2, 0]) and torch.isnan(sx[2, 1]) and sx[2, 2] == 0 and not xq[2].any()
    assert torch.isnan(sx[3, 2]) and sx[3, 0] == 0 and sx[3, 1] == 0
    # the rule itself, on random rows of every magnitude
    g = torch.Generator().manual_seed(1)
    r = torch.randn(6, 100, generator=g) * torch.logspace(-30, 30, 6)[:, None]
    rq, rs = reference.quantize_rows_q8(r)
    for b in range(4):
        blk = r[:, 32 * b : 32 * b + 32]
        s = blk.abs().amax(dim=1) / 127
        assert torch.equal(rs[:, b], s)
        assert torch.equal(rq[:, 32 * b : 32 * b + 32].float(), torch.round(blk / s[:, None]).clamp(-127, 127))


# ---- the kernel against the rule, bit for bit


def test_kernel_quantizes_x_bitwise(isa, gen):
    """An identity weight with unit scales gives y[m, k] = fp32(xq[m, k] * sx[m, k // 32]): the
    kernel's quantized activations, bitwise the reference's (ties, zeros, huge, tiny, NaN)."""
    K = 100
    x = torch.randn(7, K, generator=gen) * torch.logspace(-20, 20, 7)[:, None]
    x[0, :8] = torch.tensor([127.0, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 126.5])
    x[0, 8:32] = 0.0
    x[1, 32:64] = 0.0
    x[2, 64:] = 1e-44
    x[3, :] = 3e38
    x[4, 50] = float("nan")
    x[5, 3] = float("-inf")
    eye, ones = torch.eye(K, dtype=torch.int8), torch.ones(K, -(-K // 32))
    for dt in X_DTYPES:
        xd = x.to(dt)
        xq, sx = reference.quantize_rows_q8(xd)
        want = xq.float() * sx.repeat_interleave(32, dim=1)[:, :K]
        nan_rows = torch.isnan(sx).any(dim=1)
        want[nan_rows] = float("nan")
        got = (
            linear_q8dot(xd.float(), eye, None, ones)
            if dt == torch.float32
            else linear_q8dot(xd, eye, None, ones).float()
        )
        if dt == torch.float32:
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num()), isa
        else:  # a bf16 result rounds the same fp32 value
            assert torch.equal(got.nan_to_num(), want.bfloat16().float().nan_to_num()), isa


def test_integer_block_sums_exact(isa, gen):
    """Rows whose every block holds +-127 get sx = 1 and xq = x; unit weight scales then make y
    the exact sum of the integer block sums (< 2^24): bitwise reference.q8_block_sums."""
    for N, K in [(45, 576), (33, 100), (7, 31), (5, 64 + 32)]:
        x = torch.randint(-127, 128, (9, K), generator=gen).float()
        x[:, ::32] = 127.0
        q = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)  # -128 included
        s = torch.ones(N, -(-K // 32))
        xq, sx = reference.quantize_rows_q8(x)
        assert torch.equal(xq.float(), x) and (sx == 1).all()
        want = reference.q8_block_sums(xq, q).sum(dim=-1)
        assert want.abs().max() < 2**24
        assert torch.equal(linear_q8dot(x, q, None, s), want.float()), (isa, N, K)


# ---- the value, within the documented bound


@pytest.mark.parametrize("x_dtype", X_DTYPES)
def test_against_reference(isa, gen, x_dtype):
    for N, K in SHAPES:
        for M in (1, 2, 5, 9, 17):
            x = torch.randn(M, K, generator=gen).to(x_dtype)
            q, s = q8_weight(gen, N, K)
            bias = torch.randn(N, generator=gen) if M % 2 else None
            got = linear_q8dot(x, q, bias, s)
            assert got.dtype == x_dtype and got.shape == (M, N)
            want = reference.linear(x, q, bias, s, quantize_x=True).double()
            err = (got.double() - want).abs()
            assert (err <= bound(x, q, s, bias, x_dtype)).all(), (isa, N, K, M, err.max().item())


def test_close_to_the_weight_only_result(gen):
    """Quantizing x too costs about one more Q8 rounding: near the weight-only Q8 value."""
    x = torch.randn(5, 576, generator=gen)
    q, s = q8_weight(gen, 192, 576)
    y8, y = linear_q8dot(x, q, None, s), torch.ops.mtp.linear(x, q, None, s)
    assert ((y8 - y).norm() / y.norm()).item() < 0.02


# ---- shape invariance, bitwise


@pytest.mark.parametrize("x_dtype", X_DTYPES)
def test_shape_invariance_bitwise(isa, gen, x_dtype):
    N, K = 333, 576 + 19  # a partial last block, a partial last 64-element chunk, column tails
    x = torch.randn(70, K, generator=gen).to(x_dtype)  # 70 rows: a span of 64 and a partial one
    q, s = q8_weight(gen, N, K)
    bias = torch.randn(N, generator=gen)
    full = linear_q8dot(x, q, bias, s)
    for M in [*range(1, 34), 64, 65]:
        part = linear_q8dot(x[:M], q, bias, s)
        assert torch.equal(part, full[:M]), (isa, M)
    for i in range(70):
        assert torch.equal(linear_q8dot(x[i : i + 1], q, bias, s), full[i : i + 1]), (isa, i)
    assert torch.equal(linear_q8dot(x.reshape(7, 10, K), q, bias, s).reshape(70, N), full)


@pytest.mark.parametrize("K", [0, 1, 20, 31, 32, 33, 63, 64, 65, 100])
def test_small_and_odd_k_rows_alone(isa, gen, K):
    x = torch.randn(9, K, generator=gen)
    q, s = q8_weight(gen, 70, K)
    bias = torch.randn(70, generator=gen)
    full = linear_q8dot(x, q, bias, s)
    for i in range(9):
        assert torch.equal(linear_q8dot(x[i : i + 1], q, bias, s), full[i : i + 1]), (isa, K, i)
    if K == 0:
        assert torch.equal(full, bias.expand(9, 70))


def test_threads_and_layout_do_not_change_bits(gen, threads):
    x = torch.randn(4, 5, 576, generator=gen)  # 20 rows: quantized over the threads (linear.h kParallelRows)
    q, s = q8_weight(gen, 1536, 576)
    torch.set_num_threads(2)
    full = linear_q8dot(x, q, None, s)
    torch.set_num_threads(1)
    assert torch.equal(linear_q8dot(x, q, None, s), full)
    strided = torch.randn(4, 5, 1000, generator=gen)[..., 7 : 7 + 576]
    strided.copy_(x)
    assert torch.equal(linear_q8dot(strided, q, None, s), full)
    big_q = torch.zeros(1536, 600, dtype=torch.int8)
    big_q[:, :576] = q
    big_s = torch.zeros(1536, 20)
    big_s[:, :18] = s
    assert torch.equal(linear_q8dot(x, big_q[:, :576], None, big_s[:, :18]), full)


# ---- edge values


def test_non_finite_rows_give_nan_rows(isa, gen):
    """A NaN or infinity in a row of x makes that row's outputs NaN (every column, whatever the
    weights); the other rows keep their bits."""
    K, N = 100, 37
    x = torch.randn(6, K, generator=gen)
    q, s = q8_weight(gen, N, K)
    s[3] = 0  # a weight row of zero scales: still NaN
    clean = linear_q8dot(x, q, None, s)
    x[1, 70], x[3, 0], x[4, 99] = float("nan"), float("inf"), float("-inf")
    y = linear_q8dot(x, q, torch.ones(N), s)
    for m in (1, 3, 4):
        assert torch.isnan(y[m]).all(), (isa, m)
    for m in (0, 2, 5):
        assert torch.equal(y[m], linear_q8dot(x[m : m + 1], q, torch.ones(N), s)[0])
        assert not torch.isnan(y[m]).any()
    assert torch.isnan(reference.linear(x, q, None, s, quantize_x=True)[[1, 3, 4]]).all()
    del clean


def test_zero_rows_give_the_bias(isa, gen):
    q, s = q8_weight(gen, 20, 70)
    b = torch.randn(20, generator=gen)
    assert torch.equal(linear_q8dot(torch.zeros(3, 70), q, b, s), b.expand(3, 20))
    assert torch.equal(linear_q8dot(torch.randn(2, 70, generator=gen), q, b, torch.zeros_like(s)), b.expand(2, 20))


# ---- the op: opcheck, compile, bad input


def test_opcheck_and_compile(gen):
    x, b = torch.randn(3, 70, generator=gen), torch.randn(32, generator=gen)
    q, s = q8_weight(gen, 32, 70)
    kw = {"quantize_x": True}
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, q, b, s), kw)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x.bfloat16(), q, None, s), kw)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x[:1], q, None, s), kw)

    @torch.compile(fullgraph=True)
    def f(x):
        return torch.relu(mtp_kernels.linear(x, q, b, weight_scale=s, quantize_x=True)) * 2

    assert torch.equal(f(x), torch.relu(linear_q8dot(x, q, b, s)) * 2)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_quantize_x_needs_an_int8_weight(device, w_dtype):
    x, w = torch.randn(2, 40, device=device), torch.randn(4, 40, device=device).to(w_dtype)
    name = {torch.float32: "Float", torch.bfloat16: "BFloat16"}[w_dtype] if device == "cpu" else str(w_dtype)
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            f"mtp.linear: quantize_x=True needs an int8 weight with weight_scale (mtp_kernels.quantize_q8), got a {name} weight"  # noqa: E501
        ),
    ):
        torch.ops.mtp.linear(x, w, None, None, quantize_x=True)


def test_reference_refuses_a_float_weight():
    with pytest.raises(ValueError, match="quantize_x=True needs an int8 weight"):
        reference.linear(torch.randn(2, 40), torch.randn(4, 40), quantize_x=True)


def test_bad_q8_input_still_checked():
    q = torch.ones(4, 40, dtype=torch.int8)
    with pytest.raises(RuntimeError, match=re.escape("mtp.linear: an int8 weight needs weight_scale")):
        torch.ops.mtp.linear(torch.randn(2, 40), q, None, None, quantize_x=True)
    with pytest.raises(RuntimeError, match=re.escape("mtp.linear: x must be Float or BFloat16, got Half")):
        torch.ops.mtp.linear(torch.randn(2, 40).half(), q, None, torch.ones(4, 2), quantize_x=True)
    assert math.isfinite(float(linear_q8dot(torch.randn(2, 40), q, None, torch.ones(4, 2)).sum()))

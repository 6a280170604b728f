"""mtp.linear: close to reference.linear, and bitwise shape-invariant (each row's bits do
not depend on how many rows share the call, nor on the thread count)."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference

DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (37, 100), (5, 7), (3, 1), (64, 65)]


def tolerance(out_dtype, K):
    # fp32 sums of K products (vector order vs fp64) / a bf16 result may round to the next value (1 ulp).
    return dict(rtol=1e-5, atol=1e-6 * K) if out_dtype == torch.float32 else dict(rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", DTYPES)
def test_against_reference(isa, gen, x_dtype, w_dtype):
    for N, K in SHAPES:
        for M in (1, 2, 5, 9):
            x = torch.randn(M, K, generator=gen).to(x_dtype)
            w = (torch.randn(N, K, generator=gen) / K**0.5).to(w_dtype)
            bias = torch.randn(N, generator=gen) if M % 2 else None
            got = torch.ops.mtp.linear(x, w, bias)
            want = reference.linear(x, w, bias)
            assert got.dtype == x_dtype and got.shape == (M, N)
            torch.testing.assert_close(got, want, **tolerance(x_dtype, K))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", DTYPES)
def test_shape_invariance_bitwise(isa, gen, x_dtype, w_dtype):
    N, K = 333, 576 + 19  # odd sizes: vector tails in both dimensions
    x = torch.randn(70, K, generator=gen).to(x_dtype)  # 70 rows: a span of 64 and a partial one
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(w_dtype)
    bias = torch.randn(N, generator=gen)
    full = torch.ops.mtp.linear(x, w, bias)
    for i in range(70):
        assert torch.equal(torch.ops.mtp.linear(x[i : i + 1], w, bias), full[i : i + 1]), i
    for M in (2, 3, 5, 9, 17, 33, 65):
        assert torch.equal(torch.ops.mtp.linear(x[3 : 3 + M], w, bias), full[3 : 3 + M]), M


def test_bf16_output_rounds_like_torch(isa, threads):
    # A bf16 result is the fp32 sum rounded by the thread that computed its column block.
    # Here every output is a + b * s exactly rounded once in fp32 (the other products are
    # zeros, s a power of two), so it must be torch's fp32 -> bf16 of that sum: ties to even
    # both ways, overflow to inf, NaN. N = 70: three column blocks, the last partial.
    one = 1.0 + 2**-7  # odd last mantissa bit
    big = (2 - 2**-7) * 2.0**127  # bf16's largest finite value, odd too
    a = torch.tensor([1.0, one, -one, big, -big, 0.0, float("nan"), 3.0, -2.5, 1e30, 0.0])
    b = torch.tensor([2**-8, 2**-8, -(2**-8), 2.0**119, -(2.0**119), -0.0, 1.0, 2**-9, 2**-7, 1e22, 1.5])
    s = 2.0 ** torch.arange(-3, 67).remainder(7).float()  # 1 .. 64, per column
    K = 64
    x = torch.zeros(len(a), K, dtype=torch.bfloat16)
    x[:, 0], x[:, 1] = a, b
    w = torch.zeros(len(s), K, dtype=torch.bfloat16)
    w[:, 0], w[:, 1] = 1.0, s
    want = (x[:, :1].float() + x[:, 1:2].float() * s).to(torch.bfloat16)
    assert want.isinf().any() and want.isnan().any()
    for n in (1, 2):
        torch.set_num_threads(n)
        got = torch.ops.mtp.linear(x, w)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan], want[~nan])


def test_thread_count_and_layout_do_not_change_bits(gen, threads):
    x = torch.randn(2, 5, 576, generator=gen)
    w = torch.randn(1536, 576, generator=gen)
    full = torch.ops.mtp.linear(x, w)
    assert full.shape == (2, 5, 1536)
    torch.set_num_threads(1)
    assert torch.equal(torch.ops.mtp.linear(x, w), full)
    strided = torch.randn(2, 5, 1000, generator=gen)[..., 7 : 7 + 576]  # rows 1000 apart: read in place
    strided.copy_(x)
    assert torch.equal(torch.ops.mtp.linear(strided, w), full)
    rows = torch.randn(10, 1000, generator=gen)[:, 7 : 7 + 576]  # 2-D rows 1000 apart: read in place
    rows.copy_(x.reshape(10, 576))
    assert torch.equal(torch.ops.mtp.linear(rows, w), full.reshape(10, 1536))
    repeated = x[0, 3].expand(4, 576)  # row stride 0
    assert torch.equal(torch.ops.mtp.linear(repeated, w), full[0, 3].expand(4, 1536))
    q, scale = mtp_kernels.quantize_q8(w)
    assert torch.equal(
        torch.ops.mtp.linear(rows, q, None, scale, quantize_x=True),
        torch.ops.mtp.linear(x.reshape(10, 576), q, None, scale, quantize_x=True),
    )
    big = torch.randn(1536, 700, generator=gen)
    big[:, :576] = w
    with pytest.raises(RuntimeError, match="weight rows must be contiguous"):
        torch.ops.mtp.linear(x, big.t().contiguous().t()[:, :576])
    assert torch.equal(torch.ops.mtp.linear(x, big[:, :576]), full)  # row stride 700, read in place


def test_empty_and_degenerate(gen):
    w = torch.randn(4, 3, generator=gen)
    assert torch.ops.mtp.linear(torch.randn(0, 3), w).shape == (0, 4)
    assert torch.ops.mtp.linear(torch.randn(2, 3), torch.randn(0, 3)).shape == (2, 0)
    y = torch.ops.mtp.linear(torch.randn(2, 0), torch.randn(4, 0), torch.ones(4))
    assert torch.equal(y, torch.ones(2, 4))


def test_opcheck_and_compile(gen):
    x, w, b = torch.randn(3, 64, generator=gen), torch.randn(32, 64, generator=gen), torch.randn(32, generator=gen)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, w, b))
    torch.library.opcheck(torch.ops.mtp.linear.default, (x.bfloat16(), w.bfloat16()))

    @torch.compile(fullgraph=True)
    def f(x):
        return torch.relu(mtp_kernels.linear(x, w, b)) * 2

    assert torch.equal(f(x), torch.relu(torch.ops.mtp.linear(x, w, b)) * 2)


BAD_LINEAR = [
    ((torch.randn(2, 3), torch.randn(4, 5)), "weight.size(1) must equal K (x.size(-1)) = 3, got 5"),
    ((torch.randn(2, 3), torch.randn(4, 3, 1)), "weight must be 2-D [N, K]"),
    ((torch.randn(2, 3).double(), torch.randn(4, 3)), "x must be Float or BFloat16, got Double"),
    ((torch.randn(2, 3), torch.randn(4, 3).half()), "weight must be Float or BFloat16 or Char, got Half"),
    ((torch.randn(2, 3), torch.randn(4, 3), torch.randn(5)), "bias.size(0) must equal N (weight.size(0)) = 4, got 5"),
    ((torch.tensor(1.0), torch.randn(4, 3)), "x must have at least 1 dimension"),
]


@pytest.mark.parametrize("args,message", BAD_LINEAR)
def test_bad_input(args, message):
    with pytest.raises(RuntimeError, match="mtp.linear: .*" + re.escape(message)):
        torch.ops.mtp.linear(*args)

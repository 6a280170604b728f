"""mtp.linear with weight-only int8 weights (Q8: fp32 scales per block of 32 along K):
close to reference.linear, bitwise shape-invariant on every instruction set, thread count
free; quantize_q8 / dequantize_q8; opcheck; bad input."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import dequantize_q8, quantize_q8, reference

X_DTYPES = [torch.float32, torch.bfloat16]
# (N, K): K below, at and across block edges, K < 32, N = 1, the model's shapes.
SHAPES = [(37, 100), (5, 7), (3, 1), (64, 31), (33, 32), (17, 33), (1, 70), (1, 5), (9, 64), (192, 576), (70, 1000)]


def tolerance(out_dtype, K):
    # fp32 sums in the kernel's order vs fp64; a bf16 result may round to the next value.
    return dict(rtol=1e-5, atol=1e-6 * K) if out_dtype == torch.float32 else dict(rtol=2**-7, atol=1e-3)


def q8_weight(gen, N, K):
    return quantize_q8(torch.randn(N, K, generator=gen) / K**0.5)


def raw_q8(gen, N, K):
    """Any int8 values (-128 included) and scales of both signs, zero blocks among them."""
    q = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    s = torch.randn(N, -(-K // 32), generator=gen) * 0.01
    s[::3, ::2] = 0
    return q, s


@pytest.mark.parametrize("x_dtype", X_DTYPES)
def test_against_reference(isa, gen, x_dtype):
    for N, K in SHAPES:
        for M in (1, 2, 5, 9, 17):
            x = torch.randn(M, K, generator=gen).to(x_dtype)
            q, s = q8_weight(gen, N, K) if M % 3 else raw_q8(gen, N, K)
            bias = torch.randn(N, generator=gen) if M % 2 else None
            got = torch.ops.mtp.linear(x, q, bias, s)
            assert got.dtype == x_dtype and got.shape == (M, N)
            want = reference.linear(x, q, bias, s)
            scale = 1.0 if M % 3 else 127 * 0.01 * K**0.5  # raw_q8 elements are larger
            torch.testing.assert_close(got.float() / scale, want.float() / scale, **tolerance(x_dtype, K))


def test_reference_is_the_dequantised_weight(gen):
    q, s = raw_q8(gen, 7, 70)
    x, b = torch.randn(3, 70, generator=gen), torch.randn(7, generator=gen)
    w64 = q.double() * s.double().repeat_interleave(32, dim=1)[:, :70]
    assert torch.equal(reference.linear(x, q, b, s), (x.double() @ w64.T + b.double()).float())
    torch.testing.assert_close(dequantize_q8(q, s).double(), w64, rtol=2**-24, atol=0)


@pytest.mark.parametrize("x_dtype", X_DTYPES)
def test_shape_invariance_bitwise(isa, gen, x_dtype):
    N, K = 333, 576 + 19  # odd sizes: a partial last block, column tails
    x = torch.randn(70, K, generator=gen).to(x_dtype)  # 70 rows: a span of 64 and a partial one
    q, s = q8_weight(gen, N, K)
    bias = torch.randn(N, generator=gen)
    full = torch.ops.mtp.linear(x, q, bias, s)
    for i in range(70):
        assert torch.equal(torch.ops.mtp.linear(x[i : i + 1], q, bias, s), full[i : i + 1]), i
    for M in (2, 3, 5, 9, 17, 33, 65):
        assert torch.equal(torch.ops.mtp.linear(x[3 : 3 + M], q, bias, s), full[3 : 3 + M]), M
    assert torch.equal(torch.ops.mtp.linear(x.reshape(7, 10, K), q, bias, s).reshape(70, N), full)


def test_thread_count_and_layout_do_not_change_bits(gen, threads):
    x = torch.randn(2, 5, 576, generator=gen)
    q, s = q8_weight(gen, 1536, 576)  # 48 column blocks: split across threads
    torch.set_num_threads(2)
    full = torch.ops.mtp.linear(x, q, None, s)
    assert full.shape == (2, 5, 1536)
    torch.set_num_threads(1)
    assert torch.equal(torch.ops.mtp.linear(x, q, None, s), full)
    strided = torch.randn(2, 5, 1000, generator=gen)[..., 7 : 7 + 576]
    strided.copy_(x)
    assert torch.equal(torch.ops.mtp.linear(strided, q, None, s), full)
    # weight and scale rows strided (slices of wider buffers), read in place
    big_q = torch.zeros(1536, 600, dtype=torch.int8)
    big_q[:, :576] = q
    big_s = torch.zeros(1536, 20)
    big_s[:, :18] = s
    assert torch.equal(torch.ops.mtp.linear(x, big_q[:, :576], None, big_s[:, :18]), full)


def test_empty_and_degenerate(gen):
    q, s = q8_weight(gen, 4, 3)
    assert torch.ops.mtp.linear(torch.randn(0, 3), q, None, s).shape == (0, 4)
    assert torch.ops.mtp.linear(torch.randn(2, 3), q[:0], None, s[:0]).shape == (2, 0)
    q0, s0 = quantize_q8(torch.randn(4, 0))
    assert q0.shape == (4, 0) and s0.shape == (4, 0)
    y = torch.ops.mtp.linear(torch.randn(2, 0), q0, torch.ones(4), s0)
    assert torch.equal(y, torch.ones(2, 4))
    # an all-zero scale row gives exactly the bias
    s_zero = torch.zeros_like(s)
    assert torch.equal(
        torch.ops.mtp.linear(torch.randn(2, 3), q, torch.full((4,), 0.25), s_zero), torch.full((2, 4), 0.25)
    )


@pytest.mark.parametrize("quantize_x", [False, True])  # weight-only Q8 and the integer dots
def test_isas_agree_to_rounding(gen, quantize_x):
    x = torch.randn(5, 515, generator=gen)
    q, s = q8_weight(gen, 40, 515)
    before = mtp_kernels.get_isa()
    outs = {}
    try:
        for isa in mtp_kernels.supported_isas():
            mtp_kernels.set_isa(isa)
            outs[isa] = torch.ops.mtp.linear(x, q, None, s, quantize_x=quantize_x)
    finally:
        mtp_kernels.set_isa(before)
    for isa, y in outs.items():
        torch.testing.assert_close(y, outs["generic"], rtol=1e-5, atol=1e-5, msg=isa)


# ---- quantize_q8 / dequantize_q8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_round_trip(gen, dtype):
    for N, K in [(7, 100), (3, 1), (5, 31), (4, 32), (6, 33), (2, 577)]:
        w = (torch.randn(N, K, generator=gen) * torch.rand(N, 1, generator=gen) * 3).to(dtype)
        q, s = quantize_q8(w)
        assert q.dtype == torch.int8 and q.shape == (N, K) and q.is_contiguous()
        assert s.dtype == torch.float32 and s.shape == (N, -(-K // 32)) and s.is_contiguous()
        assert int(q.abs().max()) <= 127
        s_el = s.double().repeat_interleave(32, dim=1)[:, :K]
        err = (w.double() - q.double() * s_el).abs()
        assert (err <= s_el / 2).all(), (err - s_el / 2).max()
        # scale = max|w| / 127 per block (fp32), and the block's largest element is +-127
        pad = torch.zeros(N, s.shape[1] * 32, dtype=torch.float64)
        pad[:, :K] = w.double().abs()
        amax = pad.view(N, -1, 32).amax(dim=2)
        assert torch.equal(s, (amax / 127).float())
        qa = torch.zeros(N, s.shape[1] * 32, dtype=torch.int64)
        qa[:, :K] = q.long().abs()
        assert torch.equal(qa.view(N, -1, 32).amax(dim=2), torch.where(amax > 0, 127, 0))
        assert torch.equal(dequantize_q8(q, s), q.float() * s.repeat_interleave(32, dim=1)[:, :K])


def test_quantize_edge_values():
    w = torch.zeros(3, 70)
    w[1, 40] = 1e30  # one huge value: its block's others become 0, the rest of the row is untouched
    w[1, 41:64] = 1.0
    w[1, :32] = torch.linspace(-1, 1, 32)
    w[2, :32] = 2.5  # ties: max 127 gives scale 1 exactly
    w[2, 0], w[2, 1], w[2, 2], w[2, 3], w[2, 4] = 127.0, 3.5, -2.5, -3.5, 0.5
    q, s = quantize_q8(w)
    assert not torch.isnan(s).any() and not torch.isnan(dequantize_q8(q, s)).any()
    assert torch.equal(s[0], torch.zeros(3)) and torch.equal(q[0], torch.zeros(70, dtype=torch.int8))  # zero blocks
    assert q[1, 40] == 127 and torch.equal(q[1, 41:64], torch.zeros(23, dtype=torch.int8))
    assert s[1, 1] == torch.tensor(1e30 / 127, dtype=torch.float32) and s[1, 2] == 0
    assert q[1, 0] == -127 and q[1, 31] == 127
    assert s[2, 0] == 1.0 and q[2, :5].tolist() == [127, 4, -2, -4, 0] and q[2, 5] == 2  # half to even
    assert s[2, 1] == 0 and s[2, 2] == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_quantize_rejects_non_finite(bad):
    w = torch.randn(4, 40)
    w[2, 33] = bad
    with pytest.raises(ValueError, match=re.escape(f"quantize_q8: weight must be finite, got weight[2, 33] = {bad}")):
        quantize_q8(w)


def test_quantize_and_dequantize_bad_arguments():
    with pytest.raises(ValueError, match=re.escape("quantize_q8: weight must be 2-D [N, K], got shape [4]")):
        quantize_q8(torch.randn(4))
    with pytest.raises(TypeError, match="quantize_q8: weight must be a float tensor, got torch.int8"):
        quantize_q8(torch.zeros(2, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match="beyond fp32's range"):
        quantize_q8(torch.full((1, 4), 1e300, dtype=torch.float64))
    q, s = quantize_q8(torch.randn(3, 40))
    with pytest.raises(ValueError, match=re.escape("dequantize_q8: scale must be float32 [N, ceil(K/32)] = [3, 2]")):
        dequantize_q8(q, s[:, :1])
    with pytest.raises(ValueError, match="dequantize_q8: q must be a 2-D int8 tensor"):
        dequantize_q8(q.float(), s)


# ---- the op: opcheck, compile, bad input


def test_opcheck_and_compile(gen):
    x, b = torch.randn(3, 70, generator=gen), torch.randn(32, generator=gen)
    q, s = q8_weight(gen, 32, 70)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, q, b, s))
    torch.library.opcheck(torch.ops.mtp.linear.default, (x.bfloat16(), q, None, s))
    torch.library.opcheck(torch.ops.mtp.linear.default, (x[:1], q, None, s))

    @torch.compile(fullgraph=True)
    def f(x):
        return torch.relu(mtp_kernels.linear(x, q, b, weight_scale=s)) * 2

    assert torch.equal(f(x), torch.relu(torch.ops.mtp.linear(x, q, b, s)) * 2)


def _q8(N, K):
    return torch.ones(N, K, dtype=torch.int8), torch.ones(N, -(-K // 32))


# (x, weight, bias, weight_scale), message after "mtp.linear: "
BAD_Q8 = [
    (
        (torch.randn(2, 40), _q8(4, 40)[0], None, None),
        "an int8 weight needs weight_scale, Float [N, ceil(K/32)] = [4, 2] (one scale per block of 32 along K), got None",  # noqa: E501
    ),
    (
        (torch.randn(2, 40), torch.randn(4, 40), None, torch.ones(4, 2)),
        "weight_scale goes with an int8 weight only (Q8 blocks), got a Float weight",
    ),
    (
        (torch.randn(2, 40), torch.randn(4, 40).bfloat16(), None, torch.ones(4, 2)),
        "weight_scale goes with an int8 weight only (Q8 blocks), got a BFloat16 weight",
    ),
    ((torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(4, 2).half()), "weight_scale must be Float, got Half"),
    ((torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(4, 2).double()), "weight_scale must be Float, got Double"),
    (
        (torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(8)),
        "weight_scale must be 2-D [N, ceil(K/32)], got shape [8]",
    ),
    (
        (torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(3, 2)),
        "weight_scale.size(0) must equal N (weight.size(0)) = 4, got 3 (shape [3, 2])",
    ),
    (
        (torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(4, 1)),
        "weight_scale.size(1) must equal ceil(K/32) (blocks of 32 along K) = 2, got 1 (shape [4, 1])",
    ),
    (
        (torch.randn(2, 64), _q8(4, 64)[0], None, torch.ones(4, 3)),
        "weight_scale.size(1) must equal ceil(K/32) (blocks of 32 along K) = 2, got 3 (shape [4, 3])",
    ),
    (
        (torch.randn(2, 40), _q8(4, 40)[0], None, torch.ones(2, 4).t()),
        "weight_scale rows must be contiguous (stride 1 along the blocks), got strides [1, 4]",
    ),
    (
        (torch.randn(2, 40), torch.ones(40, 4, dtype=torch.int8).t(), None, torch.ones(4, 2)),
        "weight rows must be contiguous",
    ),
    (
        (torch.randn(2, 40), _q8(4, 39)[0], None, torch.ones(4, 2)),
        "weight.size(1) must equal K (x.size(-1)) = 40, got 39",
    ),
    (
        (torch.randn(2, 40), torch.ones(4, 40, dtype=torch.uint8), None, torch.ones(4, 2)),
        "weight must be Float or BFloat16 or Char, got Byte",
    ),
    ((torch.randn(2, 40).half(), _q8(4, 40)[0], None, torch.ones(4, 2)), "x must be Float or BFloat16, got Half"),
    (
        (torch.randn(2, 40), _q8(4, 40)[0], torch.ones(5), torch.ones(4, 2)),
        "bias.size(0) must equal N (weight.size(0)) = 4, got 5",
    ),
]


@pytest.mark.parametrize("args,message", BAD_Q8)
def test_bad_input(args, message):
    with pytest.raises(RuntimeError, match="mtp.linear: " + re.escape(message)):
        torch.ops.mtp.linear(*args)


def test_scale_on_another_device():
    x = torch.randn(2, 40)
    with pytest.raises(RuntimeError, match="mtp.linear: weight_scale must be on x's device cpu, got meta"):
        torch.ops.mtp.linear(x, _q8(4, 40)[0], None, torch.ones(4, 2, device="meta"))

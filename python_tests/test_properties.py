"""Property-based checks of the ops against mtp_kernels/reference.py (hypothesis).

Hypothesis draws shapes, dtypes, strides and edge values (ties, NaN, inf, -0.0, ids outside the
vocabulary, random GGUF bytes including non-finite scales) and shrinks any failure to a small case.
CI runs a fixed, derandomized budget (profile "ci"); `make fuzz` runs the long one
(HYPOTHESIS_PROFILE=fuzz, FUZZ_EXAMPLES per test, random seeds).
Every comparison is bitwise (NaN positions compared as positions).
"""

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mtp_kernels  # noqa: F401  (registers the ops)
from mtp_kernels import reference
from mtp_kernels.gguf import BLOCK_TYPES

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 5000)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
EDGE = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 3.0e38, 1e-40]


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bitwise equal, NaN compared by position (its payload comes from the hardware)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not got.is_floating_point():
        return torch.equal(got, want)
    nan = want.isnan()
    return (
        torch.equal(got.isnan(), nan)
        and torch.equal(got[~nan], want[~nan])
        and torch.equal(got[~nan].signbit(), want[~nan].signbit())
    )


@st.composite
def tensors(draw, shape, dtype, edge=True, scale=4.0):
    """A tensor of ``shape`` with values from a seed, some replaced by edge values and some
    snapped to a few levels (ties); returned with a stride pattern: contiguous, a column slice
    of a wider buffer, or a transposed copy."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    t = torch.randn(shape, generator=gen) * scale
    if draw(st.booleans()):  # ties: few distinct values
        t = t.round()
    if edge and t.numel() and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 4))):
            idx = tuple(draw(st.integers(0, s - 1)) for s in shape)
            t[idx] = draw(st.sampled_from(EDGE))
    t = t.to(dtype)
    layout = draw(st.sampled_from(["contiguous", "sliced", "transposed"]))
    if layout == "sliced" and t.dim():
        wide = torch.zeros(*shape[:-1], shape[-1] + 3, dtype=dtype)
        wide[..., 1 : 1 + shape[-1]] = t
        t = wide[..., 1 : 1 + shape[-1]]
    elif layout == "transposed" and t.dim() >= 2:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t


@st.composite
def verify_case(draw):
    B, K, V = draw(st.integers(1, 5)), draw(st.integers(0, 6)), draw(st.integers(1, 300))
    dtype = draw(st.sampled_from(FLOATS))
    itype = draw(st.sampled_from([torch.int32, torch.int64]))
    logits = draw(tensors((B, K + 1, V), dtype))
    # drafts: mostly the backbone's own tokens (so prefixes get accepted), else anything, out of range too
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    drafts = torch.where(
        torch.rand(B, K, generator=gen) < 0.7, logits.argmax(-1)[:, :K], torch.randint(-2, V + 2, (B, K), generator=gen)
    ).to(itype)
    num_drafts = None
    if draw(st.booleans()):
        num_drafts = torch.randint(0, K + 1, (B,), generator=gen).to(draw(st.sampled_from([torch.int32, torch.int64])))
    pad_id = draw(st.sampled_from([-1, 0, 7]))
    return drafts, logits, num_drafts, pad_id


@given(verify_case())
def test_verify_is_the_reference(case):
    drafts, logits, num_drafts, pad_id = case
    got = torch.ops.mtp.verify(drafts, logits, num_drafts, pad_id)
    want = reference.verify(drafts, logits, num_drafts, pad_id)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


@given(verify_case())
def test_accept_prefix_is_the_reference(case):
    drafts, logits, num_drafts, _ = case
    target = logits.float().nan_to_num(0.0).round().to(drafts.dtype)[..., 0]  # [B, K+1] ids, with ties to drafts
    got = torch.ops.mtp.accept_prefix(drafts, target, num_drafts)
    assert same_bits(got, reference.accept_prefix(drafts, target, num_drafts))


@st.composite
def rows_case(draw, even=False):
    M, H = draw(st.integers(1, 6)), draw(st.integers(1, 80))
    H += H % 2 if even else 0
    dtype = draw(st.sampled_from(FLOATS))
    return draw(tensors((M, H), dtype)), draw(tensors((H,), draw(st.sampled_from(FLOATS)), edge=False))


@given(rows_case(), st.sampled_from([1e-6, 1e-5, 0.5]))
def test_rms_norm_is_the_reference(case, eps):
    x, w = case
    assert same_bits(torch.ops.mtp.rms_norm(x, w, eps), reference.rms_norm(x, w, eps))


@given(rows_case(even=True))
def test_silu_mul_rows_are_invariant_and_near_the_reference(case):
    """silu_mul's exp is a polynomial (a few ulp from torch's): rows are checked bitwise against
    their one-row calls, NaN/inf positions against the reference, values within a few ulp."""
    x, _ = case
    got, want = torch.ops.mtp.silu_mul(x), reference.silu_mul(x)
    for m in range(x.shape[0]):
        assert same_bits(torch.ops.mtp.silu_mul(x[m : m + 1]), got[m : m + 1]), m
    finite = want.isfinite()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(
        got[~finite & ~want.isnan()], want[~finite & ~want.isnan()]
    )
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(
        got[finite].float(), want[finite].float(), rtol=8 * eps, atol=2**-24 if x.dtype == torch.float16 else 1e-30
    )  # fp16 subnormals: one ulp


@given(rows_case(even=True))
def test_gelu_tanh_mul_rows_are_invariant_and_near_the_reference(case):
    """gelu_tanh_mul as silu_mul above: each row bitwise its one-row call (any strides: the cases
    come contiguous, sliced or transposed), NaN/inf positions as the reference's, values within a
    few ulp (its exp a polynomial). Gates below -9.9995 give gelu = -0 here, ~1e-37 in the
    reference: checked apart (times an inf up, NaN here, inf there)."""
    x, _ = case
    got, want = torch.ops.mtp.gelu_tanh_mul(x), reference.gelu_tanh_mul(x)
    for m in range(x.shape[0]):
        assert same_bits(torch.ops.mtp.gelu_tanh_mul(x[m : m + 1]), got[m : m + 1]), m
    assert same_bits(torch.ops.mtp.gelu_tanh_mul(x.contiguous()), got)
    g, u = x.float().chunk(2, dim=-1)
    flush = (g < -10) & g.isfinite()
    assert same_bits(got[flush], (-0.0 * u[flush]).to(x.dtype))
    keep = (g >= -9.99) | (g == float("-inf"))  # gelu(-inf) = NaN (-inf * 0) in both
    got, want = got[keep], want[keep]
    finite = want.isfinite()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(
        got[~finite & ~want.isnan()], want[~finite & ~want.isnan()]
    )
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(
        got[finite].float(), want[finite].float(), rtol=8 * eps, atol=2**-24 if x.dtype == torch.float16 else 1e-30
    )  # fp16 subnormals: one ulp


@given(
    st.integers(1, 9),
    st.integers(1, 70),
    st.integers(1, 40),
    st.sampled_from([torch.float32, torch.bfloat16]),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_linear_rows_are_shape_invariant(M, K, N, dtype, seed, bias):
    """Each row of a multi-row call has the bits of that row alone (any M), and is close to
    the reference (the float linear's sum order is the kernel's own, not the reference's)."""
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=gen).to(dtype), torch.randn(N, K, generator=gen).to(dtype)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    full = torch.ops.mtp.linear(x, w, b)
    for m in range(M):
        assert torch.equal(torch.ops.mtp.linear(x[m : m + 1], w, b), full[m : m + 1]), m
    tol = 1e-4 * K if dtype == torch.float32 else 2e-2 * K
    torch.testing.assert_close(full.float(), reference.linear(x, w, b).float(), atol=tol, rtol=tol)


@st.composite
def gguf_case(draw):
    code = draw(st.sampled_from(sorted(BLOCK_TYPES)))
    _, elems, nbytes = BLOCK_TYPES[code]
    nb, N, M = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    data = torch.randint(0, 256, (N, nb * nbytes), generator=gen, dtype=torch.uint8)
    if draw(st.booleans()):  # tame scales: zero the fp16 exponent's top bits of every byte pair
        data = data & torch.tensor([0xFF, 0x3F], dtype=torch.uint8).repeat(nb * nbytes // 2)
    x = draw(tensors((M, nb * elems), draw(st.sampled_from([torch.float32, torch.bfloat16]))))
    return code, data, x


@given(gguf_case())
def test_gguf_linear_is_the_reference(case):
    code, data, x = case
    assert same_bits(torch.ops.mtp.linear(x, data, gguf_type=code), reference.gguf_linear(x, data, code))

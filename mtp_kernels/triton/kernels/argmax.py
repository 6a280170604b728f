"""Row argmax with torch.argmax's rule, in Triton.

``argmax_combine`` is the rule of ``csrc/include/mtp/argmax_rule.h`` (argmax_combine),
elementwise: each lane folds its tiles with it. ``argmax_reduce`` applies the same rule
across lanes (or vocabulary slices) with tl.max/tl.min, which are exact and order-free:
no custom-combine tl.reduce (the interpreter runs that one element at a time).
"""

import triton
import triton.language as tl


@triton.jit
def argmax_combine(v1, i1, v2, i2):
    # A NaN beats any number; otherwise the larger value; among equal values (-0.0 == +0.0)
    # or two NaNs the lower index.
    n1 = v1 != v1
    n2 = v2 != v2
    take2 = (n2 & ~n1) | (~n1 & (v2 > v1)) | (((v1 == v2) | (n1 & n2)) & (i2 < i1))
    return tl.where(take2, v2, v1), tl.where(take2, i2, i1)


@triton.jit
def argmax_reduce(v, i, axis: tl.constexpr):
    """(value, index) of the argmax along `axis` of lanes holding (value, first index)."""
    nan = v != v
    has_nan = tl.max(nan.to(tl.int32), axis) > 0
    nan_i = tl.min(tl.where(nan, i, 2147483647), axis)
    m = tl.max(tl.where(nan, float("-inf"), v), axis)  # exact; -0.0 vs +0.0 does not matter
    m_i = tl.min(tl.where(v == tl.expand_dims(m, axis), i, 2147483647), axis)
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, nan_i, m_i)


@triton.jit
def clamped_num_drafts(num_drafts, b, K, HAS_ND: tl.constexpr):
    """num_drafts[b] clamped to [0, K] (never trust it for addressing), or K when absent."""
    if HAS_ND:
        n = tl.minimum(tl.maximum(tl.load(num_drafts + b).to(tl.int32), 0), K)
    else:
        n = b * 0 + K  # an int32 tensor, like the other branch
    return n


@triton.jit
def first_of(first, b, HAS_FIRST: tl.constexpr):
    """Request b's row offset in the flattened ragged layout (first[b]), or 0 (verify's layout)."""
    if HAS_FIRST:
        f = tl.load(first + b).to(tl.int64)
    else:
        f = b.to(tl.int64) * 0
    return f


@triton.jit
def argmax_partials_kernel(
    logits,
    stride_b,
    stride_t,
    stride_v,
    num_drafts,
    K,
    V,
    chunk,
    part_val,
    part_idx,
    splits,
    first_row,
    HAS_ND: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per (row b*(K+1)+t, vocabulary slice): the slice's argmax into the partials.
    Rows past num_drafts[b] are not read. Request b's row t is at b*stride_b + t*stride_t, or
    with HAS_FIRST (verify_ragged: stride_b = 0) at (first_row[b] + t)*stride_t."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // (K + 1)
    t = row % (K + 1)
    if t <= clamped_num_drafts(num_drafts, b, K, HAS_ND):
        lo = split * chunk
        hi = tl.minimum(lo + chunk, V)
        base = logits + b.to(tl.int64) * stride_b + (first_of(first_row, b, HAS_FIRST) + t.to(tl.int64)) * stride_t
        lanes = tl.arange(0, BLOCK_V)
        best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK_V], V, tl.int32)  # past every real index: loses all ties
        # Each lane sees increasing indices; the combine makes the order irrelevant anyway.
        for start in range(lo, hi, BLOCK_V):
            idx = start + lanes
            inside = idx < hi
            v = tl.load(base + idx.to(tl.int64) * stride_v, mask=inside, other=float("-inf")).to(tl.float32)
            best_v, best_i = argmax_combine(best_v, best_i, v, tl.where(inside, idx, V))
        v, i = argmax_reduce(best_v, best_i, 0)
        tl.store(part_val + row * splits + split, v)
        tl.store(part_idx + row * splits + split, i)

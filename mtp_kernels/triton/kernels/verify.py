"""Triton kernels of verify's second step and of accept_prefix: one program per request."""

import triton
import triton.language as tl

from .argmax import argmax_reduce, clamped_num_drafts, first_of


@triton.jit
def accepted_length(draft, target, t, nd):
    """The first position t < nd whose draft differs from the target, else nd."""
    return tl.min(tl.where((t < nd) & (draft != target), t, nd), axis=0)


@triton.jit
def verify_finish_kernel(
    draft,
    d_sb,
    d_st,
    part_val,
    part_idx,
    splits,
    num_drafts,
    K,
    pad,
    accepted,
    out,
    o_sb,
    o_st,
    draft_first,
    HAS_ND: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Merges the vocabulary slices of request b's rows (exact), then accepts and emits. With
    HAS_FIRST (verify_ragged: d_sb = 0) request b's drafts start at draft_first[b] and only
    its num_drafts[b] are read."""
    b = tl.program_id(0)
    nd = clamped_num_drafts(num_drafts, b, K, HAS_ND)
    t = tl.arange(0, BLOCK_T)
    s = tl.arange(0, BLOCK_S)
    at = (b * (K + 1) + t)[:, None] * splits + s[None, :]
    read = (t[:, None] <= nd) & (s[None, :] < splits)
    pv = tl.load(part_val + at, mask=read, other=float("-inf"))
    pi = tl.load(part_idx + at, mask=read, other=2147483647)
    _, target = argmax_reduce(pv, pi, 1)
    target = target.to(tl.int64)
    if HAS_FIRST:
        d_mask = t < nd  # the next request's drafts (or the end of the array) follow
    else:
        d_mask = t < K
    d_at = draft + b.to(tl.int64) * d_sb + (first_of(draft_first, b, HAS_FIRST) + t) * d_st
    d = tl.load(d_at, mask=d_mask, other=-1).to(tl.int64)
    n = accepted_length(d, target, t, nd)
    tl.store(accepted + b, n.to(accepted.dtype.element_ty))
    o = tl.where(t < n, d, tl.where(t == n, target, pad))
    tl.store(out + b.to(tl.int64) * o_sb + t * o_st, o.to(out.dtype.element_ty), mask=t <= K)


@triton.jit
def accept_prefix_kernel(
    draft, d_sb, d_st, target, t_sb, t_st, num_drafts, K, accepted, HAS_ND: tl.constexpr, BLOCK_T: tl.constexpr
):
    b = tl.program_id(0)
    nd = clamped_num_drafts(num_drafts, b, K, HAS_ND)
    t = tl.arange(0, BLOCK_T)
    d = tl.load(draft + b.to(tl.int64) * d_sb + t * d_st, mask=t < K, other=-1).to(tl.int64)
    g = tl.load(target + b.to(tl.int64) * t_sb + t * t_st, mask=t < K, other=-2).to(tl.int64)
    tl.store(accepted + b, accepted_length(d, g, t, nd).to(accepted.dtype.element_ty))

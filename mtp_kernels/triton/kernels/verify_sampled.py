"""verify_sampled in Triton: csrc/include/mtp/verify_sampled.h step for step, so the tokens are
bitwise those of the CPU op for the same inputs.

What makes that hold: the RNG is integer (uint64 splitmix64); the exp is exp_fixed, built
from exact IEEE steps (never tl.exp: libdevice, numpy and glibc differ in the last place);
every sum runs in verify_sampled.h's fixed order (256-wide blocks, each a pairwise tree, the block
sums left to right; no tl.sum/tl.cumsum over values, whose order is the backend's); fp64
constants are made with tl.full (a Python float literal would be typed fp32). Launch with
enable_fp_fusion=False on a GPU, or a*b+c becomes an FMA.
"""

import triton
import triton.language as tl

from .argmax import argmax_combine, argmax_reduce, clamped_num_drafts, first_of

SAMPLE_BLOCK = tl.constexpr(256)  # verify_sampled.h kSampleBlock (read inside the kernels: constexpr on a GPU)
LOG2_BLOCK = tl.constexpr(8)


@triton.jit
def _f64(v: tl.constexpr):
    return tl.full([], v, tl.float64)


@triton.jit
def _u64(v: tl.constexpr):
    return tl.full([], v, tl.uint64)


@triton.jit
def mix64(z):
    z = z + _u64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> 30)) * _u64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> 27)) * _u64(0x94D049BB133111EB)
    return z ^ (z >> 31)


@triton.jit
def sample_uniform(seed, position, stream: tl.constexpr):
    """verify_sampled.h sample_uniform: (seed, position) int64 as two's-complement uint64."""
    s = mix64(seed.to(tl.uint64, bitcast=True))
    h = mix64(mix64(s + position.to(tl.uint64, bitcast=True)) + _u64(stream))
    return (h >> 40).to(tl.float64) * _f64(1.0 / 16777216.0)


@triton.jit
def exp_fixed(y):
    """verify_sampled.h exp_fixed (y <= 0): the same operations in the same order."""
    yc = tl.maximum(y, _f64(-708.0))  # keeps -inf out of the int conversion; masked below
    k = tl.floor(yc * _f64(1.44269504088896338700e00) + _f64(0.5))
    r = (yc - k * _f64(6.93147180369123816490e-01)) - k * _f64(1.90821492927058770002e-10)
    p = _f64(1.0 / 6227020800.0)
    p = p * r + _f64(1.0 / 479001600.0)
    p = p * r + _f64(1.0 / 39916800.0)
    p = p * r + _f64(1.0 / 3628800.0)
    p = p * r + _f64(1.0 / 362880.0)
    p = p * r + _f64(1.0 / 40320.0)
    p = p * r + _f64(1.0 / 5040.0)
    p = p * r + _f64(1.0 / 720.0)
    p = p * r + _f64(1.0 / 120.0)
    p = p * r + _f64(1.0 / 24.0)
    p = p * r + _f64(1.0 / 6.0)
    p = p * r + _f64(1.0 / 2.0)
    p = p * r + _f64(1.0)
    p = p * r + _f64(1.0)
    two_k = ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)  # 2^k, exact
    return tl.where(y >= _f64(-708.0), p * two_k, _f64(0.0))


@triton.jit
def tree_sum(v):
    """The pairwise tree of a [SAMPLE_BLOCK] block: leaves 2j, 2j+1 first (block_tree)."""
    for i in tl.static_range(LOG2_BLOCK):
        a, b = tl.split(tl.reshape(v, [SAMPLE_BLOCK >> (i + 1), 2]))
        v = a + b
    return tl.sum(v, axis=0)  # one element: exact


@triton.jit
def order_key(x):
    """verify_sampled.h order_key of fp32 values, as int64 in [0, 2^32)."""
    u = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return tl.where(u >= 0x80000000, 0xFFFFFFFF - u, u + 0x80000000)


@triton.jit
def raw_weights(row, sv, lo, V, m, T, point):
    """Block [lo, lo + SAMPLE_BLOCK) of RowDist's unfiltered weights (0 past V) and keys."""
    idx = lo + tl.arange(0, SAMPLE_BLOCK)
    inside = idx < V
    x32 = tl.load(row + idx.to(tl.int64) * sv, mask=inside, other=float("-inf")).to(tl.float32)
    x = x32.to(tl.float64)
    y = tl.where(point >= 0, _f64(0.0), (x - m) / T)  # a point-mass row's y is never used (m = 0, T = 1 there)
    w = tl.where(point >= 0, tl.where(idx == point, _f64(1.0), _f64(0.0)), exp_fixed(y))
    return tl.where(inside, w, _f64(0.0)), order_key(x32), inside


@triton.jit
def filtered(w, key, key_min, w_min):
    """RowDist::w's filters: keys below key_min and weights below w_min are out."""
    return tl.where((key >= key_min) & (w >= w_min), w, _f64(0.0))


@triton.jit
def weights(row, sv, q, sq, lo, V, m, T, point, S, residual, key_min, w_min, HAS_Q: tl.constexpr):
    """Block [lo, lo + SAMPLE_BLOCK) of RowDist::w (p's weights, filtered), or with `residual`
    of max(0, w / S - q); 0 past V."""
    w, key, inside = raw_weights(row, sv, lo, V, m, T, point)
    w = filtered(w, key, key_min, w_min)
    if HAS_Q:
        idx = lo + tl.arange(0, SAMPLE_BLOCK)
        # (where, not `inside & residual`: the interpreter cannot broadcast a scalar bool into &)
        read = tl.where(residual, inside, False)
        qv = tl.load(q + idx.to(tl.int64) * sq, mask=read, other=0.0).to(tl.float32).to(tl.float64)
        w = tl.where(residual, tl.maximum(w / S - qv, _f64(0.0)), w)
    return w


@triton.jit
def ordered_sum(row, sv, q, sq, V, m, T, point, S, residual, key_min, w_min, HAS_Q: tl.constexpr):
    s = _f64(0.0)
    for lo in range(0, V, SAMPLE_BLOCK):
        s = s + tree_sum(weights(row, sv, q, sq, lo, V, m, T, point, S, residual, key_min, w_min, HAS_Q))
    return s


@triton.jit
def kept_count(row, sv, V, m, T, point, key_min, w_min):
    """How many tokens the filters (key_min, w_min) keep: integers, any order."""
    n = V * 0
    for lo in range(0, V, SAMPLE_BLOCK):
        w, key, inside = raw_weights(row, sv, lo, V, m, T, point)
        n = n + tl.sum(((key >= key_min) & (w >= w_min) & inside).to(tl.int32), axis=0)
    return n


@triton.jit
def filter_cut(row, sv, V, m, T, point, top_k, top_p, w_min):
    """RowDist's key_min for the filters: top_k's cut, the top_k-th largest key min_p keeps
    (found bit by bit: the largest key with >= top_k kept keys at or above it), then top_p's,
    verify_sampled.h top_p_key_bitwise's search run with dense sums (the same sums: x + 0 == x; the
    C++ brackets the cut first, then searches, and keeps the same tokens)."""
    key_min = V.to(tl.int64) * 0
    if (top_k > 0) & (top_k < kept_count(row, sv, V, m, T, point, key_min, w_min)):
        for i in tl.static_range(32):
            cand = key_min | (1 << (31 - i))
            key_min = tl.where(kept_count(row, sv, V, m, T, point, cand, w_min) >= top_k, cand, key_min)
    if top_p < 1:
        no = tl.zeros([], tl.int1)
        bound = top_p * ordered_sum(row, sv, row, sv, V, m, T, point, _f64(1.0), no, key_min, w_min, False)
        above = ordered_sum(row, sv, row, sv, V, m, T, point, _f64(1.0), no, tl.maximum(key_min, 1), w_min, False)
        lo = key_min * 0  # invariant: above(lo) >= bound
        if above >= bound:
            for i in tl.static_range(32):
                cand = lo | (1 << (31 - i))
                a = ordered_sum(
                    row, sv, row, sv, V, m, T, point, _f64(1.0), no, tl.maximum(key_min, cand + 1), w_min, False
                )
                lo = tl.where(a < bound, lo, cand)
            key_min = tl.maximum(key_min, lo + 1)
    return key_min


@triton.jit
def inverse_cdf(row, sv, q, sq, V, m, T, point, S, residual, key_min, w_min, total, u, HAS_Q: tl.constexpr):
    """verify_sampled.h inverse_cdf: the first block passing u * total, then down its tree."""
    target = u * total
    acc = _f64(0.0)
    found = tl.zeros([], tl.int1)
    acc_at = _f64(0.0)
    block_lo = V * 0
    keep = tl.zeros([SAMPLE_BLOCK], tl.float64)
    for lo in range(0, V, SAMPLE_BLOCK):
        w = weights(row, sv, q, sq, lo, V, m, T, point, S, residual, key_min, w_min, HAS_Q)
        s = tree_sum(w)
        hit = ~found & (s > 0) & (acc + s > target)
        keep = tl.where(hit, w, keep)
        acc_at = tl.where(hit, acc, acc_at)
        block_lo = tl.where(hit, lo, block_lo)
        found = found | hit
        acc = acc + s
    # Down the tree: a subtree's sum is the whole block's tree over it alone (x + 0 == x).
    idx = tl.arange(0, SAMPLE_BLOCK)
    node = 0
    acc = acc_at
    for i in tl.static_range(LOG2_BLOCK):
        half = SAMPLE_BLOCK >> (i + 1)
        left = tree_sum(tl.where((idx >= node) & (idx < node + half), keep, _f64(0.0)))
        right = tree_sum(tl.where((idx >= node + half) & (idx < node + 2 * half), keep, _f64(0.0)))
        go_left = (right == 0) | (acc + left > target)
        acc = tl.where(go_left, acc, acc + left)
        node = tl.where(go_left, node, node + half)
    return block_lo + node


@triton.jit
def row_max(row, sv, V, BLOCK_V: tl.constexpr):
    """(max, torch.argmax's index) of a row; the max is NaN when the row has one."""
    lanes = tl.arange(0, BLOCK_V)
    best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK_V], V, tl.int32)
    for start in range(0, V, BLOCK_V):
        idx = start + lanes
        inside = idx < V
        v = tl.load(row + idx.to(tl.int64) * sv, mask=inside, other=float("-inf")).to(tl.float32)
        best_v, best_i = argmax_combine(best_v, best_i, v, tl.where(inside, idx, V))
    return argmax_reduce(best_v, best_i, 0)


@triton.jit
def verify_sampled_kernel(
    draft,
    d_sb,
    d_st,
    q,
    q_sb,
    q_st,
    q_sv,
    logits,
    l_sb,
    l_st,
    l_sv,
    temperature,
    top_ks,
    top_ps,
    min_ps,
    seeds,
    offsets,
    num_drafts,
    K,
    V,
    pad,
    accepted,
    out,
    o_sb,
    o_st,
    draft_first,
    row_first,
    HAS_Q: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    HAS_ND: tl.constexpr,
    HAS_FILTERS: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per request: verify_sampled.h sample_request. With HAS_FIRST (verify_sampled_ragged:
    d_sb = q_sb = l_sb = 0) request b's drafts and q rows start at draft_first[b] and its logits
    rows at row_first[b] (the flattened layout, clamped on the host side)."""
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    d0 = first_of(draft_first, b, HAS_FIRST)
    r0 = first_of(row_first, b, HAS_FIRST)
    nd = clamped_num_drafts(num_drafts, b, K, HAS_ND)
    T = tl.load(temperature + b).to(tl.float64)
    seed = tl.load(seeds + b)
    if HAS_FILTERS:
        top_k = tl.load(top_ks + b).to(tl.int64)
        top_p = tl.load(top_ps + b).to(tl.float64)
        w_min = tl.load(min_ps + b).to(tl.float64)
    else:
        top_k = seed * 0
        top_p = _f64(1.0)
        w_min = _f64(0.0)
    if HAS_OFFSETS:
        offset = tl.load(offsets + b)
    else:
        offset = seed * 0
    tt = tl.arange(0, BLOCK_T)
    tokens = tl.full([BLOCK_T], 0, tl.int64)
    no = tl.zeros([], tl.int1)
    n = nd
    done = no
    for t in range(0, K + 1):
        if (t <= nd) & ~done:
            row = logits + b64 * l_sb + (r0 + t) * l_st
            mf, mi = row_max(row, l_sv, V, BLOCK_V)
            point = tl.where((T == 0) | (mf != mf) | (mf == float("inf")) | (mf == float("-inf")), mi, -1)
            # What the weights see: m = 0, T = 1 on a point-mass row (no inf - inf, no / 0).
            m = tl.where(point >= 0, _f64(0.0), mf.to(tl.float64))
            Tw = tl.where(point >= 0, _f64(1.0), T)
            qrow = q + b64 * q_sb + (d0 + t) * q_st
            key_min = seed * 0  # the filters' cuts (none on a point-mass row)
            wmin = tl.where(point >= 0, _f64(0.0), w_min)
            if HAS_FILTERS:
                if point < 0:
                    key_min = filter_cut(row, l_sv, V, m, Tw, point, top_k, top_p, wmin)
            S = ordered_sum(row, l_sv, qrow, q_sv, V, m, Tw, point, _f64(1.0), no, key_min, wmin, HAS_Q)
            pos = offset + t
            us = sample_uniform(seed, pos, 1)
            x = tl.load(draft + b64 * d_sb + (d0 + t) * d_st, mask=t < nd, other=-1).to(tl.int64)
            if HAS_Q:
                onehot = (t == nd) | (T == 0)
            else:
                onehot = t >= 0
            if onehot:
                y = inverse_cdf(row, l_sv, qrow, q_sv, V, m, Tw, point, S, no, key_min, wmin, S, us, HAS_Q).to(tl.int64)
                take = (t < nd) & (x == y)
            else:
                ok = (x >= 0) & (x < V)
                xs = tl.where(ok, x, 0)
                xl32 = tl.load(row + xs * l_sv).to(tl.float32)
                xl = xl32.to(tl.float64)
                wx = tl.where(
                    point >= 0,
                    tl.where(xs == point, _f64(1.0), _f64(0.0)),
                    exp_fixed(tl.where(point >= 0, _f64(0.0), (xl - m) / Tw)),
                )
                wx = filtered(wx, order_key(xl32), key_min, wmin)
                qx = tl.load(qrow + xs * q_sv).to(tl.float32).to(tl.float64)
                take = ok & (sample_uniform(seed, pos, 0) * qx < wx / S)
                y = x
                if ~take:
                    R = ordered_sum(row, l_sv, qrow, q_sv, V, m, Tw, point, S, ~no, key_min, wmin, HAS_Q)
                    use_r = R > 0
                    y = inverse_cdf(
                        row,
                        l_sv,
                        qrow,
                        q_sv,
                        V,
                        m,
                        Tw,
                        point,
                        S,
                        use_r,
                        key_min,
                        wmin,
                        tl.where(use_r, R, S),
                        us,
                        HAS_Q,
                    ).to(tl.int64)
            tokens = tl.where(tt == t, tl.where(take, x, y), tokens)
            n = tl.where(take, n, t)
            done = ~take
    tokens = tl.where(tt > n, pad, tokens)
    tl.store(accepted + b, n.to(accepted.dtype.element_ty))
    tl.store(out + b64 * o_sb + tt * o_st, tokens.to(out.dtype.element_ty), mask=tt <= K)

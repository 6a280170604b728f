"""Triton kernels of head_attention (split-KV decode attention) and cache_append.

head_attention keeps the exactness rule of the CPU kernel (csrc/include/mtp/attention.h):
  1. attention_chunk_kernel: one program per (request, kv head, block of BLOCK_R query rows)
     and chunk of CHUNK keys at a fixed absolute position. Rows are r = t * G + g (the G
     query heads of the kv head and the T queries), so each K/V element loaded serves all of
     them. It writes each row's partial (max m, sum l, acc[D]) over its visible keys of the
     chunk; inside a chunk, BLOCK_N keys at a time (at multiples of BLOCK_N) with the usual
     running rescale. With a sliding window (WINDOW > 0) a row sees keys [lo, n) of the
     chunk; steps before the tile's first lo are skipped (those keys are not read), and a
     step where a row sees no key leaves its state exactly as it was, so a row's bits never
     depend on which step the tile starts at.
  2. attention_merge_kernel: folds each row's chunk partials strictly left to right (the
     local segment's after the cache's), then normalises; a row with no key gets zeros, a row
     that saw a non-finite score or value is all NaN (reference.head_attention's contract).
Every block size is a fixed constant (BLOCK_D only follows D), so one compiled kernel serves
every T and B, and a row's operations never involve the other rows of its tile: its bits do
not depend on T, B or the other requests' lengths. No tl.dot: its order (and TF32) are the
hardware's. Values are widened to fp32 on load (the interpreter has no bf16 arithmetic).
"""

import triton
import triton.language as tl

CHUNK = 256  # mtp::kAttnChunk: partials at the same fixed key positions as the CPU
BLOCK_R = 16  # query rows per program (t * G + g)
BLOCK_N = 16  # keys per step inside a chunk


def num_warps(block_d: int) -> int:
    # Room for the [BLOCK_R, BLOCK_N, BLOCK_D] products; a function of D only, so the
    # reduction layouts (and bits) never change with T or B.
    return 4 if block_d <= 64 else 8


@triton.jit
def _rows(pid, n_row_blocks, Hkv, G, T, BLOCK_R: tl.constexpr):
    bh = pid // n_row_blocks
    r = (pid % n_row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    return bh // Hkv, bh % Hkv, r, r < G * T, r // G, r % G


@triton.jit
def _visible_cache(lens, b, t, T, L, CAUSAL: tl.constexpr):
    # Clamped to [0, L]: under CUDA-graph capture the host could not check the lengths.
    n = tl.minimum(tl.maximum(tl.load(lens + b), 0), L) + t * 0
    if CAUSAL:
        n = tl.maximum(n - T + t + 1, 0)
    return n


@triton.jit
def _first_visible(vis, WINDOW):
    # attention_args.h: first_visible (the last WINDOW of the keys [0, vis); 0: no window).
    return tl.where((WINDOW > 0) & (vis > WINDOW), vis - WINDOW, 0)


@triton.jit
def _visible_local(t, T, S):
    # The T queries are the last T local positions: query t sees s <= S - T + t.
    return tl.minimum(tl.maximum(S - T + t + 1, 0), S)


# Sizes and outer strides vary from call to call: specialising on them (== 1, % 16) would only
# multiply compilations. The head-dim strides stay specialised (unit stride: vector loads).
_SIZES = ["T", "Hkv", "G", "L", "S", "n_row_blocks", "C"]
_OUTER_STRIDES = ["q_sb", "q_st", "q_sh", "k_sb", "k_sh", "k_sl", "v_sb", "v_sh", "v_sl"]


@triton.jit(do_not_specialize=_SIZES + _OUTER_STRIDES + ["c_first", "WINDOW"])
def attention_chunk_kernel(
    q,
    q_sb,
    q_st,
    q_sh,
    q_sd,
    k,
    k_sb,
    k_sh,
    k_sl,
    k_sd,
    v,
    v_sb,
    v_sh,
    v_sl,
    v_sd,
    lens,
    part_m,
    part_l,
    part_acc,
    T,
    Hkv,
    G,
    D,
    L,
    S,
    scale,
    n_row_blocks,
    C,
    c_first,
    WINDOW,
    LOCAL: tl.constexpr,
    CAUSAL: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b, h, r, row_ok, t, g = _rows(tl.program_id(0), n_row_blocks, Hkv, G, T, BLOCK_R)
    c = tl.program_id(1)
    if LOCAL:
        vis = _visible_local(t, T, S)
    else:
        vis = _visible_cache(lens, b, t, T, L, CAUSAL)
    c0 = c * CHUNK
    cnt = tl.where(row_ok, tl.minimum(tl.maximum(vis - c0, 0), CHUNK), 0)  # the row sees keys [lo, cnt)
    if LOCAL:
        lo = cnt * 0
    else:
        lo = tl.minimum(tl.maximum(_first_visible(vis, WINDOW) - c0, 0), CHUNK)
    sees = cnt > lo
    cnt = tl.where(sees, cnt, 0)
    lo = tl.where(sees, lo, 0)
    n_max = tl.max(cnt, 0)
    j_min = tl.min(tl.where(sees, lo, CHUNK), 0)  # the tile reads keys [j_min, n_max)
    if n_max > 0:  # else no row of the tile reads this chunk: nothing to load or store
        b64, h64 = b.to(tl.int64), h.to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        q_rows = q + b64 * q_sb + t.to(tl.int64) * q_st + (h64 * G + g) * q_sh
        qv = tl.load(q_rows[:, None] + d[None, :] * q_sd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        qv = qv.to(tl.float32)
        k_base = k + b64 * k_sb + h64 * k_sh + c0.to(tl.int64) * k_sl
        v_base = v + b64 * v_sb + h64 * v_sh + c0.to(tl.int64) * v_sl
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        bad = tl.zeros([BLOCK_R], tl.int32)  # the row saw a non-finite score (-inf too): l = NaN
        for j0 in range(j_min - j_min % BLOCK_N, n_max, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            kv_ok = ((j >= j_min) & (j < n_max))[:, None] & d_ok[None, :]
            kt = tl.load(k_base + j.to(tl.int64)[:, None] * k_sl + d[None, :] * k_sd, mask=kv_ok, other=0.0)
            s = tl.sum(qv[:, None, :] * kt.to(tl.float32)[None, :, :], axis=2) * scale  # [BLOCK_R, BLOCK_N]
            seen = (j[None, :] >= lo[:, None]) & (j[None, :] < cnt[:, None])
            bad = bad | tl.max((seen & ~(tl.abs(s) < float("inf"))).to(tl.int32), 1)
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp(-inf - 0) = 0
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v_base + j.to(tl.int64)[:, None] * v_sl + d[None, :] * v_sd, mask=kv_ok, other=0.0)
            # A key another row sees may hold inf: an unseen key must add exactly 0, not 0 * inf.
            pv = tl.where(seen[:, :, None], p[:, :, None] * vt.to(tl.float32)[None, :, :], 0.0)
            acc = acc * alpha[:, None] + tl.sum(pv, 1)
            m_i = m_new
        l_i = tl.where(bad != 0, float("nan"), l_i)  # NaN stays NaN through the merge
        rp = n_row_blocks * BLOCK_R
        idx = ((b64 * Hkv + h64) * C + c_first + c) * rp + r
        tl.store(part_m + idx, m_i, mask=row_ok)
        tl.store(part_l + idx, l_i, mask=row_ok)
        tl.store(part_acc + idx[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _fold(active, done, st_m, st_l, st_acc, part_m, part_l, part_acc, idx, D, d, d_ok):
    """Folds the partial at idx (later keys) into the state of the active rows; the first is copied."""
    pm = tl.load(part_m + idx, mask=active, other=0.0)
    pl = tl.load(part_l + idx, mask=active, other=0.0)
    pa = tl.load(part_acc + idx[:, None] * D + d[None, :], mask=active[:, None] & d_ok[None, :], other=0.0)
    m = tl.maximum(st_m, pm)
    a = tl.exp(st_m - m)
    c = tl.exp(pm - m)
    new_l = tl.where(done, st_l * a + pl * c, pl)
    new_acc = tl.where(done[:, None], st_acc * a[:, None] + pa * c[:, None], pa)
    st_m = tl.where(active, tl.where(done, m, pm), st_m)
    st_l = tl.where(active, new_l, st_l)
    st_acc = tl.where(active[:, None], new_acc, st_acc)
    return done | active, st_m, st_l, st_acc


@triton.jit(do_not_specialize=_SIZES + ["Cc", "WINDOW"])
def attention_merge_kernel(
    lens,
    part_m,
    part_l,
    part_acc,
    out,
    T,
    Hkv,
    G,
    D,
    L,
    S,
    n_row_blocks,
    C,
    Cc,
    WINDOW,
    CAUSAL: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b, h, r, row_ok, t, g = _rows(tl.program_id(0), n_row_blocks, Hkv, G, T, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    vis = _visible_cache(lens, b, t, T, L, CAUSAL)
    n_cache = tl.where(row_ok, tl.cdiv(vis, CHUNK), 0)
    c_lo = tl.where(row_ok, _first_visible(vis, WINDOW) // CHUNK, 0)  # a window's first chunk
    n_local = tl.where(row_ok, tl.cdiv(_visible_local(t, T, S), CHUNK), 0)
    base = (b.to(tl.int64) * Hkv + h) * C * (n_row_blocks * BLOCK_R) + r
    step = n_row_blocks * BLOCK_R
    done = r < 0
    st_m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    st_l = tl.zeros([BLOCK_R], tl.float32)
    st_acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for c in range(tl.min(tl.where(row_ok, c_lo, C), 0), tl.max(n_cache, 0)):  # cache chunks, left to right
        done, st_m, st_l, st_acc = _fold(
            (c >= c_lo) & (c < n_cache), done, st_m, st_l, st_acc, part_m, part_l, part_acc, base + c * step, D, d, d_ok
        )
    for c in range(0, tl.max(n_local, 0)):  # then the local segment's
        done, st_m, st_l, st_acc = _fold(
            c < n_local, done, st_m, st_l, st_acc, part_m, part_l, part_acc, base + (Cc + c) * step, D, d, d_ok
        )
    # div_rn: IEEE division (a GPU's plain fp32 `/` is an approximation, ~2 ulp; the interpreter's is exact).
    res = tl.where(done[:, None], tl.math.div_rn(st_acc, tl.where(done, st_l, 1.0)[:, None]), 0.0)
    # A row is finite or all NaN (as the CPU's write_row): a NaN l (a non-finite score) or a
    # non-finite acc element (a non-finite value: inf, or 0 * inf = NaN) makes every element NaN.
    acc_bad = tl.max((d_ok[None, :] & ~(tl.abs(st_acc) < float("inf"))).to(tl.int32), 1)
    row_bad = done & ((acc_bad != 0) | ~(tl.abs(st_l) < float("inf")))
    res = tl.where(row_bad[:, None], float("nan"), res)
    o = ((b.to(tl.int64) * T + t) * (Hkv * G) + h * G + g) * D
    tl.store(out + o[:, None] + d[None, :], res, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def cache_append_kernel(
    cache,
    c_sb,
    c_sh,
    c_sl,
    c_sd,
    new,
    n_sb,
    n_st,
    n_sh,
    n_sd,
    lens,
    B,
    T,
    Hkv,
    D,
    L,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (b * Hkv + h, t) copies new[b, t, h, :] to cache[b, h, lens[b] + t, :] as raw
    bits. Every program first checks every request: if one would pass the capacity L, none
    writes (the host check raises before; this guards a CUDA-graph replay)."""
    i = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    all_lens = tl.load(lens + tl.arange(0, BLOCK_B), mask=tl.arange(0, BLOCK_B) < B, other=0)
    bad = tl.max(((all_lens < 0) | (all_lens + T > L)).to(tl.int32), 0)
    if bad == 0:
        b = (i // Hkv).to(tl.int64)
        h = (i % Hkv).to(tl.int64)
        pos = tl.load(lens + b).to(tl.int64) + t
        d = tl.arange(0, BLOCK_D)
        x = tl.load(new + b * n_sb + t * n_st + h * n_sh + d * n_sd, mask=d < D)
        tl.store(cache + b * c_sb + h * c_sh + pos * c_sl + d * c_sd, x, mask=d < D)

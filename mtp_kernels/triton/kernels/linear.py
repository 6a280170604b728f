"""Triton kernel of the shape-invariant linear layer.

Every block size is a fixed constant, so one compiled kernel serves every M and each output
element (m, n) is reduced the same way whatever M is: lane j of the K tile accumulates
x[m, k] * w[n, k] for k = j, j + BLOCK_K, ... in order, then one tl.sum over the BLOCK_K
lanes (a fixed tree for a fixed layout), then + bias. No tl.dot: its order (and TF32) is
the hardware's.
"""

import triton
import triton.language as tl

BLOCK_M = 4
BLOCK_N = 32
BLOCK_K = 64


@triton.jit
def linear_kernel(
    x,
    x_sm,
    x_sk,
    w,
    w_sn,
    w_sk,
    bias,
    y,
    y_sm,
    y_sn,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x + rm.to(tl.int64)[:, None] * x_sm
    w_rows = w + rn.to(tl.int64)[:, None] * w_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        xv = tl.load(x_rows + k[None, :] * x_sk, mask=(rm < M)[:, None] & (k < K)[None, :], other=0.0)
        wv = tl.load(w_rows + k[None, :] * w_sk, mask=(rn < N)[:, None] & (k < K)[None, :], other=0.0)
        acc += xv.to(tl.float32)[:, None, :] * wv.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(bias + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(y + rm.to(tl.int64)[:, None] * y_sm + rn[None, :] * y_sn, out, mask=(rm < M)[:, None] & (rn < N)[None, :])

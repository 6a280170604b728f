"""mtp.head_attention at Gemma 3 270M's attention shape (Hq = 4 over one kv head, D = 256), side
by side in one process:
- the instruction sets: ``generic`` (the scalar path every set took for D = 256 before it had a
  vector kernel) against this machine's vector sets (the simd/ kernel at D = 256);
- the sliding window (512, Gemma 3's local layers) against the whole cache (its global layers):
  keys older than the window are not read, so a local layer's cost stays that of 512 keys.

    MTP_BENCH_THREADS=1 .venv/bin/python -m pytest bench/bench_attention_gemma.py --benchmark-only \\
        --benchmark-columns=median,iqr,rounds --benchmark-sort=name

Groups are one shape; compare the medians within a group.
"""

import itertools

import pytest
import torch

import mtp_kernels

HQ, HKV, D, WINDOW = 4, 1, 256, 512
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ISAS = [i for i in ("generic", "avx2", "avx512", "neon") if i in mtp_kernels.supported_isas()]
# dtype, T (1: a decode step, 3: a verify pass of K = 2 drafts), L (cache length)
CONFIGS = list(itertools.product(DTYPES, [1, 3], [512, 4096]))


def make_inputs(dtype, T, L, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, HQ, D, generator=gen).to(dtype)
    k = torch.randn(1, HKV, L, D, generator=gen).to(dtype)
    v = torch.randn(1, HKV, L, D, generator=gen).to(dtype)
    return q, k, v, torch.tensor([L])


def timed(benchmark, isa, fn):
    default = mtp_kernels.get_isa()
    mtp_kernels.set_isa(isa)
    try:
        benchmark(fn)
    finally:
        mtp_kernels.set_isa(default)


@pytest.mark.parametrize("dtype,T,L", CONFIGS, ids=[f"{d}-T{t}-L{n}" for d, t, n in CONFIGS])
@pytest.mark.parametrize("isa", ISAS)
def test_head_dim_256(benchmark, isa, dtype, T, L):
    """The whole cache, causal (a global layer's verify pass or decode step), per instruction set."""
    q, k, v, lens = make_inputs(DTYPES[dtype], T, L)
    benchmark.group = f"D=256 {dtype} T={T} L={L}"
    timed(benchmark, isa, lambda: mtp_kernels.head_attention(q, k, v, lens, causal=True))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("window", [None, WINDOW])
def test_window(benchmark, dtype, window):
    """A 4096-key cache: the whole of it (global layer) against the last 512 keys (local layer)."""
    q, k, v, lens = make_inputs(DTYPES[dtype], 1, 4096)
    benchmark.group = f"window {dtype} T=1 L=4096"
    timed(
        benchmark, mtp_kernels.get_isa(), lambda: mtp_kernels.head_attention(q, k, v, lens, causal=True, window=window)
    )

"""mtp.head_attention against torch SDPA at SmolLM2's attention shape (Hq=9, Hkv=3, D=64).

SDPA gets contiguous [B, H, L, D] inputs prepared outside the timed call; mtp.head_attention
reads the same K/V and q as [B, T, Hq, D]. Both attend to the whole cache (no mask).
    .venv/bin/python -m pytest bench/bench_attention.py --benchmark-only
The side-by-side table with bandwidth: bench/attention_table.py.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import mtp_kernels

HQ, HKV, D = 9, 3, 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONFIGS = list(itertools.product(DTYPES, [1, 4], [1, 4, 8], [512, 2048, 8192, 32768]))  # dtype, B, T, L


def make_inputs(dtype, B, T, L, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen).to(dtype)
    k = torch.randn(B, HKV, L, D, generator=gen).to(dtype)
    v = torch.randn(B, HKV, L, D, generator=gen).to(dtype)
    lens = torch.full((B,), L, dtype=torch.int32)
    return q, k, v, lens


def runners(dtype, B, T, L):
    """(ours, sdpa, kv_bytes): two zero-argument callables computing the same attention."""
    q, k, v, lens = make_inputs(DTYPES[dtype], B, T, L)
    q_sdpa = q.transpose(1, 2).contiguous()  # [B, Hq, T, D], at no cost to SDPA

    def ours():
        return mtp_kernels.head_attention(q, k, v, lens)

    def sdpa():
        return F.scaled_dot_product_attention(q_sdpa, k, v, enable_gqa=True)

    torch.testing.assert_close(ours(), sdpa().transpose(1, 2), atol=2e-2, rtol=2e-2)
    return ours, sdpa, 2 * k.numel() * k.element_size()


@pytest.mark.parametrize("dtype,B,T,L", CONFIGS, ids=[f"{d}-B{b}-T{t}-L{l}" for d, b, t, l in CONFIGS])
@pytest.mark.parametrize("impl", ["mtp", "sdpa"])
def test_head_attention(benchmark, impl, dtype, B, T, L):
    ours, sdpa, _ = runners(dtype, B, T, L)
    benchmark.group = f"{dtype} B={B} T={T} L={L}"
    benchmark(ours if impl == "mtp" else sdpa)

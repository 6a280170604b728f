"""Kernels to profile under Nsight Compute (bench/gpu_check.sh's last step): the C++ CUDA
head_attention on two decode shapes of bench/gpu_bench.py (bf16 caches read in place from a
[B, L, Hkv, D] buffer) and linear on its slowest shape. Each op runs once to warm up, then
once more inside an NVTX range "profile" that ncu selects (--nvtx-include profile/)."""

import torch

import mtp_kernels  # noqa: F401  (registers torch.ops.mtp)


def attention(B, L, Hq=32, Hkv=8, D=128):
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    kv = [torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16).permute(0, 2, 1, 3) for _ in range(2)]
    lens = torch.full((B,), L, device="cuda")
    return lambda: torch.ops.mtp.head_attention(q, kv[0], kv[1], lens, None, None, None, False)


def linear(M, N, K):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.ops.mtp.linear(x, w)


def main():
    calls = [attention(1, 32768), attention(32, 4096), linear(16, 4096, 4096), linear(5, 49152, 576)]
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()

"""GPU microbenchmarks: ours (the dispatched torch.ops.mtp kernel -- C++ CUDA when built with
MTP_WITH_CUDA -- and the Triton launcher) against the torch implementation, as GB/s next to
the bandwidth measured in the same run. Run by bench/gpu_check.sh; needs a CUDA GPU.
head_attention is compared with torch's scaled_dot_product_attention (enable_gqa=True) on
the same cache, every request at the full length L (SDPA takes no per-request lengths).

    python bench/gpu_bench.py RESULTS.md

Each time is the mean of `iters` back-to-back calls between two CUDA events, after a
warm-up: it includes launch overhead (a few microseconds per launch, more for Triton's
Python launcher), which dominates the smallest cases. Bytes count what the op must read
(logits / weights and activations) and write.
"""

import statistics
import sys

import torch
import torch.nn.functional as F

import mtp_kernels
import mtp_kernels.triton as mtp_triton
from mtp_kernels import reference

GB = 1e9


def time_ms(fn, *args, iters=50, warmup=5, repeats=5):
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / iters)
    return statistics.median(runs)


def bandwidth():
    n = (1 << 30) // 4
    src, dst = torch.ones(n, device="cuda"), torch.empty(n, device="cuda")
    copy = time_ms(dst.copy_, src, iters=10)
    read = time_ms(torch.sum, src, iters=10)
    return {"copy (read+write)": 2 * n * 4 / (copy * 1e-3) / GB, "read (sum)": n * 4 / (read * 1e-3) / GB}


def verify_rows():
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for B, K, V in [(1, 4, 128256), (8, 4, 128256), (64, 4, 128256), (8, 4, 49152), (64, 8, 49152)]:
            logits = torch.randn(B, K + 1, V, device="cuda").to(dtype)
            drafts = logits.argmax(-1)[:, :K].contiguous()
            nbytes = logits.numel() * logits.element_size()
            case = f"verify B={B} K={K} V={V} {str(dtype)[6:]}"
            for impl, fn in [
                ("mtp (torch.ops)", torch.ops.mtp.verify),
                ("triton", mtp_triton.verify),
                ("torch (reference.verify)", reference.verify),
            ]:
                ms = time_ms(fn, drafts, logits)
                rows.append((case, impl, ms, nbytes / (ms * 1e-3) / GB))
    return rows


def linear_rows():
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for M, N, K in [(1, 1536, 576), (5, 1536, 576), (5, 576, 1536), (5, 49152, 576), (16, 4096, 4096)]:
            x = torch.randn(M, K, device="cuda").to(dtype)
            w = (torch.randn(N, K, device="cuda") / K**0.5).to(dtype)
            nbytes = (w.numel() + x.numel() + M * N) * x.element_size()
            case = f"linear M={M} N={N} K={K} {str(dtype)[6:]}"
            for impl, fn in [
                ("mtp (torch.ops)", torch.ops.mtp.linear),
                ("triton", mtp_triton.linear),
                ("torch (F.linear, not shape-invariant)", F.linear),
            ]:
                ms = time_ms(fn, x, w)
                rows.append((case, impl, ms, nbytes / (ms * 1e-3) / GB))
    return rows


def attention_rows():
    """Decode (T = 1) and verify (T = 4, causal) over bf16 caches [B, Hkv, L, D] read in place
    from a [B, L, Hkv, D] buffer; bytes: the K and V rows read, plus q and the output."""
    rows = []
    for Hq, Hkv, D in [(32, 8, 128), (9, 3, 64)]:
        for B, T, L in [(1, 1, 32768), (8, 1, 8192), (32, 1, 4096), (8, 4, 8192)]:
            dtype = torch.bfloat16
            kbuf = torch.randn(B, L, Hkv, D, device="cuda", dtype=dtype)
            vbuf = torch.randn(B, L, Hkv, D, device="cuda", dtype=dtype)
            k, v = kbuf.permute(0, 2, 1, 3), vbuf.permute(0, 2, 1, 3)
            q = torch.randn(B, T, Hq, D, device="cuda", dtype=dtype)
            lens = torch.full((B,), L, device="cuda")
            causal = T > 1
            nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()
            case = f"head_attention Hq={Hq} Hkv={Hkv} D={D} B={B} T={T} L={L} bf16"
            qs = q.transpose(1, 2)
            # SDPA's is_causal aligns the mask top-left; with T << L the work is the same without it.
            impls = [
                ("mtp (torch.ops)", lambda: torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, causal)),
                ("triton", lambda: mtp_triton.head_attention(q, k, v, lens, None, None, None, causal)),
                ("torch SDPA (enable_gqa)", lambda: F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)),
            ]
            for impl, fn in impls:
                ms = time_ms(fn)
                rows.append((case, impl, ms, nbytes / (ms * 1e-3) / GB))
            kbuf = vbuf = None  # free the caches before the next case's
    return rows


def append_rows():
    """cache_append of T new rows per request into a [B, Lmax, Hkv, D] buffer (bytes: read and
    write of the new K and V) vs torch's index_put_ at the same positions."""
    rows = []
    for B, T, Hkv, D, L in [(1, 1, 8, 128, 32768), (32, 4, 8, 128, 4096)]:
        kbuf = torch.zeros(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        vbuf = torch.zeros_like(kbuf)
        k, v = kbuf.permute(0, 2, 1, 3), vbuf.permute(0, 2, 1, 3)
        kn = torch.randn(B, T, Hkv, D, device="cuda", dtype=torch.bfloat16)
        vn = torch.randn_like(kn)
        lens = torch.full((B,), L // 2, device="cuda")
        pos = lens[:, None] + torch.arange(T, device="cuda")[None, :]  # [B, T]
        bidx = torch.arange(B, device="cuda")[:, None].expand(B, T)

        def torch_append():
            kbuf.index_put_((bidx, pos), kn)
            vbuf.index_put_((bidx, pos), vn)

        nbytes = 4 * kn.numel() * kn.element_size()
        case = f"cache_append B={B} T={T} Hkv={Hkv} D={D} bf16"
        for impl, fn in [
            ("mtp (torch.ops)", lambda: torch.ops.mtp.cache_append(k, v, kn, vn, lens)),
            ("triton", lambda: mtp_triton.cache_append(k, v, kn, vn, lens)),
            ("torch (index_put_)", torch_append),
        ]:
            ms = time_ms(fn)
            rows.append((case, impl, ms, nbytes / (ms * 1e-3) / GB))
    return rows


def main(path):
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    backend = "C++ CUDA kernels (MTP_WITH_CUDA)" if mtp_kernels._C.with_cuda else "Triton kernels"
    bw = bandwidth()
    lines = [
        f"# GPU microbenchmarks: {torch.cuda.get_device_name()}",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; torch.ops.mtp on CUDA tensors: {backend}.",
        "",
        "Measured ceilings: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in bw.items()) + ".",
        "",
        "| case | implementation | time (us) | GB/s | % of copy bandwidth |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    ceiling = bw["copy (read+write)"]
    for case, impl, ms, gbs in verify_rows() + linear_rows() + attention_rows() + append_rows():
        lines.append(f"| {case} | {impl} | {ms * 1e3:.1f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% |")
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_results.md")

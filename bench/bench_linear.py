"""mtp.linear (shape-invariant) against torch's F.linear for SmolLM2's shapes and the few
rows of decoding (M=1) and verification (M=K+1). Bytes = the weights read once.
"int8" cases: bf16 activations with Q8 weights (int8 + one fp32 scale per 32) for mtp, against
torch's F.linear on the same weights dequantized to bf16 (torch has no such int8 kernel).
"int8dot" cases: the same with quantize_x=True (x quantized row by row to int8 blocks,
integer dot products; VNNI where the CPU has it).
"mtp_avx512": bf16 cases on the `avx512` path (two FMAs per bf16 pair) when the default is
`avx512_bf16` (VDPBF16PS), to show what the instruction gives in the same run."""

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

import mtp_kernels

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
CASES = list(itertools.product(SHAPES, [1, 2, 5, 9, 17], ["float32", "bfloat16", "int8", "int8dot"]))


@pytest.mark.parametrize("impl", ["mtp", "mtp_avx512", "torch"])
@pytest.mark.parametrize("shape,M,dtype", CASES, ids=lambda v: str(v).replace(" ", ""))
def test_linear(benchmark, impl, shape, M, dtype):
    N, K = shape
    act = torch.float32 if dtype == "float32" else torch.bfloat16
    w = (torch.randn(N, K) / K**0.5).to(act)
    x = torch.randn(M, K).to(act)
    args, nbytes = (w,), w.numel() * w.element_size()
    if dtype.startswith("int8"):
        q, scale = mtp_kernels.quantize_q8(w)
        w = mtp_kernels.dequantize_q8(q, scale).to(act)
        args, nbytes = ((q, None, scale) if impl == "mtp" else (w,)), q.numel() + scale.numel() * 4
    benchmark.group = f"linear {N}x{K} M={M} {dtype}"
    benchmark.extra_info["bytes"] = nbytes
    # quantize_x passed only where it is set: a keyword costs ~0.7 us per call from Python
    op = functools.partial(torch.ops.mtp.linear, quantize_x=True) if dtype == "int8dot" else torch.ops.mtp.linear
    if impl != "mtp_avx512":
        return benchmark(op if impl == "mtp" else F.linear, x, *args)
    default = mtp_kernels.get_isa()
    if dtype != "bfloat16" or default != "avx512_bf16":
        pytest.skip("the avx512 comparison is for bf16 cases where avx512_bf16 is the default")
    mtp_kernels.set_isa("avx512")
    try:
        benchmark(op, x, *args)
    finally:
        mtp_kernels.set_isa(default)

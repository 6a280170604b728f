"""mtp.linear on GGUF block-type weights read as stored (gguf_type=), in their x8 layout (the
same bytes, 8 rows interleaved: what the loader gives the decoder layers), and the same matrix
as bf16 weights (what the dequantized backbone streams), at the rows of decoding (M = 1) and
verification (M = 5, 9). Bytes = the weights read once per call. The activations: for the
8-bit shapes, the same weights as the Q8 format of `mtp.linear` (int8 + an fp32 scale per 32)
with bf16 activations ("q8_bf16x": the weights widened in registers, fp32 FMAs) and with int8
activations ("q8_int8x": quantize_x=True, VNNI), the choice the GGUF kernels made (int8 rows).
Each call reads the next of several copies of the matrix (>= 256 MB in all), so the weights come from DRAM, as in a
decode step, not from a cache that a repeated call would keep warm; compare GB/s with
bench_bandwidth.py's read bandwidth of the same run (bench/report.py --gguf prints the table).
"""

import itertools

import pytest
import torch

from mtp_kernels import quantize_q8
from mtp_kernels.gguf import BLOCK_TYPES, X8_TYPES, repack_x8, row_bytes

# (N, K) per format: SmolLM2's q/o, gate_up, down and LM head for the 32-element blocks; the
# K-quants need K % 256 == 0 (Gemma-like widths). Q5_0: Gemma 3 270M's q and fused gate_up
# (hidden 640), the latter beside Q4_0 and Q8_0 at the same shape.
SHAPES = {
    2: [(576, 576), (3072, 576), (576, 1536), (4096, 640)],
    3: [(576, 576), (3072, 576), (576, 1536)],
    6: [(1024, 640), (4096, 640)],
    8: [(3072, 576), (49152, 576), (4096, 640)],
    12: [(2048, 768), (768, 2048)],
    14: [(2048, 768), (768, 2048)],
}
CASES = [
    (impl, code, shape, M)
    for code, shapes in SHAPES.items()
    for shape, M in itertools.product(shapes, [1, 5, 9])
    for impl in ["gguf", "bf16"]
    + (["x8"] if code + 100 in X8_TYPES else [])
    + (["q8_bf16x", "q8_int8x"] if code == 8 else [])
]
ROTATE_BYTES = 256 << 20


def copies(nbytes, make):
    return [make() for _ in range(max(2, ROTATE_BYTES // max(nbytes, 1)))]


@pytest.mark.parametrize("impl,code,shape,M", CASES, ids=lambda v: str(v).replace(" ", ""))
def test_gguf_linear(benchmark, impl, code, shape, M):
    N, K = shape
    name = BLOCK_TYPES[code][0]
    x = torch.randn(M, K).to(torch.bfloat16)
    if impl in ("gguf", "x8"):
        nbytes = N * row_bytes(code, K)
        g = torch.Generator().manual_seed(0)

        def make():
            w = torch.randint(0, 256, (N, nbytes // N), dtype=torch.uint8, generator=g)
            w.view(N, -1, BLOCK_TYPES[code][2])[:, :, :2] = torch.tensor([0, 0x20], dtype=torch.uint8)  # fp16 0.0078
            return (repack_x8(w, code) if impl == "x8" else w,)

        ws = copies(nbytes, make)
        kw = {"gguf_type": code + 100 if impl == "x8" else code}
    elif impl.startswith("q8_"):  # mtp.linear's Q8 weights: bf16 or int8 activations over the same bytes
        nbytes = N * K + N * (K // 32) * 4
        q, scale = quantize_q8((torch.randn(N, K) / K**0.5).to(torch.bfloat16))
        ws = copies(nbytes, lambda: (q.clone(), None, scale.clone()))
        kw = {"quantize_x": True} if impl == "q8_int8x" else {}
    else:
        nbytes = N * K * 2
        ws = copies(nbytes, lambda: ((torch.randn(N, K) / K**0.5).to(torch.bfloat16),))
        kw = {}
    it = itertools.cycle(ws)  # each item: linear's arguments after x
    benchmark.group = f"gguf {name} {N}x{K} M={M}"
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["format"] = {"gguf": name, "x8": name + "_X8", "bf16": "bf16"}.get(impl, impl)
    benchmark.pedantic(lambda: torch.ops.mtp.linear(x, *next(it), **kw), rounds=50, iterations=1, warmup_rounds=len(ws))

"""mtp.linear (shape-invariant) against torch's F.linear for SmolLM2's shapes and the few
rows of decoding (M=1) and verification (M=K+1). Bytes = the weights read once."""
import itertools

import pytest
import torch
import torch.nn.functional as F

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
CASES = list(itertools.product(SHAPES, [1, 2, 5, 9, 17], [torch.float32, torch.bfloat16]))


@pytest.mark.parametrize("impl", ["mtp", "torch"])
@pytest.mark.parametrize("shape,M,dtype", CASES, ids=lambda v: str(v).replace("torch.", "").replace(" ", ""))
def test_linear(benchmark, impl, shape, M, dtype):
    N, K = shape
    w = (torch.randn(N, K) / K ** 0.5).to(dtype)
    x = torch.randn(M, K).to(dtype)
    fn = torch.ops.mtp.linear if impl == "mtp" else F.linear
    benchmark.group = f"linear {N}x{K} M={M} {str(dtype).replace('torch.', '')}"
    benchmark.extra_info["bytes"] = w.numel() * w.element_size()
    benchmark(fn, x, w)

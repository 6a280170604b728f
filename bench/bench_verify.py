"""mtp.verify against the straightforward torch implementation (argmax, compare, cumprod:
reference.verify). Drafts equal the backbone's choices, so every row is read by both."""

import itertools

import pytest
import torch

from mtp_kernels import reference

CASES = list(itertools.product([1, 8, 64], [1, 4, 8], [32000, 49152, 128256], [torch.float32, torch.bfloat16]))
# Gemma 3's 262,144-token vocabulary: one request, the drafts of a phone's verify pass.
CASES += list(itertools.product([1], [2, 4], [262144], [torch.float32, torch.bfloat16]))


@pytest.mark.parametrize("impl", ["mtp", "torch"])
@pytest.mark.parametrize("B,K,V,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_verify(benchmark, impl, B, K, V, dtype):
    logits = torch.randn(B, K + 1, V).to(dtype)
    drafts = logits.argmax(-1)[:, :K].contiguous()
    fn = torch.ops.mtp.verify if impl == "mtp" else reference.verify
    benchmark.group = f"verify B={B} K={K} V={V} {str(dtype).replace('torch.', '')}"
    benchmark.extra_info["bytes"] = logits.numel() * logits.element_size()
    benchmark(fn, drafts, logits)

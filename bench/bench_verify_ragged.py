"""mtp.verify_ragged on the flattened layout of continuous batching against what a caller of
mtp.verify has to do with the same work: gather the rows into [B, K+1, V] (padding each request
to the widest) and pad the drafts, then verify ("padded"); and verify alone on inputs already
padded ("verify_only", what the copy-free padded layout would cost). Uneven drafts per request;
drafts equal the backbone's choices, so every row is read. GB/s against the N + B logits rows.

    .venv/bin/python -m pytest bench/bench_bandwidth.py bench/bench_verify_ragged.py --benchmark-only -q
"""

import pytest
import torch

from mtp_kernels import reference

CASES = [(32, 8, 49152, torch.bfloat16), (32, 8, 49152, torch.float32), (8, 4, 128256, torch.bfloat16)]


def pad_then_verify(drafts, cu, logits):
    """The flattened inputs padded into verify's layout, then verify (one host read of cu, as
    verify_ragged without max_num_drafts)."""
    cu = cu.long()
    B, N = cu.numel(), drafts.numel()
    prev = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - prev
    K = int(counts.max())
    t = torch.arange(K + 1)
    rows = torch.where(t <= counts[:, None], prev[:, None] + torch.arange(B)[:, None] + t, 0)
    at = (prev[:, None] + t[:K]).clamp(max=max(N - 1, 0))
    padded = torch.where(t[:K] < counts[:, None], drafts[at], -1)
    return torch.ops.mtp.verify(padded, logits[rows], counts)


def make(B, K, V, dtype):
    gen = torch.Generator().manual_seed(B * K + V)
    counts = torch.randint(0, K + 1, (B,), generator=gen)
    cu = counts.cumsum(0)
    logits = torch.randn(int(cu[-1]) + B, V, generator=gen).to(dtype)
    target = logits.argmax(-1)
    drafts = torch.cat([target[int(c - k) + b : int(c) + b] for b, (c, k) in enumerate(zip(cu, counts))])
    return drafts, cu, logits


@pytest.mark.parametrize("impl", ["ragged", "padded", "verify_only"])
@pytest.mark.parametrize("B,K,V,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_verify_ragged(benchmark, impl, B, K, V, dtype):
    drafts, cu, logits = make(B, K, V, dtype)
    want = reference.verify_ragged(drafts, cu, logits)
    got = torch.ops.mtp.verify_ragged(drafts, cu, logits)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(torch.equal(g, w) for g, w in zip(pad_then_verify(drafts, cu, logits), want))
    benchmark.group = f"verify_ragged B={B} K_b<={K} V={V} {str(dtype).replace('torch.', '')}"
    benchmark.extra_info["bytes"] = logits.numel() * logits.element_size()  # the N + B rows read
    benchmark.extra_info["rows"] = logits.shape[0]
    if impl == "ragged":
        benchmark(torch.ops.mtp.verify_ragged, drafts, cu, logits)
    elif impl == "padded":
        benchmark(pad_then_verify, drafts, cu, logits)
    else:  # the padded inputs built once: verify alone
        cu64 = cu.long()
        counts = cu64 - torch.cat([cu64.new_zeros(1), cu64[:-1]])
        Kmax = int(counts.max())
        prev = cu64 - counts
        t = torch.arange(Kmax + 1)
        rows = torch.where(t <= counts[:, None], prev[:, None] + torch.arange(B)[:, None] + t, 0)
        padded_logits = logits[rows].contiguous()
        at = (prev[:, None] + t[:Kmax]).clamp(max=max(drafts.numel() - 1, 0))
        padded = torch.where(t[:Kmax] < counts[:, None], drafts[at], -1)
        benchmark(torch.ops.mtp.verify, padded, padded_logits, counts)

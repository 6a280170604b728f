"""mtp.verify_sampled (one-hot greedy drafts and given draft_probs) against the straightforward
torch implementation: softmax over [B, K+1, V], gather, compare, multinomial."""

import itertools

import pytest
import torch

CASES = list(itertools.product([1, 8, 64], [4], [32000, 128256]))
T = 0.8


def torch_sampled(drafts, q, logits, temperature):
    """Chain rejection sampling, materialising the [B, K+1, V] probabilities (torch's RNG)."""
    B, K = drafts.shape
    p = torch.softmax(logits.float() / temperature[:, None, None], -1)
    px = p[:, :K].gather(-1, drafts[..., None])[..., 0]
    qx = torch.ones_like(px) if q is None else q.gather(-1, drafts[..., None])[..., 0]
    ok = torch.rand(B, K) * qx < px
    accepted = ok.long().cumprod(1).sum(1)
    rows = p[torch.arange(B), accepted]
    if q is None:
        resid = rows.scatter(-1, drafts.gather(1, accepted.clamp_max(K - 1)[:, None]), 0.0)
    else:
        qrow = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[torch.arange(B), accepted]
        resid = (rows - qrow).clamp_min(0)
    full = (accepted == K)[:, None]
    dist = torch.where(full, rows, resid)
    y = torch.multinomial(dist, 1)[:, 0]
    out = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], y[:, None])
    return accepted, out


@pytest.mark.parametrize("impl", ["mtp", "torch"])
@pytest.mark.parametrize("draft_probs", [False, True], ids=["onehot", "q"])
@pytest.mark.parametrize("B,K,V", CASES)
def test_verify_sampled(benchmark, impl, draft_probs, B, K, V):
    logits = torch.randn(B, K + 1, V)
    q = torch.softmax(torch.randn(B, K, V), -1) if draft_probs else None
    drafts = logits.argmax(-1)[:, :K].contiguous()  # likely accepted: rows past the first are read
    temp, seeds = torch.full((B,), T), torch.arange(B)
    benchmark.group = f"verify_sampled B={B} K={K} V={V} {'q' if draft_probs else 'onehot'}"
    if impl == "mtp":
        benchmark(torch.ops.mtp.verify_sampled, drafts, q, logits, temp, seeds)
    else:
        benchmark(torch_sampled, drafts, q, logits, temp)


FILTERS = {
    "none": {},
    "top_k=50": dict(top_k=50),
    "top_p=0.9": dict(top_p=0.9),
    "min_p=0.05": dict(min_p=0.05),
    "all three": dict(top_k=50, top_p=0.9, min_p=0.05),
}


@pytest.mark.parametrize("spread", [1.0, 4.0], ids=["flat", "peaked"])
@pytest.mark.parametrize("filters", list(FILTERS))
def test_verify_sampled_filters(benchmark, filters, spread):
    """The filters' cost beside the temperature-only op (same call, same rows): logits
    N(0, spread^2) over SmolLM2's vocabulary; flat rows put most of V in top_p's nucleus."""
    B, K, V = 8, 4, 49152
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, K + 1, V, generator=g) * spread
    drafts = logits.argmax(-1)[:, :K].contiguous()
    temp, seeds = torch.full((B,), T), torch.arange(B)
    f = FILTERS[filters]
    args = [None, None, None]
    for i, (name, dtype) in enumerate([("top_k", torch.long), ("top_p", torch.float32), ("min_p", torch.float32)]):
        if name in f:
            args[i] = torch.full((B,), f[name], dtype=dtype)
    benchmark.group = f"verify_sampled filters B={B} K={K} V={V} {'flat' if spread == 1.0 else 'peaked'}"
    benchmark(torch.ops.mtp.verify_sampled, drafts, None, logits, temp, seeds, None, None, -1, *args)

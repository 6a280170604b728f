"""Extra memory of the MTP head path at several context lengths.

The head reads the backbone's KV cache in place, so what it adds is its weights plus a
scratch (its local K/V of K draft positions and a row of activations) that must not grow
with the context. Scratch = the peak of live bytes allocated by torch during one K-step
draft (torch.profiler memory events in time order), next to the backbone's own cache.

    python bench/memory.py [--contexts 1024 4096 8192] [--k 4] [--dtype float32]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from mtp_kernels.cli import load_head
from mtp_kernels.models import checkpoint
from mtp_kernels.models.llama import Backbone

MB = 1 << 20


def peak_live_bytes(fn) -> int:
    """Peak of bytes allocated and not yet freed while fn runs (CPU allocator events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8000])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = p.parse_args()
    cfg, weights, _ = checkpoint.load()
    dtype = getattr(torch, args.dtype)
    model = Backbone(cfg, weights, dtype)
    head = load_head(None, model, log=lambda m: None)  # in the backbone's dtype
    head_bytes = sum(t.numel() * t.element_size() for t in head.state_dict().values())
    hidden, token = torch.randn(1, cfg.hidden_size).to(dtype), torch.tensor([42])
    print(f"SmolLM2-135M, {args.dtype}, K={args.k}, 1 request; head weights: {head_bytes / MB:.2f} MB\n")
    print("| context | backbone KV cache (MB) | head weights (MB) | head scratch, peak during a K-step draft (MB) |")
    print("|---:|---:|---:|---:|")
    for ctx in args.contexts:
        cache = model.new_cache(1, ctx + args.k + 1)
        cache.lens.fill_(ctx)  # a filled context: the head only reads it
        head.draft(model, cache, hidden, token, args.k)  # warm-up
        scratch = peak_live_bytes(lambda: head.draft(model, cache, hidden, token, args.k))
        print(f"| {ctx} | {cache.nbytes() / MB:.1f} | {head_bytes / MB:.2f} | {scratch / MB:.3f} |")


if __name__ == "__main__":
    main()

"""Extra memory of the MTP head path against the standalone drafter's, at several
context lengths.

The head reads the backbone's KV cache and the LM-head rows of its draft vocabulary in place,
so what it adds is its weights (and its draft vocabulary's token ids) and a scratch (its local
K/V of K draft positions and a row of activations) that must not grow with the context. The
drafter adds its weights, its token tables (its vocabulary's backbone ids and the reverse index
it maps the backbone's tokens through) and its own KV cache, which grows with every context
token, plus its scratch.
Scratch = the peak of live bytes allocated by torch during one K-step draft
(torch.profiler memory events in time order).

    python bench/memory.py [--contexts 1024 4096 8192] [--k 3] [--dtype bfloat16]
"""

import argparse
import math

import torch
from torch.profiler import ProfilerActivity, profile

from mtp_kernels.models.loading import load_drafter, load_head
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


def nbytes(tensors) -> int:
    """Bytes of the storages behind tensors, each storage once (the backbone's fused qkv /
    gate_up matrices are also registered as per-projection row views of the same storage)."""
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8000])
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = p.parse_args()
    cfg, weights, _ = checkpoint.load()
    dtype = getattr(torch, args.dtype)
    model = Backbone(cfg, weights, dtype)
    head = load_head(None, model, log=lambda m: None)  # in the backbone's dtype
    drafter = load_drafter(None, model, log=lambda m: None)
    hidden, token = torch.randn(1, cfg.hidden_size).to(dtype), torch.tensor([42])
    # What it drafts with (its matrices as load_head made them, Q4_1: the float ones are freed), draft_vocab.
    head_fixed = nbytes([*head.draft_weights(model.dtype), head.draft_vocab])
    # Its weights (not its RoPE tables, which it could share with the backbone) and token tables.
    drafter_weights = nbytes(
        [b for n, b in drafter.model.named_buffers() if not n.startswith("rope_")] + [drafter.vocab, drafter._index]
    )
    params = sum(math.prod(s) for s in head.cfg.shapes().values())  # its config's: drafting frees the float matrices
    print(
        f"SmolLM2-135M, {args.dtype}, K={args.k}, 1 request. Head: {params} "
        f"parameters, draft vocabulary {head.draft_vocab.numel() or cfg.vocab_size}; drafter: "
        f"{drafter.num_parameters()} parameters, vocabulary {drafter.cfg.vocab_size}\n"
    )
    print(
        "| context | backbone KV cache (MB) | head: weights + draft vocabulary ids (MB) | head scratch (MB) | head total (MB) "  # noqa: E501
        "| drafter: weights + token tables (MB) | drafter KV cache (MB) | drafter scratch (MB) | drafter total (MB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    totals = []
    for ctx in args.contexts:
        cache = model.new_cache(1, ctx + args.k + 1)
        cache.lens.fill_(ctx)  # a filled context: the head only reads it
        head.draft(model, cache, hidden, token, args.k)  # warm-up
        h_scratch = peak_live_bytes(lambda: head.draft(model, cache, hidden, token, args.k))
        # The drafter holds the same context in its own cache (prefilled by begin()).
        drafter.begin([[42] * ctx], ctx + args.k + 1)
        d_scratch = peak_live_bytes(lambda: drafter.draft(model, cache, hidden, token, args.k))
        d_cache = drafter.cache.nbytes()
        h_total, d_total = head_fixed + h_scratch, drafter_weights + d_cache + d_scratch
        totals.append((ctx, h_total, d_total))
        print(
            f"| {ctx} | {cache.nbytes() / MB:.1f} | {head_fixed / MB:.2f} | {h_scratch / MB:.3f} | {h_total / MB:.2f} "
            f"| {drafter_weights / MB:.2f} | {d_cache / MB:.2f} | {d_scratch / MB:.3f} | {d_total / MB:.2f} |"
        )
    (c0, h0, d0), (c1, h1, d1) = totals[0], totals[-1]
    print(
        f"\nGrowth per context token between {c0} and {c1}: head {(h1 - h0) / (c1 - c0):.1f} bytes, "
        f"drafter {(d1 - d0) / (c1 - c0):.1f} bytes"
    )


if __name__ == "__main__":
    main()

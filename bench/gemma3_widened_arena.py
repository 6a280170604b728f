"""Gemma 3 270M (make gemma) steps with its Q5_0 matrices widened to Q8_0 by the loader into its
huge-page arena (gemma3.load(widen=True), the default since 2026-12-05: the fused q/k/v and
gate/up views of it) against widened by Gemma3Backbone into copies on 4 KB pages (the default
before), side by side in one process: a 1-token and a 4-token step (LM head included) after a
short prompt, bf16 activations, 2 threads, the two backbones alternated per batch of 30 calls,
median ms per round; the logits of both must be bitwise equal.

    .venv/bin/python bench/gemma3_widened_arena.py [--rounds 4]
"""

import argparse
import statistics
import time

import torch

from mtp_kernels.models import gemma3
from mtp_kernels.models.gemma3_backbone import Gemma3Backbone


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(2)
    models = {}
    for name, widen in (("backbone's copies", False), ("loader's arena", True)):
        cfg, weights, tok = gemma3.load(native=True, widen=widen)
        models[name] = Gemma3Backbone(cfg, weights, torch.bfloat16)
        del weights
    ids = gemma3.prompt_ids(tok, cfg, "Once upon a time, in a small village by the sea, there lived")
    caches = {}
    for name, m in models.items():
        cache = m.new_cache(1, 256)
        m(torch.tensor([ids]), cache)
        caches[name] = (cache, cache.lens.clone())
    print("| round | " + " | ".join(f"T={T} {n}, ms" for T in (1, 4) for n in models) + " |")
    print("|---:|" + "---:|" * 4)
    for r in range(args.rounds):
        row = []
        for T in (1, 4):
            step = torch.tensor([[100 + i for i in range(T)]])
            logits = []
            for name, m in models.items():
                cache, base = caches[name]
                samples = []
                for _ in range(30):
                    t0 = time.perf_counter()
                    out = m.logits(m(step, cache))
                    samples.append(time.perf_counter() - t0)
                    cache.truncate(base)
                logits.append(out)
                row.append(f"{statistics.median(samples) * 1e3:.2f}")
            assert torch.equal(*logits), "the two backbones' logits differ"
        print(f"| {r + 1} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()

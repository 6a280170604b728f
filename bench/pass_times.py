"""Best and median time of one backbone pass (bf16, LM head excluded: a prefill) over T tokens
from an empty cache, for each T given, with the installed build of the extension: the quantity
that bench/ab_builds.sh compares between two builds.

    .venv/bin/python bench/pass_times.py [--threads 2] [--calls 12] T [T ...]
"""
import argparse
import time

import torch

import mtp_kernels  # noqa: F401  (registers torch.ops.mtp.*)
from mtp_kernels.models import checkpoint
from mtp_kernels.models.llama import Backbone


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tokens", type=int, nargs="+", help="tokens per pass")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=12, help="timed passes per T")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg, weights, _ = checkpoint.load(checkpoint.default_gguf_path())
    model = Backbone(cfg, weights, torch.bfloat16)
    cache = model.new_cache(1, max(args.tokens))
    out = []
    for T in args.tokens:
        ids = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(args.calls):
            cache.lens.zero_()
            start = time.perf_counter()
            model(ids, cache)
            times.append(time.perf_counter() - start)
        times.sort()
        out.append(f"T={T} best {times[0] * 1e3:.1f} ms median {times[len(times) // 2] * 1e3:.1f} ms")
    print(" | ".join(out))


if __name__ == "__main__":
    main()

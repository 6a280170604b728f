"""Best and median time of one backbone pass (LM head excluded: a prefill) over T tokens from an
empty cache, for each T given, with the installed build of the extension: the quantity that
bench/ab_builds.sh compares between two builds. The backbone is the default GGUF's (or --model's), loaded as
`mtp generate` loads it: its own 4-/8-bit weights as stored, or with --dtype dequantized to
bfloat16 / float32. With --isas A,B the passes run on each CPU instruction set in turn, call by
call in one process (the same minutes of this shared machine), and the line per set ends with
its time over the first set's.

    .venv/bin/python bench/pass_times.py [--model X.gguf] [--dtype bfloat16] [--threads 2] [--calls 12] \
        [--isas avx512,avx512_bf16] T [T ...]
"""

import argparse
import time

import torch

import mtp_kernels
from mtp_kernels.models.loading import load_backbone


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tokens", type=int, nargs="+", help="tokens per pass")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: the weights as stored")
    p.add_argument("--model", default=None, help="a GGUF (default: SmolLM2-135M's), as mtp generate --model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=12, help="timed passes per T (and instruction set)")
    p.add_argument("--isas", default=None, help="comma-separated instruction sets to alternate (default: the current)")
    args = p.parse_args()
    default = mtp_kernels.get_isa()
    isas = args.isas.split(",") if args.isas else [default]
    missing = [i for i in isas if i not in mtp_kernels.supported_isas()]
    if missing:
        p.error(f"this CPU lacks {', '.join(missing)} (it has {', '.join(mtp_kernels.supported_isas())})")
    torch.set_num_threads(args.threads)
    cfg, model, _, _ = load_backbone(args.model, args.dtype, lambda *a: None)
    cache = model.new_cache(1, max(args.tokens))
    lines = {isa: [] for isa in isas}
    for T in args.tokens:
        ids = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
        times = {isa: [] for isa in isas}
        for _ in range(args.calls):
            for isa in isas:
                mtp_kernels.set_isa(isa)
                cache.lens.zero_()
                start = time.perf_counter()
                model(ids, cache)
                times[isa].append(time.perf_counter() - start)
        mtp_kernels.set_isa(default)
        first = sorted(times[isas[0]])
        for isa in isas:
            ts = sorted(times[isa])
            ratio = (
                f" ({ts[0] / first[0]:.2f}x / {ts[len(ts) // 2] / first[len(first) // 2]:.2f}x)"
                if isa != isas[0]
                else ""
            )
            lines[isa].append(f"T={T} best {ts[0] * 1e3:.1f} ms median {ts[len(ts) // 2] * 1e3:.1f} ms{ratio}")
    for isa in isas:
        print((f"{isa}: " if args.isas else "") + " | ".join(lines[isa]))


if __name__ == "__main__":
    main()

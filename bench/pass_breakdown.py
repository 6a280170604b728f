"""Where one speculative pass of the default configuration (SmolLM2-135M, its GGUF blocks as
stored, the shipped head, K = 2) spends its time, on this machine: the backbone's layers over
T = 1 (a plain step) and T = 3 (the verify pass of a K = 2 chain) with 1 and 2 threads, the LM
head over those rows right after the layers (its 30 MB out of cache, as in decoding), and the
head's draft both hot (called again and again) and right after a backbone pass (its weights
evicted, as in decoding), with its matrices as shipped by default (Q4_1 since 2026-12-06, 2.5
MB; Q8_0, 4.3 MB, before) and in bf16 (8.4 MB). Each figure the median of ROUNDS rounds of 30
calls, the variants interleaved round by round on this shared machine; prints the read
bandwidth the layers reach (their matrices' bytes / time) beside the read bandwidth of a torch
sum measured in the same run.

    .venv/bin/python bench/pass_breakdown.py [--rounds 5]
"""

import argparse
import statistics
import time

import torch

from mtp_kernels.models.loading import load_backbone, load_head


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    _, model, _, what = load_backbone(None, None, print)
    head = load_head(None, model, print)
    # the same head with its matrices in bf16 (the default before 2026-12-03's Q8_0): both timed
    bf16_head = load_head(None, model, lambda _: None, matrices="bfloat16")
    cache = model.new_cache(1, 512)
    hidden = model(torch.randint(0, 49152, (1, 200), generator=torch.Generator().manual_seed(0)), cache)[:, -1]
    base, token = cache.lens.clone(), torch.tensor([100])
    layer_bytes = sum(w.numel() * w.element_size() for w in model.decoder_weights()[0])
    lm = model.w(model.lm_head_name)
    times: dict[str, list[float]] = {}

    def record(name, fn, calls=30):
        """The median of `calls` runs of fn() (each after the cache is set back), in ms; fn
        returns the seconds of the part it times."""
        samples = []
        for _ in range(calls):
            cache.truncate(base)
            samples.append(fn())
        times.setdefault(name, []).append(statistics.median(samples) * 1e3)

    def seconds(fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        return time.perf_counter() - t0, out

    def layers(T):
        return seconds(model, torch.tensor([[100 + t for t in range(T)]]), cache)[0]

    def logits_after_layers(T):  # the LM head right after the layers streamed past it
        _, h = seconds(model, torch.tensor([[100 + t for t in range(T)]]), cache)
        return seconds(model.logits, h)[0]

    def draft(h=head):
        return seconds(h.draft, model, cache, hidden, token, 2)[0]

    def draft_after_pass(h=head):  # the head's weights evicted by a verify pass and its logits
        model.logits(model(torch.tensor([[5, 6, 7]]), cache))
        cache.truncate(base)
        return draft(h)

    big = torch.ones(64 << 20)  # 256 MB, beyond the caches: the read bandwidth of a torch sum, 2 threads
    gbs = []

    for _ in range(args.rounds):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for T in (1, 3):
                record(f"layers T={T}, {threads} thread(s)", lambda T=T: layers(T))
                record(
                    f"LM head over T={T} rows after the layers, {threads} thread(s)", lambda T=T: logits_after_layers(T)
                )
        torch.set_num_threads(2)
        for name, h in ((head.matrix_dtype, head), ("bf16", bf16_head)):
            record(f"head draft K=2, {name} matrices, hot", lambda h=h: draft(h))
            record(f"head draft K=2, {name} matrices, after a backbone pass", lambda h=h: draft_after_pass(h))
        gbs.append(big.numel() * 4 / min(seconds(big.sum)[0] for _ in range(5)) / 1e9)
    print(f"{what}; layers' matrices {layer_bytes / 1e6:.1f} MB, LM head {lm.numel() * lm.element_size() / 1e6:.1f} MB")
    print("| part | ms (median of rounds) | rounds |\n|---|---:|---|")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.2f} | {' '.join(f'{x:.2f}' for x in v)} |")
    for T in (1, 3):
        ms = statistics.median(times[f"layers T={T}, 2 thread(s)"])
        print(f"layers T={T}, 2 threads: {layer_bytes / ms / 1e6:.1f} GB/s of matrices read")
    print(f"read bandwidth (torch sum of 256 MB, 2 threads, best of 5 per round): {statistics.median(gbs):.1f} GB/s")


if __name__ == "__main__":
    main()

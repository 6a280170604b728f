"""Markdown table: mtp.head_attention vs torch SDPA, medians measured side by side
(calls interleaved round by round), K/V bytes read per second, and the machine's memory
bandwidth measured in the same run (1 GiB copy, read + write bytes; 1 GiB sum, read bytes).

    .venv/bin/python bench/attention_table.py [--quick] [--threads N]
"""

import sys
import time

import torch

import mtp_kernels
from bench_attention import CONFIGS, runners


def side_by_side(fns, budget_s):
    """Median seconds of each callable, calls interleaved so both see the same machine."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or len(times[0]) < 5:
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [sorted(ts)[len(ts) // 2] for ts in times]


def bandwidth():
    src = torch.ones(2**28)  # 1 GiB of fp32
    dst = torch.empty_like(src)
    copy_s, sum_s = side_by_side([lambda: dst.copy_(src), lambda: src.sum()], 3.0)
    return 2 * src.nbytes / copy_s / 1e9, src.nbytes / sum_s / 1e9


def main():
    quick = "--quick" in sys.argv
    if "--threads" in sys.argv:
        torch.set_num_threads(int(sys.argv[sys.argv.index("--threads") + 1]))
    copy_bw, read_bw = bandwidth()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, ISA {mtp_kernels.get_isa()}; "
        f"memory bandwidth this run: copy {copy_bw:.1f} GB/s (read+write), read {read_bw:.1f} GB/s (sum)\n"
    )
    print("| dtype | B | T | L | K/V MiB | mtp µs | SDPA µs | SDPA / mtp | mtp K/V GB/s | % of read bw |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype, B, T, L in CONFIGS:
        if quick and (T == 4 or L == 2048):
            continue
        ours, sdpa, kv_bytes = runners(dtype, B, T, L)
        t_ours, t_sdpa = side_by_side([ours, sdpa], 1.0 if L >= 8192 else 0.5)
        gbs = kv_bytes / t_ours / 1e9
        print(
            f"| {dtype} | {B} | {T} | {L} | {kv_bytes / 2**20:.1f} | {t_ours * 1e6:.0f} | {t_sdpa * 1e6:.0f} | "
            f"{t_sdpa / t_ours:.2f} | {gbs:.1f} | {100 * gbs / read_bw:.0f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Markdown table: one backbone pass (LM head included, cache of 200 positions) at T = 1, 5
and 9 tokens, ours (bf16 weights, Q8 weights, Q8 weights with int8 activations) and
transformers', every call interleaved round by round so that the ratios compare the same
minutes of this shared machine; medians. Per implementation: ms per pass, the pass / its
one-token step, and the weights read per second next to the read bandwidth measured in the
same run (1 GiB sum).

    .venv/bin/python bench/backbone_table.py [--seconds 120] [--threads 2] [--no-transformers]
"""

import argparse

import torch

import mtp_kernels
from attention_table import bandwidth, side_by_side
from bench_backbone import CACHE, our_backbone, pass_of, their_backbone
from memory import nbytes
from mtp_kernels.models import checkpoint

TOKENS = (1, 5, 9)


def on_isa(isa, back, reset, run):
    """(reset, run) with run on instruction set `isa`, then `back` again."""

    def run_on():
        mtp_kernels.set_isa(isa)
        try:
            return run()
        finally:
            mtp_kernels.set_isa(back)

    return reset, run_on


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="time budget of the interleaved rounds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-transformers", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = checkpoint.default_gguf_path()
    prompt = torch.randint(0, 49152, (1, CACHE + 9), generator=torch.Generator().manual_seed(0))
    impls = {
        "ours (bf16)": our_backbone(path, prompt, quantize=False),
        "ours (Q8 weights)": our_backbone(path, prompt, quantize=True),
        "ours (Q8, int8 dot)": our_backbone(path, prompt, quantize=True, int8_dot=True),
    }
    if not args.no_transformers:
        impls["transformers (bf16)"] = their_backbone(path, prompt)
    # The bytes a pass reads: our matrices (the tied embedding once, as the LM head); transformers'
    # are the same bf16 matrices.
    read = {
        name: nbytes([b for n, b in m.named_buffers() if not n.startswith("rope_")])
        for name, (m, _) in impls.items()
        if name.startswith("ours")
    }
    read["transformers (bf16)"] = read["ours (bf16)"]
    calls = {
        (name, T): pass_of("ours" if name.startswith("ours") else "transformers", m, c, prompt[:, CACHE : CACHE + T])
        for name, (m, c) in impls.items()
        for T in TOKENS
    }
    # The default ISA's bf16 backbone again on the other AVX-512 path (the same weights and
    # cache), so that the table shows what VDPBF16PS gives: avx512_bf16 <-> avx512.
    isa = mtp_kernels.get_isa()
    other = {"avx512_bf16": "avx512", "avx512": "avx512_bf16"}.get(isa)
    if other in mtp_kernels.supported_isas():
        name = f"ours (bf16, {other})"
        impls[name], read[name] = impls["ours (bf16)"], read["ours (bf16)"]
        for T in TOKENS:
            calls[name, T] = on_isa(other, isa, *calls["ours (bf16)", T])
    _, read_bw = bandwidth()
    # Each call sets its cache back first, inside the timed call (~1 us for ours).
    medians = side_by_side(
        [lambda reset=reset, run=run: (reset(), run()) for reset, run in calls.values()], args.seconds
    )
    ms = {key: t * 1e3 for key, t in zip(calls, medians)}
    print(
        f"torch {torch.__version__}, {args.threads} threads, ISA {mtp_kernels.get_isa()}, cache {CACHE}, "
        f"{args.seconds:.0f} s of interleaved rounds; read bandwidth this run {read_bw:.1f} GB/s (1 GiB sum)\n"
    )
    print(
        "| backbone | weights read (MB) | T=1 (ms) | T=5 (ms) | T=9 (ms) | T=5 / T=1 | T=9 / T=1 "
        "| T=1 weights GB/s (% of read bw) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in impls:
        step = ms[name, 1]
        gbs = read[name] / (step / 1e3) / 1e9
        print(
            f"| {name} | {read[name] / 1e6:.0f} | {step:.2f} | {ms[name, 5]:.2f} | {ms[name, 9]:.2f} | "
            f"{ms[name, 5] / step:.2f}x | {ms[name, 9] / step:.2f}x | {gbs:.1f} ({100 * gbs / read_bw:.0f}%) |"
        )


if __name__ == "__main__":
    main()

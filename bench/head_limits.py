"""What limits head + lookup decoding on one task of the evaluation set: for the
shipped head (K = 2, prompt lookup up to 6, bf16, 2 threads, 48 new tokens), per pass
whether the drafts came from prompt lookup or from the head and how many were accepted;
where the time of the whole requests went (prefill, backbone passes, LM head, head drafts,
the rest); and how many of the greedy output's tokens the head's draft vocabulary holds
(a token outside it can never be drafted by the head), and of those outside, how many occur
in the request's own prompt. With --answers (the backbone's answers that `mtp train` cached,
runs/distilled.jsonl) also how many output tokens draft vocabularies of other sizes would
hold (the most frequent answer tokens, as `mtp train --draft-vocab N` picks them).

    .venv/bin/python bench/head_limits.py [--task summary] [--prompts 30] [--answers runs/distilled.jsonl]
"""

import argparse
import collections
import time

import torch

from mtp_kernels import data, decoding, train
from mtp_kernels.models.loading import load_head
from mtp_kernels.models import checkpoint
from mtp_kernels.models.llama import DTYPES, Backbone


def timed(seconds: collections.Counter, label, fn):
    """fn, its time added to seconds[label(args)]."""

    def wrapper(*args, **kw):
        start = time.perf_counter()
        out = fn(*args, **kw)
        seconds[label(*args)] += time.perf_counter() - start
        return out

    return wrapper


def load_shipped():
    """(cfg, tokenizer, the default backbone dequantized to bf16, the shipped head), 2 threads: as
    `mtp bench --dtype bfloat16` runs them (the default backbone until 2026-12-01, when this
    bench's figures were taken; the default since is the GGUF's own weights)."""
    torch.set_num_threads(2)
    cfg, weights, tok = checkpoint.load(None)
    model = Backbone(cfg, weights, DTYPES["bfloat16"])
    return cfg, tok, model, load_head(None, model, print)


def eval_prompts(tok, eval_set: str, task: str, n: int) -> list[list[int]]:
    """The first n prompts of a task of the evaluation set, chat template applied, as token ids."""
    return [tok.encode(tok.apply_chat_template(r["prompt"])) for r in data.read_jsonl(eval_set) if r["task"] == task][
        :n
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="summary", choices=data.TASKS)
    p.add_argument("--prompts", type=int, default=30)
    p.add_argument("--eval-set", default="bench/eval_set.jsonl")
    p.add_argument("--answers", help="JSON lines with answer_ids (mtp train's runs/distilled.jsonl)")
    args = p.parse_args()
    cfg, tok, model, head = load_shipped()
    eos = tuple(cfg.eos_token_ids)
    prompts = eval_prompts(tok, args.eval_set, args.task, args.prompts)

    # Each pass: lookup_drafts is asked first (once per pass at batch 1), then verify says
    # how many drafts were accepted.
    passes, seconds = [], collections.Counter()
    lookup, verify = decoding.lookup_drafts, decoding._Sampler.verify

    def lookup_logged(context, most):
        found = lookup(context, most)
        passes.append(["lookup" if found else "head"])
        return found

    def verify_logged(self, drafts, logits, num, positions):
        accepted, tokens = verify(self, drafts, logits, num, positions)
        passes[-1].append(int(accepted[0]))
        return accepted, tokens

    decoding.lookup_drafts, decoding._Sampler.verify = lookup_logged, verify_logged
    forward = type(model).forward
    type(model).forward = timed(seconds, lambda m, x, c: "prefill" if x.shape[1] > 16 else "backbone passes", forward)
    model.logits = timed(seconds, lambda h: "LM head", model.logits)
    head.draft = timed(seconds, lambda *a: "head drafts", head.draft)
    outputs, total = [], 0.0
    for ids in prompts:
        g = decoding.generate(model, [ids], 48, head=head, k=2, eos_token_ids=eos, lookup=6, branches=1)[0]
        outputs.append(g.tokens)
        total += g.seconds + g.prefill_seconds
    decoding.lookup_drafts, decoding._Sampler.verify = lookup, verify
    type(model).forward = forward

    made = sum(len(o) for o in outputs)
    # tau as mtp bench counts it: the first token of each request comes from its prefill
    tau = (made - len(prompts)) / len(passes)
    print(
        f"{args.task}: {len(prompts)} prompts, {made} tokens, {len(passes)} passes after the prefills (tau {tau:.2f})"
    )
    for source in ("lookup", "head"):
        accepted = [a for s, a in passes if s == source]
        if accepted:
            histogram = sorted(collections.Counter(accepted).items())
            print(
                f"  {source} passes: {len(accepted)}, accepted drafts per pass {sum(accepted) / len(accepted):.2f}, "
                f"passes by drafts accepted {histogram}"
            )
    print(f"time: {total:.2f} s in all")
    for label, s in seconds.most_common():
        print(f"  {label}: {s:.2f} s ({s / total:.0%})")
    rest = total - sum(seconds.values())
    print(f"  the rest (Python, lookup, verify): {rest:.2f} s ({rest / total:.0%})")
    vocab = set(head.draft_vocab.tolist())
    outside = [(t, ids) for o, ids in zip(outputs, prompts) for t in o if t not in vocab]
    in_prompt = sum(t in ids for t, ids in outside)
    print(
        f"draft vocabulary ({len(vocab)} tokens): holds {1 - len(outside) / made:.1%} of the output tokens; "
        f"of the {len(outside)} outside it, {in_prompt} occur in their own prompt"
    )
    if args.answers:
        answers = [r["answer_ids"] for r in data.read_jsonl(args.answers)]
        for size in (1024, 2048, 4096, 8192, 16384):
            held = set(train.draft_vocabulary(answers, size, cfg.vocab_size, always=eos).tolist())
            print(f"  a draft vocabulary of {size} would hold {sum(t in held for o in outputs for t in o) / made:.1%}")


if __name__ == "__main__":
    main()

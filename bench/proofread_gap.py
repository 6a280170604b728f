"""Why held-out proofreading's tau trails eval_set's: the backbone's corrections, counted.

Per set, each proofreading prompt's greedy answer (the default backbone, up to 64 new
tokens; any drafts give the same tokens) against the message it corrects (the prompt after
its instruction line), token by token (difflib): how many of the answer's tokens are copies
of the message, and how many edits (changed, inserted or deleted runs) per 100 answer tokens.
Beside them, prompt lookup replayed alone on those answers (decoding.lookup_drafts, the
default's 3 drafts growing to 8, and an unbounded copy of up to 64): every edit stops a copy,
so the fewer tokens between edits, the fewer a pass can take, whatever drafts the head adds.

    .venv/bin/python bench/proofread_gap.py [--per-task 30]
"""

import argparse
import difflib
import os

import torch

from mtp_kernels import data, decoding
from mtp_kernels.models.loading import load_backbone

HERE = os.path.dirname(__file__)
SETS = {"dev_set": "dev_set.jsonl", "eval_set": "eval_set.jsonl", "held-out": "heldout_set.jsonl"}


def lookup_passes(prompt: list[int], answer: list[int], start: int, most: int) -> int:
    """The passes prompt lookup alone takes to decode a fixed answer: each accepts the drafts'
    prefix equal to the answer, plus the backbone's token (the first comes from the prefill)."""
    pos, passes = 1, 0
    while pos < len(answer):
        drafts = decoding.lookup_drafts(prompt + answer[:pos], most, start)
        n = 0
        while n < len(drafts) and pos + n < len(answer) and drafts[n] == answer[pos + n]:
            n += 1
        pos += n + 1
        passes += 1
    return passes


def copies_and_edits(message: list[int], answer: list[int]) -> tuple[int, int]:
    """The answer's tokens copied from the message, and its edits: the changed, inserted or
    deleted runs between copies (the message's rest after the answer's end is none)."""
    ops = difflib.SequenceMatcher(None, message, answer, autojunk=False).get_opcodes()
    if ops and ops[-1][0] == "delete":
        ops = ops[:-1]
    return sum(j2 - j1 for op, _, _, j1, j2 in ops if op == "equal"), sum(op != "equal" for op, *_ in ops)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-task", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(2)
    cfg, model, tok, _ = load_backbone(None, None, lambda s: None)
    cols = ["answer tokens", "copied from the message", "edits per 100 answer tokens", "lookup alone 3-8 tau"]
    print("| set | " + " | ".join(cols + ["lookup of up to 64 tau"]) + " |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, file in SETS.items():
        rows = [r for r in data.read_jsonl(os.path.join(HERE, file)) if r["task"] == "proofread"][: args.per_task]
        total = copied = edits = decoded = 0
        passes = {(3, 8): 0, (64, 64): 0}
        for r in rows:
            prompt = tok.prompt_prefix + tok.encode(tok.apply_chat_template(r["prompt"]))
            answer = decoding.generate(model, [prompt], args.max_new_tokens, eos_token_ids=cfg.eos_token_ids)[0].tokens
            text = [t for t in answer if t not in cfg.eos_token_ids]
            c, e = copies_and_edits(tok.encode(r["prompt"].split("\n\n", 1)[-1]), text)
            total, copied, edits = total + len(text), copied + c, edits + e
            for start, most in passes:
                passes[start, most] += lookup_passes(prompt, answer, start, most)
            decoded += len(answer) - 1
        taus = " | ".join(f"{decoded / n:.2f}" for n in passes.values())
        print(f"| {name} | {total} | {copied / total:.3f} | {100 * edits / total:.1f} | {taus} |")


if __name__ == "__main__":
    main()

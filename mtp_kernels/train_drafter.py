"""Training the standalone drafter on the same distilled data as the head (the baseline).

Next-token cross-entropy on the backbone's own greedy answers (runs/distilled.jsonl, written
by `mtp train`), targets mapped into the drafter's vocabulary (UNK for the others), with a
differentiable fp32 forward of the drafter's architecture (what `Backbone` runs through the
mtp ops) and train.train_head's schedule and budget.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from typing import Callable

import torch
import torch.nn.functional as F

from . import train
from .models.config import LlamaConfig
from .models.drafter import StandaloneDrafter, config_near, default_config, parameter_counts
from .models.head import HeadConfig
from .models.llama import rope_tables
from .reference import rms_norm, rope  # the runtime ops' spec, differentiable

IGNORE = train.IGNORE


def forward_hidden(cfg: LlamaConfig, w: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Final normed hidden states [B, L, H] of drafter indices [B, L] at positions 0..L-1
    (plain causal attention; right padding is never seen by the real positions)."""
    B, L = tokens.shape
    cos, sin = rope_tables(cfg, L)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q = rope(q.view(B, L, cfg.num_heads, cfg.head_dim), cos[None], sin[None])
        k = rope(k.view(B, L, cfg.num_kv_heads, cfg.head_dim), cos[None], sin[None])
        v = v.view(B, L, cfg.num_kv_heads, cfg.head_dim)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        x = x + a.transpose(1, 2).reshape(B, L, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = (
            x
            + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    return rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)


def batch_loss(drafter: StandaloneDrafter, batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over the answer tokens of `batch` (anything with .tokens [N] of backbone
    ids and .prompt_len, e.g. train.Sequence), and the number of those tokens predicted
    right (greedy over the vocabulary without UNK, as drafting picks)."""
    ids = train.pad_stack([drafter.to_draft(s.tokens) for s in batch], 0)  # [B, L]
    tgt = train.pad_stack([drafter.to_draft(s.tokens[1:]) for s in batch], 0, value=IGNORE)
    first = torch.tensor([s.prompt_len - 1 for s in batch])[:, None]  # predicts the first answer token
    tgt = torch.where(torch.arange(tgt.shape[1])[None] >= first, tgt, IGNORE)
    keep = tgt != IGNORE
    hidden = forward_hidden(drafter.cfg, drafter.weights, ids[:, : tgt.shape[1]])[keep]
    logits = hidden @ drafter.weights["model.embed_tokens.weight"].T  # tied LM head
    loss = F.cross_entropy(logits, tgt[keep])
    return loss, (logits[:, : drafter.unk].argmax(-1) == tgt[keep]).sum()


@torch.no_grad()
def evaluate(drafter: StandaloneDrafter, val: list, batch: int = 8) -> dict:
    loss, correct, total = 0.0, 0, 0
    for i in range(0, len(val), batch):
        b = val[i : i + batch]
        n = sum(len(s.tokens) - s.prompt_len for s in b)
        lo, ok = batch_loss(drafter, b)
        loss, correct, total = loss + lo.item() * n, correct + int(ok), total + n
    return {"val_loss": round(loss / max(total, 1), 4), "val_acc": round(correct / max(total, 1), 4)}


def train_drafter(
    drafter: StandaloneDrafter,
    train_seqs: list,
    val_seqs: list,
    tc: train.TrainConfig,
    log: Callable[[str], None] = print,
) -> dict:
    """AdamW (betas 0.9, 0.95), 50 warmup steps then cosine to 10% over max_steps, grad
    clip 1.0, wall-clock cap: train.train_head's schedule. Trains drafter.weights in place."""
    if not train_seqs or not val_seqs:  # else the loop below would spin over zero batches until the time cap
        raise ValueError(
            f"training needs at least one training and one validation sequence, got {len(train_seqs)} "
            f"and {len(val_seqs)}"
        )
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    params = [w.requires_grad_() for w in drafter.weights.values()]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    order = sorted(range(len(train_seqs)), key=lambda i: len(train_seqs[i].tokens))
    batches = [order[i : i + tc.batch] for i in range(0, len(order), tc.batch)]
    t0, step, losses = time.perf_counter(), 0, []
    # Early stopping: it overfits the distilled answers within a few epochs (3.7M parameters
    # with their own embedding), so the weights of the best validation loss are kept.
    best = (float("inf"), None, 0)
    while step < tc.max_steps and time.perf_counter() - t0 < tc.minutes * 60:
        rng.shuffle(batches)
        for bi in batches:
            if step == tc.max_steps or time.perf_counter() - t0 >= tc.minutes * 60:
                break
            lr = train.learning_rate(tc, step)
            for grp in opt.param_groups:
                grp["lr"] = lr
            loss, _ = batch_loss(drafter, [train_seqs[i] for i in bi])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            losses.append(loss.item())
            if step % 25 == 0:
                log(f"train drafter: step {step}, {time.perf_counter() - t0:.0f} s, lr {lr:.2e}, loss {losses[-1]:.3f}")
            if step % 250 == 0 or step == tc.max_steps:
                with torch.no_grad():
                    val = evaluate(drafter, val_seqs)
                log(f"train drafter: validation at step {step}: {val}")
                if val["val_loss"] < best[0]:
                    best = (val["val_loss"], {n: w.detach().clone() for n, w in drafter.weights.items()}, step)
    for w in params:
        w.requires_grad_(False)
    if best[1] is not None:
        with torch.no_grad():
            for n, w in drafter.weights.items():
                w.copy_(best[1][n])
    elapsed = round(time.perf_counter() - t0)
    if step < tc.max_steps:
        log(f"train drafter: time cap of {tc.minutes} min reached at step {step} of {tc.max_steps}")
    drafter.trained = True
    drafter.to(drafter.model.dtype if drafter.model is not None else torch.float32)
    result = {
        "steps": step,
        "seconds": elapsed,
        "kept_step": best[2],
        "first_loss": losses[0] if losses else float("nan"),
        "last_loss": losses[-1] if losses else float("nan"),
        **evaluate(drafter, val_seqs),
    }
    log(f"train drafter: done after {step} steps, {elapsed} s; {result}")
    return result


def run_drafter(
    prompts_path: str | list[str],
    out_dir: str,
    work_dir: str,
    tc: train.TrainConfig,
    vocab_size: int = 8192,
    max_new_tokens: int = 96,
    num_prompts: int = 0,
    log: Callable[[str], None] = print,
    model: str | None = None,
    num_blocks: int = 1,
) -> dict:
    """The head's distilled data and validation split (train.distilled_rows, train.split)
    -> a drafter of about the size of a head of num_blocks blocks (the default size for the
    shipped head's one), over the most frequent answer tokens -> out_dir."""
    from .models import loading

    train.check_blocks(num_blocks)  # before any work
    cfg, teacher, tok, _ = loading.load_backbone(model, None, log)  # as `mtp generate` runs it
    vocab_size = train.check_draft_vocab(vocab_size, cfg.vocab_size)
    rows = train.distilled_rows(prompts_path, work_dir, max_new_tokens, num_prompts, teacher, tok, log)[0]
    seqs = [
        train.Sequence(torch.tensor(r["prompt_ids"] + r["answer_ids"]), len(r["prompt_ids"]), *[torch.empty(0)] * 3)
        for r in rows
    ]
    (train_rows, _), (train_seqs, val_seqs) = train.split(rows), train.split(seqs)
    vocab = train.draft_vocabulary(
        [r["answer_ids"] for r in train_rows], vocab_size, cfg.vocab_size, always=tuple(cfg.eos_token_ids)
    )
    # About the MTP head's size (its parameters for this backbone and vocabulary): a fair baseline.
    head_params = parameter_counts(
        default_config(len(vocab), cfg.max_position), HeadConfig.for_backbone(cfg, num_blocks=num_blocks)
    )["head"]
    drafter = StandaloneDrafter(
        config_near(len(vocab), cfg.max_position, head_params), vocab, seed=tc.seed, family=teacher.family
    )
    result = train_drafter(drafter, train_seqs, val_seqs, tc, log=log)
    drafter.save(out_dir)
    result.update(
        prompts=[prompts_path] if isinstance(prompts_path, str) else list(prompts_path),
        num_prompts=num_prompts,
        distilled_by=train.distilled_by(teacher),
        train_config=dataclasses.asdict(tc),
        sequences=len(train_seqs),
        val_sequences=len(val_seqs),
        vocab_size=len(vocab),
        drafter_parameters=drafter.num_parameters(),
    )
    train.save_json(os.path.join(out_dir, "training.json"), result)
    log(f"train drafter: saved to {out_dir} ({result['drafter_parameters']} parameters)")
    return result

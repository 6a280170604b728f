"""Training the MTP head on the frozen backbone (self-distillation).

1. distill: the frozen backbone, as `mtp generate` runs it by default (the file's own
   weights, bf16 activations), answers every training prompt greedily, a batch of
   prompts at a time; those answers are the targets, exactly what verification will
   accept. What the passes compute on the way are the features, the head's inputs at
   inference bit for bit: per position the backbone's final hidden state and the K/V of
   the layer the head reads.
2. train: the head is unrolled over `steps` draft steps exactly as `MTPHead.draft` runs
   them (step j of anchor p: input = embedding of token p+1+j and the previous step's
   hidden state, query at position p+1+j, attending to the backbone keys 0..p and to its
   own keys of steps 0..j), with cross-entropy against the backbone's tokens p+2+j over
   the draft vocabulary (optionally mixed with soft targets: the backbone's own
   distribution there, from the hidden states already kept). The backbone is never
   updated: its weights are buffers and the features are computed under no_grad.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .models.head import MAX_BLOCKS, HeadConfig, MTPHead, check_global_layer
from .models.llama import Backbone
from .reference import rms_norm, rope  # the runtime ops' spec, differentiable

IGNORE = -100


# ---- 1. distillation, which also gives the features ---------------------------------------
@dataclasses.dataclass
class Sequence:
    tokens: torch.Tensor  # [N] prompt + answer
    prompt_len: int
    hidden: torch.Tensor  # [N, H] the backbone's final (normed) hidden states, in its dtype
    k: torch.Tensor  # [Hkv, N, D] post-RoPE keys of the head's layer, in the backbone's dtype
    v: torch.Tensor
    # [N] the backbone's argmax after each position (its greedy next token given the
    # sequence so far): the targets at prompt positions, where the next token is the user's.
    greedy: torch.Tensor | None = None
    taps: torch.Tensor | None = None  # [N, n, H] the residual streams of the head's fuse_layers, or None


@torch.no_grad()
def distill(
    backbone: Backbone,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    eos_ids: tuple[int, ...],
    kv_layer: int,
    batch: int = 16,
    on_batch: Callable[[dict[int, Sequence]], None] | None = None,
    log: Callable[[str], None] = print,
    fuse_layers: tuple[int, ...] = (),
) -> list[Sequence]:
    """Our backbone answers every prompt greedily, `batch` prompts of similar length at a
    time, and what it computes on the way is kept: per position its final hidden state, its
    argmax, the K/V of layer kv_layer and the residual streams of fuse_layers. Those are
    exactly what the head sees and must predict at inference (a row has the same bits
    whatever the batch and the rows beside it), and no second pass is needed. An answer ends
    with EOS when the backbone stopped. on_batch sees each batch's sequences by prompt index
    (to cache the answers)."""
    layer, eos = kv_layer % backbone.cfg.num_layers, set(eos_ids)
    out: list[Sequence | None] = [None] * len(prompt_ids)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    t0 = time.perf_counter()
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        cache = backbone.new_cache(len(idx), max(len(prompt_ids[i]) for i in idx) + max_new_tokens)
        first = [
            backbone.features(torch.tensor([prompt_ids[i]]), cache.select(r), layers=fuse_layers)
            for r, i in enumerate(idx)
        ]
        hidden = [[f[0]] for _, f in first]  # per row its features [n, 1 + len(fuse_layers), H]
        picks = [[backbone.logits(h[0]).argmax(-1)] for h, _ in first]
        answers: list[list[int]] = [[] for _ in idx]
        token, live = torch.stack([p[0][-1] for p in picks]), list(range(len(idx)))
        while live:
            for r in live:
                answers[r].append(int(token[r]))
            # Every row runs (one batched pass); a finished row's extra positions are never read.
            h, f = backbone.features(token[:, None], cache, layers=fuse_layers)
            h, f = h[:, 0], f[:, 0]
            token = backbone.logits(h).argmax(-1)
            for r in live:
                hidden[r].append(f[r : r + 1])
                picks[r].append(token[r : r + 1])
            live = [r for r in live if answers[r][-1] not in eos and len(answers[r]) < max_new_tokens]
        new = {}
        for r, i in enumerate(idx):
            n = len(prompt_ids[i]) + len(answers[r])
            feats = torch.cat(hidden[r])  # [n, 1 + len(fuse_layers), H]
            new[i] = Sequence(
                torch.tensor(prompt_ids[i] + answers[r]),
                len(prompt_ids[i]),
                feats[:, 0].contiguous(),
                cache.k[layer, r, :, :n].clone(),
                cache.v[layer, r, :, :n].clone(),
                torch.cat(picks[r]),
                feats[:, 1:].contiguous() if fuse_layers else None,
            )
            out[i] = new[i]
        if on_batch:
            on_batch(new)
        log(f"distill: {min(start + batch, len(order))}/{len(order)} prompts, {time.perf_counter() - t0:.0f} s")
    return out  # type: ignore[return-value]


@torch.no_grad()
def sequence_from_backbone(
    backbone: Backbone, tokens: list[int], prompt_len: int, kv_layer: int, fuse_layers: tuple[int, ...] = ()
) -> Sequence:
    """The same features from our own backbone (exact, one sequence at a time). Keeps copies
    of the head's layer's K/V: views would keep every layer's cache alive (~30x the memory)."""
    cache = backbone.new_cache(1, len(tokens))
    hidden, feats = backbone.features(torch.tensor([tokens]), cache, layers=fuse_layers)
    hidden = hidden[0]
    layer = kv_layer % backbone.cfg.num_layers
    n = len(tokens)
    return Sequence(
        torch.tensor(tokens),
        prompt_len,
        hidden,
        cache.k[layer, 0, :, :n].clone(),
        cache.v[layer, 0, :, :n].clone(),
        backbone.logits(hidden).argmax(-1),
        feats[0, :, 1:].contiguous() if fuse_layers else None,
    )


# ---- 3. the head unrolled over all anchors at once --------------------------------------
def pad_stack(xs: list[torch.Tensor], dim: int, value=0) -> torch.Tensor:
    n = max(x.shape[dim] for x in xs)
    return torch.stack([F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, n - x.shape[dim]], value=value) for x in xs])


def answer_anchors(
    batch: list[Sequence], limit: int = 0, rng: random.Random | None = None, prompt_limit: int = 0
) -> torch.Tensor:
    """Anchor positions [B, A] (-1 = padding): every p from the last prompt position on
    whose next-but-one token exists (p + 2 < N); at most `limit` of them, drawn at random.
    prompt_limit > 0: also up to that many positions p < prompt_len - 1 inside the prompt
    (their targets are the backbone's greedy tokens there: see unrolled_targets)."""
    rng = rng or random
    rows = []
    for s in batch:
        ps = list(range(s.prompt_len - 1, len(s.tokens) - 2))
        if limit and len(ps) > limit:
            ps = sorted(rng.sample(ps, limit))
        if prompt_limit:
            inside = list(range(0, min(s.prompt_len - 1, len(s.tokens) - 2)))
            ps = sorted(rng.sample(inside, min(prompt_limit, len(inside)))) + ps
        rows.append(torch.tensor(ps, dtype=torch.long))
    return pad_stack(rows, 0, value=-1)


def unrolled_logits(
    head: MTPHead,
    backbone: Backbone,
    batch: list[Sequence],
    anchors: torch.Tensor,
    steps: int,
    vocab_rows: torch.Tensor,
) -> list[torch.Tensor]:
    """Draft logits [B, A, len(vocab_rows)] of every step j < steps at every anchor p
    (the position of the backbone's last hidden state; anchors [B, A]), with the
    sequence's own tokens as the head's inputs (teacher forcing): the computation of
    MTPHead.draft, in fp32 torch ops so that it has gradients."""
    c = head.cfg
    tokens = pad_stack([s.tokens for s in batch], 0)  # [B, L]
    kb = pad_stack([s.k for s in batch], 1).float()  # [B, Hkv, L, D]
    vb = pad_stack([s.v for s in batch], 1).float()
    B, L = tokens.shape
    A = anchors.shape[1]
    p = anchors.clamp(min=0)
    g, scale = c.num_heads // c.num_kv_heads, c.head_dim**-0.5
    emb = backbone.embedding.float()
    visible = (torch.arange(L)[None, None] <= p[:, :, None])[:, None, None]  # backbone keys 0..p: [B,1,1,A,L]
    h = pad_stack([s.hidden for s in batch], 0).float().gather(1, p[:, :, None].expand(B, A, c.hidden_size))
    if c.fuse_layers:  # the first step's input: the hidden state and the tapped layers' (MTPHead.first_hidden)
        n = len(c.fuse_layers)
        taps = pad_stack([s.taps for s in batch], 0).gather(1, p[:, :, None, None].expand(B, A, n, c.hidden_size))
        h = head.first_hidden(torch.cat([h[:, :, None], taps.float()], dim=2))
    local_k = [[] for _ in head.blocks]
    local_v = [[] for _ in head.blocks]
    out = []
    for j in range(steps):
        nxt = tokens.gather(1, (p + 1 + j).clamp(max=L - 1))  # the input token p+1+j
        cos, sin = backbone.rope_rows(p + 1 + j)  # [B, A, D] at position p+1+j
        x = (
            torch.cat(
                [rms_norm(emb[nxt], head.embed_norm, c.rms_norm_eps), rms_norm(h, head.hidden_norm, c.rms_norm_eps)],
                dim=-1,
            )
            @ head.proj.T
        )
        for i, blk in enumerate(head.blocks):
            a = rms_norm(x, blk.attn_norm, c.rms_norm_eps)
            q = rope((a @ blk.q_proj.T).view(B, A, c.num_kv_heads * g, c.head_dim), cos, sin)
            q = q.view(B, A, c.num_kv_heads, g, c.head_dim)
            local_k[i].append(rope((a @ blk.k_proj.T).view(B, A, c.num_kv_heads, c.head_dim), cos, sin))
            local_v[i].append((a @ blk.v_proj.T).view(B, A, c.num_kv_heads, c.head_dim))
            qh = q.permute(0, 2, 3, 1, 4)  # [B, Hkv, g, A, D]
            s_back = (qh @ kb[:, :, None].transpose(-1, -2)) * scale  # [B, Hkv, g, A, L]
            s_back = s_back.masked_fill(~visible, float("-inf"))
            s_loc = torch.stack([(q * lk[:, :, :, None]).sum(-1) for lk in local_k[i]], -1) * scale
            w = torch.softmax(torch.cat([s_back, s_loc.permute(0, 2, 3, 1, 4)], -1), -1)
            att = w[..., :L] @ vb[:, :, None]  # [B, Hkv, g, A, D]
            att = att + torch.einsum("bkgas,sbakd->bkgad", w[..., L:], torch.stack(local_v[i]))
            x = x + att.permute(0, 3, 1, 2, 4).reshape(B, A, -1) @ blk.o_proj.T
            m = rms_norm(x, blk.mlp_norm, c.rms_norm_eps)
            x = x + (F.silu(m @ blk.gate_proj.T) * (m @ blk.up_proj.T)) @ blk.down_proj.T
        h = x
        out.append(rms_norm(h, head.out_norm, c.rms_norm_eps) @ vocab_rows.T)
    return out


def unrolled_targets(
    batch: list[Sequence], anchors: torch.Tensor, steps: int, vocab_index: torch.Tensor
) -> list[torch.Tensor]:
    """Target [B, A] of step j at anchor p: what greedy decoding gives after the tokens up to
    p+1+j, as an index into the draft vocabulary: in the answer the sequence's own token p+2+j,
    inside the prompt the backbone's argmax at p+1+j (Sequence.greedy); IGNORE for padding
    anchors, past the end, or outside the vocabulary."""
    tokens = pad_stack([s.tokens for s in batch], 0, value=-1)
    L = tokens.shape[1]
    # inputs[j] = p+1+j, the position of step j's input token; before the prompt's last token
    # the next token is the user's, not the backbone's.
    inputs = [anchors + 1 + j for j in range(steps)]
    last_prompt = torch.tensor([[s.prompt_len - 1] for s in batch])
    in_prompt = [(anchors >= 0) & (i < last_prompt) for i in inputs]
    greedy = None
    if any(bool(m.any()) for m in in_prompt):
        if any(s.greedy is None for s in batch):
            raise ValueError("anchors inside the prompt need the backbone's greedy tokens (Sequence.greedy)")
        greedy = pad_stack([s.greedy for s in batch], 0, value=-1)
    out = []
    for i, inside in zip(inputs, in_prompt):
        tgt = torch.where((anchors >= 0) & (i + 1 < L), tokens.gather(1, (i + 1).clamp(0, L - 1)), -1)
        if greedy is not None:
            tgt = torch.where(inside, greedy.gather(1, i.clamp(0, L - 1)), tgt)
        out.append(torch.where(tgt >= 0, vocab_index[tgt.clamp(min=0)], IGNORE))
    return out


@torch.no_grad()
def soft_targets(
    batch: list[Sequence], anchors: torch.Tensor, steps: int, vocab_rows: torch.Tensor
) -> list[torch.Tensor]:
    """The backbone's own next-token distribution [B, A, len(vocab_rows)] for step j at anchor p,
    restricted to the draft vocabulary: softmax of its logits after position p+1+j (its final
    hidden state there times the LM head's rows), whose argmax is the hard target."""
    hidden = pad_stack([s.hidden for s in batch], 0)
    L = hidden.shape[1]
    p = anchors.clamp(min=0)
    out = []
    for j in range(steps):
        h = hidden.gather(1, (p + 1 + j).clamp(max=L - 1)[:, :, None].expand(-1, -1, hidden.shape[2]))
        out.append(torch.softmax(h.float() @ vocab_rows.T, dim=-1))
    return out


def draft_loss(
    logits: list[torch.Tensor], targets: list[torch.Tensor], soft: list[torch.Tensor] | None, soft_weight: float
) -> torch.Tensor:
    """Mean over draft steps of the cross-entropy against the hard targets, mixed with
    soft_weight of the cross-entropy against the soft ones (at the same anchors: IGNORE
    targets count in neither). A step without any target adds 0 (a mean over nothing
    would be NaN, and one NaN gradient ruins every weight)."""
    total = logits[0].sum() * 0  # keeps the graph when no step has a target
    for j, (lg, t) in enumerate(zip(logits, targets)):
        lg, t = lg.flatten(0, 1), t.flatten()
        keep = t != IGNORE
        if not keep.any():
            continue
        loss = F.cross_entropy(lg, t, ignore_index=IGNORE)
        if soft_weight:
            soft_ce = -(soft[j].flatten(0, 1)[keep] * F.log_softmax(lg[keep], dim=-1)).sum(-1).mean()
            loss = (1 - soft_weight) * loss + soft_weight * soft_ce
        total = total + loss
    return total / len(logits)


def draft_vocabulary(
    answers: list[list[int]], size: int, vocab_size: int, always: tuple[int, ...] = ()
) -> torch.Tensor:
    """The `size` most frequent answer tokens, most frequent first (so any prefix is the
    best draft vocabulary of that smaller size), plus the `always` ids (EOS)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for a in answers:
        counts += torch.bincount(torch.tensor(a, dtype=torch.long), minlength=vocab_size)
    counts[list(always)] = counts.max() + 1
    return counts.argsort(descending=True, stable=True)[:size]


def init_from_backbone(head: MTPHead, backbone: Backbone) -> None:
    """Start every block from the weights of the backbone layer whose cache it reads: its
    queries then already match that layer's keys (a Gemma 3 layer's q/k norms and GELU have no
    place in the head's block: its projections start from the layer's all the same). The
    projection starts as the sum of the two normed inputs (the next token's embedding plus the
    hidden state)."""
    layer = head.cfg.kv_layer % backbone.cfg.num_layers
    names = {
        "attn_norm": "input_layernorm",
        "q_proj": "self_attn.q_proj",
        "k_proj": "self_attn.k_proj",
        "v_proj": "self_attn.v_proj",
        "o_proj": "self_attn.o_proj",
        # the norm before the MLP
        "mlp_norm": "pre_feedforward_layernorm" if backbone.family == "gemma3" else "post_attention_layernorm",
        "gate_proj": "mlp.gate_proj",
        "up_proj": "mlp.up_proj",
        "down_proj": "mlp.down_proj",
    }
    with torch.no_grad():
        for blk in head.blocks:
            for mine, theirs in names.items():
                getattr(blk, mine).copy_(backbone.layer_weight(layer, theirs).float())
        eye = torch.eye(head.cfg.hidden_size)
        head.proj.copy_(torch.cat([eye, eye], dim=1))


@dataclasses.dataclass
class TrainConfig:
    steps: int = 4  # unrolled draft steps per anchor
    batch: int = 8  # sequences per optimiser step
    lr: float = 1e-3
    weight_decay: float = 0.01
    anchors: int = 48  # anchors (draft start positions) drawn per sequence and step
    prompt_anchors: int = 0  # more anchors inside the prompt (greedy targets), per sequence and step
    soft_targets: float = 0.0  # weight of the soft-target loss (the backbone's distribution), 0..1
    max_steps: int = 1000  # optimiser steps; the schedule depends on steps only (reproducible)
    minutes: float = 60.0  # safety cap on the wall clock: stops early (logged) when reached
    seed: int = 0


def learning_rate(tc: TrainConfig, step: int) -> float:
    """50 warmup steps, then cosine decay to 10% of tc.lr at tc.max_steps (steps only: reproducible)."""
    return tc.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / tc.max_steps)))


VALIDATE_EVERY = 200  # steps between validations (and checkpoints)


def train_head(
    head: MTPHead,
    backbone: Backbone,
    train: list[Sequence],
    val: list[Sequence],
    tc: TrainConfig,
    log: Callable[[str], None] = print,
    checkpoint: str | None = None,
) -> dict:
    """AdamW, warmup then cosine decay over max_steps; returns the validation curve.
    checkpoint: a file where the whole training state (head, optimiser, step, random states)
    is saved at every validation and when the time cap stops the run. A run of the same
    configuration on the same data resumes there and ends with the bits of an uninterrupted
    one; the file is removed once max_steps are done."""
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    vocab = head.draft_vocab
    rows = backbone.lm_head[vocab].float() if vocab.numel() else backbone.lm_head.float()
    index = torch.full((backbone.cfg.vocab_size,), IGNORE, dtype=torch.long)
    index[vocab if vocab.numel() else torch.arange(backbone.cfg.vocab_size)] = torch.arange(rows.shape[0])
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    if not train or not val:
        raise ValueError(
            f"training needs at least one training and one validation sequence, got {len(train)} and {len(val)}"
        )
    order = sorted(range(len(train)), key=lambda i: len(train[i].tokens))
    batches = [order[i : i + tc.batch] for i in range(0, len(order), tc.batch)]
    state = {"step": 0, "pos": len(batches), "curve": [], "first_loss": float("nan"), "last_loss": float("nan")}
    state["seconds"] = 0.0  # of the earlier runs this one resumes
    # What must match for a checkpoint to be resumed: the configuration and the data.
    config = {k: v for k, v in dataclasses.asdict(tc).items() if k != "minutes"}  # a new time cap may resume
    key = [config, len(train), len(val), [len(s.tokens) for s in train[:64]], vocab.tolist()[:64]]
    key.append(dataclasses.asdict(head.cfg))  # another head shape (fuse_layers, ...) starts over
    if checkpoint and os.path.isfile(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        if saved.get("key") == key:
            head.load_state_dict(saved["head"])
            opt.load_state_dict(saved["opt"])
            rng.setstate(saved["rng"])
            torch.set_rng_state(saved["torch_rng"])
            state, batches = saved["state"], saved["batches"]
            log(f"train: resuming {checkpoint} at step {state['step']}")
        else:
            log(f"train: {checkpoint} holds another configuration or data; starting over")

    def save() -> None:
        if checkpoint:
            snapshot = dict(head=head.state_dict(), opt=opt.state_dict(), rng=rng.getstate())
            snapshot.update(torch_rng=torch.get_rng_state(), state=state, batches=batches, key=key)
            torch.save(snapshot, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)  # never a half-written checkpoint

    budget, t0, curve = tc.minutes * 60, time.perf_counter() - state["seconds"], state["curve"]
    while True:  # ends: every batch checks the step and time caps
        if state["pos"] == len(batches):  # a new pass over the (non-empty) batches
            rng.shuffle(batches)
            state["pos"] = 0
        bi, step = batches[state["pos"]], state["step"]
        elapsed = state["seconds"] = time.perf_counter() - t0
        if not elapsed < budget or step >= tc.max_steps:
            if step < tc.max_steps:
                log(f"train: time cap of {tc.minutes} min reached at step {step} of {tc.max_steps}")
                save()  # the same command resumes here
            elif checkpoint and os.path.isfile(checkpoint):
                os.remove(checkpoint)
            if not curve or curve[-1]["step"] != step:  # not again when the last step was just validated
                curve.append(
                    {"step": step, "seconds": round(elapsed), **evaluate(head, backbone, val, tc.steps, rows, index)}
                )
            log(f"train: done after {step} steps, {elapsed:.0f} s; {curve[-1]}")
            return {
                "curve": curve,
                "steps": step,
                "first_loss": state["first_loss"],
                "last_loss": state["last_loss"],
                "seconds": round(elapsed),
            }
        lr = learning_rate(tc, step)
        for grp in opt.param_groups:
            grp["lr"] = lr
        batch = [train[i] for i in bi]
        anchors = answer_anchors(batch, tc.anchors, rng, tc.prompt_anchors)
        logits = unrolled_logits(head, backbone, batch, anchors, tc.steps, rows)
        targets = unrolled_targets(batch, anchors, tc.steps, index)
        soft = soft_targets(batch, anchors, tc.steps, rows) if tc.soft_targets else None
        loss = draft_loss(logits, targets, soft, tc.soft_targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step = state["step"] = step + 1
        state["pos"] += 1
        state["last_loss"] = loss.item()
        if step == 1:
            state["first_loss"] = state["last_loss"]
        if step % 25 == 0:
            log(f"train: step {step}, {elapsed:.0f} s, lr {lr:.2e}, loss {state['last_loss']:.3f}")
        if step % VALIDATE_EVERY == 0:
            curve.append(
                {"step": step, "seconds": round(elapsed), **evaluate(head, backbone, val, tc.steps, rows, index)}
            )
            log(f"train: validation {curve[-1]}")
            save()


@torch.no_grad()
def evaluate(
    head: MTPHead,
    backbone: Backbone,
    val: list[Sequence],
    steps: int,
    rows: torch.Tensor,
    index: torch.Tensor,
    batch: int = 8,
) -> dict:
    """Teacher-forced top-1 accuracy of each draft step, and the expected accepted
    drafts per anchor (the product of step-wise correctness, summed over steps)."""
    correct, total, chain = torch.zeros(steps), 0, 0.0
    for i in range(0, len(val), batch):
        b = val[i : i + batch]
        anchors = answer_anchors(b)
        logits = unrolled_logits(head, backbone, b, anchors, steps, rows)
        targets = unrolled_targets(b, anchors, steps, index)
        valid = anchors >= 0
        run = valid.clone()
        for j, (lg, t) in enumerate(zip(logits, targets)):
            ok = (lg.argmax(-1) == t) & (t != IGNORE)
            correct[j] += (ok & valid).sum()
            run &= ok
            chain += run.sum().item()
        total += valid.sum().item()
    return {
        "acc_by_step": [round(x, 4) for x in (correct / max(total, 1)).tolist()],
        "accepted_per_anchor": round(chain / max(total, 1), 3),
    }


def save_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


# ---- the whole job (`mtp train`) ---------------------------------------------------------
def split(rows: list, val_fraction: float = 0.04) -> tuple[list, list]:
    """(train, validation): the first rows validate (the same split for head and drafter); at
    least one of each (fewer than 2 rows: a ValueError, not an empty training set)."""
    if len(rows) < 2:
        raise ValueError(f"training needs at least 2 prompts (one is held out for validation), got {len(rows)}")
    n_val = max(1, int(len(rows) * val_fraction))
    return rows[n_val:], rows[:n_val]


def check_kv_layer(kv_layer: int, num_layers: int) -> None:
    if isinstance(kv_layer, bool) or not isinstance(kv_layer, int) or not -num_layers <= kv_layer < num_layers:
        raise ValueError(
            f"--kv-layer {kv_layer} is out of range: the backbone has {num_layers} layers (0 to "
            f"{num_layers - 1}, or -{num_layers} to -1 from the end)"
        )


def check_fuse_layers(layers: tuple[int, ...], num_layers: int) -> None:
    if list(layers) != sorted(set(layers)) or any(not 0 <= i < num_layers for i in layers):
        raise ValueError(
            f"--fuse-layers {','.join(map(str, layers))}: distinct layers 0..{num_layers - 1}, in increasing order"
        )


def check_blocks(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BLOCKS:
        raise ValueError(f"--blocks {n}: the head has 1 to {MAX_BLOCKS} dense blocks")


def check_draft_vocab(size: int, vocab_size: int) -> int:
    """The draft vocabulary size to use: at least 1, at most the whole vocabulary (a larger
    request is the whole vocabulary, and the head's config says so)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"--draft-vocab {size} must be >= 1")
    return min(size, vocab_size)


# Cached answers are those of the backbone `mtp generate` runs by default: the file's own
# weights as stored, bf16 activations (older caches held our dequantized bf16 backbone's
# answers, "bfloat16", or transformers' fp32 ones: distilled again).
DISTILLED_BY = "stored"


def distilled_by(backbone) -> str:
    """The cache key of a teacher's answers (Llama's keeps the key its caches were written with)."""
    return DISTILLED_BY if backbone.family == "llama" else f"{DISTILLED_BY}:{backbone.family}"


def _prompt_line(path: str, n: int) -> str:
    """'path:line' of prompt n (0-based) of a prompts file, for an error message: data.read_jsonl's
    rows are its non-blank lines (a UTF-8 BOM dropped), so blank lines shift the count."""
    with open(path, "rb") as f:
        lines = f.read().removeprefix(b"\xef\xbb\xbf").split(b"\n")
    rows = [i for i, line in enumerate(lines, 1) if line.decode("utf-8").strip()]  # read_jsonl decoded them all
    return f"{path}:{rows[n]}" if n < len(rows) else path


def distilled_rows(
    prompts_path: str | list[str],
    work_dir: str,
    max_new_tokens: int,
    num_prompts: int,
    backbone,
    tok,
    log: Callable[[str], None] = print,
    kv_layer: int | None = None,
    fuse_layers: tuple[int, ...] = (),
) -> tuple[list[dict], list[Sequence] | None]:
    """{"task", "prompt_ids", "answer_ids"} for the first num_prompts prompts (0: all) of each
    prompts file, in the files' order: the backbone's greedy answers (backbone, tok: the model
    as `mtp generate` runs it by default, loading.load_backbone(path, None): the file's own
    weights, bf16 activations for Llama, fp32 for Gemma 3), cached in
    work_dir/distilled.jsonl (an interrupted run resumes; a cached answer is reused when its
    prompt, length cap and backbone are the same). With kv_layer also the head's features of
    each row, with the residual streams of fuse_layers (distill's; for a cached answer one
    teacher-forced pass over prompt + answer, the same bits), else None."""
    from . import data

    cfg, teacher = backbone.cfg, distilled_by(backbone)
    paths = [prompts_path] if isinstance(prompts_path, str) else list(prompts_path)
    prompts, where = [], []  # where[n]: (file, index in it) of prompt n, for error messages
    for path in paths:
        try:
            rows = data.read_jsonl(path)[: num_prompts or None]
        except OSError as e:
            raise ValueError(f"cannot read the prompts {path}: {e.strerror or e}") from None
        except ValueError as e:  # read_jsonl's: names path:line
            raise ValueError(f"cannot read the prompts: {e}") from None
        prompts += rows
        where += [(path, n) for n in range(len(rows))]
    for (path, n), p in zip(where, prompts):
        if not isinstance(p, dict) or not isinstance(p.get("prompt"), str):
            raise ValueError(
                f'{_prompt_line(path, n)}: expected JSON lines with a string "prompt" (prompt {n + 1} is not)'
            )
        try:
            p["prompt"].encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{_prompt_line(path, n)}: prompt {n + 1}: an unpaired surrogate is not text") from None
    if len(prompts) < 2:  # before any distilling: split() holds one out for validation
        raise ValueError(
            f"{', '.join(paths)}: training needs at least 2 prompts (one is held out for validation), got "
            f"{len(prompts)}" + (" (--num-prompts)" if num_prompts else "")
        )
    if max_new_tokens < 1 or max_new_tokens + 2 > cfg.max_position:
        raise ValueError(f"--max-new-tokens {max_new_tokens}: the model's context is {cfg.max_position} tokens")
    ids = []
    for (path, n), r in zip(where, prompts):
        text = tok.apply_chat_template(r["prompt"])
        room = cfg.max_position - max_new_tokens
        # A token covers at most max_token_bytes bytes: a cheap bound before tokenizing.
        nbytes = len(text.encode("utf-8"))
        bound = tok.max_token_bytes if nbytes > 1 << 18 else None  # below, tokenizing is cheaper than the bound
        if bound and nbytes > room * bound or len(i := tok.prompt_prefix + tok.encode(text)) > room or not i:
            raise ValueError(
                f"{_prompt_line(path, n)}: prompt {n + 1} plus --max-new-tokens {max_new_tokens} does not "
                f"fit the model's context of {cfg.max_position} tokens (or it is empty)"
            )
        ids.append(i)
    os.makedirs(work_dir, exist_ok=True)
    cached = os.path.join(work_dir, "distilled.jsonl")
    position = {tuple(i): n for n, i in enumerate(ids)}
    done = {
        position[tuple(r["prompt_ids"])]: r["answer_ids"]
        for r in (data.read_jsonl(cached) if os.path.isfile(cached) else [])
        if _cached_row_ok(r, cfg.vocab_size)
        and tuple(r["prompt_ids"]) in position
        and r.get("max_new_tokens") == max_new_tokens
        and r.get("distilled_by") == teacher
    }
    log(f"distill: {len(done)} of {len(ids)} answers found in {cached}")
    seqs: list[Sequence | None] = [None] * len(ids)
    todo = [i for i in range(len(ids)) if i not in done]
    if todo:

        def append(new: dict[int, Sequence]) -> None:
            with open(cached, "a", encoding="utf-8") as f:
                for n, s in new.items():
                    i = todo[n]
                    done[i] = s.tokens[s.prompt_len :].tolist()
                    f.write(
                        json.dumps(
                            {
                                "task": prompts[i].get("task", ""),
                                "prompt_ids": ids[i],
                                "answer_ids": done[i],
                                "max_new_tokens": max_new_tokens,
                                "distilled_by": teacher,
                            }
                        )
                        + "\n"
                    )
                    seqs[i] = s if kv_layer is not None else None

        distill(
            backbone,
            [ids[i] for i in todo],
            max_new_tokens,
            tuple(cfg.eos_token_ids),
            cfg.num_layers - 1 if kv_layer is None else kv_layer,
            on_batch=append,
            log=log,
            fuse_layers=fuse_layers if kv_layer is not None else (),
        )
    rows = [
        {"task": p.get("task", ""), "prompt_ids": i, "answer_ids": done[n]}
        for n, (p, i) in enumerate(zip(prompts, ids))
    ]
    if kv_layer is None:
        return rows, None
    for n, r in enumerate(rows):
        if seqs[n] is None:
            seqs[n] = sequence_from_backbone(
                backbone, r["prompt_ids"] + r["answer_ids"], len(r["prompt_ids"]), kv_layer, fuse_layers
            )
    return rows, seqs  # type: ignore[return-value]


def _cached_row_ok(r, vocab_size: int) -> bool:
    """A cached row is reused only when it is well formed (a damaged cache line is distilled again)."""

    def ids(x):
        return isinstance(x, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in x
        )

    return isinstance(r, dict) and ids(r.get("prompt_ids")) and ids(r.get("answer_ids"))


def run(
    prompts_path: str | list[str],
    out_dir: str,
    work_dir: str,
    tc: TrainConfig,
    draft_vocab_size: int = 8192,
    kv_layer: int = -1,
    max_new_tokens: int = 96,
    num_prompts: int = 0,
    log: Callable[[str], None] = print,
    model: str | None = None,
    fuse_layers: tuple[int, ...] = (),
    num_blocks: int = 1,
) -> dict:
    """distill with features (answers cached in work_dir) -> train -> save the head to out_dir.
    model: the backbone's file (None: the default SmolLM2; a Gemma 3 GGUF trains its head).
    fuse_layers: backbone layers whose residual streams the head also reads (HeadConfig).
    num_blocks: the head's dense blocks (each starts as the layer it reads, init_from_backbone)."""
    from .models import loading

    check_blocks(num_blocks)  # before any work
    torch.manual_seed(tc.seed)
    t0 = time.perf_counter()
    # The teacher: the backbone as `mtp generate` runs it by default (the file's own weights).
    cfg, teacher, tok, _ = loading.load_backbone(model, None, log)
    check_kv_layer(kv_layer, cfg.num_layers)  # before any work: the head must read a layer that exists
    check_global_layer(kv_layer, cfg, f"--kv-layer {kv_layer} reads layer")
    check_fuse_layers(fuse_layers, cfg.num_layers)
    draft_vocab_size = check_draft_vocab(draft_vocab_size, cfg.vocab_size)
    rows, seqs = distilled_rows(
        prompts_path,
        work_dir,
        max_new_tokens,
        num_prompts,
        teacher,
        tok,
        log,
        kv_layer=kv_layer,
        fuse_layers=fuse_layers,
    )
    t_distill = time.perf_counter() - t0
    split(rows)  # at least 2 rows, else a clear error here
    del teacher
    # The embedding and LM head rows of the training graph, and the head's first weights: fp32.
    backbone = loading.load_backbone(model, "float32", log)[1]
    (train_rows, _), (train_seqs, val_seqs) = split(rows), split(seqs)
    head = MTPHead(
        HeadConfig.for_backbone(
            cfg,
            kv_layer=kv_layer,
            draft_vocab_size=draft_vocab_size,
            trained=True,
            fuse_layers=tuple(fuse_layers),
            num_blocks=num_blocks,
        )
    )
    head.set_draft_vocab(
        draft_vocabulary(
            [r["answer_ids"] for r in train_rows], draft_vocab_size, cfg.vocab_size, always=tuple(cfg.eos_token_ids)
        )
    )
    init_from_backbone(head, backbone)
    result = train_head(
        head, backbone, train_seqs, val_seqs, tc, log=log, checkpoint=os.path.join(work_dir, "head.ckpt")
    )
    head.save(out_dir, dtype=torch.bfloat16)  # ships in the package: half the bytes
    result.update(
        prompts=[prompts_path] if isinstance(prompts_path, str) else list(prompts_path),
        num_prompts=num_prompts,
        distilled_by=distilled_by(backbone),
        distill_seconds=round(t_distill),
        train_config=dataclasses.asdict(tc),
        sequences=len(train_seqs),
        val_sequences=len(val_seqs),
        draft_vocab_size=draft_vocab_size,
        kv_layer=kv_layer,
        fuse_layers=list(fuse_layers),
        head_parameters=sum(p.numel() for p in head.parameters()),
    )
    save_json(os.path.join(out_dir, "training.json"), result)
    log(f"train: head saved to {out_dir} ({result['head_parameters']} parameters)")
    return result

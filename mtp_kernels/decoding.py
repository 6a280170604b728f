"""Greedy and speculative (frozen-MTP) generation, batch >= 1, bit-exact to each other.

Speculative step, per request b: the head drafts K tokens after the backbone's pending
token t0; the backbone runs [t0, d1..dK] in one pass (K+1 positions); `mtp.verify`
accepts the longest prefix equal to the backbone's own greedy choices and adds the
backbone's token at the first mismatch (or the bonus token after a full match). The cache
keeps t0 and the accepted drafts: its length is set back past the rejected ones.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import torch

from .models.head import MTPHead
from .models.llama import Backbone, KVCache


@dataclasses.dataclass
class Generation:
    tokens: list[int]          # generated ids (ending with EOS when one was produced)
    passes: int = 0            # backbone forward passes after the prefill while it was running
    seconds: float = 0.0       # decode time (prefill and loading excluded)
    prefill_seconds: float = 0.0
    drafted: list[int] = dataclasses.field(default_factory=list)   # drafts offered at position j
    accepted: list[int] = dataclasses.field(default_factory=list)  # drafts accepted at position j

    @property
    def tokens_per_pass(self) -> float:
        """tau: tokens committed per backbone pass (the first token comes from the prefill)."""
        return (len(self.tokens) - 1) / self.passes if self.passes else 0.0


def _prefill(model: Backbone, cache: KVCache, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs each prompt into its own cache row; returns the last hidden states [B, H] and
    the first generated tokens [B]."""
    hidden = []
    for b, ids in enumerate(prompts):
        if not ids:
            raise ValueError(f"prompt {b} is empty")
        h = model(torch.tensor([ids]), cache.select(b))
        hidden.append(h[0, -1])
    hidden = torch.stack(hidden)
    return hidden, model.logits(hidden).argmax(-1)


def _check_prompts(model: Backbone, prompts: list[list[int]], max_new_tokens: int, extra: int) -> int:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    need = max(len(p) for p in prompts) + max_new_tokens + extra
    if need > model.cfg.max_position:
        raise ValueError(f"the longest prompt ({max(len(p) for p in prompts)} tokens) plus max_new_tokens "
                         f"({max_new_tokens}) does not fit the model's context of {model.cfg.max_position} tokens")
    return need


def generate(model: Backbone, prompts: list[list[int]], max_new_tokens: int, head: Optional[MTPHead] = None,
             k: int = 3, eos_token_ids: tuple[int, ...] = (),
             on_tokens: Optional[Callable[[int, list[int]], None]] = None) -> list[Generation]:
    """Greedy generation of every prompt (token id lists); speculative with `head` and K
    drafts per pass when a head is given. on_tokens(b, ids) sees each request's newly
    committed tokens as they come (for streaming)."""
    if head is not None and k < 1:
        raise ValueError(f"k (drafts per pass) must be >= 1, got {k}")
    K = k if head is not None else 0
    B = len(prompts)
    cache = model.new_cache(B, _check_prompts(model, prompts, max_new_tokens, K + 1))
    eos = set(eos_token_ids)
    t0 = time.perf_counter()
    hidden, token = _prefill(model, cache, prompts)
    out = [Generation(tokens=[], drafted=[0] * K, accepted=[0] * K) for _ in range(B)]
    done = [False] * B

    def commit(b: int, ids: list[int]) -> None:
        room = max_new_tokens - len(out[b].tokens)
        ids = ids[:room]
        for i, t in enumerate(ids):
            if t in eos:
                ids = ids[:i + 1]
                break
        out[b].tokens.extend(ids)
        done[b] = len(out[b].tokens) >= max_new_tokens or (bool(ids) and ids[-1] in eos)
        if on_tokens and ids:
            on_tokens(b, ids)

    for b in range(B):
        commit(b, [int(token[b])])
    t1 = time.perf_counter()
    while not all(done):
        active = torch.tensor([not d for d in done])
        for b in range(B):
            out[b].passes += not done[b]
        start = cache.lens.clone()
        if head is None:
            hidden = model(token[:, None], cache)[:, 0]
            cache.lens.copy_(torch.where(active, cache.lens, start))  # finished requests stay put
            token = model.logits(hidden).argmax(-1)
            for b in range(B):
                if not done[b]:
                    commit(b, [int(token[b])])
            continue
        drafts = head.draft(model, cache, hidden, token, K)
        # Drafts beyond what a request may still commit are not offered.
        num = torch.tensor([0 if done[b] else min(K, max_new_tokens - len(out[b].tokens) - 1) for b in range(B)])
        h = model(torch.cat([token[:, None], drafts], dim=1), cache)
        accepted, tokens = torch.ops.mtp.verify(drafts, model.logits(h), num)
        # Keep t0 and the accepted drafts; the rejected drafts' K/V are dropped by length.
        cache.lens.copy_(torch.where(active, start + 1 + accepted, start))
        hidden = h[torch.arange(B), accepted]
        token = tokens[torch.arange(B), accepted]
        for b in range(B):
            if done[b]:
                continue
            n = int(accepted[b])
            for j in range(int(num[b])):
                out[b].drafted[j] += 1
                out[b].accepted[j] += j < n
            commit(b, tokens[b, :n + 1].tolist())
    t2 = time.perf_counter()
    for g in out:
        g.seconds, g.prefill_seconds = t2 - t1, t1 - t0
    return out

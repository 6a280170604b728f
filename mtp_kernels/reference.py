"""Pure-torch oracles: the executable specification of every ``torch.ops.mtp`` op.

Slow and simple on purpose; the kernels are tested against these functions.
"""
from __future__ import annotations

from typing import Optional

import torch


def accept_prefix(draft_tokens: torch.Tensor, target_tokens: torch.Tensor,
                  num_drafts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """accepted[b] = the longest n <= num_drafts[b] (default K) such that
    draft_tokens[b, t] == target_tokens[b, t] for every t < n.

    draft_tokens [B, K] int32|int64; target_tokens [B, K+1] or [B, K]; the result has
    draft_tokens' dtype.
    """
    B, K = draft_tokens.shape
    if num_drafts is None:
        num_drafts = torch.full((B,), K, dtype=torch.long, device=draft_tokens.device)
    positions = torch.arange(K, device=draft_tokens.device)
    match = (draft_tokens.long() == target_tokens[:, :K].long()) & (positions < num_drafts.long()[:, None])
    return match.long().cumprod(dim=1).sum(dim=1).to(draft_tokens.dtype)


def verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
           num_drafts: Optional[torch.Tensor] = None, pad_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification of K drafted tokens against the backbone's logits.

    draft_tokens [B, K] int32|int64; target_logits [B, K+1, V] fp32|bf16|fp16, any strides;
    num_drafts [B] in [0, K] (default K): how many of request b's drafts are real.
    The backbone's token at position t is argmax(target_logits[b, t]) with torch.argmax's
    rules (the first NaN wins, else the first maximal index).
    Returns accepted [B] (longest matching prefix, <= num_drafts[b]) and out_tokens [B, K+1]:
    the accepted drafts, then the backbone's token at position accepted[b] (the correction,
    or the bonus token after a full match), then pad_id; both in draft_tokens' dtype.
    A draft id outside [0, V) never matches.
    """
    B, K = draft_tokens.shape
    target = target_logits.argmax(dim=-1)  # [B, K+1] int64
    accepted = accept_prefix(draft_tokens, target, num_drafts).long()
    positions = torch.arange(K + 1, device=draft_tokens.device)
    drafts_padded = torch.cat([draft_tokens.long(), draft_tokens.new_zeros((B, 1), dtype=torch.long)], dim=1)
    out = torch.where(positions < accepted[:, None], drafts_padded, torch.full_like(drafts_padded, pad_id))
    out = torch.where(positions == accepted[:, None], target, out)
    return accepted.to(draft_tokens.dtype), out.to(draft_tokens.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), x [..., K] fp32|bf16, weight [N, K] fp32|bf16, bias [N];
    products summed in fp32 (here: fp64, then rounded), result in x's dtype.

    The kernel's promise beyond this value: each output row has the same bits whatever
    the number of rows in the call (shape invariance), which torch's fp32 F.linear lacks.
    """
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


def head_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
                   k_local: Optional[torch.Tensor] = None, v_local: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, causal: bool = False) -> torch.Tensor:
    """Decode attention of T queries per request over its KV cache (fp64 math, explicit masks).

    q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D] (any strides), Hq a multiple of Hkv
    (query head h reads kv head h // (Hq // Hkv)); cache_lens [B]: request b's first
    cache_lens[b] keys are its cache. Query t of request b sees cache keys [0, cache_lens[b])
    or, with causal=True, [0, cache_lens[b] - T + t] (the queries are the last T cached
    positions; cache_lens[b] >= T). An optional local segment k_local, v_local [B, Hkv, S, D]
    (the MTP head's own draft positions) is attended causally, the T queries being its last T
    positions: query t also sees local entries s <= S - T + t (s <= t when S == T; a single
    query sees all S). scale defaults to
    1/sqrt(D). A row with no visible key gives zeros. Returns [B, T, Hq, D] in q's dtype.
    """
    B, T, Hq, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    qf = q.double().permute(0, 2, 1, 3)  # [B, Hq, T, D]
    t = torch.arange(T)
    lens = cache_lens.long()[:, None]
    limit = lens - T + t[None, :] + 1 if causal else lens.expand(B, T)  # [B, T]
    keys = [k_cache.double().repeat_interleave(G, dim=1)]
    vals = [v_cache.double().repeat_interleave(G, dim=1)]
    masks = [torch.arange(L)[None, None, :] < limit[:, :, None]]  # [B, T, L]
    if k_local is not None:
        S = k_local.shape[2]
        keys.append(k_local.double().repeat_interleave(G, dim=1))
        vals.append(v_local.double().repeat_interleave(G, dim=1))
        masks.append((torch.arange(S)[None, :] <= S - T + t[:, None]).expand(B, T, S))
    k, v, mask = torch.cat(keys, dim=2), torch.cat(vals, dim=2), torch.cat(masks, dim=2)[:, None]  # mask [B,1,T,L+S]
    scores = (qf @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).min)  # all-masked rows: finite
    p = torch.exp(scores - m) * mask
    den = p.sum(dim=-1, keepdim=True)
    out = torch.where(den > 0, (p @ v) / den.clamp_min(1e-300), torch.zeros((), dtype=torch.float64))
    return out.permute(0, 2, 1, 3).to(q.dtype)


def cache_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 cache_lens: torch.Tensor) -> None:
    """Writes k_new, v_new [B, T, Hkv, D] into the cache views [B, Hkv, L, D] in place, request b's
    at positions cache_lens[b] .. cache_lens[b] + T - 1. Raises (writing nothing) when any
    request would pass the capacity L. cache_lens is not changed: the caller advances it, and
    rolls rejected drafts back by lowering it.
    """
    T, L = k_new.shape[1], k_cache.shape[2]
    lens = cache_lens.long().tolist()
    for b, n in enumerate(lens):
        if n < 0 or n + T > L:
            raise ValueError(f"cache_append: request {b} would pass the cache capacity: {n} + {T} > L = {L}")
    for b, n in enumerate(lens):
        k_cache[b, :, n:n + T] = k_new[b].transpose(0, 1)
        v_cache[b, :, n:n + T] = v_new[b].transpose(0, 1)

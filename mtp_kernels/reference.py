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

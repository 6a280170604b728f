"""Typed wrappers of the ``torch.ops.mtp`` operators and their fake (meta) kernels.

The fake kernels give torch.compile / FakeTensor the output shapes and dtypes without
running anything; the contracts themselves are in ``reference.py``.
"""
from __future__ import annotations

from typing import Optional

import torch


def verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
           num_drafts: Optional[torch.Tensor] = None, pad_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification; see ``reference.verify`` for the contract."""
    return torch.ops.mtp.verify.default(draft_tokens, target_logits, num_drafts, pad_id)


def accept_prefix(draft_tokens: torch.Tensor, target_tokens: torch.Tensor,
                  num_drafts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Accepted prefix lengths from token ids already chosen; see ``reference.accept_prefix``."""
    return torch.ops.mtp.accept_prefix.default(draft_tokens, target_tokens, num_drafts)


def _check_same_device(op, **tensors):
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    torch._check(all(d == first for d in devices.values()),
                 lambda: f"{op}: all tensors must be on one device, got {devices}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Shape-invariant ``x @ weight.T + bias``; see ``reference.linear``."""
    return torch.ops.mtp.linear.default(x, weight, bias)


@torch.library.register_fake("mtp::linear")
def _linear_fake(x, weight, bias=None):
    _check_same_device("mtp.linear", x=x, weight=weight, bias=bias)
    torch._check(weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[1],
                 lambda: f"mtp.linear: x [..., K] and weight [N, K] do not fit: {tuple(x.shape)}, {tuple(weight.shape)}")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("mtp::verify")
def _verify_fake(draft_tokens, target_logits, num_drafts=None, pad_id=-1):
    _check_same_device("mtp.verify", draft_tokens=draft_tokens, target_logits=target_logits, num_drafts=num_drafts)
    torch._check(draft_tokens.dim() == 2, lambda: "mtp.verify: draft_tokens must be 2-D [B, K]")
    torch._check(target_logits.dim() == 3, lambda: "mtp.verify: target_logits must be 3-D [B, K+1, V]")
    B, K = draft_tokens.shape
    return draft_tokens.new_empty((B,)), draft_tokens.new_empty((B, K + 1))


@torch.library.register_fake("mtp::accept_prefix")
def _accept_prefix_fake(draft_tokens, target_tokens, num_drafts=None):
    _check_same_device("mtp.accept_prefix", draft_tokens=draft_tokens, target_tokens=target_tokens,
                       num_drafts=num_drafts)
    torch._check(draft_tokens.dim() == 2, lambda: "mtp.accept_prefix: draft_tokens must be 2-D [B, K]")
    return draft_tokens.new_empty((draft_tokens.shape[0],))

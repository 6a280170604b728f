"""Argument checks of the Python launchers (Triton), with the messages of the C++ bindings
(csrc/cpu/checks.h): the op, the argument, what was expected and what came, so every
backend fails the same way on the same bad input."""
from __future__ import annotations

from typing import Optional

import torch

from .ops import _check_same_device

# c10's names of the scalar types, as TORCH_CHECK prints them.
_C10_NAMES = {torch.int32: "Int", torch.int64: "Long", torch.float32: "Float", torch.bfloat16: "BFloat16",
              torch.float16: "Half", torch.float64: "Double", torch.int16: "Short", torch.int8: "Char",
              torch.uint8: "Byte", torch.bool: "Bool"}
ID_TYPES = (torch.int32, torch.int64)
FLOAT_TYPES = (torch.float32, torch.bfloat16, torch.float16)
LINEAR_TYPES = (torch.float32, torch.bfloat16)


def _name(dtype):
    return _C10_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def check(ok: bool, op: str, message: str):
    if not ok:
        raise RuntimeError(f"{op}: {message}")


def check_dtype(op, name, t, ok):
    check(t.dtype in ok, op, f"{name} must be {' or '.join(_name(d) for d in ok)}, got {_name(t.dtype)}")


def check_dim(op, name, t, dim, shape):
    check(t.dim() == dim, op, f"{name} must be {dim}-D {shape}, got shape {list(t.shape)}")


def check_size(op, name, t, d, want, what):
    check(t.size(d) == want, op,
          f"{name}.size({d}) must equal {what} = {want}, got {t.size(d)} (shape {list(t.shape)})")


def check_drafts(op, draft):
    check_dtype(op, "draft_tokens", draft, ID_TYPES)
    check_dim(op, "draft_tokens", draft, 2, "[B, K]")


def check_verify_inputs(op, draft, logits, num_drafts=None):
    _check_same_device(op, "draft_tokens", draft, target_logits=logits, num_drafts=num_drafts)
    check_drafts(op, draft)
    check_dtype(op, "target_logits", logits, FLOAT_TYPES)
    check_dim(op, "target_logits", logits, 3, "[B, K+1, V]")
    B, K = draft.shape
    check_size(op, "target_logits", logits, 0, B, "B (draft_tokens.size(0))")
    check_size(op, "target_logits", logits, 1, K + 1, "K+1 (draft_tokens.size(1) + 1)")
    check(logits.size(2) > 0, op, "target_logits must have a vocabulary of V >= 1 entries, got V = 0")


def check_accept_inputs(op, draft, target, num_drafts=None):
    _check_same_device(op, "draft_tokens", draft, target_tokens=target, num_drafts=num_drafts)
    check_drafts(op, draft)
    check_dtype(op, "target_tokens", target, ID_TYPES)
    check_dim(op, "target_tokens", target, 2, "[B, K+1] or [B, K]")
    B, K = draft.shape
    check_size(op, "target_tokens", target, 0, B, "B (draft_tokens.size(0))")
    check(target.size(1) in (K + 1, K), op,
          f"target_tokens.size(1) must be K+1 = {K + 1} or K = {K}, got {target.size(1)}")


def checked_num_drafts(op, num_drafts: Optional[torch.Tensor], B: int, K: int) -> Optional[torch.Tensor]:
    """num_drafts as a contiguous int64 tensor on its device (None when absent). The values
    are checked on the host (one sync on a GPU), except while a CUDA graph is being captured,
    where no sync is allowed: the kernels clamp to [0, K], so nothing is read out of range."""
    if num_drafts is None:
        return None
    check_dtype(op, "num_drafts", num_drafts, ID_TYPES)
    check_dim(op, "num_drafts", num_drafts, 1, "[B]")
    check_size(op, "num_drafts", num_drafts, 0, B, "B (draft_tokens.size(0))")
    capturing = num_drafts.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and B > 0:
        bad = ((num_drafts < 0) | (num_drafts > K)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            check(False, op, f"num_drafts must lie in [0, K] = [0, {K}], got num_drafts[{b}] = {int(num_drafts[b])}")
    return num_drafts.to(torch.int64).contiguous()


def check_linear_inputs(op, x, weight, bias=None):
    _check_same_device(op, "x", x, weight=weight, bias=bias)
    check_dtype(op, "x", x, LINEAR_TYPES)
    check_dtype(op, "weight", weight, LINEAR_TYPES)
    check(x.dim() >= 1, op, "x must have at least 1 dimension [..., K], got a scalar")
    check_dim(op, "weight", weight, 2, "[N, K]")
    K, N = x.shape[-1], weight.shape[0]
    check_size(op, "weight", weight, 1, K, "K (x.size(-1))")
    check(weight.stride(1) == 1 or K <= 1, op,
          f"weight rows must be contiguous (stride(1) == 1), got strides {list(weight.stride())}; "
          "it is read in place, call .contiguous() once when loading")
    if bias is not None:
        check_dim(op, "bias", bias, 1, "[N]")
        check_size(op, "bias", bias, 0, N, "N (weight.size(0))")

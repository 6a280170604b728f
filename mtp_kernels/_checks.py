"""Argument checks of the Python launchers (Triton), with the messages of the C++ bindings
(csrc/torch/adapter.h): the op, the argument, what was expected and what came, so every
backend fails the same way on the same bad input."""

from __future__ import annotations

import math
import struct
from typing import Optional

import torch

from .ops import _check_same_device
from .quant import q8_blocks

# c10's names of the scalar types, as TORCH_CHECK prints them.
_C10_NAMES = {
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float32: "Float",
    torch.bfloat16: "BFloat16",
    torch.float16: "Half",
    torch.float64: "Double",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}
ID_TYPES = (torch.int32, torch.int64)
FLOAT_TYPES = (torch.float32, torch.bfloat16, torch.float16)
LINEAR_TYPES = (torch.float32, torch.bfloat16)


def _name(dtype):
    return _C10_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def check(ok: bool, op: str, message: str):
    if not ok:
        raise RuntimeError(f"{op}: {message}")


# ---- scalars at the kernels' width (op_args.h's float_arg_error) -------------------------
def _as_float32(v: float) -> float:
    """v narrowed to float32 as C's (float) cast does: inf when it overflows."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _float_arg(op, name, v, what, nonnegative):
    f = _as_float32(float(v))
    ok = math.isfinite(f) and (not nonnegative or f >= 0)
    check(ok, op, f"{name} must be {what}, got {v:g}" + (" (inf as float32)" if math.isfinite(v) else ""))


def check_eps(op, eps):
    _float_arg(op, "eps", eps, "a finite number >= 0", True)


def check_scale(op, scale):
    """head_attention's scale (None: 1/sqrt(D)), finite as the float32 the kernels use."""
    if scale is not None:
        _float_arg(op, "scale", scale, "finite", False)


# ---- aliasing (op_args.h's aliasing_error): what an op writes has no overlapping elements
# and shares no byte range with any other argument ----------------------------------------
def _byte_range(t: torch.Tensor):
    if t.numel() == 0:
        return (0, 0)
    lo = t.data_ptr()
    extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return (lo, lo + (extent + 1) * t.element_size())


def _self_overlap(t: torch.Tensor) -> bool:
    span = 1
    for n, st in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if st < span:
            return True
        span += (n - 1) * st
    return False


def check_written(op, why, outputs: dict, inputs: dict, list_name=None):
    """Outputs written in place: none overlaps itself or another argument. An input may be a
    list of tensors, named in a message by list_name(name, k) (default name[k]), formatted
    only on an error."""
    for name, t in outputs.items():
        check(
            not _self_overlap(t),
            op,
            f"{name} must not have overlapping elements ({why}), got strides "
            f"{list(t.stride())} for sizes {list(t.shape)}",
        )
    others = list(outputs.items())
    for n, t in inputs.items():
        if isinstance(t, (list, tuple)):
            others += [((n, k), u) for k, u in enumerate(t) if u is not None]
        elif t is not None:
            others.append((n, t))
    for i, (name, t) in enumerate(outputs.items()):
        a0, a1 = _byte_range(t)
        for j, (other, u) in enumerate(others):
            if j == i or (j < i and j < len(outputs)):
                continue
            b0, b1 = _byte_range(u)
            if not (a0 == a1 or b0 == b1 or a1 <= b0 or b1 <= a0):
                label = other
                if isinstance(other, tuple):
                    label = list_name(*other) if list_name else f"{other[0]}[{other[1]}]"
                check(
                    False,
                    op,
                    f"{name} and {label} overlap in memory: {name} "
                    "is written in place and must share no memory with another argument",
                )


def check_dtype(op, name, t, ok):
    check(t.dtype in ok, op, f"{name} must be {' or '.join(_name(d) for d in ok)}, got {_name(t.dtype)}")


def check_dim(op, name, t, dim, shape):
    check(t.dim() == dim, op, f"{name} must be {dim}-D {shape}, got shape {list(t.shape)}")


def check_size(op, name, t, d, want, what):
    check(
        t.size(d) == want, op, f"{name}.size({d}) must equal {what} = {want}, got {t.size(d)} (shape {list(t.shape)})"
    )


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
    check(
        target.size(1) in (K + 1, K),
        op,
        f"target_tokens.size(1) must be K+1 = {K + 1} or K = {K}, got {target.size(1)}",
    )


def checked_counts(op, name, n: torch.Tensor, B: int, b_what: str, hi: int, hi_what: str) -> Optional[list]:
    """A [B] int32/int64 vector of counts in [0, hi] (adapter.h's checked_counts). The values
    are checked on the host (one sync on a GPU) and returned as a list, except while a CUDA
    graph is being captured, where no sync is allowed (None then: the kernels guard instead)."""
    check_dtype(op, name, n, ID_TYPES)
    check_dim(op, name, n, 1, "[B]")
    check_size(op, name, n, 0, B, b_what)
    if n.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    values = n.tolist()
    for b, x in enumerate(values):
        check(0 <= x <= hi, op, f"{name} must lie in [0, {hi_what}] = [0, {hi}], got {name}[{b}] = {x}")
    return values


def checked_num_drafts(op, num_drafts: Optional[torch.Tensor], B: int, K: int) -> Optional[torch.Tensor]:
    """num_drafts as a contiguous int64 tensor on its device (None when absent), its values
    checked (checked_counts); under CUDA-graph capture the kernels clamp to [0, K]."""
    if num_drafts is None:
        return None
    checked_counts(op, "num_drafts", num_drafts, B, "B (draft_tokens.size(0))", K, "K")
    return num_drafts.to(torch.int64).contiguous()


# ---- verify_ragged (op_args.h's ragged_* checks, csrc/torch/adapter.h's check_ragged_inputs) ---
def check_ragged_inputs(op, draft, cu, logits, pad_id, max_num_drafts=None):
    _check_same_device(op, "draft_token_ids", draft, cu_num_draft_tokens=cu, target_logits=logits)
    check_dtype(op, "draft_token_ids", draft, ID_TYPES)
    check_dim(op, "draft_token_ids", draft, 1, "[N]")
    check_dtype(op, "cu_num_draft_tokens", cu, ID_TYPES)
    check_dim(op, "cu_num_draft_tokens", cu, 1, "[B]")
    check_dtype(op, "target_logits", logits, FLOAT_TYPES)
    check_dim(op, "target_logits", logits, 2, "[N + B, V]")
    N, B = draft.shape[0], cu.shape[0]
    check(
        logits.shape[0] == N + B,
        op,
        f"target_logits.size(0) must equal N + B (N = {N} drafts plus one bonus row per request, B = {B}) = "
        f"{N + B}, got {logits.shape[0]}",
    )
    check(logits.size(1) > 0, op, "target_logits must have a vocabulary of V >= 1 entries, got V = 0")
    if max_num_drafts is not None:
        ragged_cap(op, "max_num_drafts", max_num_drafts, None)
    check(
        draft.dtype != torch.int32 or -(2**31) <= pad_id < 2**31,
        op,
        f"pad_id must fit draft_token_ids' dtype int32, [-2147483648, 2147483647], got {pad_id}",
    )


def ragged_counts(op, cu: list, N: int) -> list:
    """K_b from cu's values: non-decreasing from 0 and ending at N."""
    counts, prev = [], 0
    for b, c in enumerate(cu):
        if c < prev:
            got = (
                f"cu_num_draft_tokens[0] = {c} < 0"
                if b == 0
                else (f"cu_num_draft_tokens[{b}] = {c} < cu_num_draft_tokens[{b - 1}] = {prev}")
            )
            check(
                False,
                op,
                f"cu_num_draft_tokens must hold non-decreasing inclusive cumulative counts, got {got}: "
                f"request {b} would have {c - prev} drafts",
            )
        check(
            c <= N,
            op,
            f"cu_num_draft_tokens must end at N (draft_token_ids.size(0)) = {N}, got cu_num_draft_tokens[{b}] = {c} "
            f"> N (request {b})",
        )
        counts.append(c - prev)
        prev = c
    got = f"cu_num_draft_tokens[{len(cu) - 1}] = {prev}" if cu else "no requests (B = 0 holds no drafts)"
    check(prev == N, op, f"cu_num_draft_tokens must end at N (draft_token_ids.size(0)) = {N}, got {got}")
    return counts


def ragged_cap(op, name: str, cap: int, counts: Optional[list]):
    check(cap >= 0, op, f"{name} must be >= 0, got {cap}")
    check(cap < 2**63 - 1, op, f"{name} = {cap} is too large ({name} + 1 overflows int64)")
    for b, k in enumerate(counts or []):
        prev = f"cu_num_draft_tokens[{b - 1}]" if b else "0"
        check(
            k <= cap,
            op,
            f"{name} = {cap} is smaller than request {b}'s {k} drafts (cu_num_draft_tokens[{b}] - {prev})",
        )


def checked_ragged_width(op, cu: torch.Tensor, N: int, max_num_drafts: Optional[int]) -> int:
    """W: max_num_drafts + 1, or the widest request + 1. cu's values are read and checked on
    the host (one sync on a GPU), except while a CUDA graph is captured: max_num_drafts is
    needed then, and the kernels clamp (triton.ragged_device_layout)."""
    values = _host_values(cu)
    if values is None:
        check(
            max_num_drafts is not None,
            op,
            "max_num_drafts is needed while a CUDA graph is captured (the width would need "
            "cu_num_draft_tokens's values on the host)",
        )
        return max_num_drafts + 1
    counts = ragged_counts(op, values, N)
    if max_num_drafts is not None:
        ragged_cap(op, "max_num_drafts", max_num_drafts, counts)
        return max_num_drafts + 1
    return max(counts, default=0) + 1


GGUF_CPU_ONLY = "GGUF block-type weights (gguf_type) run on the CPU only: call it on CPU tensors"
INT8_CPU_ONLY = (
    "int8 weights run on the CPU only (no GPU kernel for Q8 blocks yet): call it on CPU tensors, or "
    "dequantize (mtp_kernels.dequantize_q8) for the GPU"
)


def check_linear_inputs(op, x, weight, bias=None, weight_scale=None, quantize_x=False):
    _check_same_device(op, "x", x, weight=weight, bias=bias, weight_scale=weight_scale)
    check_dtype(op, "x", x, LINEAR_TYPES)
    check_dtype(op, "weight", weight, LINEAR_TYPES + (torch.int8,))
    check(x.dim() >= 1, op, "x must have at least 1 dimension [..., K], got a scalar")
    check_dim(op, "weight", weight, 2, "[N, K]")
    K, N = x.shape[-1], weight.shape[0]
    check_size(op, "weight", weight, 1, K, "K (x.size(-1))")
    check(
        weight.stride(1) == 1 or K <= 1,
        op,
        f"weight rows must be contiguous (stride(1) == 1), got strides {list(weight.stride())}; "
        "it is read in place, call .contiguous() once when loading",
    )
    check_weight_scale(op, weight, weight_scale)
    # adapter.h's check_quantize_x
    check(
        not quantize_x or weight.dtype == torch.int8,
        op,
        f"quantize_x=True needs an int8 weight with weight_scale (mtp_kernels.quantize_q8), got a {_name(weight.dtype)} weight",  # noqa: E501
    )
    if bias is not None:
        check_dim(op, "bias", bias, 1, "[N]")
        check_size(op, "bias", bias, 0, N, "N (weight.size(0))")


def check_weight_scale(op, weight, scale):
    # adapter.h's check_weight_scale: an int8 weight takes fp32 [N, ceil(K/32)] scales, a float one none.
    N, K = weight.shape
    blocks = q8_blocks(K)
    if weight.dtype != torch.int8:
        check(
            scale is None,
            op,
            f"weight_scale goes with an int8 weight only (Q8 blocks), got a {_name(weight.dtype)} weight",
        )
        return
    check(
        scale is not None,
        op,
        f"an int8 weight needs weight_scale, Float [N, ceil(K/32)] = [{N}, {blocks}] "
        "(one scale per block of 32 along K), got None",
    )
    check_dtype(op, "weight_scale", scale, (torch.float32,))
    check_dim(op, "weight_scale", scale, 2, "[N, ceil(K/32)]")
    check_size(op, "weight_scale", scale, 0, N, "N (weight.size(0))")
    check_size(op, "weight_scale", scale, 1, blocks, "ceil(K/32) (blocks of 32 along K)")
    check(
        scale.stride(1) == 1 or blocks <= 1,
        op,
        f"weight_scale rows must be contiguous (stride 1 along the blocks), got strides {list(scale.stride())}; "
        "it is read in place, make it contiguous once when loading",
    )


def _check_caches(op, k, v, ref_name, ref):
    check_dim(op, "k_cache", k, 4, "[B, Hkv, L, D]")
    check_dim(op, "v_cache", v, 4, "[B, Hkv, L, D]")
    check_same_dtype(op, "k_cache", k, ref_name, ref)
    check_same_dtype(op, "v_cache", v, ref_name, ref)
    check(v.shape == k.shape, op, f"v_cache must have k_cache's shape {list(k.shape)}, got {list(v.shape)}")


def check_same_dtype(op, name, t, ref_name, ref):
    check(t.dtype == ref.dtype, op, f"{name} must have {ref_name}'s dtype {_name(ref.dtype)}, got {_name(t.dtype)}")


def check_window(op, window, has_local):
    """head_attention's window (op_args.h's window_error): None or 0 (none), else > 0; no local segment."""
    if window is None:
        return
    check(
        window >= 0,
        op,
        f"window must be >= 0 (0: no window; else how many of the latest keys a query sees), got window = {window}",
    )
    check(
        window == 0 or not has_local, op, f"window = {window} does not combine with a local segment (k_local / v_local)"
    )


def check_attention_inputs(
    op, q, k, v, lens, k_local=None, v_local=None, causal=False, scale=None, window=None
) -> Optional[list]:
    """mtp.head_attention's arguments (adapter.h's attention_args + cache_lens, same order and messages);
    returns the cache lengths on the host (None under CUDA-graph capture)."""
    _check_same_device(op, "q", q, k_cache=k, v_cache=v, cache_lens=lens, k_local=k_local, v_local=v_local)
    check_dtype(op, "q", q, FLOAT_TYPES)
    check_dim(op, "q", q, 4, "[B, T, Hq, D]")
    _check_caches(op, k, v, "q", q)
    B, T, Hq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    check_size(op, "k_cache", k, 0, B, "B (q.size(0))")
    check_size(op, "k_cache", k, 3, D, "the head dim D (q.size(3))")
    check(
        Hkv > 0 and Hq % Hkv == 0,
        op,
        f"q's head count Hq = {Hq} must be a multiple of k_cache's head count Hkv = {Hkv} (grouped-query attention)",
    )
    check(
        (k_local is None) == (v_local is None),
        op,
        f"k_local and v_local must be given together, got only {'k_local' if k_local is not None else 'v_local'}",
    )
    if k_local is not None:
        check_dim(op, "k_local", k_local, 4, "[B, Hkv, S, D]")
        check_same_dtype(op, "k_local", k_local, "q", q)
        check_same_dtype(op, "v_local", v_local, "q", q)
        check_size(op, "k_local", k_local, 0, B, "B (q.size(0))")
        check_size(op, "k_local", k_local, 1, Hkv, "Hkv (k_cache.size(1))")
        check_size(op, "k_local", k_local, 3, D, "the head dim D (q.size(3))")
        check(
            v_local.shape == k_local.shape,
            op,
            f"v_local must have k_local's shape {list(k_local.shape)}, got {list(v_local.shape)}",
        )
    check_scale(op, scale)
    check_window(op, window, k_local is not None)
    values = checked_counts(op, "cache_lens", lens, B, "B (q.size(0))", L, "L (k_cache.size(2))")
    if causal and values and T > 0:
        check(
            min(values) >= T,
            op,
            f"causal=True needs cache_lens[b] >= T = {T} (the T queries are the last T "
            f"cached positions), got min(cache_lens) = {min(values)}",
        )
    return values


def check_append_inputs(op, k, v, k_new, v_new, lens) -> Optional[list]:
    """mtp.cache_append's arguments, capacity included (nothing is written when one fails);
    returns the cache lengths on the host (None under CUDA-graph capture)."""
    _check_same_device(op, "k_new", k_new, k_cache=k, v_cache=v, v_new=v_new, cache_lens=lens)
    check_dtype(op, "k_new", k_new, FLOAT_TYPES)
    check_dim(op, "k_new", k_new, 4, "[B, T, Hkv, D]")
    check_same_dtype(op, "v_new", v_new, "k_new", k_new)
    check(v_new.shape == k_new.shape, op, f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
    _check_caches(op, k, v, "k_new", k_new)
    B, T, Hkv, D = k_new.shape
    L = k.shape[2]
    check_size(op, "k_cache", k, 0, B, "B (k_new.size(0))")
    check_size(op, "k_cache", k, 1, Hkv, "Hkv (k_new.size(2))")
    check_size(op, "k_cache", k, 3, D, "the head dim D (k_new.size(3))")
    # The caches are written in place: not expanded, not each other, not the new entries.
    check_written(op, "it is written in place", {"k_cache": k, "v_cache": v}, {"k_new": k_new, "v_new": v_new})
    values = checked_counts(op, "cache_lens", lens, B, "B (k_new.size(0))", L, "L (k_cache.size(2))")
    for b, n in enumerate(values or []):
        check(
            T <= L - n,
            op,
            f"request {b} would pass the cache capacity: cache_lens[{b}] + T = {n} + {T} > L = {L} "
            "(k_cache.size(2)); nothing was written",
        )
    return values


def _host_values(t: torch.Tensor) -> Optional[list]:
    # Values on the host (one sync on a GPU); None while a CUDA graph is captured.
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    return t.tolist()


def check_sampled_inputs(
    op, draft, probs, logits, temperature, seeds, offsets=None, num_drafts=None, top_k=None, top_p=None, min_p=None
):
    """mtp.verify_sampled's arguments, with csrc/cpu/verify.cpp's messages."""
    _check_same_device(
        op,
        "draft_tokens",
        draft,
        draft_probs=probs,
        target_logits=logits,
        temperature=temperature,
        seeds=seeds,
        offsets=offsets,
        num_drafts=num_drafts,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )
    check_verify_inputs(op, draft, logits)
    B, K = draft.shape
    check_sampled_values(op, B, "B (draft_tokens.size(0))", temperature, seeds, offsets, top_k, top_p, min_p)
    if probs is not None:
        check_dtype(op, "draft_probs", probs, FLOAT_TYPES)
        check_dim(op, "draft_probs", probs, 3, "[B, K, V]")
        check_size(op, "draft_probs", probs, 0, B, "B (draft_tokens.size(0))")
        check_size(op, "draft_probs", probs, 1, K, "K (draft_tokens.size(1))")
        check_size(op, "draft_probs", probs, 2, logits.size(2), "V (target_logits.size(2))")
        bad = _host_values(((probs < 0) | ~probs.isfinite()).any())
        check(not bad, op, "draft_probs must be probabilities (finite, >= 0), found a negative, NaN or infinite entry")


def check_sampled_values(op, B: int, b_what: str, temperature, seeds, offsets, top_k, top_p, min_p):
    """verify_sampled's per-request tensors [B] (b_what: where B comes from) and their values."""
    for name, t, dtype in (
        ("temperature", temperature, torch.float32),
        ("seeds", seeds, torch.int64),
        ("offsets", offsets, torch.int64),
    ):
        if t is not None:
            check_dtype(op, name, t, (dtype,))
            check_dim(op, name, t, 1, "[B]")
            check_size(op, name, t, 0, B, b_what)
    for b, v in enumerate(_host_values(temperature) or []):
        check(math.isfinite(v) and v >= 0, op, f"temperature must be finite and >= 0, got temperature[{b}] = {v:g}")
    check_filters(op, B, top_k, top_p, min_p, b_what)


def check_sampled_ragged_inputs(
    op, draft, probs, cu, logits, temperature, seeds, offsets, pad_id, top_k, top_p, min_p, max_num_drafts
):
    """mtp.verify_sampled_ragged's arguments (cu's values: checked_ragged_width), with
    csrc/cpu/verify.cpp's messages."""
    _check_same_device(
        op,
        "draft_token_ids",
        draft,
        draft_probs=probs,
        temperature=temperature,
        seeds=seeds,
        offsets=offsets,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )
    check_ragged_inputs(op, draft, cu, logits, pad_id, max_num_drafts)
    B = cu.shape[0]
    check_sampled_values(op, B, "B (cu_num_draft_tokens.size(0))", temperature, seeds, offsets, top_k, top_p, min_p)
    if probs is not None:
        check_dtype(op, "draft_probs", probs, FLOAT_TYPES)
        check_dim(op, "draft_probs", probs, 2, "[N, V]")
        check_size(op, "draft_probs", probs, 0, draft.shape[0], "N (draft_token_ids.size(0))")
        check_size(op, "draft_probs", probs, 1, logits.size(1), "V (target_logits.size(1))")
        bad = _host_values(((probs < 0) | ~probs.isfinite()).any())
        check(not bad, op, "draft_probs must be probabilities (finite, >= 0), found a negative, NaN or infinite entry")


def check_filters(op, B: int, top_k=None, top_p=None, min_p=None, b_what="B (draft_tokens.size(0))"):
    """verify_sampled's filters, [B] each or None, with op_args.h filter_error's messages."""
    for name, t, dtypes in (
        ("top_k", top_k, ID_TYPES),
        ("top_p", top_p, (torch.float32,)),
        ("min_p", min_p, (torch.float32,)),
    ):
        if t is not None:
            check_dtype(op, name, t, dtypes)
            check_dim(op, name, t, 1, "[B]")
            check_size(op, name, t, 0, B, b_what)
    for b, k in enumerate(_host_values(top_k) if top_k is not None else []):
        check(k >= 0, op, f"top_k must be >= 0 (0: off), got top_k[{b}] = {k}")
    for b, p in enumerate(_host_values(top_p) if top_p is not None else []):
        check(0 < p <= 1, op, f"top_p must lie in (0, 1] (1: off), got top_p[{b}] = {p:g}")
    for b, p in enumerate(_host_values(min_p) if min_p is not None else []):
        check(0 <= p < 1, op, f"min_p must lie in [0, 1) (0: off), got min_p[{b}] = {p:g}")


# ---- the row-local layer ops (csrc/cpu/rowwise.cpp's checks) ------------------------------
def check_norm_inputs(op, x, weight, eps, residual=None):
    _check_same_device(op, "x", x, weight=weight, residual=residual)
    check_dtype(op, "x", x, FLOAT_TYPES)
    check(x.dim() >= 1, op, "x must have at least 1 dimension [..., H], got a scalar")
    check_dtype(op, "weight", weight, FLOAT_TYPES)
    check_dim(op, "weight", weight, 1, "[H]")
    check_size(op, "weight", weight, 0, x.size(-1), "H (x.size(-1))")
    check_eps(op, eps)
    if residual is not None:
        check(
            residual.dtype == x.dtype, op, f"residual must have x's dtype {_name(x.dtype)}, got {_name(residual.dtype)}"
        )
        check(
            residual.shape == x.shape, op, f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}"
        )


def check_rope_inputs(op, x, cos, sin):
    _check_same_device(op, "x", x, cos=cos, sin=sin)
    check_dtype(op, "x", x, FLOAT_TYPES)
    check_dim(op, "x", x, 4, "[B, T, H, D]")
    check(x.size(3) % 2 == 0, op, f"x.size(3) (the head dim D, rotated as two halves) must be even, got {x.size(3)}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_dtype(op, name, t, (torch.float32,))
        check_dim(op, name, t, 3, "[B, T, D]")
        check_size(op, name, t, 0, x.size(0), "B (x.size(0))")
        check_size(op, name, t, 1, x.size(1), "T (x.size(1))")
        check_size(op, name, t, 2, x.size(3), "D (x.size(3))")
    check_written(op, "it is rotated in place", {"x": x}, {"cos": cos, "sin": sin})


def check_gated_mul_input(op, gate_up):
    """gate_up [..., 2I] of silu_mul and gelu_tanh_mul (csrc/cpu/rowwise.cpp's gated_mul_cpu)."""
    check_dtype(op, "gate_up", gate_up, FLOAT_TYPES)
    check(gate_up.dim() >= 1, op, "gate_up must have at least 1 dimension [..., 2I], got a scalar")
    check(
        gate_up.size(-1) % 2 == 0,
        op,
        f"gate_up.size(-1) must be even [..., 2I] (gate, then up), got {gate_up.size(-1)}",
    )


def check_layer_kind(op, layer: str, windows, local_tables: bool, scale) -> None:
    """decoder_layers' layer kind and the gemma3 kind's own arguments (layer_kind_error in
    mtp/op_args.h)."""
    check(layer in ("llama", "gemma3"), op, f'layer must be "llama" or "gemma3", got "{layer}"')
    if layer == "gemma3":
        return
    check(windows is None, op, 'windows goes with layer="gemma3" only (the llama layer has no window)')
    check(not local_tables, op, 'rope_cos_local / rope_sin_local go with layer="gemma3" only')
    check(scale is None, op, 'attention_scale goes with layer="gemma3" only (the llama layer\'s is 1/sqrt(D))')


def check_gemma3_windows(op, windows, layers: int, has_cos_local: bool, has_sin_local: bool) -> None:
    """The gemma3 kind's windows and local RoPE tables (gemma3_windows_error in mtp/op_args.h)."""
    if windows is not None:
        check(
            len(windows) == layers,
            op,
            f"windows must hold one sliding window per layer (0: global) for the {layers} layers of k_cache, "
            f"got {len(windows)} values",
        )
        for i, w in enumerate(windows):
            check(
                w >= 0,
                op,
                f"windows[{i}]: window must be >= 0 (0: no window; else how many of the latest keys a query sees), "
                f"got window = {w}",
            )
    check(
        has_cos_local == has_sin_local,
        op,
        "rope_cos_local and rope_sin_local go together, got only "
        + ("rope_cos_local" if has_cos_local else "rope_sin_local"),
    )
    check(
        not any(w > 0 for w in windows or []) or has_cos_local,
        op,
        "a layer with a window (windows holds values > 0) takes its RoPE angles from rope_cos_local / "
        "rope_sin_local [P, D], got None",
    )


def check_tree_parents(op, parents, B: int, T: int):
    """tree_parents [B, T] of decoder_layers: row 0 of each request the root (-1), every other
    row's parent an earlier row (the messages of tree_parents_error in mtp/op_args.h)."""
    check(parents.dtype in ID_TYPES, op, f"tree_parents must be int32 or int64, got {_name(parents.dtype)}")
    check(
        parents.dim() == 2 and tuple(parents.shape) == (B, T),
        op,
        f"tree_parents must be [B, T] = [{B}, {T}] (x's first two sizes), got {list(parents.shape)}",
    )
    for b, row in enumerate(parents.tolist()):
        for i, p in enumerate(row):
            want = "-1 (row 0 is the root)" if i == 0 else f"an earlier row in [0, {i})"
            check(p == -1 if i == 0 else 0 <= p < i, op, f"tree_parents[{b}][{i}] must be {want}, got {p}")


def check_taps(op, taps, tap_out, x, layers: int):
    """decoder_layers' taps and tap_out [len(taps), B, T, H] (taps_error in mtp/op_args.h, then
    the tensor checks of csrc/cpu/decoder.cpp); the overlaps are the caller's check_written."""
    check(
        (taps is None) == (tap_out is None),
        op,
        f"taps and tap_out go together, got only {'taps' if taps is not None else 'tap_out'}",
    )
    if taps is None:
        return
    for j, i in enumerate(taps):
        check(
            0 <= i < layers,
            op,
            f"taps must hold layer indices in [0, layers (k_cache.size(0))) = [0, {layers}), got taps[{j}] = {i}",
        )
        check(
            j == 0 or i > taps[j - 1],
            op,
            f"taps must be strictly increasing, got taps[{j - 1}] = {taps[j - 1]} then taps[{j}] = {i}",
        )
    check_same_dtype(op, "tap_out", tap_out, "x", x)
    check_dim(op, "tap_out", tap_out, 4, "[len(taps), B, T, H]")
    for d, (want, what) in enumerate(
        (
            (len(taps), "len(taps)"),
            (x.size(0), "B (x.size(0))"),
            (x.size(1), "T (x.size(1))"),
            (x.size(2), "H (x.size(2))"),
        )
    ):
        check_size(op, "tap_out", tap_out, d, want, what)
    check(
        tap_out.is_contiguous(),
        op,
        f"tap_out must be contiguous (it is written in place), got strides {list(tap_out.stride())} "
        f"for shape {list(tap_out.shape)}",
    )


def check_alternatives(op, alternatives: int, Vd: int, k: int):
    """head_draft's alternatives (the messages of alternatives_error in mtp/op_args.h)."""
    check(
        0 <= alternatives < Vd,
        op,
        f"alternatives must be in [0, {Vd}) (fewer than the draft vocabulary's {Vd} tokens), got {alternatives}",
    )
    check(alternatives == 0 or k >= 1, op, "alternatives are first drafts: they need k >= 1, got k = 0")
    check(k + alternatives < 2**63, op, f"k + alternatives = {k} + {alternatives} overflows int64")


def check_probs_out(op, probs_out, hidden, k: int):
    """head_draft's probs_out: None, or [B, k] float32 on hidden's device."""
    if probs_out is None:
        return
    check(
        probs_out.device == hidden.device,
        op,
        f"probs_out must be on hidden's device {hidden.device}, got {probs_out.device}",
    )
    check(probs_out.dtype == torch.float32, op, f"probs_out must be Float, got {probs_out.dtype}")
    check_dim(op, "probs_out", probs_out, 2, "[B, k]")
    check_size(op, "probs_out", probs_out, 0, hidden.shape[0], "B (hidden.size(0))")
    check_size(op, "probs_out", probs_out, 1, k, "k")


_INT64_MAX = 2**63 - 1


def check_decoder_heads(op, num_heads: int, Hkv: int, D: int, eps):
    """num_heads against the cache's Hkv and D, then eps (decoder_heads_error in mtp/op_args.h):
    the qkv rows (Hq + 2 Hkv) D and Hq D must fit int64 (they wrap in C++ with num_heads near 2^62)."""
    check(num_heads >= 1, op, f"num_heads must be >= 1, got {num_heads}")
    check(
        Hkv > 0 and num_heads % Hkv == 0,
        op,
        f"q's head count Hq = {num_heads} must be a multiple of k_cache's head count Hkv = {Hkv} "
        "(grouped-query attention)",
    )
    check(D % 2 == 0, op, f"the head dim D must be even (RoPE rotates two halves), got {D}")
    check(
        (num_heads + 2 * Hkv) * D <= _INT64_MAX and num_heads + 2 * Hkv <= _INT64_MAX,
        op,
        f"num_heads = {num_heads} is too large: the qkv rows (Hq + 2 Hkv) D with Hkv = {Hkv} and D = {D} "
        "overflow int64",
    )
    check_eps(op, eps)


def check_positions(op, lens: list, T: int, L: int, l_what: str, P: int, p_what: str):
    """decoder_layers' T new positions per request within the cache and the RoPE tables
    (positions_error in mtp/op_args.h)."""
    for b, n in enumerate(lens):
        check(
            T <= L - n,
            op,
            f"request {b} would pass the cache capacity: cache_lens[{b}] + T = {n} + {T} > L = {L} ({l_what}); "
            "nothing was written",
        )
        check(
            T <= P - n,
            op,
            f"request {b} would pass the RoPE tables: cache_lens[{b}] + T = {n} + {T} > P = {P} ({p_what}) positions",
        )


def check_draft_positions(op, lens: list, k: int, P: int, p_what: str):
    """head_draft's k steps of request b at positions cache_lens[b] .. + k - 1 of the RoPE tables
    (draft_positions_error in mtp/op_args.h)."""
    for b, n in enumerate(lens):
        check(
            k <= P - n,
            op,
            f"request {b}'s drafts would pass the RoPE tables: cache_lens[{b}] + k = {n} + {k} > P = {P} ({p_what}) "
            "positions",
        )

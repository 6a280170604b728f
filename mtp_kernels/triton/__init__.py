"""Triton implementations of the ``mtp`` ops, callable directly (``mtp_kernels.triton.verify``)
and registered as the ops' CUDA kernels when the package was built without its C++ CUDA
kernels (``register_cuda_kernels``). Same contracts as ``mtp_kernels.reference``; on CPU
tensors they run under ``TRITON_INTERPRET=1`` (how the test suite checks them without a GPU).

A new op is added the same way: its kernels in ``kernels/<op>.py``, a launcher here (checks
from ``mtp_kernels._checks``, then the grid), and its name in ``_OPS``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from .. import _checks as C
from .kernels import attention as A
from .kernels.argmax import argmax_partials_kernel
from .kernels.linear import BLOCK_K, BLOCK_M, BLOCK_N, linear_kernel
from .kernels.verify_sampled import verify_sampled_kernel
from .kernels.verify import accept_prefix_kernel, verify_finish_kernel

# Vocabulary tile of the argmax, and the smallest slice worth a program of its own.
BLOCK_V = 1024
MIN_SLICE = 2048


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few slices, so the merge is exercised


def verify_splits(rows: int, V: int, sm_count: int) -> int:
    """Vocabulary slices per row: about 4 programs per SM, slices of at least MIN_SLICE
    (the rule of mtp::cuda::verify_splits)."""
    want = -(-4 * sm_count // max(rows, 1))
    return max(1, min(want, -(-V // MIN_SLICE)))


def _argmax_partials(rows: int, V: int, dev: torch.device, splits: Optional[int], block_v: int):
    """verify's vocabulary slicing (slices start on a tile) and its per-slice partial argmaxes."""
    if splits is None:
        splits = verify_splits(rows, V, _sm_count(dev))
    chunk = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v
    splits = triton.cdiv(V, chunk)
    part_val = torch.empty((rows, splits), dtype=torch.float32, device=dev)
    part_idx = torch.empty((rows, splits), dtype=torch.int32, device=dev)
    return chunk, splits, part_val, part_idx


def _chain_outputs(op, draft_tokens, target_logits, num_drafts):
    # verify and verify_sampled after their input checks: sizes, checked num_drafts, outputs.
    B, K = draft_tokens.shape
    V = target_logits.shape[2]
    C.check(V < 2**31, op, f"target_logits must have V < 2^31 entries, got V = {V}")
    nd = C.checked_num_drafts(op, num_drafts, B, K)
    return B, K, V, nd, draft_tokens.new_empty((B,)), draft_tokens.new_empty((B, K + 1))


def verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    num_drafts: Optional[torch.Tensor] = None,
    pad_id: int = -1,
    *,
    splits: Optional[int] = None,
    block_v: int = BLOCK_V,
):
    """``mtp.verify`` in Triton. ``splits`` / ``block_v`` force the vocabulary slicing and tile
    (tests use them to put slice and tile edges where ties and NaN are)."""
    op = "mtp.verify"
    C.check_verify_inputs(op, draft_tokens, target_logits, num_drafts)
    B, K, V, nd, accepted, out = _chain_outputs(op, draft_tokens, target_logits, num_drafts)
    if B == 0:
        return accepted, out
    rows = B * (K + 1)
    chunk, splits, part_val, part_idx = _argmax_partials(rows, V, target_logits.device, splits, block_v)
    has_nd = nd is not None
    nd_arg = nd if has_nd else part_idx  # never read without HAS_ND
    sb, st, sv = target_logits.stride()
    argmax_partials_kernel[(rows, splits)](
        target_logits,
        sb,
        st,
        sv,
        nd_arg,
        K,
        V,
        chunk,
        part_val,
        part_idx,
        splits,
        part_idx,  # first_row: never read without HAS_FIRST
        HAS_ND=has_nd,
        HAS_FIRST=False,
        BLOCK_V=block_v,
    )
    verify_finish_kernel[(B,)](
        draft_tokens,
        *draft_tokens.stride(),
        part_val,
        part_idx,
        splits,
        nd_arg,
        K,
        pad_id,
        accepted,
        out,
        *out.stride(),
        part_idx,  # draft_first: never read without HAS_FIRST
        HAS_ND=has_nd,
        HAS_FIRST=False,
        BLOCK_T=triton.next_power_of_2(K + 1),
        BLOCK_S=triton.next_power_of_2(splits),
    )
    return accepted, out


def ragged_device_layout(cu_num_draft_tokens: torch.Tensor, N: int, W: int):
    """(K_b, cu[b-1], cu[b-1] + b) as contiguous int64 device tensors, computed on the device
    (no sync). Clamped so that an unchecked cu (CUDA-graph capture) cannot send a read out of
    range: cu[b-1] in [0, N], K_b in [0, min(W - 1, N - cu[b-1])]."""
    cu = cu_num_draft_tokens.to(torch.int64).clamp(0, N)
    prev = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = (cu - prev).clamp(0, W - 1).contiguous()
    first_row = (prev + torch.arange(cu.shape[0], device=cu.device)).contiguous()
    return counts, prev.contiguous(), first_row


def verify_ragged(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    pad_id: int = -1,
    max_num_drafts: Optional[int] = None,
    *,
    splits: Optional[int] = None,
    block_v: int = BLOCK_V,
):
    """``mtp.verify_ragged`` in Triton: verify's two kernels with per-request row offsets.
    Without max_num_drafts, cu is read on the host for the width (one sync on a GPU)."""
    op = "mtp.verify_ragged"
    C.check_ragged_inputs(op, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts)
    N, B, V = draft_token_ids.shape[0], cu_num_draft_tokens.shape[0], target_logits.shape[1]
    C.check(V < 2**31, op, f"target_logits must have V < 2^31 entries, got V = {V}")
    W = C.checked_ragged_width(op, cu_num_draft_tokens, N, max_num_drafts)
    accepted, out = draft_token_ids.new_empty((B,)), draft_token_ids.new_empty((B, W))
    if B == 0:
        return accepted, out
    K = W - 1
    counts, draft_first, first_row = ragged_device_layout(cu_num_draft_tokens, N, W)
    rows = B * W
    chunk, splits, part_val, part_idx = _argmax_partials(rows, V, target_logits.device, splits, block_v)
    s_row, s_v = target_logits.stride()
    argmax_partials_kernel[(rows, splits)](
        target_logits,
        0,
        s_row,
        s_v,
        counts,
        K,
        V,
        chunk,
        part_val,
        part_idx,
        splits,
        first_row,
        HAS_ND=True,
        HAS_FIRST=True,
        BLOCK_V=block_v,
    )
    verify_finish_kernel[(B,)](
        draft_token_ids,
        0,
        draft_token_ids.stride(0),
        part_val,
        part_idx,
        splits,
        counts,
        K,
        pad_id,
        accepted,
        out,
        *out.stride(),
        draft_first,
        HAS_ND=True,
        HAS_FIRST=True,
        BLOCK_T=triton.next_power_of_2(W),
        BLOCK_S=triton.next_power_of_2(splits),
    )
    return accepted, out


def accept_prefix(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, num_drafts: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``mtp.accept_prefix`` in Triton."""
    op = "mtp.accept_prefix"
    C.check_accept_inputs(op, draft_tokens, target_tokens, num_drafts)
    B, K = draft_tokens.shape
    nd = C.checked_num_drafts(op, num_drafts, B, K)
    accepted = draft_tokens.new_empty((B,))
    if B == 0:
        return accepted
    accept_prefix_kernel[(B,)](
        draft_tokens,
        *draft_tokens.stride(),
        target_tokens,
        *target_tokens.stride(),
        nd if nd is not None else accepted,
        K,
        accepted,
        HAS_ND=nd is not None,
        BLOCK_T=triton.next_power_of_2(K + 1),
    )
    return accepted


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    num_drafts: Optional[torch.Tensor] = None,
    pad_id: int = -1,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
):
    """``mtp.verify_sampled`` in Triton: one program per request, the tokens bitwise those of
    the CPU op (kernels/verify_sampled.py mirrors csrc/include/mtp/verify_sampled.h)."""
    op = "mtp.verify_sampled"
    C.check_sampled_inputs(
        op, draft_tokens, draft_probs, target_logits, temperature, seeds, offsets, num_drafts, top_k, top_p, min_p
    )
    B, K, V, nd, accepted, out = _chain_outputs(op, draft_tokens, target_logits, num_drafts)
    if B == 0:
        return accepted, out
    q_strides = draft_probs.stride() if draft_probs is not None else (0, 0, 0)
    _launch_verify_sampled(
        (draft_tokens, *draft_tokens.stride()),
        draft_probs,
        q_strides,
        (target_logits, *target_logits.stride()),
        (temperature, seeds, offsets, top_k, top_p, min_p),
        nd,
        K,
        V,
        pad_id,
        accepted,
        out,
        None,
    )
    return accepted, out


def _sampled_values(temperature, seeds, offsets, top_k, top_p, min_p):
    # verify_sampled's per-request tensors as the kernel reads them: contiguous, the filters
    # present (0, 1, 0: off) when any is given.
    temp = temperature.contiguous()
    seeds = seeds.contiguous()
    offs = offsets.contiguous() if offsets is not None else seeds  # never read without HAS_OFFSETS
    has_filters = top_k is not None or top_p is not None or min_p is not None
    top_k = (top_k if top_k is not None else torch.zeros_like(seeds)).to(torch.int64).contiguous()
    top_p = (top_p if top_p is not None else torch.ones_like(temp)).contiguous()
    min_p = (min_p if min_p is not None else torch.zeros_like(temp)).contiguous()
    return temp, seeds, offs, has_filters, top_k, top_p, min_p


def _launch_verify_sampled(
    draft, draft_probs, q_strides, logits, per_request, num_drafts, K, V, pad_id, accepted, out, firsts
):
    """One verify_sampled_kernel launch, one program per request, for both layouts. draft and
    logits: (tensor, *3 strides) with request stride 0 in the ragged layout; q_strides: 3
    strides; per_request: (temperature, seeds, offsets, top_k, top_p, min_p) as the op takes
    them; num_drafts: [B] or None (all K); firsts: None (flat) or (draft_first, row_first), the
    ragged layout's per-request starts (HAS_FIRST)."""
    temp, seeds, offs, has_filters, top_k, top_p, min_p = _sampled_values(*per_request)
    q = draft_probs if draft_probs is not None else logits[0]  # never read without HAS_Q
    draft_first, row_first = firsts if firsts is not None else (seeds, seeds)  # never read without HAS_FIRST
    # No FMA contraction when compiled: every product rounds, as in the C++ kernel (the
    # interpreter never fuses, and rejects the option).
    opts = {} if isinstance(verify_sampled_kernel, InterpretedFunction) else {"enable_fp_fusion": False}
    verify_sampled_kernel[(accepted.shape[0],)](
        *draft,
        q,
        *q_strides,
        *logits,
        temp,
        top_k,
        top_p,
        min_p,
        seeds,
        offs,
        num_drafts if num_drafts is not None else seeds,
        K,
        V,
        pad_id,
        accepted,
        out,
        *out.stride(),
        draft_first,
        row_first,
        HAS_Q=draft_probs is not None,
        HAS_OFFSETS=per_request[2] is not None,
        HAS_ND=num_drafts is not None,
        HAS_FILTERS=has_filters,
        HAS_FIRST=firsts is not None,
        BLOCK_T=triton.next_power_of_2(K + 1),
        BLOCK_V=BLOCK_V,
        **opts,
    )


def verify_sampled_ragged(
    draft_token_ids: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    pad_id: int = -1,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
    max_num_drafts: Optional[int] = None,
):
    """``mtp.verify_sampled_ragged`` in Triton: verify_sampled's kernel with verify_ragged's
    per-request offsets (HAS_FIRST). Without max_num_drafts, cu is read on the host for the
    width (one sync on a GPU)."""
    op = "mtp.verify_sampled_ragged"
    C.check_sampled_ragged_inputs(
        op,
        draft_token_ids,
        draft_probs,
        cu_num_draft_tokens,
        target_logits,
        temperature,
        seeds,
        offsets,
        pad_id,
        top_k,
        top_p,
        min_p,
        max_num_drafts,
    )
    N, B, V = draft_token_ids.shape[0], cu_num_draft_tokens.shape[0], target_logits.shape[1]
    C.check(V < 2**31, op, f"target_logits must have V < 2^31 entries, got V = {V}")
    W = C.checked_ragged_width(op, cu_num_draft_tokens, N, max_num_drafts)
    accepted, out = draft_token_ids.new_empty((B,)), draft_token_ids.new_empty((B, W))
    if B == 0:
        return accepted, out
    counts, draft_first, first_row = ragged_device_layout(cu_num_draft_tokens, N, W)
    q_strides = (0, *draft_probs.stride()) if draft_probs is not None else (0, 0, 0)
    _launch_verify_sampled(
        (draft_token_ids, 0, draft_token_ids.stride(0)),
        draft_probs,
        q_strides,
        (target_logits, 0, *target_logits.stride()),
        (temperature, seeds, offsets, top_k, top_p, min_p),
        counts,
        W - 1,
        V,
        pad_id,
        accepted,
        out,
        (draft_first, first_row),
    )
    return accepted, out


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    weight_scale: Optional[torch.Tensor] = None,
    *,
    quantize_x: bool = False,
    gguf_type: Optional[int] = None,
) -> torch.Tensor:
    """``mtp.linear`` in Triton: fp32 accumulation, each row's bits independent of M. Float
    weights only: an int8 weight (with weight_scale, with or without quantize_x) is checked,
    then refused (CPU only), and so is a GGUF block-type one."""
    C.check(gguf_type is None, "mtp.linear", f"{C.GGUF_CPU_ONLY}, got weight on {weight.device}")
    C.check_linear_inputs("mtp.linear", x, weight, bias, weight_scale, quantize_x)
    C.check(weight.dtype != torch.int8, "mtp.linear", f"{C.INT8_CPU_ONLY}, got weight on {weight.device}")
    K, N = x.shape[-1], weight.shape[0]
    M = x.numel() // K if K else x.shape[:-1].numel()
    x2 = x.reshape(M, K)
    y = torch.empty((M, N), dtype=torch.float32, device=x.device)
    if M > 0 and N > 0:
        b = bias.to(torch.float32).contiguous() if bias is not None else y
        linear_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
            x2,
            *x2.stride(),
            weight,
            *weight.stride(),
            b,
            y,
            *y.stride(),
            M,
            N,
            K,
            HAS_BIAS=bias is not None,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
        )
    return y.to(x.dtype).reshape(*x.shape[:-1], N)  # fp32 -> x's dtype rounds like the C++ kernels


def head_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    k_local: Optional[torch.Tensor] = None,
    v_local: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    causal: bool = False,
    *,
    window: Optional[int] = None,
) -> torch.Tensor:
    """``mtp.head_attention`` in Triton: split-KV over fixed 256-key chunks, partials merged
    left to right (kernels/attention.py). The caches are read in place, whatever their strides;
    keys older than a sliding window are not read."""
    lens_host = C.check_attention_inputs(
        "mtp.head_attention", q, k_cache, v_cache, cache_lens, k_local, v_local, causal, scale=scale, window=window
    )
    window = window or 0
    B, T, Hq, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((B, T, Hq, D), dtype=torch.float32, device=q.device)
    if B == 0 or T == 0 or Hq == 0 or D == 0:
        return out.to(q.dtype)
    G = Hq // Hkv
    S = k_local.shape[2] if k_local is not None else 0
    scale = D**-0.5 if scale is None else float(scale)
    # The grid covers the longest cache (its capacity while a CUDA graph is captured: no sync);
    # programs past a request's length return at once. It never changes a row's bits.
    longest = max(lens_host, default=0) if lens_host is not None else L
    Cc, Cl = triton.cdiv(longest, A.CHUNK), triton.cdiv(S, A.CHUNK)
    n_rb = triton.cdiv(G * T, A.BLOCK_R)
    parts = B * Hkv * (Cc + Cl) * n_rb * A.BLOCK_R
    part_m = torch.empty(parts, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(parts * D, dtype=torch.float32, device=q.device)
    lens = cache_lens.to(torch.int64).contiguous()
    block_d = triton.next_power_of_2(D)
    segments = [(k_cache, v_cache, Cc, 0, False)]
    if S:
        segments.append((k_local, v_local, Cl, Cc, True))
    for k, v, chunks, first, local in segments:
        if chunks:
            A.attention_chunk_kernel[(B * Hkv * n_rb, chunks)](
                q,
                *q.stride(),
                k,
                *k.stride(),
                v,
                *v.stride(),
                lens,
                part_m,
                part_l,
                part_acc,
                T,
                Hkv,
                G,
                D,
                L,
                S,
                scale,
                n_rb,
                Cc + Cl,
                first,
                window,
                LOCAL=local,
                CAUSAL=causal,
                CHUNK=A.CHUNK,
                BLOCK_R=A.BLOCK_R,
                BLOCK_N=A.BLOCK_N,
                BLOCK_D=block_d,
                num_warps=A.num_warps(block_d),
            )
    A.attention_merge_kernel[(B * Hkv * n_rb,)](
        lens,
        part_m,
        part_l,
        part_acc,
        out,
        T,
        Hkv,
        G,
        D,
        L,
        S,
        n_rb,
        Cc + Cl,
        Cc,
        window,
        CAUSAL=causal,
        CHUNK=A.CHUNK,
        BLOCK_R=A.BLOCK_R,
        BLOCK_D=block_d,
    )
    return out.to(q.dtype)  # fp32 -> q's dtype rounds like the C++ kernels


def _raw_bits(t: torch.Tensor) -> torch.Tensor:
    # Copies move bits, never values: the same view as integers (any strides).
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def cache_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache_lens: torch.Tensor
) -> None:
    """``mtp.cache_append`` in Triton: in place, any strides; raises and writes nothing when a
    request would pass the capacity."""
    C.check_append_inputs("mtp.cache_append", k_cache, v_cache, k_new, v_new, cache_lens)
    B, T, Hkv, D = k_new.shape
    if B * T * Hkv * D == 0:
        return
    lens = cache_lens.to(torch.int64).contiguous()
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        cache, new = _raw_bits(cache), _raw_bits(new)
        A.cache_append_kernel[(B * Hkv, T)](
            cache,
            *cache.stride(),
            new,
            *new.stride(),
            lens,
            B,
            T,
            Hkv,
            D,
            cache.shape[2],
            BLOCK_B=triton.next_power_of_2(B),
            BLOCK_D=triton.next_power_of_2(D),
        )


_OPS = {
    "verify": verify,
    "verify_ragged": verify_ragged,
    "verify_sampled": verify_sampled,
    "verify_sampled_ragged": verify_sampled_ragged,
    "accept_prefix": accept_prefix,
    "linear": linear,
    "head_attention": head_attention,
    "cache_append": cache_append,
}


def register_cuda_kernels() -> list[str]:
    """Registers these launchers as the CUDA kernels of the ``mtp`` ops that have none (the
    package was built without MTP_WITH_CUDA). Returns the ops registered now."""
    done = []
    for name, fn in _OPS.items():
        qualname = f"mtp::{name}"
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"):
            torch.library.register_kernel(qualname, "cuda", fn)
            done.append(name)
    return done

"""The CUDA kernels of the row-local layer ops (``rms_norm``, ``add_rms_norm``, ``rope_``,
``silu_mul``, ``gelu_tanh_mul``) and of ``embedding`` (float and Q8 tables): their plain-torch
specification (``reference.py``) run on the GPU, after the checks of the CPU binding (same
messages). ``decoder_layers`` and ``head_draft`` on CUDA are their op-by-op composition of
the kernels (``reference.decoder_layers`` / ``head_draft`` with ``ops.KERNELS``): each op runs
its own CUDA kernel (or the fallback above). There is no C++ or Triton kernel for them; this
keeps a model on a GPU working through the same ops. Exact like the CPU kernels: every step of
rms_norm, add_rms_norm and rope_ is one IEEE operation in the kernels' order, so they should
give the CPU kernels' bits, each row alone (test_rowwise.py checks it on a GPU; not run on one
yet); silu_mul and gelu_tanh_mul use torch's exp (within a few ulp of the CPU kernel's
polynomial). Not fast: the norm is a loop over the H / 16 lane chunks.

Registered for the CUDA dispatch key on import (``register_cuda_kernels``); the functions are
plain Python and run on any device (the tests run them on CPU tensors).
"""

from __future__ import annotations

import torch

from . import _checks as C
from . import ops, reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    C.check_norm_inputs("mtp.rms_norm", x, weight, eps)
    return reference.rms_norm(x, weight, eps).contiguous()


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    C.check_norm_inputs("mtp.add_rms_norm", x, weight, eps, residual)
    s, n = reference.add_rms_norm(x, residual, weight, eps)
    return s.contiguous(), n.contiguous()


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    C.check_rope_inputs("mtp.rope_", x, cos, sin)
    x.copy_(reference.rope(x, cos, sin))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    C.check_gated_mul_input("mtp.silu_mul", gate_up)
    return reference.silu_mul(gate_up).contiguous()


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    C.check_gated_mul_input("mtp.gelu_tanh_mul", gate_up)
    return reference.gelu_tanh_mul(gate_up).contiguous()


def _decoder_weight_name(k: int, n: int, parts=reference.DECODER_PARTS) -> str:
    """op_args.h WeightNames for decoder_layers: "weights[7] (layer 1's qkv)", the last one
    the final norm."""
    what = "final_norm" if k == n - 1 else f"layer {k // len(parts)}'s {parts[k % len(parts)]}"
    return f"weights[{k}] ({what})"


def decoder_layers(
    x,
    k_cache,
    v_cache,
    cache_lens,
    rope_cos,
    rope_sin,
    weights,
    weight_scales,
    num_heads,
    eps,
    *,
    quantize_x=False,
    tree_parents=None,
    weight_types=None,
    layer="llama",
    windows=None,
    rope_cos_local=None,
    rope_sin_local=None,
    attention_scale=None,
    taps=None,
    tap_out=None,
):
    op = "mtp.decoder_layers"
    local = rope_cos_local is not None or rope_sin_local is not None
    C.check_layer_kind(op, layer, windows, local, attention_scale)
    gemma3 = layer == "gemma3"
    parts = reference.GEMMA3_DECODER_PARTS if gemma3 else reference.DECODER_PARTS
    C.check(not weight_types or all(t == -1 for t in weight_types), op, C.GGUF_CPU_ONLY)
    C.check_dim(op, "x", x, 3, "[B, T, H]")
    C.check_dim(op, "k_cache", k_cache, 5, "[layers, B, Hkv, L, D]")
    _, T, _ = x.shape
    _, _, Hkv, L, D = k_cache.shape
    C.check_decoder_heads(op, num_heads, Hkv, D, eps)  # then eps, as the C++ op
    C.check_written(
        op,
        "it is written in place",
        {"k_cache": k_cache, "v_cache": v_cache},
        {
            "x": x,
            "cache_lens": cache_lens,
            "rope_cos": rope_cos,
            "rope_sin": rope_sin,
            "weights": weights,
            **{
                n: t
                for n, t in (("rope_cos_local", rope_cos_local), ("rope_sin_local", rope_sin_local))
                if t is not None
            },
        },
        list_name=lambda _, k: _decoder_weight_name(k, len(weights), parts),
    )
    C.check_taps(op, taps, tap_out, x, k_cache.shape[0])
    if tap_out is not None:
        C.check_written(
            op,
            "it is written in place",
            {"tap_out": tap_out},
            {
                "x": x,
                "k_cache": k_cache,
                "v_cache": v_cache,
                "cache_lens": cache_lens,
                "rope_cos": rope_cos,
                "rope_sin": rope_sin,
                "tree_parents": tree_parents,
                "rope_cos_local": rope_cos_local,
                "rope_sin_local": rope_sin_local,
                "weights": weights,
                "weight_scales": weight_scales,
            },
            list_name=lambda name, k: (
                _decoder_weight_name(k, len(weights), parts) if name == "weights" else f"{name}[{k}]"
            ),
        )
    lens = C.checked_counts(op, "cache_lens", cache_lens, x.shape[0], "B (x.size(0))", L, "L (k_cache.size(3))")
    if lens is not None:
        C.check_positions(op, lens, T, L, "k_cache.size(3)", rope_cos.shape[0], "rope_cos.size(0)")
    if tree_parents is not None:
        C.check_tree_parents(op, tree_parents, x.shape[0], x.shape[1])
    if gemma3:
        C.check_gemma3_windows(op, windows, k_cache.shape[0], rope_cos_local is not None, rope_sin_local is not None)
        if rope_cos_local is not None and lens is not None:
            C.check_positions(op, lens, T, L, "k_cache.size(3)", rope_cos_local.shape[0], "rope_cos_local.size(0)")
    return reference.decoder_layers(
        x,
        k_cache,
        v_cache,
        cache_lens,
        rope_cos,
        rope_sin,
        weights,
        weight_scales,
        num_heads,
        eps,
        quantize_x=quantize_x,
        tree_parents=tree_parents,
        layer=layer,
        windows=windows,
        rope_cos_local=rope_cos_local,
        rope_sin_local=rope_sin_local,
        attention_scale=attention_scale,
        taps=taps,
        tap_out=tap_out,
        ops=ops.KERNELS,
    )


def head_draft(
    hidden,
    token,
    k_cache,
    v_cache,
    cache_lens,
    rope_cos,
    rope_sin,
    embedding,
    embedding_scale,
    weights,
    lm_head,
    lm_head_scale,
    draft_vocab,
    k,
    num_heads,
    eps,
    *,
    alternatives=0,
    embedding_type=-1,
    lm_head_type=-1,
    weight_types=None,
    probs_out=None,
):
    op = "mtp.head_draft"
    C.check(embedding_type == -1 and lm_head_type == -1, op, C.GGUF_CPU_ONLY)
    C.check(not weight_types or all(t == -1 for t in weight_types), op, C.GGUF_CPU_ONLY)
    C.check_dim(op, "hidden", hidden, 2, "[B, H]")
    C.check(k >= 0, op, f"k (draft steps) must be >= 0, got {k}")
    C.check_dim(op, "k_cache", k_cache, 4, "[B, Hkv, L, D]")
    _, Hkv, L, D = k_cache.shape
    C.check_decoder_heads(op, num_heads, Hkv, D, eps)  # eps named for head_draft, not its rms_norm
    lens = C.checked_counts(
        op, "cache_lens", cache_lens, hidden.shape[0], "B (hidden.size(0))", L, "L (k_cache.size(2))"
    )
    if lens is not None:
        C.check_draft_positions(op, lens, k, rope_cos.shape[0], "rope_cos.size(0)")
    Vd = lm_head.shape[0] if draft_vocab is None else draft_vocab.numel()
    C.check_alternatives(op, alternatives, Vd, k)
    C.check_probs_out(op, probs_out, hidden, k)
    return reference.head_draft(
        hidden,
        token,
        k_cache,
        v_cache,
        cache_lens,
        rope_cos,
        rope_sin,
        embedding,
        embedding_scale,
        weights,
        lm_head,
        lm_head_scale,
        draft_vocab,
        k,
        num_heads,
        eps,
        alternatives=alternatives,
        probs_out=probs_out,
        ops=ops.KERNELS,
    )


def embedding(tokens, weight, weight_scale=None, *, gguf_type=None, dtype=None):
    op = "mtp.embedding"
    C.check(gguf_type is None, op, C.GGUF_CPU_ONLY)
    C.check_dtype(op, "tokens", tokens, C.ID_TYPES)
    C.check_dtype(op, "weight", weight, (torch.float32, torch.bfloat16, torch.int8))
    C.check_dim(op, "weight", weight, 2, "[V, H]")
    int8 = weight.dtype == torch.int8
    C.check(
        int8 == (weight_scale is not None),
        op,
        f"weight is {C._name(weight.dtype)} but weight_scale is "
        + (
            "empty: int8 (Q8) weights need their scales" if int8 else "not empty: scales go with int8 (Q8) weights only"
        ),
    )
    C.check_weight_scale(op, weight, weight_scale)  # its shape
    C.check(
        dtype in (None, torch.float32, torch.bfloat16),
        op,
        f"dtype must be torch.float32 or torch.bfloat16, got {dtype}",
    )
    V = weight.shape[0]
    for i, t in enumerate(C._host_values(tokens.reshape(-1)) or []):  # none while a graph is captured
        C.check(
            0 <= t < V, op, f"tokens must hold token ids in [0, V (weight.size(0))) = [0, {V}), got tokens[{i}] = {t}"
        )
    return reference.embedding(tokens, weight, weight_scale, dtype=dtype).contiguous()


FALLBACKS = {
    "rms_norm": rms_norm,
    "add_rms_norm": add_rms_norm,
    "rope_": rope_,
    "silu_mul": silu_mul,
    "gelu_tanh_mul": gelu_tanh_mul,
    "decoder_layers": decoder_layers,
    "head_draft": head_draft,
    "embedding": embedding,
}


def register_cuda_kernels() -> None:
    """Registers the functions above as the ops' CUDA kernels (no GPU needed to register)."""
    for name, fn in FALLBACKS.items():
        torch.library.register_kernel(f"mtp::{name}", "cuda", fn)

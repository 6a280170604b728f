"""Typed wrappers of the ``torch.ops.mtp`` operators, each followed by its fake (meta) kernel.

The fake kernels give torch.compile / FakeTensor the output shapes and dtypes without
running anything (``FAKES``, registered at import by ``_registry``); the contracts themselves
are in ``reference.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch


def _chain_outputs(op, draft_tokens, target_logits, **others):
    # verify, verify_sampled, verify_lenient: accepted [B] and out_tokens [B, K+1].
    _check_same_device(op, "draft_tokens", draft_tokens, target_logits=target_logits, **others)
    torch._check(draft_tokens.dim() == 2, lambda: f"{op}: draft_tokens must be 2-D [B, K]")
    torch._check(target_logits.dim() == 3, lambda: f"{op}: target_logits must be 3-D [B, K+1, V]")
    B, K = draft_tokens.shape
    return draft_tokens.new_empty((B,)), draft_tokens.new_empty((B, K + 1))


def verify(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafts: Optional[torch.Tensor] = None, pad_id: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification; see ``reference.verify`` for the contract."""
    return torch.ops.mtp.verify.default(draft_tokens, target_logits, num_drafts, pad_id)


def _verify_fake(draft_tokens, target_logits, num_drafts=None, pad_id=-1):
    return _chain_outputs("mtp.verify", draft_tokens, target_logits, num_drafts=num_drafts)


def verify_ragged(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    pad_id: int = -1,
    max_num_drafts: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification in the flattened ragged layout of continuous batching
    (draft_token_ids [N], inclusive cumulative counts cu_num_draft_tokens [B], target_logits
    [N + B, V]); see ``reference.verify_ragged``. With ``max_num_drafts`` the output width is
    ``max_num_drafts + 1`` and no host read of cu is needed for the shape (CUDA graphs,
    torch.compile); without it the op reads cu on the host (one sync on a GPU)."""
    return torch.ops.mtp.verify_ragged.default(
        draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts
    )


def _verify_ragged_fake(draft_token_ids, cu_num_draft_tokens, target_logits, pad_id=-1, max_num_drafts=None):
    return _ragged_outputs("mtp.verify_ragged", draft_token_ids, cu_num_draft_tokens, target_logits, max_num_drafts)


def _ragged_outputs(op, draft_token_ids, cu_num_draft_tokens, target_logits, max_num_drafts, **others):
    # verify_ragged's and verify_sampled_ragged's fake outputs: accepted [B], out_tokens [B, W].
    _check_same_device(
        op,
        "draft_token_ids",
        draft_token_ids,
        cu_num_draft_tokens=cu_num_draft_tokens,
        target_logits=target_logits,
        **others,
    )
    torch._check(draft_token_ids.dim() == 1, lambda: f"{op}: draft_token_ids must be 1-D [N]")
    torch._check(cu_num_draft_tokens.dim() == 1, lambda: f"{op}: cu_num_draft_tokens must be 1-D [B]")
    torch._check(target_logits.dim() == 2, lambda: f"{op}: target_logits must be 2-D [N + B, V]")
    B = cu_num_draft_tokens.shape[0]
    if max_num_drafts is not None:
        torch._check(max_num_drafts >= 0, lambda: f"{op}: max_num_drafts must be >= 0, got {max_num_drafts}")
        W = max_num_drafts + 1
    else:  # the widest request + 1: known only from cu's values
        W = torch.library.get_ctx().new_dynamic_size(min=1)
    return draft_token_ids.new_empty((B,)), draft_token_ids.new_empty((B, W))


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify_sampled`` in ``verify_ragged``'s flattened layout (draft_token_ids [N],
    draft_probs [N, V] or None, cu_num_draft_tokens [B], target_logits [N + B, V]; per-request
    values [B]); see ``reference.verify_sampled_ragged``. ``max_num_drafts`` as in
    ``verify_ragged``: a static output width, no host read of cu for the shape."""
    return torch.ops.mtp.verify_sampled_ragged.default(
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


def _verify_sampled_ragged_fake(
    draft_token_ids,
    draft_probs,
    cu_num_draft_tokens,
    target_logits,
    temperature,
    seeds,
    offsets=None,
    pad_id=-1,
    top_k=None,
    top_p=None,
    min_p=None,
    max_num_drafts=None,
):
    return _ragged_outputs(
        "mtp.verify_sampled_ragged",
        draft_token_ids,
        cu_num_draft_tokens,
        target_logits,
        max_num_drafts,
        draft_probs=draft_probs,
        temperature=temperature,
        seeds=seeds,
        offsets=offsets,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )


def accept_prefix(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, num_drafts: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Accepted prefix lengths from token ids already chosen; see ``reference.accept_prefix``."""
    return torch.ops.mtp.accept_prefix.default(draft_tokens, target_tokens, num_drafts)


def _accept_prefix_fake(draft_tokens, target_tokens, num_drafts=None):
    _check_same_device(
        "mtp.accept_prefix", "draft_tokens", draft_tokens, target_tokens=target_tokens, num_drafts=num_drafts
    )
    torch._check(draft_tokens.dim() == 2, lambda: "mtp.accept_prefix: draft_tokens must be 2-D [B, K]")
    return draft_tokens.new_empty((draft_tokens.shape[0],))


def _check_same_device(op, ref_name, ref, **tensors):
    # A tensor on another device routes the whole call here (meta) or to a missing kernel.
    for name, t in tensors.items():
        torch._check(
            t is None or t.device == ref.device,
            lambda: f"{op}: {name} must be on {ref_name}'s device {ref.device}, got {t.device}",
        )


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless chain rejection sampling with a counter-based RNG, against each request's
    filtered distribution (top_k / top_p / min_p, [B] each or None); see ``reference.verify_sampled``."""
    return torch.ops.mtp.verify_sampled.default(
        draft_tokens, draft_probs, target_logits, temperature, seeds, offsets, num_drafts, pad_id, top_k, top_p, min_p
    )


def _verify_sampled_fake(
    draft_tokens,
    draft_probs,
    target_logits,
    temperature,
    seeds,
    offsets=None,
    num_drafts=None,
    pad_id=-1,
    top_k=None,
    top_p=None,
    min_p=None,
):
    return _chain_outputs(
        "mtp.verify_sampled",
        draft_tokens,
        target_logits,
        draft_probs=draft_probs,
        temperature=temperature,
        seeds=seeds,
        offsets=offsets,
        num_drafts=num_drafts,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )


def verify_lenient(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    num_drafts: Optional[torch.Tensor] = None,
    top_k: int = 1,
    min_ratio: float = 1.0,
    pad_id: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lenient greedy verification, NOT lossless: also accepts a draft within the row's top_k
    whose probability is >= min_ratio x the top one's; see ``reference.verify_lenient``."""
    return torch.ops.mtp.verify_lenient.default(draft_tokens, target_logits, num_drafts, top_k, min_ratio, pad_id)


def _verify_lenient_fake(draft_tokens, target_logits, num_drafts=None, top_k=1, min_ratio=1.0, pad_id=-1):
    return _chain_outputs("mtp.verify_lenient", draft_tokens, target_logits, num_drafts=num_drafts)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    weight_scale: Optional[torch.Tensor] = None,
    *,
    quantize_x: bool = False,
    gguf_type: Optional[int] = None,
) -> torch.Tensor:
    """Shape-invariant ``x @ weight.T + bias``; an int8 weight takes ``weight_scale`` (Q8 blocks
    of 32 along K, ``mtp_kernels.quantize_q8``), and with ``quantize_x=True`` the activations
    are quantized the same way (row by row) for integer dot products. See ``reference.linear``.
    ``gguf_type`` (a GGML type number, or an x8 layout's: ``mtp_kernels.gguf.LAYOUTS``): weight is the uint8
    bytes [N, row_bytes] of a GGUF block-quantized matrix as stored in the file, read in place
    (CPU); see ``reference.gguf_linear``."""
    return torch.ops.mtp.linear.default(x, weight, bias, weight_scale, quantize_x=quantize_x, gguf_type=gguf_type)


def _linear_fake(x, weight, bias=None, weight_scale=None, *, quantize_x=False, gguf_type=None):
    _check_same_device("mtp.linear", "x", x, weight=weight, bias=bias, weight_scale=weight_scale)
    if gguf_type is not None:
        from .gguf import LAYOUTS, row_bytes

        torch._check(gguf_type in LAYOUTS, lambda: f"mtp.linear: GGML type {gguf_type} is not supported")
        torch._check(
            weight.dtype == torch.uint8
            and weight.dim() == 2
            and x.dim() >= 1
            and weight.shape[1] == row_bytes(gguf_type, x.shape[-1]),
            lambda: (
                f"mtp.linear: a GGML type {gguf_type} weight must be uint8 [N, row bytes of K], got "
                f"{weight.dtype} {tuple(weight.shape)} for x {tuple(x.shape)}"
            ),
        )
        return x.new_empty((*x.shape[:-1], weight.shape[0]))
    torch._check(
        weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[1],
        lambda: f"mtp.linear: x [..., K] and weight [N, K] do not fit: {tuple(x.shape)}, {tuple(weight.shape)}",
    )
    torch._check(
        (weight.dtype == torch.int8) == (weight_scale is not None),
        lambda: (
            "mtp.linear: an int8 weight needs weight_scale and a float weight takes none, got "
            f"weight {weight.dtype} and weight_scale {None if weight_scale is None else weight_scale.dtype}"
        ),
    )
    torch._check(
        not quantize_x or weight.dtype == torch.int8,
        lambda: (
            "mtp.linear: quantize_x=True needs an int8 weight with weight_scale (mtp_kernels.quantize_q8), "
            f"got a {weight.dtype} weight"
        ),
    )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def head_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    k_local: Optional[torch.Tensor] = None,
    v_local: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Optional[int] = None,
) -> torch.Tensor:
    """Attention of q [B, T, Hq, D] over the cache views k_cache, v_cache [B, Hkv, L, D] (read
    in place, any strides) and an optional causal local segment; window (None or 0: none) keeps
    each query to the latest ``window`` keys (a sliding window; older keys are not read). See
    ``reference.head_attention``.
    """
    return torch.ops.mtp.head_attention.default(
        q, k_cache, v_cache, cache_lens, k_local, v_local, scale, causal, window=window
    )


def _head_attention_fake(
    q, k_cache, v_cache, cache_lens, k_local=None, v_local=None, scale=None, causal=False, *, window=None
):
    torch._check(q.dim() == 4, lambda: "mtp.head_attention: q must be 4-D [B, T, Hq, D]")
    torch._check(k_cache.dim() == 4, lambda: "mtp.head_attention: k_cache must be 4-D [B, Hkv, L, D]")
    _check_same_device(
        "mtp.head_attention",
        "q",
        q,
        k_cache=k_cache,
        v_cache=v_cache,
        cache_lens=cache_lens,
        k_local=k_local,
        v_local=v_local,
    )
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def cache_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache_lens: torch.Tensor
) -> None:
    """Writes k_new, v_new [B, T, Hkv, D] at each request's offset cache_lens[b], in place;
    cache_lens is left for the caller to advance. See ``reference.cache_append``.
    """
    torch.ops.mtp.cache_append.default(k_cache, v_cache, k_new, v_new, cache_lens)


def _cache_append_fake(k_cache, v_cache, k_new, v_new, cache_lens):
    torch._check(k_new.dim() == 4, lambda: "mtp.cache_append: k_new must be 4-D [B, T, Hkv, D]")
    _check_same_device(
        "mtp.cache_append", "k_new", k_new, k_cache=k_cache, v_cache=v_cache, v_new=v_new, cache_lens=cache_lens
    )
    return None


def _norm_fake(op, x, weight, **others):
    _check_same_device(op, "x", x, weight=weight, **others)
    torch._check(
        x.dim() >= 1 and weight.dim() == 1 and weight.shape[0] == x.shape[-1],
        lambda: f"{op}: x [..., H] and weight [H] do not fit: {tuple(x.shape)}, {tuple(weight.shape)}",
    )
    return x.new_empty(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-row RMSNorm of x [..., H] in fp32, in x's dtype; see ``reference.rms_norm``."""
    return torch.ops.mtp.rms_norm.default(x, weight, eps)


def _rms_norm_fake(x, weight, eps):
    return _norm_fake("mtp.rms_norm", x, weight)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, RMSNorm of it) in one pass per row; see ``reference.add_rms_norm``."""
    return torch.ops.mtp.add_rms_norm.default(x, residual, weight, eps)


def _add_rms_norm_fake(x, residual, weight, eps):
    torch._check(residual.shape == x.shape, lambda: "mtp.add_rms_norm: residual must have x's shape")
    return x.new_empty(x.shape), _norm_fake("mtp.add_rms_norm", x, weight, residual=residual)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates x [B, T, H, D] (any strides, e.g. the q/k heads of a fused projection's output)
    in place by cos, sin [B, T, D] fp32; see ``reference.rope``."""
    torch.ops.mtp.rope_.default(x, cos, sin)


def _rope_fake(x, cos, sin):
    _check_same_device("mtp.rope_", "x", x, cos=cos, sin=sin)
    torch._check(x.dim() == 4, lambda: "mtp.rope_: x must be 4-D [B, T, H, D]")
    return None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I] (gate, then up) -> [..., I]; see ``reference.silu_mul``."""
    return torch.ops.mtp.silu_mul.default(gate_up)


def _silu_mul_fake(gate_up):
    torch._check(gate_up.dim() >= 1 and gate_up.shape[-1] % 2 == 0, lambda: "mtp.silu_mul: gate_up must be [..., 2I]")
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up of gate_up [..., 2I] (gate, then up) -> [..., I], Gemma 3's MLP
    activation (torch's gelu(approximate="tanh")); see ``reference.gelu_tanh_mul``."""
    return torch.ops.mtp.gelu_tanh_mul.default(gate_up)


def _gelu_tanh_mul_fake(gate_up):
    torch._check(
        gate_up.dim() >= 1 and gate_up.shape[-1] % 2 == 0, lambda: "mtp.gelu_tanh_mul: gate_up must be [..., 2I]"
    )
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def decoder_layers(
    x: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    weights: list[torch.Tensor],
    weight_scales: list[torch.Tensor],
    num_heads: int,
    eps: float,
    *,
    quantize_x: bool = False,
    tree_parents: Optional[torch.Tensor] = None,
    weight_types: Optional[list[int]] = None,
    layer: str = "llama",
    windows: Optional[list[int]] = None,
    rope_cos_local: Optional[torch.Tensor] = None,
    rope_sin_local: Optional[torch.Tensor] = None,
    attention_scale: Optional[float] = None,
    taps: Optional[list[int]] = None,
    tap_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """A whole Llama-family decoder pass over the embeddings x [B, T, H] in one call (CPU):
    per layer input_norm, qkv, o_proj, post_norm, gate_up, down_proj in ``weights`` (then the
    final norm), Q8 scales of the four matrices per layer in ``weight_scales`` (or none). The
    tokens go to positions cache_lens[b] + t of k_cache, v_cache [layers, B, Hkv, L, D]
    (written in place; cache_lens is left for the caller to advance). tree_parents [B, T]
    makes each request's tokens a tree (row 0 the root, -1; row t's parent an earlier row):
    token t attends to the cache and its own path from the root, at position cache_lens[b] +
    its depth, with a chain's bits. Returns the final normed hidden states, bitwise those of
    the op-by-op composition; see ``reference.decoder_layers``. weight_types: per matrix (4 per
    layer) the GGML type number of a GGUF block-type matrix given as its uint8 bytes, or -1.
    layer="gemma3": Gemma 3's layer, 10 tensors per layer (``reference.GEMMA3_DECODER_PARTS``),
    windows per layer (0: global), the sliding layers' RoPE tables rope_cos_local /
    rope_sin_local, the attention scale attention_scale (None: 1/sqrt(D)).
    taps (layer indices, strictly increasing, each in [0, layers)) with tap_out [len(taps), B,
    T, H] (x's dtype and device, contiguous; both or neither, an empty list taps nothing):
    after layer taps[j], tap_out[j] receives (in place) the residual stream of every row, the
    sum after that layer's MLP add and before the next norm (HF's hidden_states[taps[j] + 1]),
    bitwise what the pass carries on (EAGLE-3-style low / middle / high features)."""
    return torch.ops.mtp.decoder_layers.default(
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
        weight_types=weight_types,
        layer=layer,
        windows=windows,
        rope_cos_local=rope_cos_local,
        rope_sin_local=rope_sin_local,
        attention_scale=attention_scale,
        taps=taps,
        tap_out=tap_out,
    )


def _decoder_layers_fake(
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
    torch._check(x.dim() == 3, lambda: f"{op}: x must be 3-D [B, T, H]")
    torch._check(k_cache.dim() == 5, lambda: f"{op}: k_cache must be 5-D [layers, B, Hkv, L, D]")
    _check_same_device(op, "x", x, k_cache=k_cache, v_cache=v_cache, cache_lens=cache_lens, tap_out=tap_out)
    torch._check(
        (taps is None) == (tap_out is None),
        lambda: f"{op}: taps and tap_out go together, got only {'taps' if taps is not None else 'tap_out'}",
    )
    if tap_out is not None:
        want = (len(taps), *x.shape)
        torch._check(
            tuple(tap_out.shape) == want and tap_out.dtype == x.dtype,
            lambda: (
                f"{op}: tap_out must be [len(taps), B, T, H] = {list(want)} in x's dtype {x.dtype}, "
                f"got {list(tap_out.shape)} {tap_out.dtype}"
            ),
        )
    return x.new_empty(x.shape)


def head_draft(
    hidden: torch.Tensor,
    token: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    embedding: torch.Tensor,
    embedding_scale: Optional[torch.Tensor],
    weights: list[torch.Tensor],
    lm_head: torch.Tensor,
    lm_head_scale: Optional[torch.Tensor],
    draft_vocab: Optional[torch.Tensor],
    k: int,
    num_heads: int,
    eps: float,
    *,
    alternatives: int = 0,
    embedding_type: int = -1,
    lm_head_type: int = -1,
    weight_types: Optional[list[int]] = None,
    probs_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The MTP head's k draft steps [B, k] in one call (CPU): its blocks read the cache views
    k_cache, v_cache [B, Hkv, L, D] of one backbone layer in place, its logits the rows
    draft_vocab of the backbone's lm_head [V, H] in place (or lm_head [Vd, H], Vd < V: those
    rows gathered once by the caller, MTPHead.draft_lm_head). alternatives = m appends the first
    step's 2nd..(m+1)-th best drafts: [B, k + m] (a tree's other first drafts); see
    ``reference.head_draft``. embedding_type / lm_head_type: the GGML type number of an
    embedding / LM head given as GGUF block-type bytes (``mtp_kernels.gguf``), or -1.
    weight_types: the same per matrix of the head's own (proj, then qkv, o_proj, gate_up,
    down_proj of each block; -1 a float one), or None: all float (MTPHead's matrices in 8 bits
    as Q8_0, half a draft's bytes). probs_out [B, k] float32 (any strides), when given,
    receives each draft's probability under the head (its softmax over the draft vocabulary;
    to rounding, not bitwise: it only steers how many drafts a caller verifies)."""
    return torch.ops.mtp.head_draft.default(
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
        embedding_type=embedding_type,
        lm_head_type=lm_head_type,
        weight_types=weight_types,
        probs_out=probs_out,
    )


def _head_draft_fake(
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
    torch._check(hidden.dim() == 2, lambda: "mtp.head_draft: hidden must be 2-D [B, H]")
    _check_same_device(
        "mtp.head_draft", "hidden", hidden, token=token, k_cache=k_cache, v_cache=v_cache, cache_lens=cache_lens
    )
    return hidden.new_empty((hidden.shape[0], k + alternatives), dtype=torch.int64)


def embedding(
    tokens: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: Optional[torch.Tensor] = None,
    *,
    gguf_type: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Rows ``tokens`` (int32/int64, any shape) of an embedding table ``weight`` [V, H] ->
    [*tokens.shape, H] in ``dtype``: float rows, Q8 rows (int8 with ``weight_scale``) or the
    bytes of a GGUF block type (``gguf_type``, either layout; CPU), dequantized in fp32 and
    rounded once (dtype None: a float table's own, else float32). See ``reference.embedding``."""
    return torch.ops.mtp.embedding.default(tokens, weight, weight_scale, gguf_type=gguf_type, dtype=dtype)


def _embedding_fake(tokens, weight, weight_scale=None, *, gguf_type=None, dtype=None):
    _check_same_device("mtp.embedding", "tokens", tokens, weight=weight, weight_scale=weight_scale)
    torch._check(weight.dim() == 2, lambda: f"mtp.embedding: weight must be 2-D [V, H], got {tuple(weight.shape)}")
    H = weight.shape[1]
    if gguf_type is not None:
        from .gguf import LAYOUTS

        torch._check(gguf_type in LAYOUTS, lambda: f"mtp.embedding: GGML type {gguf_type} is not supported")
        _, elems, nbytes = LAYOUTS[gguf_type]
        H = H // nbytes * elems
    quantized = gguf_type is not None or weight.dtype == torch.int8
    return tokens.new_empty((*tokens.shape, H), dtype=dtype or (torch.float32 if quantized else weight.dtype))


def _rope_copy(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    rope_(y, cos, sin)
    return y


# The kernels one op at a time, as reference.decoder_layers / reference.head_draft take them
# (ops=KERNELS): that composition gives mtp.decoder_layers's / mtp.head_draft's bits.
KERNELS = SimpleNamespace(
    linear=linear,
    rope=_rope_copy,
    cache_append=cache_append,
    head_attention=head_attention,
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    silu_mul=silu_mul,
    gelu_tanh_mul=gelu_tanh_mul,
    embedding=embedding,
)


# Each op's fake kernel, registered by ``_registry.register_all`` when the package is imported.
FAKES = {
    "verify": _verify_fake,
    "verify_ragged": _verify_ragged_fake,
    "verify_sampled_ragged": _verify_sampled_ragged_fake,
    "accept_prefix": _accept_prefix_fake,
    "verify_sampled": _verify_sampled_fake,
    "verify_lenient": _verify_lenient_fake,
    "linear": _linear_fake,
    "head_attention": _head_attention_fake,
    "cache_append": _cache_append_fake,
    "rms_norm": _rms_norm_fake,
    "add_rms_norm": _add_rms_norm_fake,
    "rope_": _rope_fake,
    "silu_mul": _silu_mul_fake,
    "gelu_tanh_mul": _gelu_tanh_mul_fake,
    "decoder_layers": _decoder_layers_fake,
    "head_draft": _head_draft_fake,
    "embedding": _embedding_fake,
}

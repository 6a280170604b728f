"""Pure-torch oracles: the executable specification of every ``torch.ops.mtp`` op.

Slow and simple on purpose; the kernels are tested against these functions.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional

import torch

from .quant import dequantize_q8


def accept_prefix(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, num_drafts: Optional[torch.Tensor] = None
) -> torch.Tensor:
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


def verify(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafts: Optional[torch.Tensor] = None, pad_id: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
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


def verify_ragged(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    pad_id: int = -1,
    max_num_drafts: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify`` in the flattened ragged layout of continuous batching (vLLM v1's rejection
    sampler), request by request.

    draft_token_ids [N] int32|int64; cu_num_draft_tokens [B] int32|int64, inclusive cumulative
    counts: request b has K_b = cu[b] - cu[b-1] drafts (cu[-1] = 0),
    draft_token_ids[cu[b-1] : cu[b]]; target_logits [N + B, V] fp32|bf16|fp16, any strides:
    request b's K_b + 1 rows are contiguous from row cu[b-1] + b (row j predicts the token
    after its j-th verified position, the last one gives the bonus token).
    Returns accepted [B] and out_tokens [B, W], W = max_num_drafts + 1 (>= every K_b + 1) or,
    when None, max_b K_b + 1 (1 when B = 0): per request exactly ``verify`` of its drafts and
    rows (the same argmax rule), its out_tokens row padded with pad_id up to W; both in
    draft_token_ids' dtype.
    """
    cu = [0] + [int(c) for c in cu_num_draft_tokens.tolist()]
    B = len(cu) - 1
    counts = [cu[b + 1] - cu[b] for b in range(B)]
    W = (max(counts, default=0) if max_num_drafts is None else max_num_drafts) + 1
    assert all(0 <= k < W for k in counts) and cu[B] == draft_token_ids.shape[0]
    assert target_logits.shape[0] == cu[B] + B
    accepted = draft_token_ids.new_zeros((B,))
    out = draft_token_ids.new_full((B, W), pad_id)
    for b in range(B):
        k, start = counts[b], cu[b]
        acc, tokens = verify(
            draft_token_ids[start : start + k][None], target_logits[start + b : start + b + k + 1][None], None, pad_id
        )
        accepted[b] = acc[0]
        out[b, : k + 1] = tokens[0]
    return accepted, out


def _q8_blocks(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t [..., K] as `dtype` blocks of 32 along K, the last one padded with zeros: [..., ceil(K/32), 32]."""
    K, lead = t.shape[-1], t.shape[:-1]
    nb = -(-K // 32)
    out = torch.zeros(*lead, nb * 32, dtype=dtype)
    out[..., :K] = t
    return out.view(*lead, nb, 32)


def quantize_rows_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation quantization of ``linear(..., quantize_x=True)``, bit for bit.

    x [..., K] fp32|bf16 (converted to fp32 exactly) -> (xq [..., K] int8, sx [..., ceil(K/32)]
    fp32). Row-local: each row in blocks of 32 along K (the last block may be partial), per
    block ``sx = fp32(amax|x| / 127)`` and ``xq = clamp(round_half_even(fp32(x / sx)), -127,
    127)``, both divisions in fp32; ``sx == 0`` (an all-zero block, or one so tiny that
    amax / 127 underflows) gives ``xq = 0``. A block holding a NaN or an infinity gets
    ``sx = NaN`` and ``xq = 0``: every output of its row is then NaN (NaN * 0 is NaN).
    """
    K, lead = x.shape[-1], x.shape[:-1]
    blocks = _q8_blocks(x.float(), torch.float32)
    nb = blocks.shape[-2]
    finite = torch.isfinite(blocks).all(dim=-1, keepdim=True)
    amax = torch.where(torch.isfinite(blocks), blocks, 0.0).abs().amax(dim=-1, keepdim=True)
    sx = amax / 127  # fp32 / fp32: one rounding
    use = finite & (sx > 0)
    q = torch.round(blocks / torch.where(use, sx, torch.ones_like(sx))).clamp(-127, 127)  # half to even
    q = torch.where(use, q, torch.zeros_like(q))
    sx = torch.where(finite, sx, torch.full_like(sx, float("nan")))
    return q.to(torch.int8).view(*lead, nb * 32)[..., :K].contiguous(), sx.view(*lead, nb).contiguous()


def q8_block_sums(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """The exact integer dot products of ``quantize_x``: xq [M, K], wq [N, K] int8 ->
    [M, N, ceil(K/32)] int64, block b = sum over its elements of xq * wq (they fit in int32)."""
    return torch.einsum("mbk,nbk->mnb", _q8_blocks(xq, torch.int64), _q8_blocks(wq, torch.int64))


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    weight_scale: Optional[torch.Tensor] = None,
    *,
    quantize_x: bool = False,
    gguf_type: Optional[int] = None,
) -> torch.Tensor:
    """y = x @ weight.T (+ bias), x [..., K] fp32|bf16, weight [N, K] fp32|bf16, bias [N];
    products summed in fp32 (here: fp64, then rounded), result in x's dtype.

    Weight-only int8 ("Q8", mtp_kernels.quant): weight [N, K] int8 with weight_scale
    [N, ceil(K/32)] fp32, one scale per block of 32 along K (the last block may be partial);
    the weight is weight[n, k] * weight_scale[n, k // 32] (dequantised here in fp64). The
    kernel sums each block's products in fp32, then adds scale * block sum.

    quantize_x=True (int8 weights only): x is quantized too (``quantize_rows_q8``, bitwise the
    kernel's), every block is an exact integer dot product (``q8_block_sums``), and
    y = sum_b (sx_b * sw_b) * isum_b (+ bias), here in fp64. The kernel combines the blocks in
    fp32 in a fixed order of its instruction set: within (nb + 8) * 2^-24 * sum_b |sx_b * sw_b| *
    sum_{k in b} |xq_k * wq_k| + 2^-23 |y| of this value (nb = ceil(K/32); 2^-8 |y| for a bf16 result;
    python_tests/test_linear_q8dot.py).

    The kernel's promise beyond this value: each output row has the same bits whatever
    the number of rows in the call (shape invariance), which torch's fp32 F.linear lacks.

    gguf_type: weight is a GGUF block-type matrix's bytes; ``gguf_linear`` (bitwise).
    """
    if gguf_type is not None:
        return gguf_linear(x, weight, gguf_type, bias)
    if quantize_x:
        if weight.dtype != torch.int8:
            raise ValueError(f"reference.linear: quantize_x=True needs an int8 weight, got {weight.dtype}")
        K, N = x.shape[-1], weight.shape[0]
        x2 = x.reshape(x.shape[:-1].numel(), K)
        xq, sx = quantize_rows_q8(x2)
        sums = q8_block_sums(xq, weight).double()  # [M, N, nb]
        y = (sums * (sx.double()[:, None, :] * weight_scale.double()[None, :, :])).sum(dim=-1)
        if bias is not None:
            y = y + bias.double()
        return y.to(x.dtype).reshape(*x.shape[:-1], N)
    w = weight.double()
    if weight_scale is not None:
        w = w * weight_scale.double().repeat_interleave(32, dim=1)[:, : weight.shape[1]]
    y = x.double() @ w.T
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


# ---- GGUF block-type weights (mtp_kernels.gguf; the contract: csrc/include/mtp/gguf.h) -------


def _f16_at(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at byte `offset` of each block [..., bytes] -> fp32 [...] (exact)."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16)[..., 0].float()


def _q4k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 packed bytes [..., 12] -> 6-bit scales and mins [..., 8] (ggml's layout)."""
    s = s.to(torch.int32)
    lo_sc, lo_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], -1), torch.cat([lo_m, hi_m], -1)


# gguf.h's x8 layout: a file block's fields in the file's order, each (piece bytes, pieces).
_X8_PIECES = {
    "Q4_0": [(2, 1), (4, 4)],
    "Q4_1": [(2, 1), (2, 1), (4, 4)],
    "Q8_0": [(2, 1), (4, 8)],
    "Q4_K": [(2, 1), (2, 1), (1, 12), (4, 32)],
    "Q6_K": [(4, 32), (4, 16), (1, 16), (2, 1)],
}


def x8_file_rows(data: torch.Tensor, gguf_type: int) -> torch.Tensor:
    """An x8 matrix's bytes [N, row_bytes] -> its rows in the file's layout, byte by byte from
    gguf.h's definition: byte i of row n's stored block b lies in group n // 8 at block b's
    8 * bytes * b; if it is byte w of piece k of a field starting at file byte `start` (pieces
    of p bytes), it sits at 8 * start + (8 * k + n % 8) * p + w."""
    from .gguf import LAYOUTS

    name, _, nbytes = LAYOUTS[gguf_type]
    where = []  # per file byte i: its offset in an x8 block for row 0, and its piece's bytes
    for size, count in _X8_PIECES[name.removesuffix("_X8")]:
        start = len(where)
        where += [(8 * start + 8 * (j // size) * size + j % size, size) for j in range(size * count)]
    at = torch.tensor([w for w, _ in where])[None, None, :]
    size = torch.tensor([p for _, p in where])[None, None, :]
    N, rb = data.shape
    n = torch.arange(N)[:, None, None]
    b = torch.arange(rb // nbytes)[None, :, None]
    pos = n // 8 * 8 * rb + 8 * nbytes * b + at + (n % 8) * size
    return data.reshape(-1)[pos.reshape(N, rb)]


def gguf_blocks(data: torch.Tensor, gguf_type: int):
    """The canonical form of gguf.h: rows of bytes [N, row_bytes] (either layout) -> per block
    of 32 (q int32 [N, nb, 32] with offsets applied, d fp32 [N, nb], m fp32 [N, nb] (0 without
    an offset), mul int32 [N, nb, 2] (Q6_K's scale per half-block, else 1)); element =
    d * (mul * q) + m, the product exact in fp32."""
    from .gguf import BLOCK_TYPES, X8_TYPES

    if gguf_type in X8_TYPES:
        data, gguf_type = x8_file_rows(data, gguf_type), gguf_type - 100
    name, elems, nbytes = BLOCK_TYPES[gguf_type]
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % nbytes:
        raise ValueError(
            f"{name} rows must be a 2-D uint8 tensor of whole {nbytes}-byte blocks, got {data.dtype} {list(data.shape)}"
        )
    N = data.shape[0]
    blocks = data.contiguous().view(N, data.shape[1] // nbytes, nbytes)  # sizes spelled out: N may be 0
    ones = torch.ones(N, blocks.shape[1] * elems // 32, 2, dtype=torch.int32)
    if name == "Q5_0":  # qh bit e: the 5th bit of element e (little-endian uint32)
        qh = blocks[..., 2:6].to(torch.int64)
        qh = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        high = ((qh[..., None] >> torch.arange(32)) & 1).to(torch.int32)
        qs = blocks[..., 6:].to(torch.int32)
        d = _f16_at(blocks, 0)
        return (torch.cat([qs & 0xF, qs >> 4], -1) | (high << 4)) - 16, d, torch.zeros_like(d), ones
    if name in ("Q4_0", "Q4_1"):
        qs = blocks[..., nbytes - 16 :].to(torch.int32)
        q = torch.cat([qs & 0xF, qs >> 4], -1) - (8 if name == "Q4_0" else 0)
        d = _f16_at(blocks, 0)
        m = _f16_at(blocks, 2) if name == "Q4_1" else torch.zeros_like(d)
        return q, d, m, ones
    if name == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int32)
        d = _f16_at(blocks, 0)
        return q, d, torch.zeros_like(d), ones
    ns = blocks.shape[1]
    if name == "Q4_K":
        sc, mn = _q4k_scale_min(blocks[..., 4:16])  # [N, ns, 8]
        qs = blocks[..., 16:].to(torch.int32).view(N, ns, 4, 1, 32)
        q = torch.cat([qs & 0xF, qs >> 4], 3).view(N, ns * 8, 32)  # sub-block 2c: low, 2c+1: high
        d = (_f16_at(blocks, 0)[..., None] * sc.float()).view(N, ns * 8)
        m = -(_f16_at(blocks, 2)[..., None] * mn.float()).view(N, ns * 8)
        return q, d, m, ones
    # Q6_K: 32-block b of a superblock: half h = b // 4, g = b % 4
    ql = blocks[..., 0:128].to(torch.int32).view(N, ns, 2, 2, 32)  # [h, g & 1]
    qh = blocks[..., 128:192].to(torch.int32).view(N, ns, 2, 1, 32)  # [h]
    nib = torch.stack([ql[:, :, :, 0] & 0xF, ql[:, :, :, 1] & 0xF, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], 3)
    top = (qh >> torch.tensor([0, 2, 4, 6]).view(1, 1, 1, 4, 1)) & 3
    q = (nib | (top << 4)).view(N, ns * 8, 32) - 32
    mul = blocks[..., 192:208].contiguous().view(torch.int8).to(torch.int32).view(N, ns * 8, 2)
    d = _f16_at(blocks, 208)[..., None].expand(N, ns, 8).reshape(N, ns * 8)
    return q, d, torch.zeros_like(d), mul


def gguf_dequantize(data: torch.Tensor, gguf_type: int) -> torch.Tensor:
    """Rows of a GGUF block type [N, row_bytes] uint8 -> fp32 [N, K]: d * (mul * q) + m, one
    rounding (bitwise the `gguf` package's dequantizer and the kernels' embedding rows)."""
    q, d, m, mul = gguf_blocks(data, gguf_type)
    w = (q * mul.repeat_interleave(16, -1)).float() * d[..., None] + m[..., None]
    return w.view(data.shape[0], w.shape[1] * w.shape[2])


def embedding(
    tokens: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: Optional[torch.Tensor] = None,
    *,
    gguf_type: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Rows ``tokens`` (int32/int64 ids in [0, V), any shape) of an embedding table ``weight``
    [V, H] -> [*tokens.shape, H] in ``dtype``, each element computed in fp32 and rounded to
    dtype once: float rows as they are (dtype None: the table's own dtype), Q8 rows (int8 with
    weight_scale [V, ceil(H/32)]) ``dequantize_q8``, GGUF rows (gguf_type: weight the uint8
    bytes [V, row_bytes], the file's or an x8 layout) ``gguf_dequantize``; dtype None for
    those: float32. What a pass and each draft step of head_draft start from."""
    from .gguf import X8_TYPES

    ids = tokens.reshape(-1).long()
    if gguf_type is not None:
        if gguf_type in X8_TYPES:  # each id's group of 8 rows to the file's layout, then its row
            V, rb = weight.shape
            group = weight.reshape(V // 8, 8 * rb)[ids // 8].reshape(8 * ids.numel(), rb)
            rows = x8_file_rows(group, gguf_type).view(ids.numel(), 8, rb)[torch.arange(ids.numel()), ids % 8]
            gguf_type -= 100
        else:
            rows = weight[ids]
        out = gguf_dequantize(rows, gguf_type)
    elif weight_scale is not None:
        out = dequantize_q8(weight[ids], weight_scale[ids])
    else:
        out = weight[ids]
    dtype = dtype or (weight.dtype if gguf_type is None and weight_scale is None else torch.float32)
    return out.to(dtype).view(*tokens.shape, out.shape[-1])


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add, correctly rounded: a * b is exact in fp64; the fp64 sum is
    made round-to-odd (its exact error by TwoSum), so rounding it to fp32 rounds once."""
    p, c64 = a.double() * b.double(), c.double()
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    even = (s.view(torch.int64) & 1) == 0
    towards = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    s = torch.where((err != 0) & even & torch.isfinite(s), torch.nextafter(s, towards), s)
    return s.float()


def gguf_linear(
    x: torch.Tensor, data: torch.Tensor, gguf_type: int, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``mtp.linear(x, data, bias, gguf_type=gguf_type)`` bit for bit: x [..., K] fp32|bf16,
    data [N, row_bytes] uint8 (a GGUF block type, either layout). x is quantized row by row
    (``quantize_rows_q8``); per output element one chain over the blocks of 32 in order:
    ``I = mul_0 * (products 0..15) + mul_1 * (products 16..31)`` (exact),
    ``acc = fma(I, d * dx, acc)``; ``accm = fma(m, dx * sum(xq), accm)`` (formats with an
    offset only: Q4_1, Q4_K; elsewhere accm stays 0, so an overflowing dx * sum(xq) cannot turn
    a finite or infinite sum into NaN); ``y = acc + accm (+ bias)`` in fp32, then x's dtype."""
    from .gguf import LAYOUTS

    offset = LAYOUTS[gguf_type][0].removesuffix("_X8") in ("Q4_1", "Q4_K")
    q, d, m, mul = gguf_blocks(data, gguf_type)  # [N, nb, 32], [N, nb], ...
    K, N, nb = x.shape[-1], data.shape[0], q.shape[1]
    if K != nb * 32:
        raise ValueError(f"reference.gguf_linear: x has K = {K}, the weight rows hold {nb * 32} elements")
    x2 = x.reshape(-1, K)
    xq, dx = quantize_rows_q8(x2)
    xq = xq.to(torch.int64).view(-1, nb, 2, 16)
    s = dx * xq.sum(dim=(2, 3)).float()  # [M, nb]
    halves = torch.einsum("mbhi,nbhi->mnbh", xq, q.to(torch.int64).view(N, nb, 2, 16))
    I = (halves * mul.to(torch.int64)[None]).sum(-1).float()  # [M, N, nb], exact
    p = d[None] * dx[:, None]  # [M, N, nb] fp32
    acc = torch.zeros(x2.shape[0], N)
    accm = torch.zeros(x2.shape[0], N)
    for b in range(nb):
        acc = fma32(I[:, :, b], p[:, :, b], acc)
        if offset:
            accm = fma32(m[None, :, b].expand_as(accm), s[:, None, b].expand_as(accm), accm)
    y = acc + accm
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], N)


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
    """Decode attention of T queries per request over its KV cache (fp64 math, explicit masks).

    q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D] (any strides), Hq a multiple of Hkv
    (query head h reads kv head h // (Hq // Hkv)); cache_lens [B]: request b's first
    cache_lens[b] keys are its cache. Query t of request b sees cache keys [0, cache_lens[b])
    or, with causal=True, [0, cache_lens[b] - T + t] (the queries are the last T cached
    positions; cache_lens[b] >= T). An optional local segment k_local, v_local [B, Hkv, S, D]
    (the MTP head's own draft positions) is attended causally, the T queries being its last T
    positions: query t also sees local entries s <= S - T + t (s <= t when S == T; a single
    query sees all S). scale defaults to 1/sqrt(D). Returns [B, T, Hq, D] in q's dtype.

    Sliding window (window > 0; None or 0: none), as Gemma 3 and transformers define it: the
    query at position p sees only the keys at positions j with p - window < j <= p, the last
    ``window`` positions, itself included. With causal=True query t sits at position
    p = cache_lens[b] - T + t, so it sees keys [max(0, p + 1 - window), p]. Without causal
    every query sits at the last key, p = cache_lens[b] - 1, and sees keys
    [max(0, cache_lens[b] - window), cache_lens[b]) (a one-query decode step, whose key is
    already cached, is the same either way). In every mode a row sees the last ``window`` of
    the cache keys it would see without one; window >= that count changes nothing. A window
    does not combine with a local segment (an error). In a tree pass (decoder_layers'
    tree_parents) a query sits at its chain position (cache_lens[b] - T + its depth) and the
    window spans the committed cache keys and its path alike. Keys older than a row's window
    are never read by the kernels (not only masked).

    Extreme values, per output row (b, t, h), nothing else is read:
    - it sees no key: zeros;
    - one of its scores, evaluated in fp32 (fp32(scale) * sum_d of the fp32 products
      q_d * k_jd), is not finite, or one element of a value it sees is not finite: every
      element NaN. A non-finite q or key, or a product q_d * k_jd past the fp32 range,
      makes a score non-finite in any summation order; a -inf score is no exception (no mask
      is expressed through scores: how an overflowing dot comes out, -inf, +inf or NaN,
      depends on the order). Keys and values a row does not see never matter.
    - else the softmax (in fp64 here).
    The kernels accumulate in fp32 (their own orders): a score whose products each fit but
    whose sum overflows fp32, or values whose weighted sum does, may give them a NaN row
    where this function gives finite numbers.
    """
    B, T, Hq, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    scale = D**-0.5 if scale is None else scale
    if window is not None and window < 0:
        raise ValueError(f"head_attention: window must be >= 0, got {window}")
    if window and k_local is not None:
        raise ValueError("head_attention: a window does not combine with a local segment (k_local / v_local)")
    t = torch.arange(T)
    lens = cache_lens.long()[:, None]
    limit = lens - T + t[None, :] + 1 if causal else lens.expand(B, T)  # [B, T]: keys [0, limit)
    keys, vals = [k_cache], [v_cache]
    pos = torch.arange(L)[None, None, :]
    masks = [pos < limit[:, :, None]]  # [B, T, L]
    if window:  # the query sits at position limit - 1: keys limit - 1 - window < j
        masks[0] &= pos >= limit[:, :, None] - window
    if k_local is not None:
        S = k_local.shape[2]
        keys.append(k_local)
        vals.append(v_local)
        masks.append((torch.arange(S)[None, :] <= S - T + t[:, None]).expand(B, T, S))
    k = torch.cat([x.repeat_interleave(G, dim=1) for x in keys], dim=2)  # [B, Hq, L+S, D]
    v = torch.cat([x.repeat_interleave(G, dim=1) for x in vals], dim=2)
    mask = torch.cat(masks, dim=2)[:, None]  # [B, 1, T, L+S]
    qf = q.permute(0, 2, 1, 3)  # [B, Hq, T, D]
    # The fp32 scores only decide which rows are NaN; the numbers come from fp64 ones.
    s32 = (qf.float()[:, :, :, None, :] * k.float()[:, :, None, :, :]).sum(-1) * torch.tensor(
        scale, dtype=torch.float32
    )
    nan_row = ((~torch.isfinite(s32) | ~torch.isfinite(v).all(-1)[:, :, None, :]) & mask).any(-1, keepdim=True)
    scores = (qf.double() @ k.double().transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).min)  # no key: finite
    p = torch.exp(scores - m)  # unseen keys: 0
    v = torch.where(torch.isfinite(v), v, 0).double()  # unseen ones must add 0, not 0 * inf (seen: NaN row)
    out = (p @ v) / p.sum(dim=-1, keepdim=True).clamp_min(1)  # sum >= 1 (the max) with a key; none: 0 / 1
    out = torch.where(nan_row, float("nan"), out)
    return out.permute(0, 2, 1, 3).to(q.dtype)


def cache_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache_lens: torch.Tensor
) -> None:
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
        k_cache[b, :, n : n + T] = k_new[b].transpose(0, 1)
        v_cache[b, :, n : n + T] = v_new[b].transpose(0, 1)


_MASK64 = (1 << 64) - 1


def mix64(z: int) -> int:
    """splitmix64's finaliser on a 64-bit unsigned integer (Python int)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


STREAM_ACCEPT, STREAM_SAMPLE = 0, 1


def sample_uniform(seed: int, position: int, stream: int) -> float:
    """The counter-based RNG of verify_sampled: a uniform in [0, 1) on the 2^-24 grid,
        h = mix64(mix64(mix64(seed) + position) + stream)   (all mod 2^64; seed, position
        u = (h >> 40) / 2^24                                  as two's-complement uint64)
    with mix64 splitmix64's finaliser. No sequential state: a token depends only on its key.
    """
    h = mix64((mix64((mix64(seed & _MASK64) + (position & _MASK64)) & _MASK64) + stream) & _MASK64)
    return (h >> 40) / 16777216.0


# exp_fixed's constants (verify_sampled.h): Cody-Waite ln2 split, Taylor terms to r^13.
_LN2_HI, _LN2_LO, _INV_LN2 = 6.93147180369123816490e-01, 1.90821492927058770002e-10, 1.44269504088896338700e00
_EXP_TERMS = 13
SAMPLE_BLOCK = 256  # kSampleBlock: the fixed summation order's block


def exp_fixed(y: torch.Tensor) -> torch.Tensor:
    """exp(y) for fp64 y <= 0 in verify_sampled.h's exact steps (every backend gets the same bits):
    k = floor(y / ln2 + 0.5), r = (y - k ln2_hi) - k ln2_lo, Horner over 1/n! (n = 13..0,
    each coefficient 1.0 / n!), times 2^k; 0 below -708."""
    yc = torch.clamp_min(y, -708.0)
    k = torch.floor(yc * _INV_LN2 + 0.5)
    r = (yc - k * _LN2_HI) - k * _LN2_LO
    p = torch.full_like(r, 1.0 / math.factorial(_EXP_TERMS))
    for n in range(_EXP_TERMS - 1, -1, -1):
        p = p * r + 1.0 / math.factorial(n)
    two_k = ((k.long() + 1023) << 52).view(torch.float64)  # 2^k by its bits: exact
    return torch.where(y >= -708.0, p * two_k, 0.0)


def _row_weights(
    logits_row: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """w in fp64: w_i = exp_fixed((x_i - max x) / T), then the filters (_filter_weights); a
    point mass on torch.argmax's choice when T == 0 or the row has a NaN, +inf or only -inf
    (no filter removes it)."""
    x = logits_row.double()
    m = x.max()
    if temperature == 0 or not bool(torch.isfinite(m)):
        w = torch.zeros_like(x)
        w[int(logits_row.argmax())] = 1.0
        return w
    w = exp_fixed((x - m) / temperature)
    if top_k > 0 or top_p < 1 or min_p > 0:
        w = _filter_weights(logits_row.float(), w, top_k, top_p, min_p)
    return w


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving keys of fp32 values, as int64 in [0, 2^32): key(a) < key(b) iff a < b,
    -0 just below +0 (verify_sampled.h order_key). The filters cut on keys: integers."""
    u = x.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(u >= 2**31, 0xFFFFFFFF - u, u + 2**31)


def _filter_weights(x: torch.Tensor, w: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The filters of verify_sampled on one row (x its fp32 logits, w its weights), in vLLM's
    order after the temperature; returns w with the removed tokens' weights set to 0:
      min_p: keep w_i >= min_p (p_i >= min_p * max p);
      top_k: keep the tokens whose key is >= the top_k-th largest key among those kept (ties at
             the cut all stay; off when top_k is 0 or >= their number);
      top_p: among those kept, with S1 their _ordered_sum and above(v) the _ordered_sum of the
             kept weights whose key is > v: keep token i iff above(key_i) < top_p * S1 (the
             smallest top set of mass >= top_p; ties at its edge all stay)."""
    keep = w >= min_p
    keys = order_keys(x)
    if 0 < top_k < int(keep.sum()):
        keep &= keys >= keys[keep].topk(top_k).values[-1]
    if top_p < 1:
        bound = top_p * _ordered_sum(torch.where(keep, w, 0.0))
        cut = None
        for k in keys[keep].unique().flip(0).tolist():  # from the top down; above() only grows
            if not _ordered_sum(torch.where(keep & (keys > k), w, 0.0)) < bound:
                break
            cut = k
        keep &= keys >= cut
    return torch.where(keep, w, 0.0)


def _block_trees(w: torch.Tensor) -> list[torch.Tensor]:
    """The pairwise trees of w's SAMPLE_BLOCK-wide blocks (zeros past the end): levels[0] the
    leaves [nb, 256], levels[l + 1][:, j] = levels[l][:, 2j] + levels[l][:, 2j + 1]."""
    nb = -(-w.numel() // SAMPLE_BLOCK)
    level = torch.cat([w, w.new_zeros(nb * SAMPLE_BLOCK - w.numel())]).view(nb, SAMPLE_BLOCK)
    levels = [level]
    while level.shape[1] > 1:
        level = level[:, 0::2] + level[:, 1::2]
        levels.append(level)
    return levels


def _ordered_sum(w: torch.Tensor) -> float:
    """The fixed order: block trees' roots added left to right."""
    s = 0.0
    for b in _block_trees(w)[-1][:, 0].tolist():
        s += b
    return s


def _inverse_cdf(w: torch.Tensor, total: float, u: float) -> int:
    """The first block whose running sum passes u * total, then down its tree: left unless
    the left subtree's sum is passed (or the right one is empty). total = _ordered_sum(w)."""
    target = u * total
    levels = _block_trees(w)
    acc = 0.0
    for c, s in enumerate(levels[-1][:, 0].tolist()):
        if not (s > 0 and acc + s > target):
            acc += s
            continue
        n = 0
        for level in reversed(levels[:-1]):
            left, right = float(level[c, 2 * n]), float(level[c, 2 * n + 1])
            if right == 0 or acc + left > target:
                n = 2 * n
            else:
                acc += left
                n = 2 * n + 1
        return c * SAMPLE_BLOCK + n
    return 0  # unreachable: target < total


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
    """Lossless chain rejection sampling (Leviathan et al. 2023, Chen et al. 2023).

    draft_tokens [B, K] int32|int64; draft_probs [B, K, V] (q: the distributions the drafts
    were sampled from) or None (one-hot: greedy drafts); target_logits [B, K+1, V]; temperature
    [B] fp32, >= 0; seeds, offsets [B] int64 (offsets default 0); num_drafts [B] in [0, K];
    top_k [B] int32|int64 >= 0, top_p [B] fp32 in (0, 1], min_p [B] fp32 in [0, 1) (None, or
    0 / 1 / 0: off).
    Request b, row t = 0..n (n = num_drafts[b]), key (seeds[b], position offsets[b] + t):
      p_t = softmax(target_logits[b, t] / T) as w_i / S, w_i = exp_fixed((x_i - max x) / T)
            in fp64 with the request's filters applied (_filter_weights: min_p, top_k, top_p),
            S their _ordered_sum (a point mass on torch.argmax when T == 0 or the row
            has a NaN, +inf or only -inf);
      u_s = sample_uniform(seed, pos, 1), u_a = sample_uniform(seed, pos, 0);
      inverse_cdf(r, u) = _inverse_cdf(r, _ordered_sum(r), u): ~ the first i with
            r_0 + ... + r_i > u * sum(r), in a fixed order of fp64 additions.
    One-hot drafts, or T == 0, or t == n: y = inverse_cdf(p_t, u_s); the draft is accepted
      iff t < n and y == draft (probability p_t(x) = min(1, p/q); given rejection y follows
      normalize(max(0, p - q)); so the law is rejection sampling's, and y is the token plain
      sampling draws at that position with the same key; T == 0 is exactly mtp.verify).
    With draft_probs (T > 0, t < n): accept x iff 0 <= x < V and u_a * q_t(x) < p_t(x); else
      y = inverse_cdf(max(0, p_t - q_t), u_s) (p_t when that is all zero).
    At the first rejection (or t == n, the bonus) y is emitted and the request stops.
    Returns accepted [B] and out_tokens [B, K+1] (accepted drafts, y, then pad_id), both in
    draft_tokens' dtype. Every float step is an exact IEEE operation in a fixed order, so
    this reference, the CPU kernel and the Triton kernel agree bit for bit.
    """
    B, K = draft_tokens.shape
    nd = [K] * B if num_drafts is None else num_drafts.long().tolist()
    offs = [0] * B if offsets is None else offsets.long().tolist()
    accepted = torch.zeros(B, dtype=torch.long)
    out = torch.full((B, K + 1), pad_id, dtype=torch.long)
    ks = [0] * B if top_k is None else top_k.long().tolist()
    ps = [1.0] * B if top_p is None else top_p.double().tolist()
    mps = [0.0] * B if min_p is None else min_p.double().tolist()
    for b in range(B):
        T, seed = float(temperature[b]), int(seeds[b])
        for t in range(nd[b] + 1):
            w = _row_weights(target_logits[b, t], T, ks[b], ps[b], mps[b])
            S = _ordered_sum(w)
            us = sample_uniform(seed, offs[b] + t, STREAM_SAMPLE)
            x = int(draft_tokens[b, t]) if t < nd[b] else None
            if x is None or draft_probs is None or T == 0:
                y = _inverse_cdf(w, S, us)
                if x is not None and x == y:
                    out[b, t] = x
                    continue
            else:
                q = draft_probs[b, t].double()
                ua = sample_uniform(seed, offs[b] + t, STREAM_ACCEPT)
                if 0 <= x < w.numel() and ua * float(q[x]) < float(w[x]) / S:
                    out[b, t] = x
                    continue
                r = torch.clamp_min(w / S - q, 0.0)
                R = _ordered_sum(r)
                y = _inverse_cdf(r, R, us) if R > 0 else _inverse_cdf(w, S, us)
            out[b, t] = y
            accepted[b] = t
            break
    return accepted.to(draft_tokens.dtype), out.to(draft_tokens.dtype)


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
    """``verify_sampled`` in ``verify_ragged``'s flattened layout, request by request.

    draft_token_ids [N], cu_num_draft_tokens [B] and target_logits [N + B, V] as
    ``verify_ragged`` (request b: K_b = cu[b] - cu[b-1] drafts from cu[b-1], K_b + 1 logits
    rows from cu[b-1] + b); draft_probs [N, V] or None (row cu[b-1] + j: the distribution
    request b's draft j was sampled from); temperature, seeds, offsets, top_k, top_p, min_p [B]
    as ``verify_sampled``. Returns accepted [B] and out_tokens [B, W] (W as ``verify_ragged``):
    request b's outputs are exactly ``verify_sampled``'s for that request alone (its drafts,
    rows, q rows, seed, offset and filters), its row padded with pad_id up to W.
    """
    cu = [0] + [int(c) for c in cu_num_draft_tokens.tolist()]
    B = len(cu) - 1
    counts = [cu[b + 1] - cu[b] for b in range(B)]
    W = (max(counts, default=0) if max_num_drafts is None else max_num_drafts) + 1
    assert all(0 <= k < W for k in counts) and cu[B] == draft_token_ids.shape[0]
    assert target_logits.shape[0] == cu[B] + B
    accepted = draft_token_ids.new_zeros((B,))
    out = draft_token_ids.new_full((B, W), pad_id)

    def one(t: Optional[torch.Tensor], b: int) -> Optional[torch.Tensor]:
        return None if t is None else t[b : b + 1]

    for b in range(B):
        k, start = counts[b], cu[b]
        acc, tokens = verify_sampled(
            draft_token_ids[start : start + k][None],
            None if draft_probs is None else draft_probs[start : start + k][None],
            target_logits[start + b : start + b + k + 1][None],
            temperature[b : b + 1],
            seeds[b : b + 1],
            one(offsets, b),
            None,
            pad_id,
            one(top_k, b),
            one(top_p, b),
            one(min_p, b),
        )
        accepted[b] = acc[0]
        out[b, : k + 1] = tokens[0]
    return accepted, out


def verify_lenient(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    num_drafts: Optional[torch.Tensor] = None,
    top_k: int = 1,
    min_ratio: float = 1.0,
    pad_id: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lenient greedy verification. NOT lossless: the output drifts from greedy decoding.

    Arguments and outputs as ``verify``, plus top_k >= 1 and min_ratio in [0, 1]. Request b
    accepts draft x at row t < num_drafts[b] when 0 <= x < V and either x is the row's
    torch.argmax, or the row has no NaN, fewer than top_k entries rank above x (a larger
    logit, or an equal one at a lower index) and logit_x - max >= log(min_ratio) in fp64
    (p(x) / p(argmax) >= min_ratio under the softmax at temperature 1). At the first rejected
    row (or row num_drafts[b]) the argmax is emitted, then pad_id. top_k = 1 is ``verify``.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must lie in [0, 1], got {min_ratio}")
    B, K = draft_tokens.shape
    V = target_logits.shape[2]
    nd = [K] * B if num_drafts is None else num_drafts.long().tolist()
    log_ratio = math.log(min_ratio) if min_ratio > 0 else -math.inf
    accepted = torch.zeros(B, dtype=torch.long)
    out = torch.full((B, K + 1), pad_id, dtype=torch.long)
    for b in range(B):
        for t in range(nd[b] + 1):
            row = target_logits[b, t].float()
            top = int(row.argmax())
            x = int(draft_tokens[b, t]) if t < nd[b] else -1
            take = 0 <= x < V and x == top
            if 0 <= x < V and not take and not bool(row.isnan().any()):
                vx = row[x]
                above = int(((row > vx) | ((row == vx) & (torch.arange(V) < x))).sum())
                take = above < top_k and float(vx) - float(row[top]) >= log_ratio
            if take:
                out[b, t] = x
                continue
            out[b, t] = top
            accepted[b] = t
            break
    return accepted.to(draft_tokens.dtype), out.to(draft_tokens.dtype)


# ---- the row-local layer ops (rms_norm, add_rms_norm, rope_, silu_mul, gelu_tanh_mul) -----
NORM_LANES = 16  # kNormLanes: the lanes of the RMSNorm sum of squares


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of x [..., H] (fp32|bf16|fp16) with weight [H] (fp32|bf16|fp16),
    result in x's dtype. fp32 arithmetic in this exact order, which the kernel follows on
    every instruction set (this function gives its bits):
        ss  = sum of the squares x_k * x_k: square k adds into lane k % 16 in k order, then the
              16 lanes are added by the tree (l, l+8), (l, l+4), (l, l+2), (l, l+1)
        inv = 1 / sqrt(ss / H + eps)      (eps rounded to fp32; each step one IEEE rounding)
        out = (x * inv) * weight, rounded to x's dtype
    A row's bits depend on that row only, never on how many rows share the call.
    Differentiable (plain torch): the training code uses it as the runtime's norm.
    """
    xf = x.float()
    H = x.shape[-1]
    sq = torch.nn.functional.pad(xf * xf, (0, -H % NORM_LANES))  # zeros past H add nothing
    chunks = sq.unflatten(-1, (-1, NORM_LANES))
    acc = torch.zeros_like(chunks[..., 0, :])
    for c in range(chunks.shape[-2]):
        acc = acc + chunks[..., c, :]
    w = NORM_LANES
    while w > 1:
        w //= 2
        acc = acc[..., :w] + acc[..., w : 2 * w]
    # Each step one IEEE operation on every device: divide by a tensor (CUDA multiplies by the
    # reciprocal of a host scalar); sqrt in fp64 rounded to fp32 is the correctly rounded fp32
    # sqrt (torch's fp32 sqrt is not correctly rounded on the CPU, nor rsqrt on CUDA).
    v = acc / acc.new_full((), H) + acc.new_full((), eps)
    inv = torch.reciprocal(torch.sqrt(v.double()).float())
    return (xf * inv * weight.float()).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add fused with the norm that follows it: sum = x + residual (in fp32,
    rounded to x's dtype, as torch adds two bf16 tensors), normed = rms_norm(sum, weight, eps).
    residual has x's shape and dtype. Returns (sum, normed)."""
    s = (x.float() + residual.float()).to(x.dtype)
    return s, rms_norm(s, weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding in the half-split layout (Llama's rotate_half): x [B, T, H, D]
    (fp32|bf16|fp16, D even), cos and sin [B, T, D] fp32 at each token's position (shared by
    the H heads). With lo = x[..., :D/2] and hi = x[..., D/2:] in fp32:
        lo' = lo * cos[:D/2] - hi * sin[:D/2],   hi' = hi * cos[D/2:] + lo * sin[D/2:]
    each product rounded to fp32, the result rounded to x's dtype (the kernel's bits). This
    returns a new tensor; ``mtp.rope_`` writes the same values into x in place.
    Differentiable (plain torch)."""
    half = x.shape[-1] // 2
    xf = x.float()
    lo, hi = xf[..., :half], xf[..., half:]
    c, s = cos[:, :, None].float(), sin[:, :, None].float()
    return torch.cat([lo * c[..., :half] - hi * s[..., :half], hi * c[..., half:] + lo * s[..., half:]], dim=-1).to(
        x.dtype
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The gated MLP activation: gate_up [..., 2I] (fp32|bf16|fp16) holds gate then up;
    returns silu(gate) * up [..., I] computed in fp32 and rounded once to gate_up's dtype
    (torch's bf16 silu(gate) * up rounds twice). The kernel's exp is a polynomial: its fp32
    values are within a few ulp of this function's, the same bits on every instruction set."""
    g, u = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(gate_up.dtype)


GELU_TANH_2K = 1.5957691216057308  # 2 sqrt(2/pi), as the kernel's fp32 constant (rounded to fp32)
GELU_TANH_KAPPA = 0.044715


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Gemma 3's gated MLP activation: gate_up [..., 2I] (fp32|bf16|fp16) holds gate then up;
    returns gelu_tanh(gate) * up [..., I] computed in fp32 and rounded once to gate_up's dtype.
    gelu_tanh is torch's ``gelu(approximate="tanh")``, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715
    g^3))), written as g * sigmoid(a) with a = 2 sqrt(2/pi) (g + 0.044715 g^3) and t = e^-|a|:
        act = g / (1 + t) for g >= 0,  g t / (1 + t) otherwise
    each step one fp32 operation in the kernel's order (a = 2K * (g + kappa * ((g g) g)), the
    constants rounded to fp32), so no exponential overflows and nothing cancels: torch's fp32
    formula loses gelu's digits for negative g (1 + tanh: 1e-5 relative at g = -3, 30% at -5,
    0 below -5.06). The kernel's exp is a polynomial (its e^-|a| is 0 below -87.3: gelu(g) is
    -0 for g below -9.9995, where it is under 1.3e-37 in magnitude): its fp32 values are
    within a few ulp of this function's, the same bits on every instruction set. Edges:
    gelu(+inf) = inf, gelu(-inf) = NaN (-inf * 0, as torch's gelu and silu give), NaN stays NaN.
    """
    g, u = gate_up.float().chunk(2, dim=-1)
    k = torch.tensor(GELU_TANH_2K, dtype=torch.float32, device=g.device)
    kappa = torch.tensor(GELU_TANH_KAPPA, dtype=torch.float32, device=g.device)
    t = torch.exp(-(k * (g + kappa * (g * g * g))).abs())
    act = torch.where(g >= 0, g, g * t) / (1 + t)
    return (act * u).to(gate_up.dtype)


# ---- a whole decoder pass ----------------------------------------------------------------
DECODER_PARTS = ("input_norm", "qkv", "o_proj", "post_norm", "gate_up", "down_proj")  # per layer, in `weights`
# layer="gemma3": Gemma 3's layer, per layer in `weights` (the matrices the same four as DECODER_PARTS')
GEMMA3_DECODER_PARTS = (
    "input_norm",
    "qkv",
    "q_norm",
    "k_norm",
    "o_proj",
    "post_attention_norm",
    "pre_feedforward_norm",
    "gate_up",
    "down_proj",
    "post_feedforward_norm",
)


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
    ops=None,
) -> torch.Tensor:
    """A Llama-family decoder pass over the embeddings x [B, T, H] (fp32|bf16): the composition
    below of the layer ops. weights holds per layer DECODER_PARTS (norms [H] in x's dtype;
    qkv [(Hq + 2 Hkv) D, H] = the q, k, v heads' rows; o_proj [H, Hq D]; gate_up [2I, H] =
    gate rows, then up rows; down_proj [H, I]), then the final norm; weight_scales is empty or
    holds the Q8 scales of qkv, o_proj, gate_up, down_proj per layer (int8 matrices; with
    quantize_x the activations entering them are quantized too). Request b's tokens take
    positions p = cache_lens[b] + t (RoPE angles rope_cos/rope_sin [P, D] row p; written to
    k_cache, v_cache [layers, B, Hkv, L, D] in place; cache_lens is not advanced). Returns the
    final norm of the last residual stream, [B, T, H].

    tree_parents [B, T] (row 0 of each request -1, row t's parent in [0, t); None: a chain)
    makes the tokens a tree: token t is still stored at cache_lens[b] + t, but takes position
    cache_lens[b] + its depth and attends to the cache's first cache_lens[b] keys, then the
    keys of its path from the root: what a chain of its path's tokens would see.

    weight_types: per matrix (4 per layer), the GGML type number of a GGUF block-type matrix
    given as its bytes (``gguf_linear``), or -1.

    layer="gemma3": Gemma 3's layer (``_gemma3_layer``): per layer GEMMA3_DECODER_PARTS in
    ``weights`` (q_norm, k_norm [D]; the other norms [H]; the matrices as above), windows[i] the
    sliding window of layer i (None: all 0, global), whose attention sees only the last
    windows[i] positions and whose RoPE angles come from rope_cos_local / rope_sin_local [P, D]
    (Gemma 3's other base on its sliding layers); the attention scale attention_scale (None:
    1/sqrt(D)).

    taps (layer indices, strictly increasing, each in [0, layers)) with tap_out [len(taps), B, T,
    H] (x's dtype and device, contiguous; both or neither, an empty list taps nothing): after layer
    taps[j] has run, tap_out[j] holds the residual stream x of every row (the sum after that
    layer's MLP add, before the next layer's input norm or the final norm; what HF calls
    hidden_states[taps[j] + 1]), the very bits the pass carries on. Written in place.

    ``ops`` supplies linear, rope, cache_append, head_attention, rms_norm, add_rms_norm,
    silu_mul and gelu_tanh_mul (default: this module's). With the kernels (``mtp_kernels.ops``,
    rope through rope_ on a copy) this composition gives mtp.decoder_layers's bits exactly."""
    ops = ops or _REFERENCE_OPS
    gemma3 = layer == "gemma3"
    per = len(GEMMA3_DECODER_PARTS) if gemma3 else len(DECODER_PARTS)
    T = x.shape[1]
    layers = k_cache.shape[0]
    paths = None if tree_parents is None else tree_paths(tree_parents)
    depth = (
        torch.arange(T, device=x.device).expand(x.shape[0], T)
        if paths is None
        else torch.tensor([[len(p) - 1 for p in row] for row in paths], device=x.device)
    )
    positions = cache_lens.long()[:, None] + depth
    cos, sin = rope_cos[positions], rope_sin[positions]
    if rope_cos_local is not None:
        cos_local, sin_local = rope_cos_local[positions], rope_sin_local[positions]
    new_lens = cache_lens + T
    h = ops.rms_norm(x, weights[0] if layers else weights[-1], eps)
    for i in range(layers):
        window = (windows[i] if windows else 0) or None

        def attend(q, k, v):  # append the new keys/values, then attend causally over the cache
            ops.cache_append(k_cache[i], v_cache[i], k, v, cache_lens)
            if paths is None:
                if not gemma3:
                    return ops.head_attention(q, k_cache[i], v_cache[i], new_lens, causal=True)
                return ops.head_attention(
                    q, k_cache[i], v_cache[i], new_lens, None, None, attention_scale, True, window=window
                )
            return _tree_attention(ops, q, k_cache[i], v_cache[i], cache_lens, paths, attention_scale, window)

        scales = weight_scales[4 * i : 4 * i + 4] if weight_scales else (None,) * 4
        types = weight_types[4 * i : 4 * i + 4] if weight_types else (-1,) * 4
        if gemma3:
            x, h = _gemma3_layer(
                ops,
                x,
                h,
                weights[per * i : per * i + per],
                scales,
                weights[per * i + per],
                (cos_local, sin_local) if window else (cos, sin),
                num_heads,
                k_cache.shape[2],
                eps,
                quantize_x,
                attend,
                types,
            )
        else:
            x, h = _layer(
                ops,
                x,
                h,
                weights[6 * i : 6 * i + 6],
                scales,
                weights[6 * i + 6],
                cos,
                sin,
                num_heads,
                k_cache.shape[2],
                eps,
                quantize_x,
                attend,
                types,
            )
        if taps and i in taps:
            tap_out[taps.index(i)] = x
    return h


def tree_paths(tree_parents: torch.Tensor) -> list[list[list[int]]]:
    """Per request b and row t of tree_parents [B, T], the rows from the root to t."""
    paths = []
    for row in tree_parents.tolist():
        paths.append([])
        for t, p in enumerate(row):
            paths[-1].append((paths[-1][p] if p >= 0 else []) + [t])
    return paths


def _tree_attention(ops, q, k_cache, v_cache, cache_lens, paths, scale=None, window=None):
    """Each query (b, t) over the cache's first cache_lens[b] keys, then its path's keys (rows
    cache_lens[b] + u of the cache), gathered into one key sequence: a chain's view (a window
    spans that sequence's last keys)."""
    out = torch.empty_like(q)
    for b, rows in enumerate(paths):
        L0 = int(cache_lens[b])
        for t, path in enumerate(rows):
            index = torch.cat([torch.arange(L0), L0 + torch.tensor(path)]).to(q.device)
            k, v = k_cache[b : b + 1, :, index], v_cache[b : b + 1, :, index]
            lens = torch.tensor([len(index)], device=q.device)
            if scale is None and window is None:
                out[b : b + 1, t : t + 1] = ops.head_attention(q[b : b + 1, t : t + 1], k, v, lens)
            else:
                out[b : b + 1, t : t + 1] = ops.head_attention(
                    q[b : b + 1, t : t + 1], k, v, lens, None, None, scale, window=window
                )
    return out


def _layer(
    ops, x, h, w, scales, next_norm, cos, sin, num_heads, num_kv_heads, eps, quantize_x, attend, types=(-1,) * 4
):
    """One decoder layer (weights w = DECODER_PARTS, Q8 scales of its four matrices or Nones)
    on the residual stream x [B, T, H] whose input norm is h: the qkv projection, RoPE of the
    q and k heads, attend(q, k, v) -> [B, T, Hq, D], the output projection and residual add
    (fused with the MLP's norm), the MLP. Returns (x, next_norm(x))."""
    B, T, _ = x.shape
    Hq, Hkv = num_heads, num_kv_heads

    def project(a, m, s, t):
        if t >= 0:
            return ops.linear(a, m, None, None, gguf_type=t)
        return ops.linear(a, m, None, s, quantize_x=quantize_x and s is not None)

    qkv = project(h, w[1], scales[0], types[0]).view(B, T, Hq + 2 * Hkv, -1)
    qk = ops.rope(qkv[:, :, : Hq + Hkv], cos, sin)
    a = attend(qk[:, :, :Hq], qk[:, :, Hq:], qkv[:, :, Hq + Hkv :])
    x, m = ops.add_rms_norm(x, project(a.reshape(B, T, -1), w[2], scales[1], types[1]), w[3], eps)
    mlp = project(ops.silu_mul(project(m, w[4], scales[2], types[2])), w[5], scales[3], types[3])
    return ops.add_rms_norm(x, mlp, next_norm, eps)


def _gemma3_layer(ops, x, h, w, scales, next_norm, angles, num_heads, num_kv_heads, eps, quantize_x, attend, types):
    """Gemma 3's layer (weights w = GEMMA3_DECODER_PARTS) on the residual stream x [B, T, H]
    whose input norm is h, as models/gemma3_backbone.py runs it op by op: the qkv projection;
    rms_norm of each q head with q_norm and each k head with k_norm (rows of D, the same eps);
    RoPE of q and k with angles = (cos, sin) of this layer's tables; attend(q, k, v); the output
    projection, rms_norm with post_attention_norm, added to x (add_rms_norm with
    pre_feedforward_norm); gelu_tanh_mul of the gate_up projection, the down projection, rms_norm
    with post_feedforward_norm, added to x (add_rms_norm with next_norm). Returns (x, next_norm(x))."""
    B, T, _ = x.shape
    Hq, Hkv = num_heads, num_kv_heads
    cos, sin = angles

    def project(a, m, s, t):
        if t >= 0:
            return ops.linear(a, m, None, None, gguf_type=t)
        return ops.linear(a, m, None, s, quantize_x=quantize_x and s is not None)

    qkv = project(h, w[1], scales[0], types[0]).view(B, T, Hq + 2 * Hkv, -1)
    q = ops.rope(ops.rms_norm(qkv[:, :, :Hq], w[2], eps), cos, sin)
    k = ops.rope(ops.rms_norm(qkv[:, :, Hq : Hq + Hkv], w[3], eps), cos, sin)
    a = attend(q, k, qkv[:, :, Hq + Hkv :])
    o = ops.rms_norm(project(a.reshape(B, T, -1), w[4], scales[1], types[1]), w[5], eps)
    x, m = ops.add_rms_norm(x, o, w[6], eps)
    mlp = project(ops.gelu_tanh_mul(project(m, w[7], scales[2], types[2])), w[8], scales[3], types[3])
    return ops.add_rms_norm(x, ops.rms_norm(mlp, w[9], eps), next_norm, eps)


def drafted_rows(lm_head: torch.Tensor, draft_vocab: Optional[torch.Tensor], embedding: torch.Tensor) -> bool:
    """Whether head_draft's lm_head holds the draft vocabulary's rows [Vd, H] (Vd < V, the
    embedding's rows) rather than the LM head [V, H] they are read from."""
    Vd = None if draft_vocab is None else draft_vocab.numel()
    return Vd is not None and Vd < embedding.shape[0] and lm_head.shape[0] == Vd


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
    ops=None,
) -> torch.Tensor:
    """The MTP head's k greedy draft steps [B, k] int64 after token [B] (the backbone's next
    token, at position cache_lens[b], not yet in the cache) from hidden [B, H] (fp32|bf16,
    the backbone's last hidden state): the composition below of the layer ops.
    weights = embed_norm, hidden_norm, proj [H, 2H], then per block DECODER_PARTS (a decoder
    layer of the head's own; norms in hidden's dtype), then out_norm. Step j (position
    p = cache_lens[b] + j, RoPE rows p of rope_cos/rope_sin [P, D]): x = proj @ [norm(embedding
    of the token) ; norm(h)], the blocks, whose attention reads the cache views k_cache,
    v_cache [B, Hkv, L, D] (keys [0, cache_lens[b]), in place) plus the block's own keys/values
    of steps 0..j; the draft = the token of draft_vocab [Vd] (None: every token, Vd = V) whose
    row of the LM head lm_head [V, H] gives the largest logit for out_norm(x) (logits in
    hidden's dtype, torch.argmax's rules over the draft vocabulary's order); step j+1 takes
    that token and h = x. embedding [V, H]: float rows, or int8 with embedding_scale (Q8 rows:
    q * scale in fp32, then rounded to hidden's dtype); lm_head likewise float, or int8 with
    lm_head_scale (Q8 weights of mtp.linear). The kernel reads the draft vocabulary's rows of
    lm_head in place (no copy of them); lm_head [Vd, H] with Vd < V is those rows gathered by
    the caller (row i token draft_vocab[i]'s; ``drafted_rows``). alternatives = m (k >= 1)
    appends the first step's next m best drafts, [B, k + m]: its logits in torch.argmax's
    order (NaN first, then larger values, ties to the lower draft-vocabulary index), the first
    draft left out.
    embedding_type / lm_head_type >= 0: that matrix is a GGUF block type's bytes (embedding
    rows ``gguf_dequantize`` in fp32, then rounded; logits ``gguf_linear``). weight_types: the
    same for the head's own matrices (proj, then qkv, o_proj, gate_up, down_proj of each block;
    -1 a float one; None: all float): their products ``gguf_linear``.
    probs_out [B, k] float32, when given, receives each step's draft probability: the softmax
    (in fp32) of that step's logits at the draft (NaN where a logit is NaN or the largest is
    infinite). The kernel's sum of exponentials runs in another order: equal to rounding.

    ``ops`` as in ``decoder_layers``; with the kernels this composition gives mtp.head_draft's
    drafts exactly."""
    ops = ops or _REFERENCE_OPS
    B = hidden.shape[0]
    Hkv = k_cache.shape[1]
    blocks = [weights[3 + 6 * i : 9 + 6 * i] for i in range((len(weights) - 4) // 6)]
    embed_norm, hidden_norm, proj, out_norm = weights[0], weights[1], weights[2], weights[-1]
    types = list(weight_types) if weight_types is not None else [-1] * (1 + 4 * len(blocks))
    local = [
        (k_cache.new_zeros(B, Hkv, k, k_cache.shape[3]), k_cache.new_zeros(B, Hkv, k, k_cache.shape[3])) for _ in blocks
    ]
    drafts = torch.empty(B, k + alternatives, dtype=torch.int64, device=hidden.device)
    h = hidden[:, None]  # [B, 1, H]: one token per request
    from .gguf import X8_TYPES

    e_type = embedding_type if embedding_type >= 0 else None
    if lm_head_type in X8_TYPES:
        lm_head, lm_head_type = x8_file_rows(lm_head, lm_head_type), lm_head_type - 100
    rows, scales = lm_head, lm_head_scale
    if draft_vocab is not None and not drafted_rows(lm_head, draft_vocab, embedding):  # copied here, not by the kernel
        rows, scales = lm_head[draft_vocab], None if lm_head_scale is None else lm_head_scale[draft_vocab]
    for j in range(k):
        positions = cache_lens.long()[:, None] + j
        cos, sin = rope_cos[positions], rope_sin[positions]  # [B, 1, D]
        e = ops.embedding(token, embedding, embedding_scale, gguf_type=e_type, dtype=hidden.dtype)
        x = ops.linear(
            torch.cat([ops.rms_norm(e[:, None], embed_norm, eps), ops.rms_norm(h, hidden_norm, eps)], dim=-1),
            proj,
            gguf_type=types[0] if types[0] >= 0 else None,
        )
        a = ops.rms_norm(x, blocks[0][0] if blocks else out_norm, eps)
        for i, w in enumerate(blocks):

            def attend(q, k_new, v_new):  # the step's keys/values join the local segment at j
                local_k, local_v = local[i]
                local_k[:, :, j], local_v[:, :, j] = k_new[:, 0], v_new[:, 0]
                return ops.head_attention(
                    q, k_cache, v_cache, cache_lens, local_k[:, :, : j + 1], local_v[:, :, : j + 1]
                )

            after = blocks[i + 1][0] if i + 1 < len(blocks) else out_norm
            block_types = tuple(types[1 + 4 * i : 5 + 4 * i])
            x, a = _layer(ops, x, a, w, (None,) * 4, after, cos, sin, num_heads, Hkv, eps, False, attend, block_types)
        h = x
        logits = (
            ops.linear(a, rows, None, None, gguf_type=lm_head_type)
            if lm_head_type >= 0
            else ops.linear(a, rows, None, scales)
        )[:, 0]
        best = logits.argmax(-1)
        token = draft_vocab[best] if draft_vocab is not None else best
        drafts[:, j] = token
        if probs_out is not None:
            probs_out[:, j] = torch.softmax(logits.float(), -1).gather(-1, best[:, None])[:, 0]
        if j == 0 and alternatives:
            order = argmax_order(logits)[:, 1 : alternatives + 1]
            drafts[:, k:] = draft_vocab[order] if draft_vocab is not None else order
    return drafts


def argmax_order(logits: torch.Tensor) -> torch.Tensor:
    """The indices of each row of logits [B, V] in torch.argmax's order: NaNs first, then
    larger values first, equal values (-0.0 == +0.0) by lower index; column 0 is argmax."""
    v = logits.double()
    nan = torch.isnan(v)
    by_value = torch.sort(torch.where(nan, 0.0, v) + 0.0, dim=-1, descending=True, stable=True).indices
    return torch.gather(
        by_value, -1, torch.sort(nan.gather(-1, by_value).int(), dim=-1, descending=True, stable=True).indices
    )


_REFERENCE_OPS = SimpleNamespace(
    linear=linear,
    rope=rope,
    cache_append=cache_append,
    head_attention=head_attention,
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    silu_mul=silu_mul,
    gelu_tanh_mul=gelu_tanh_mul,
    embedding=embedding,
)

"""Weight-only int8 in blocks of 32 along K ("Q8", like ggml's Q8_0) for ``mtp.linear``.

Format: a weight ``w [N, K]`` is stored as ``q [N, K]`` int8 and ``scale [N, ceil(K/32)]``
float32; block ``j`` of row ``n`` is ``w[n, 32j : 32j + 32]`` (the last block holds the
``K % 32`` leftover elements when K is not a multiple of 32), and the element it stands for is
``q[n, k] * scale[n, k // 32]``. ``torch.ops.mtp.linear(x, q, bias, weight_scale=scale)`` reads
both in place (1 byte per weight + 4 bytes per 32: 1.125 bytes, against 4 for fp32 and 2 for
bf16) and computes ``x @ dequantize_q8(q, scale).T + bias`` with fp32 accumulation.

``quantize_q8`` (the rule llama.cpp's Q8_0 uses, with fp32 scales): per block, ``scale =
max|w| / 127`` (rounded to fp32) and ``q = round_half_even(w / scale)`` clamped to [-127, 127];
an all-zero block gets ``scale = 0`` and ``q = 0``. Every element is then within half a step
of its weight, ``|w - q * scale| <= scale / 2`` (exactly, for fp32 / bf16 / fp16 weights whose
block maximum is at least 127 * 2^-126 ~ 1.5e-36; below that the fp32 scale is subnormal).
"""

from __future__ import annotations

import torch

Q8_BLOCK = 32


def q8_blocks(K: int) -> int:
    """The number of 32-element blocks of a row of K elements: ceil(K / 32)."""
    return -(-K // Q8_BLOCK)


def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` (any float dtype) -> ``(q [N, K] int8, scale [N, ceil(K/32)] float32)``,
    both contiguous, on weight's device; see the module docstring for the format.

    Raises ValueError for a weight that is not 2-D or holds NaN or an infinity (or, from a
    float64 weight, a block maximum beyond fp32), TypeError for a non-float dtype.
    """
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(
            f"quantize_q8: weight must be a float tensor, got "
            f"{weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__}"
        )
    if weight.dim() != 2:
        raise ValueError(f"quantize_q8: weight must be 2-D [N, K], got shape {list(weight.shape)}")
    w = weight.detach()
    bad = ~torch.isfinite(w)
    if bad.any():
        n, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"quantize_q8: weight must be finite, got weight[{n}, {k}] = {w[n, k].item()}")
    N, K = w.shape
    nb = q8_blocks(K)
    blocks = torch.zeros(N, nb * Q8_BLOCK, dtype=torch.float64, device=w.device)
    blocks[:, :K] = w.to(torch.float64)
    blocks = blocks.view(N, nb, Q8_BLOCK)
    scale = (blocks.abs().amax(dim=2) / 127).to(torch.float32)  # [N, nb]; an empty row: [N, 0]
    if not torch.isfinite(scale).all():
        raise ValueError("quantize_q8: weight has a block maximum beyond fp32's range (its scale would be infinite)")
    s = scale.to(torch.float64)[:, :, None]
    q = torch.round(blocks / torch.where(s > 0, s, torch.ones_like(s)))  # half to even; zero blocks: 0
    # The fp64 quotient is rounded: settle ties and near-ties on the exact residual (w and
    # q * s are exact in fp64 for fp32/bf16/fp16 weights, so is their difference).
    r, half = blocks - q * s, s / 2
    odd = torch.remainder(q, 2) != 0
    q = q + ((r > half) | ((r == half) & odd)).to(q.dtype) - ((r < -half) | ((r == -half) & odd)).to(q.dtype)
    q = q.clamp_(-127, 127).to(torch.int8).view(N, nb * Q8_BLOCK)[:, :K].contiguous()
    return q, scale.contiguous()


def dequantize_q8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q [N, K] int8``, ``scale [N, ceil(K/32)] float32`` -> the fp32 weight ``[N, K]``,
    element ``q[n, k] * scale[n, k // 32]`` rounded to fp32 once (the linear kernel does not
    round it: it multiplies the block's fp32 sum of products by the scale)."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"dequantize_q8: q must be a 2-D int8 tensor [N, K], got {q.dtype} of shape {list(q.shape)}")
    N, K = q.shape
    if scale.dtype != torch.float32 or tuple(scale.shape) != (N, q8_blocks(K)):
        raise ValueError(
            f"dequantize_q8: scale must be float32 [N, ceil(K/32)] = [{N}, {q8_blocks(K)}], got "
            f"{scale.dtype} of shape {list(scale.shape)}"
        )
    return q.to(torch.float32) * scale.repeat_interleave(Q8_BLOCK, dim=1)[:, :K]

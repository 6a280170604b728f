"""Fused kernels for exact speculative decoding with a frozen Multi-Token Prediction head.

Importing the package registers the ``torch.ops.mtp.*`` operators (CPU kernels from the
compiled ``_C`` extension, and its CUDA kernels when built with MTP_WITH_CUDA; fake kernels
for torch.compile from ``ops``). On a machine with a GPU and a package built without the
C++ CUDA kernels, the Triton launchers of ``mtp_kernels.triton`` serve the CUDA tensors. The
row-local layer ops (rms_norm, add_rms_norm, rope_, silu_mul, gelu_tanh_mul) run their plain-torch
specification on CUDA tensors (``fallback``). Every registration made at import is in
``_registry``.
"""

import torch  # noqa: F401  (must be loaded before the extension that links against it)

from ._torch_version import _C  # noqa: F401  (loads the ops after checking the torch they were built for)
from . import _registry, fallback, ops, reference  # noqa: F401
from .ops import (
    accept_prefix,
    add_rms_norm,
    cache_append,
    embedding,
    gelu_tanh_mul,
    head_attention,
    linear,
    rms_norm,
    rope_,
    silu_mul,
    verify,
    verify_lenient,
    verify_ragged,
    verify_sampled,
    verify_sampled_ragged,
)
from .quant import dequantize_q8, quantize_q8

__all__ = [
    "verify",
    "verify_ragged",
    "verify_sampled",
    "verify_sampled_ragged",
    "verify_lenient",
    "accept_prefix",
    "head_attention",
    "cache_append",
    "linear",
    "rms_norm",
    "add_rms_norm",
    "rope_",
    "silu_mul",
    "gelu_tanh_mul",
    "embedding",
    "quantize_q8",
    "dequantize_q8",
    "ops",
    "reference",
    "get_isa",
    "set_isa",
    "supported_isas",
    "cuda_check",
]

get_isa = _C.get_isa
set_isa = _C.set_isa
supported_isas = _C.supported_isas


def cuda_check(device=None) -> None:
    """Waits for `device` (default: the current CUDA device) and raises the RuntimeError of a
    bad count or length an earlier call of the C++ CUDA kernels met there (their value checks
    run on the device, without a host sync, and the next call on that device raises; see
    docs/gpu.md). No-op without the C++ CUDA kernels."""
    if not _C.with_cuda:
        return
    index = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    torch.cuda.synchronize(index)
    _C.device_check(index.index if index.index is not None else torch.cuda.current_device())


_registry.register_all()  # fakes, Triton (with a GPU), fallbacks: every import-time registration

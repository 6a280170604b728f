"""Fused kernels for exact speculative decoding with a frozen Multi-Token Prediction head.

Importing the package registers the ``torch.ops.mtp.*`` operators (CPU kernels from the
compiled ``_C`` extension, fake kernels for torch.compile from ``ops``).
"""
import torch  # noqa: F401  (must be loaded before the extension that links against it)

from . import _C  # noqa: F401  (registers the ops)
from . import ops, reference  # noqa: F401
from .ops import accept_prefix, cache_append, head_attention, linear, verify

__all__ = ["verify", "accept_prefix", "head_attention", "cache_append", "linear", "ops", "reference", "get_isa",
           "set_isa", "supported_isas"]

get_isa = _C.get_isa
set_isa = _C.set_isa
supported_isas = _C.supported_isas

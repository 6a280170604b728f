"""GGUF block-quantized weights as the kernels read them: the bytes of the file, in place.

A quantized matrix ``[N, K]`` is a ``QuantTensor``: ``data``, a uint8 tensor ``[N, row_bytes]``
(usually a view into the memory-mapped .gguf file), and its GGML type number. The ops take
``data`` with ``gguf_type=`` (``mtp.linear``), ``weight_types=`` (``mtp.decoder_layers``) or
``embedding_type=`` / ``lm_head_type=`` (``mtp.head_draft``). Layouts and the exact product:
``csrc/include/mtp/gguf.h``; executable form: ``reference.gguf_dequantize`` / ``reference.gguf_linear``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# GGML type number -> (name, elements per block, bytes per block). F32/F16/BF16 are float
# tensors (torch dtypes), not block types.
BLOCK_TYPES = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}
TYPE_NUMBERS = {name: code for code, (name, _, _) in BLOCK_TYPES.items()}


def type_name(code: int) -> str:
    return BLOCK_TYPES[code][0] if code in BLOCK_TYPES else f"GGML type {code}"


def row_bytes(code: int, K: int) -> int:
    """Bytes of one row of K elements (K a multiple of the block size)."""
    _, elems, nbytes = BLOCK_TYPES[code]
    if K % elems:
        raise ValueError(f"K = {K} is not a multiple of {type_name(code)}'s blocks of {elems} elements")
    return K // elems * nbytes


@dataclass(frozen=True)
class QuantTensor:
    """A GGUF block-quantized matrix [N, K]: ``data`` uint8 [N, row_bytes(K)] (rows may be
    strided, bytes contiguous within a row) and ``gguf_type`` (a key of BLOCK_TYPES)."""

    data: torch.Tensor
    gguf_type: int

    def __post_init__(self):
        if self.gguf_type not in BLOCK_TYPES:
            raise ValueError(
                f"QuantTensor: {type_name(self.gguf_type)} is not supported "
                f"(supported: {', '.join(n for n, _, _ in BLOCK_TYPES.values())})"
            )
        if self.data.dtype != torch.uint8 or self.data.dim() != 2:
            raise ValueError(
                f"QuantTensor: data must be a 2-D uint8 tensor [N, row bytes], got "
                f"{self.data.dtype} of shape {list(self.data.shape)}"
            )
        _, elems, nbytes = BLOCK_TYPES[self.gguf_type]
        if self.data.shape[1] % nbytes:
            raise ValueError(
                f"QuantTensor: {self.data.shape[1]} bytes per row is not a whole number of "
                f"{type_name(self.gguf_type)} blocks ({nbytes} bytes)"
            )

    @property
    def shape(self) -> tuple[int, int]:
        _, elems, nbytes = BLOCK_TYPES[self.gguf_type]
        return (self.data.shape[0], self.data.shape[1] // nbytes * elems)

    @property
    def nbytes(self) -> int:
        return self.data.shape[0] * self.data.shape[1]

    def rows(self, index) -> "QuantTensor":
        """The rows ``index`` (an int tensor, a slice or a list): a view for a slice, else a copy
        of those rows' bytes (never dequantized)."""
        return QuantTensor(self.data[index], self.gguf_type)

    def dequantize(self) -> torch.Tensor:
        """The fp32 matrix [N, K] (reference.gguf_dequantize)."""
        from .reference import gguf_dequantize

        return gguf_dequantize(self.data, self.gguf_type)

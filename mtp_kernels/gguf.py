"""GGUF block-quantized weights as the kernels read them: the bytes of the file, in place.

A quantized matrix ``[N, K]`` is a ``QuantTensor``: ``data``, a uint8 tensor ``[N, row_bytes]``
(usually a view into the memory-mapped .gguf file), and its GGML type number. The ops take
``data`` with ``gguf_type=`` (``mtp.linear``), ``weight_types=`` (``mtp.decoder_layers``) or
``embedding_type=`` / ``lm_head_type=`` (``mtp.head_draft``). Layouts and the exact product:
``csrc/include/mtp/gguf.h``; executable form: ``reference.gguf_dequantize`` / ``reference.gguf_linear``.

The x8 layouts (type numbers 100 + the file's: ``X8_TYPES``) hold the same bytes with 8 rows
interleaved (``repack_x8``), which the SIMD kernels read 8 columns per vector; the product's
bits are the file layout's. The loaders repack the Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K matrices in
place.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# GGML type number -> (name, elements per block, bytes per block). F32/F16/BF16 are float
# tensors (torch dtypes), not block types.
BLOCK_TYPES = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}
TYPE_NUMBERS = {name: code for code, (name, _, _) in BLOCK_TYPES.items()}
# A file block's fields in the file's order, each (piece bytes, pieces): an x8 block holds field
# after field, in a field piece k of the 8 rows in turn (gguf.h: x8_fields).
X8_FIELDS = {
    2: ((2, 1), (4, 4)),  # Q4_0: d, 4 chunks of nibbles
    3: ((2, 1), (2, 1), (4, 4)),  # Q4_1: d, m, 4 chunks
    8: ((2, 1), (4, 8)),  # Q8_0: d, 8 chunks of int8
    12: ((2, 1), (2, 1), (1, 12), (4, 32)),  # Q4_K: d, dmin, 12 scale bytes, 32 chunks of nibbles
    14: ((4, 32), (4, 16), (1, 16), (2, 1)),  # Q6_K: 32 chunks of low nibbles, 16 of high bits, 16 scales, d
}
# The x8 layout of a file type -> (name, elements per block, bytes per block and row).
X8_TYPES = {100 + code: (BLOCK_TYPES[code][0] + "_X8",) + BLOCK_TYPES[code][1:] for code in X8_FIELDS}
LAYOUTS = {**BLOCK_TYPES, **X8_TYPES}  # every type number the ops take
X8_ROWS = 8


def type_name(code: int) -> str:
    return LAYOUTS[code][0] if code in LAYOUTS else f"GGML type {code}"


def row_bytes(code: int, K: int) -> int:
    """Bytes of one row of K elements (K a multiple of the block size)."""
    _, elems, nbytes = LAYOUTS[code]
    if K % elems:
        raise ValueError(f"K = {K} is not a multiple of {type_name(code)}'s blocks of {elems} elements")
    return K // elems * nbytes


@dataclass(frozen=True)
class QuantTensor:
    """A GGUF block-quantized matrix [N, K]: ``data`` uint8 [N, row_bytes(K)] (rows may be
    strided, bytes contiguous within a row; x8: contiguous, N a multiple of 8) and
    ``gguf_type`` (a key of LAYOUTS). ``widened_from``: the file's type where a loader widened
    the matrix to this one, the same values (Q5_0 -> Q8_0, widen_q5_0); else None."""

    data: torch.Tensor
    gguf_type: int
    widened_from: int | None = None

    def __post_init__(self):
        if self.gguf_type not in LAYOUTS:
            raise ValueError(
                f"QuantTensor: {type_name(self.gguf_type)} is not supported "
                f"(supported: {', '.join(n for n, _, _ in LAYOUTS.values())})"
            )
        if self.data.dtype != torch.uint8 or self.data.dim() != 2:
            raise ValueError(
                f"QuantTensor: data must be a 2-D uint8 tensor [N, row bytes], got "
                f"{self.data.dtype} of shape {list(self.data.shape)}"
            )
        _, elems, nbytes = LAYOUTS[self.gguf_type]
        if self.data.shape[1] % nbytes:
            raise ValueError(
                f"QuantTensor: {self.data.shape[1]} bytes per row is not a whole number of "
                f"{type_name(self.gguf_type)} blocks ({nbytes} bytes)"
            )
        if self.gguf_type in X8_TYPES and (self.data.shape[0] % X8_ROWS or not self.data.is_contiguous()):
            raise ValueError(
                f"QuantTensor: a {type_name(self.gguf_type)} matrix is contiguous groups of 8 rows, got "
                f"{self.data.shape[0]} rows with strides {list(self.data.stride())}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        _, elems, nbytes = LAYOUTS[self.gguf_type]
        return (self.data.shape[0], self.data.shape[1] // nbytes * elems)

    @property
    def nbytes(self) -> int:
        return self.data.shape[0] * self.data.shape[1]

    def rows(self, index) -> "QuantTensor":
        """The rows ``index`` (an int tensor, a slice or a list): a view for a slice, else a copy
        of those rows' bytes (never dequantized); of an x8 matrix, a copy in the file layout."""
        if self.gguf_type in X8_TYPES:
            return QuantTensor(unpack_x8(self.data, self.gguf_type)[index], self.gguf_type - 100)
        return QuantTensor(self.data[index], self.gguf_type)

    def dequantize(self) -> torch.Tensor:
        """The fp32 matrix [N, K] (reference.gguf_dequantize)."""
        from .reference import gguf_dequantize

        return gguf_dequantize(self.data, self.gguf_type)

    def x8(self, out: torch.Tensor | None = None) -> "QuantTensor":
        """This matrix in its x8 layout (repack_x8): a new tensor, or written into ``out``
        (uint8, data's shape: the loaders' weight arena, or data itself: the new order over its
        own bytes, which nothing else may read since)."""
        if self.gguf_type in X8_TYPES:
            return self
        if out is None:
            return QuantTensor(repack_x8(self.data, self.gguf_type), self.gguf_type + 100)
        if out.shape != self.data.shape or out.dtype != torch.uint8:
            raise ValueError(f"QuantTensor.x8: out must be uint8 of shape {list(self.data.shape)}")
        # A few groups at a time: small temporaries, which the allocator reuses, where one
        # matrix-sized temporary (30 MB for the embedding) would stay in the process's heap.
        step = max(X8_ROWS, (_REPACK_CHUNK_BYTES // self.data.shape[1]) // X8_ROWS * X8_ROWS)
        for r in range(0, self.data.shape[0], step):
            out[r : r + step].copy_(repack_x8(self.data[r : r + step], self.gguf_type))
        return QuantTensor(out, self.gguf_type + 100)


_REPACK_CHUNK_BYTES = 1 << 20


def can_x8(w) -> bool:
    """Whether repack_x8 takes this matrix: Q4_0, Q4_1, Q8_0, Q4_K or Q6_K with rows in groups of 8."""
    return isinstance(w, QuantTensor) and w.gguf_type + 100 in X8_TYPES and w.data.shape[0] % X8_ROWS == 0


def as_x8(data: torch.Tensor, code: int) -> tuple[torch.Tensor, int]:
    """File-layout rows [N, row_bytes] of type ``code`` -> (bytes, their type): in the x8 layout
    where can_x8 takes them (a new tensor), else as they are; contiguous either way."""
    q = QuantTensor(data.contiguous(), code)
    q = q.x8() if can_x8(q) else q
    return q.data, q.gguf_type


def repack_x8(data: torch.Tensor, code: int) -> torch.Tensor:
    """File-layout rows [N, row_bytes] of type ``code`` (a key of X8_FIELDS; N a multiple of 8)
    -> the x8 layout (csrc/include/mtp/gguf.h), a new contiguous tensor of the same shape: per
    group of 8 rows and block, each field's pieces, piece k of the 8 rows in turn."""
    N, rb = data.shape
    nbytes = LAYOUTS[code][2]
    G, nb = N // X8_ROWS, rb // nbytes
    blocks = data.reshape(G, X8_ROWS, nb, nbytes)  # [g, c, b, byte]
    parts, at = [], 0
    for size, count in X8_FIELDS[code]:
        field = blocks[..., at : at + size * count].reshape(G, X8_ROWS, nb, count, size)
        parts.append(field.permute(0, 2, 3, 1, 4).reshape(G, nb, -1))  # [g, b, k, c, byte]
        at += size * count
    return torch.cat(parts, -1).reshape(N, rb)


def file_rows(data: torch.Tensor, code: int, index) -> tuple[torch.Tensor, int]:
    """Rows ``index`` (an int tensor, any shape) of a matrix of type ``code`` in the file's
    layout: (bytes [*index.shape, row_bytes], their type). An x8 matrix's rows are read byte
    by byte from their groups (one gather through _lane_bytes: a decode step's embedding row
    costs one indexing op, not an unpack of its group)."""
    if code not in X8_TYPES:
        return data[index], code
    index = torch.as_tensor(index)
    flat, rb = index.reshape(-1), data.shape[1]
    at = (flat // X8_ROWS * (X8_ROWS * rb))[:, None] + _lane_bytes(code, rb)[flat % X8_ROWS]
    return data.view(-1)[at].view(*index.shape, rb), code - 100


@functools.lru_cache(maxsize=32)
def _lane_bytes(code: int, rb: int) -> torch.Tensor:
    """[8, rb]: where byte j of row c's file-layout bytes lies in its x8 group (unpack_x8 of the
    group's byte positions: the layout is a permutation of bytes)."""
    return unpack_x8(torch.arange(X8_ROWS * rb).view(X8_ROWS, rb), code)


def unpack_x8(data: torch.Tensor, code: int) -> torch.Tensor:
    """repack_x8's inverse: x8 bytes [N, row_bytes] -> the file layout's rows (a new tensor)."""
    N, rb = data.shape
    nbytes = LAYOUTS[code][2]
    G, nb = N // X8_ROWS, rb // nbytes
    blocks = data.reshape(G, nb, X8_ROWS * nbytes)
    parts, at = [], 0
    for size, count in X8_FIELDS[code - 100]:
        field = blocks[..., X8_ROWS * at : X8_ROWS * (at + size * count)].reshape(G, nb, count, X8_ROWS, size)
        parts.append(field.permute(0, 3, 1, 2, 4).reshape(G, X8_ROWS, nb, -1))  # [g, c, b, k, byte]
        at += size * count
    return torch.cat(parts, -1).reshape(N, rb)


def widen_q5_0(data: torch.Tensor) -> torch.Tensor:
    """Q5_0 rows [N, row_bytes] -> the same values as Q8_0 rows (a new tensor, 34/22 the
    bytes). Lossless: a Q5_0 block is d and 32 five-bit values q - 16 in [-16, 15], which
    Q8_0's d and 32 int8 hold as they are; the kernels' product is an exact integer dot per
    block then the same fp32 chain, so the bits of mtp.linear do not change (tested), while
    Q8_0's x8 layout runs 1.3x-2.5x faster than Q5_0 as stored. A few rows at a time: the
    temporaries (int64 bit masks, 8x the output) stay small and are reused by the allocator."""
    N, rb = data.shape
    out = torch.empty(N, rb // 22 * 34, dtype=torch.uint8)
    step = max(1, _REPACK_CHUNK_BYTES // (rb // 22 * 34 * 8))
    for r in range(0, N, step):
        out[r : r + step] = _widened_rows(data[r : r + step])
    return out


def _widened_rows(data: torch.Tensor) -> torch.Tensor:
    N, rb = data.shape
    blocks = data.reshape(N, rb // 22, 22)
    qh = blocks[..., 2:6].to(torch.int64)
    qh = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24  # bit j: value j's 5th bit
    qs = blocks[..., 6:22]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=-1).to(torch.int16)  # values 0..15, then 16..31
    high = ((qh[..., None] >> torch.arange(32)) & 1).to(torch.int16) << 4
    q = ((low | high) - 16).to(torch.int8).view(torch.uint8)
    return torch.cat([blocks[..., :2], q], dim=-1).reshape(N, rb // 22 * 34)

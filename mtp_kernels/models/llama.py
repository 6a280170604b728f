"""A Llama-family decoder for decoding and verification, exact by construction.

Every step that mixes values across a row goes through a shape-invariant kernel
(`mtp.linear` for all projections and the LM head, `mtp.head_attention` for attention,
`mtp.add_rms_norm` for the residual adds and norms), and the rest (`mtp.rope_`,
`mtp.silu_mul`) is elementwise; all layers run in one `mtp.decoder_layers` call, which runs
those kernels in that order. So the logits of a verify pass over K+1 positions are
bitwise those of K+1 one-token steps: speculative decoding gives exactly the tokens of plain
greedy decoding.

The KV cache is static and preallocated, [layers, B, Hkv, Lmax, D], with a length per
request; rejected draft positions are dropped by lowering that length (no data moves;
`KVCache.truncate`), except an accepted tree leaf's, moved after its parent (`KVCache.move`).
"""

from __future__ import annotations


import numpy as np
import torch

from ..gguf import X8_TYPES, QuantTensor, type_name, unpack_x8
from ..quant import dequantize_q8, quantize_q8
from ..reference import DECODER_PARTS, gguf_dequantize
from .config import LlamaConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Fused projection -> its parts, in row order.
FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
}


class MixedTypesError(ValueError):
    """GGUF matrices that run as one (q/k/v, gate/up) but are stored in different types."""


class KVCache:
    """Static per-layer K/V buffers and the number of valid positions of each request."""

    def __init__(self, cfg: LlamaConfig, batch: int, max_len: int, dtype: torch.dtype):
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.lens = torch.zeros(batch, dtype=torch.int64)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def truncate(self, lens: torch.Tensor) -> None:
        """Sets every request's length (no data moves): positions past it are dropped, as a
        verify pass drops its rejected drafts."""
        self.lens.copy_(lens)

    def move(self, b: int, src: int, dst: int) -> None:
        """Request b's K/V at position src moved to dst in every layer, and its length set to
        dst + 1: an accepted tree leaf, verified at src, takes the place right after its
        parent at dst - 1; the rejected positions between are dropped."""
        self.k[:, b, :, dst] = self.k[:, b, :, src]
        self.v[:, b, :, dst] = self.v[:, b, :, src]
        self.lens[b] = dst + 1

    def select(self, b: int) -> "KVCache":
        """A view of request b alone (shares the buffers and the length)."""
        view = KVCache.__new__(KVCache)
        view.k, view.v, view.lens = self.k[:, b : b + 1], self.v[:, b : b + 1], self.lens[b : b + 1]
        return view


def rope_tables(cfg: LlamaConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, head_dim] in fp32 (computed in fp64), half-split layout."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class TiedMatrices:
    """The embedding and LM head as stored (`w`), for a backbone with `w` and `lm_head_name`:
    what the head's training reads (Backbone, gemma3_backbone.Gemma3Backbone)."""

    @property
    def embedding(self) -> torch.Tensor:
        return self.w("model.embed_tokens.weight")

    @property
    def lm_head(self) -> torch.Tensor:
        return self.w(self.lm_head_name)

    def features(self, tokens: torch.Tensor, cache, tree_parents=None, layers: tuple[int, ...] = ()):
        """forward() that also keeps the residual streams of `layers` (an MTP head's
        fuse_layers), from the same one pass (mtp.decoder_layers' taps): the final hidden
        states [B, T, H] and the features [B, T, 1 + n, H], those, then each layer's."""
        if not layers:
            h = self(tokens, cache, tree_parents)
            return h, h[:, :, None]
        B, T = tokens.shape
        taps = torch.empty(len(layers), B, T, self.cfg.hidden_size, dtype=self.dtype)
        h = self(tokens, cache, tree_parents, taps=list(layers), tap_out=taps)
        return h, torch.cat([h[:, :, None], taps.permute(1, 2, 0, 3)], dim=2)


class Backbone(TiedMatrices, torch.nn.Module):
    """The frozen backbone. Weights are buffers (never trained), in `dtype`; with
    quantize=True every weight matrix (projections, embedding = LM head) is kept in the Q8
    format of `mtp_kernels.quant` (int8, one fp32 scale per 32 weights: ~1.1 bytes per weight)
    and activations, norms and the KV cache stay in `dtype`. int8_dot=True (with quantize=True)
    also quantizes the activations entering each of those matrices, row by row (`mtp.linear`'s
    quantize_x: integer dot products; every row keeps its bits whatever the number of rows, so
    speculative decoding still equals this backbone's greedy)."""

    family = "llama"  # the model family; the MTP head and the standalone drafter are this family's

    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict,
        dtype: torch.dtype = torch.float32,
        quantize: bool = False,
        int8_dot: bool = False,
    ):
        super().__init__()
        if int8_dot and not quantize:
            raise ValueError(
                "Backbone: int8_dot=True quantizes the activations for int8 weights: it needs quantize=True"
            )
        native = any(isinstance(w, QuantTensor) for w in weights.values())
        if native and quantize:
            raise ValueError(
                "Backbone: quantize=True re-quantizes float weights to Q8; these are already GGUF "
                "block-quantized (QuantTensor): run them as they are, or load them dequantized"
            )
        self.cfg, self.dtype, self.quantized, self.int8_dot, self.native = cfg, dtype, quantize, int8_dot, native
        # Set by models.loading.load_backbone when no dtype was asked for (the file's own
        # weights): config.wide_passes_pay keeps chains there, and lookup drafts
        # beyond 3 for longer matches only.
        self.loaded_as_stored = False
        self._types: dict[str, int] = {}  # GGML type of each block-quantized matrix (its buffer: uint8 rows)
        weights = dict(weights)
        # Projections that read the same input are one weight matrix (one mtp.linear call, its
        # weights streamed once); the named per-projection weights are row views into it. Each
        # output element is reduced the same way whatever its column: the bits do not change.
        parts_of = {}
        for i in range(cfg.num_layers):
            for fused, parts in FUSED.items():
                names = [f"model.layers.{i}.{part}.weight" for part in parts]
                parts_of[f"model.layers.{i}.{fused}"] = (names, [weights[n].shape[0] for n in names])
                name = f"model.layers.{i}.{fused}"
                weights[name] = _fuse(name, [weights.pop(n) for n in names])
        for name, w in weights.items():
            if isinstance(w, QuantTensor):  # the file's bytes as they are (never dequantized here)
                stored = {"": w.data}
                self._types[name] = w.gguf_type
                for part in parts_of.get(name, ((), ()))[0]:
                    self._types[part] = w.gguf_type
            elif quantize and w.dim() == 2:
                q, scale = quantize_q8(w.float())
                stored = {"": q, "__scale": scale}
            else:
                stored = {"": w.to(dtype).contiguous()}
            parts, rows = parts_of.get(name, ((), ()))
            for suffix, t in stored.items():
                self.register_buffer(self._key(name) + suffix, t, persistent=False)
                for part, view in zip(parts, t.split(rows) if parts else ()):
                    self.register_buffer(self._key(part) + suffix, view, persistent=False)
        cos, sin = rope_tables(cfg, cfg.max_position)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._decoder_weights = None  # mtp.decoder_layers's lists, built on the first forward

    def _apply(self, fn, *args, **kwargs):  # .to() and friends replace the buffers
        self._decoder_weights = None
        return super()._apply(fn, *args, **kwargs)

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    def w(self, name: str) -> torch.Tensor:
        """A weight as stored (int8 for a matrix of a quantized backbone: see `scale`; uint8
        rows [N, row_bytes] for a GGUF block-quantized one: see `gguf_type`)."""
        return getattr(self, self._key(name))

    def layer_weight(self, i: int, part: str) -> torch.Tensor:
        """Layer i's weight `part` ("self_attn.q_proj", "input_layernorm", ...) as stored."""
        return self.w(f"model.layers.{i}.{part}.weight")

    def gguf_type(self, name: str) -> int | None:
        """The GGML type number of a GGUF block-quantized matrix (its `w` is the file's
        uint8 rows), else None."""
        return self._types.get(name)

    def scale(self, name: str) -> torch.Tensor | None:
        """The Q8 scales of a quantized matrix, else None."""
        return getattr(self, self._key(name) + "__scale", None)

    def matmul(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W.T through the shape-invariant mtp.linear, W stored plain or Q8 (and x quantized
        too with int8_dot)."""
        gguf_type = self.gguf_type(name)
        if gguf_type is not None:  # GGUF blocks: x is quantized row by row inside (reference.gguf_linear)
            return torch.ops.mtp.linear(x, self.w(name), None, None, gguf_type=gguf_type)
        scale = self.scale(name)
        return torch.ops.mtp.linear(x, self.w(name), None, scale, quantize_x=self.int8_dot and scale is not None)

    @property
    def lm_head_name(self) -> str:
        return "model.embed_tokens.weight" if self.cfg.tie_embeddings else "lm_head.weight"

    def _rows(self, name: str, index) -> torch.Tensor:
        w, scale, gguf_type = self.w(name), self.scale(name), self.gguf_type(name)
        if index is not None:  # one mtp.embedding call: gathered and dequantized in C++
            return torch.ops.mtp.embedding(torch.as_tensor(index), w, scale, gguf_type=gguf_type, dtype=self.dtype)
        if gguf_type is not None:
            return block_rows(w, gguf_type, self.dtype)
        if scale is None:
            return w
        return dequantize_q8(w, scale).to(self.dtype)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embeddings of tokens [...] -> [..., hidden] in `dtype`."""
        return self._rows("model.embed_tokens.weight", tokens)

    def lm_head_rows(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """LM head rows (all when index is None) in `dtype`, dequantized if need be."""
        return self._rows(self.lm_head_name, index)

    def rope_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE cos, sin [*positions.shape, D] at positions (what the head's layer uses)."""
        return self.rope_cos[positions], self.rope_sin[positions]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        if max_len > self.cfg.max_position:
            raise ValueError(f"a cache of {max_len} positions exceeds the model's context of {self.cfg.max_position}")
        return KVCache(self.cfg, batch, max_len, self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.matmul(hidden, self.lm_head_name)

    def decoder_weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """mtp.decoder_layers's weights (per layer its DECODER_PARTS, then the final norm) and
        weight_scales (the Q8 scales of the four matrices per layer; empty for float weights)."""
        parts = {
            "input_norm": "input_layernorm.weight",
            "qkv": "qkv",
            "o_proj": "self_attn.o_proj.weight",
            "post_norm": "post_attention_layernorm.weight",
            "gate_up": "gate_up",
            "down_proj": "mlp.down_proj.weight",
        }
        names = [f"model.layers.{i}.{parts[p]}" for i in range(self.cfg.num_layers) for p in DECODER_PARTS]
        weights = [self.w(n) for n in names] + [self.w("model.norm.weight")]
        scales = [s for s in map(self.scale, names) if s is not None]
        return weights, scales

    def decoder_weight_types(self) -> list[int] | None:
        """mtp.decoder_layers's weight_types for a native backbone: per layer, its four
        matrices' GGML types in DECODER_PARTS order (qkv, o_proj, gate_up, down_proj; -1 for a
        float one); None when no matrix is block-quantized (the argument is left out)."""
        if not self._types:
            return None
        names = {
            "qkv": "qkv",
            "o_proj": "self_attn.o_proj.weight",
            "gate_up": "gate_up",
            "down_proj": "mlp.down_proj.weight",
        }
        return [
            self._types.get(f"model.layers.{i}.{names[p]}", -1)
            for i in range(self.cfg.num_layers)
            for p in DECODER_PARTS
            if p in names
        ]

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        tree_parents: torch.Tensor | None = None,
        taps: list[int] | None = None,
        tap_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Runs tokens [B, T] at positions cache.lens[b] + t, appends their K/V to the
        cache and advances cache.lens by T. Returns the final normed hidden states
        [B, T, hidden] (the LM head's input; `logits()` turns them into logits).
        tree_parents [B, T]: the tokens form a tree instead (mtp.decoder_layers); token t
        still goes to cache.lens[b] + t, with the bits a chain of its path would give.
        taps, tap_out: mtp.decoder_layers' (the residual streams of those layers; `features`).
        All layers run in one mtp.decoder_layers call (reference.decoder_layers: the same
        bits as the op-by-op composition, without ~11 dispatches per layer)."""
        B, T = tokens.shape
        if B != cache.lens.shape[0]:
            raise ValueError(f"tokens has {B} requests but the cache has {cache.lens.shape[0]}")
        if int(cache.lens.max()) + T > cache.capacity:
            raise ValueError(f"{T} more tokens do not fit the cache: {int(cache.lens.max())} used of {cache.capacity}")
        if self._decoder_weights is None:
            self._decoder_weights = self.decoder_weights() + (self.decoder_weight_types(),)
        weights, scales, types = self._decoder_weights
        extra = {} if types is None else {"weight_types": types}
        if taps:
            extra.update(taps=taps, tap_out=tap_out)
        h = torch.ops.mtp.decoder_layers(
            self.embed(tokens),
            cache.k,
            cache.v,
            cache.lens,
            self.rope_cos,
            self.rope_sin,
            weights,
            scales,
            self.cfg.num_heads,
            self.cfg.rms_norm_eps,
            quantize_x=self.int8_dot,
            tree_parents=tree_parents,
            **extra,
        )
        cache.lens.add_(T)
        return h


def block_rows(w: torch.Tensor, gguf_type: int, dtype: torch.dtype) -> torch.Tensor:
    """Every row of a GGUF block-type matrix's bytes w (either layout), dequantized in fp32
    then rounded to dtype (mtp.embedding's values): [N, K]."""
    if gguf_type in X8_TYPES:
        w, gguf_type = unpack_x8(w, gguf_type), gguf_type - 100
    return gguf_dequantize(w, gguf_type).to(dtype)


def _fuse(name: str, parts: list):
    """Row-stacked [q; k; v] or [gate; up]. Float parts: one new tensor. GGUF block parts
    (QuantTensor, one type): their bytes, as ONE zero-copy view when each part starts where the
    previous one ends in the same storage with the same row stride (gate and up in a llama.cpp
    file), else concatenated (a copy of the quantized bytes: q/k are row-permuted copies anyway)."""
    quant = [isinstance(p, QuantTensor) for p in parts]
    if not any(quant):
        return torch.cat(parts)
    types = {p.gguf_type for p in parts if isinstance(p, QuantTensor)}
    if all(quant) and len(types) > 1 and len({t % 100 for t in types}) == 1:  # x8 beside the file layout
        parts = [p.rows(slice(None)) for p in parts]  # all in the file's layout (the x8 ones copied)
        types = {p.gguf_type for p in parts}
    if not all(quant) or len(types) > 1:
        # the types as stored (an x8 layout's file type)
        kinds = [type_name(p.gguf_type % 100) if isinstance(p, QuantTensor) else str(p.dtype) for p in parts]
        raise MixedTypesError(
            f"Backbone: the parts of {name} have different types ({', '.join(kinds)}): they run "
            "as one matrix of one type; load this model dequantized (mtp: --dtype float32|bfloat16)"
        )
    datas = [p.data for p in parts]
    first = datas[0]
    adjacent = all(
        d.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and d.stride() == first.stride()
        and d.shape[1] == first.shape[1]
        for d in datas
    ) and all(b.storage_offset() == a.storage_offset() + a.shape[0] * a.stride(0) for a, b in zip(datas, datas[1:]))
    if adjacent:
        data = first.as_strided(
            (sum(d.shape[0] for d in datas), first.shape[1]), first.stride(), first.storage_offset()
        )
    elif all(d.device.type == "cpu" for d in datas):  # numpy: torch's cat of a few uint8 rows is slow here
        data = torch.from_numpy(np.concatenate([d.numpy() for d in datas]))
    else:
        data = torch.cat(datas)
    return QuantTensor(data, types.pop())

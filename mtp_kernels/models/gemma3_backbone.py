"""Gemma 3 on the kernels: the runtime's backbone for a `gemma3` GGUF, exact by construction
like the Llama one (models/llama.py).

Every step that mixes values across a row is a shape-invariant kernel (`mtp.linear` for the
projections and the LM head, `mtp.head_attention` with its sliding `window` on the local
layers, `mtp.rms_norm` / `mtp.add_rms_norm` for the norms, the per-head q/k norms included),
the rest is elementwise (`mtp.rope_`, `mtp.gelu_tanh_mul`), so a verify pass over K+1
positions gives every position the bits of a one-token step: speculative decoding equals
plain greedy decoding. The layer is gemma3.Gemma3's (the fp32 reference checked against
transformers), op by op:

    h = input_norm(x); q, k, v = h @ Wq, Wk, Wv; q, k = q_norm(q), k_norm(k) per head;
    RoPE (base rope_local_theta on sliding layers, rope_theta on global ones); append k, v;
    a = attention(q, cache; causal, window on sliding layers)
    x, h = x + post_attention_norm(a @ Wo), pre_feedforward_norm(of that sum)
    x, h = x + post_feedforward_norm(gelu_tanh_mul(h @ [Wgate; Wup]) @ Wdown), next norm

forward() runs every layer in ONE `mtp.decoder_layers(layer="gemma3")` call (the kernels above
in the same order, so the same bits, without the ~16 dispatches per layer) when each layer has
one fused q/k/v matrix and one fused gate/up matrix (its parts of one type: true for the 270M
with widen=True, and for float weights); otherwise (a layer's parts of mixed types) it runs the
ops one call each, `forward_ops`, also kept as the fused call's oracle (bitwise equal, tested).
Matrices run as stored (GGUF block types through `mtp.linear`'s gguf_type, each matrix its own
type: the 270M mixes Q5_0 and Q8_0 within a layer's q/k/v, widened to Q8_0 by default) or as
float weights in `dtype`. The KV cache is the Llama one's (static, every position kept; the
window only limits what is read).
"""

from __future__ import annotations

import math

import torch

from ..gguf import TYPE_NUMBERS, QuantTensor, can_x8, widen_q5_0
from .gemma3 import Gemma3Config, expected_shapes
from .llama import KVCache, MixedTypesError, TiedMatrices, _fuse


class Gemma3Backbone(TiedMatrices, torch.nn.Module):
    """The frozen Gemma 3 backbone: forward(tokens, cache) -> final normed hidden states,
    logits(hidden) -> logits, the interface decoding.generate drives. weights: gemma3.load's
    dict (QuantTensors with native=True, else fp32 tensors); activations, norms and the KV
    cache in dtype (float32 or bfloat16). widen: Q5_0 matrices run as Q8_0 (x8 layout), the
    same values and bits (gguf.widen_q5_0), faster, for 34/22 of their bytes (+23 MB on the
    270M; gemma3.load(widen=True), the default load, has widened them into its arena already);
    False runs the Q5_0 matrices it is given as stored."""

    family = "gemma3"  # its MTP head: heads/gemma3-270m (llama.Backbone.family)

    def __init__(self, cfg: Gemma3Config, weights: dict, dtype: torch.dtype = torch.float32, widen: bool = True):
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"Gemma3Backbone: dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        for name, shape in expected_shapes(cfg).items():
            if name not in weights:
                raise ValueError(f"Gemma3Backbone: weight {name!r} is missing")
            if tuple(weights[name].shape) != shape:
                raise ValueError(
                    f"Gemma3Backbone: weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}"
                )
        self.cfg, self.dtype = cfg, dtype
        q5_0 = TYPE_NUMBERS["Q5_0"]
        # Q5_0 as Q8_0 (x8): the same bits, faster (gguf.widen_q5_0); each matrix as it is
        # taken (_stored), so that one layer's widened parts at a time precede its fused copies
        # (gemma3.load(widen=True) widens them into its arena instead, the fused ones views).
        quant = [w for w in weights.values() if isinstance(w, QuantTensor)]
        self.widened = any(w.widened_from == q5_0 for w in quant) or (widen and any(w.gguf_type == q5_0 for w in quant))
        self.native = any(isinstance(w, QuantTensor) for w in weights.values())
        self.quantized = self.int8_dot = False  # the Llama backbone's Q8 options: not offered here
        self.loaded_as_stored = False  # set by loading.load_backbone
        self._mats: dict[str, tuple[torch.Tensor, int | None]] = {}  # name -> (weight as stored, GGML type)
        self._norms: dict[str, torch.Tensor] = {}
        self.layers = []  # per layer: the names of its matrices and norms
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            attn = self._matrices(weights, p, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
            mlp = self._matrices(weights, p, ("mlp.gate_proj", "mlp.up_proj"))
            norms = {
                n: self._norm(weights, p + n + ".weight")
                for n in (
                    "input_layernorm",
                    "self_attn.q_norm",
                    "self_attn.k_norm",
                    "post_attention_layernorm",
                    "pre_feedforward_layernorm",
                    "post_feedforward_layernorm",
                )
            }
            self._add(p + "self_attn.o_proj.weight", self._stored(weights[p + "self_attn.o_proj.weight"]))
            self._add(p + "mlp.down_proj.weight", self._stored(weights[p + "mlp.down_proj.weight"]))
            self.layers.append((attn, mlp, norms))
        self.final_norm = self._norm(weights, "model.norm.weight")
        self.lm_head_name = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        self._add("model.embed_tokens.weight", self._stored(weights["model.embed_tokens.weight"]))
        if not cfg.tie_embeddings:
            self._add("lm_head.weight", self._stored(weights["lm_head.weight"]))
        self.embed_scale = math.sqrt(cfg.hidden_size)  # rounded to fp32 with the product (gemma3.Gemma3)
        self.attention_scale = cfg.query_pre_attn_scalar**-0.5
        self._rope: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}  # sliding? -> cos, sin [P, D]
        # One mtp.decoder_layers call per pass when every layer's q/k/v and gate/up are one matrix each.
        self.fused = all(len(attn) == 1 and len(mlp) == 1 for attn, mlp, _ in self.layers)
        self._decoder_weights: tuple[list[torch.Tensor], list[int] | None] | None = None

    def _stored(self, w):
        """A matrix as this backbone keeps it: Q5_0 widened to Q8_0 when asked, else as given."""
        return _widened(w) if self.widened else w

    def _add(self, name: str, w) -> None:
        if isinstance(w, QuantTensor):
            self._mats[name] = (w.data, w.gguf_type)
        else:
            self._mats[name] = (w.to(self.dtype).contiguous(), None)

    def _norm(self, weights: dict, name: str) -> torch.Tensor:
        w = weights[name]
        if isinstance(w, QuantTensor):  # a norm vector of a block type (no known file has one)
            w = w.dequantize().view(-1)
        return w.to(self.dtype).contiguous()

    def _matrices(self, weights: dict, prefix: str, parts: tuple[str, ...]) -> list[tuple[str, list[int]]]:
        """The parts as one fused matrix when they share a type (one mtp.linear call, the
        input read once; a float or mixed-type set: each part alone, as stored). Returns
        [(matrix name, rows of each part in it)]."""
        names = [f"{prefix}{part}.weight" for part in parts]
        ws = [self._stored(weights[n]) for n in names]
        quant = [isinstance(w, QuantTensor) for w in ws]
        if all(quant) or not any(quant):  # float parts: one new tensor (llama._fuse)
            try:
                fused = prefix + "+".join(parts)
                self._add(fused, _fuse(fused, ws))
                return [(fused, [w.shape[0] for w in ws])]
            except MixedTypesError:
                pass
        for n, w in zip(names, ws):
            self._add(n, w)
        return [(n, [w.shape[0]]) for n, w in zip(names, ws)]

    def gguf_type(self, name: str) -> int | None:
        return self._mats[name][1]

    # ---- what the MTP head reads (llama.Backbone's interface) -------------------------------
    def w(self, name: str) -> torch.Tensor:
        """A matrix as stored (uint8 rows of its GGML type: see gguf_type, or a float tensor)."""
        return self._mats[name][0]

    def scale(self, name: str) -> None:
        return None  # no Q8 re-quantization here

    @property
    def rope_cos(self) -> torch.Tensor:
        """The global layers' RoPE tables (the head reads a global layer's cache), as long as
        the largest cache made so far (new_cache grows them)."""
        return self._tables(False, 1)[0]

    @property
    def rope_sin(self) -> torch.Tensor:
        return self._tables(False, 1)[1]

    def rope_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The global layers' RoPE cos, sin [*positions.shape, D] at positions (training's)."""
        cos, sin = self._tables(False, int(positions.max()) + 1)
        return cos[positions], sin[positions]

    def layer_weight(self, i: int, part: str) -> torch.Tensor:
        """Layer i's weight `part` ("self_attn.q_proj", "input_layernorm", ...) as a float tensor
        (a row view of its fused matrix): what a new MTP head starts from (train.init_from_backbone).
        Float weights only (a backbone loaded dequantized)."""
        attn, mlp, norms = self.layers[i]
        if part in norms:
            return norms[part]
        prefix = f"model.layers.{i}."
        for name, rows in attn + mlp + [(prefix + part + ".weight", [0])]:
            parts = name[len(prefix) :].removesuffix(".weight").split("+")
            if part in parts:
                w, gguf_type = self._mats[name]
                if gguf_type is not None:
                    raise ValueError(f"Gemma3Backbone.layer_weight: {name} is block-quantized: load it dequantized")
                start = sum(rows[: parts.index(part)])
                return w[start : start + rows[parts.index(part)]] if len(parts) > 1 else w
        raise KeyError(f"layer {i} has no weight {part!r}")

    def gguf_types(self) -> set[int]:
        """The GGML types of the block-quantized matrices (x8 layouts: type + 100)."""
        return {t for _, t in self._mats.values() if t is not None}

    def matmul(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W.T through mtp.linear, W as stored; the fp32 result rounded to dtype."""
        w, gguf_type = self._mats[name]
        return torch.ops.mtp.linear(x, w, None, None, gguf_type=gguf_type).to(self.dtype)

    def _project(self, x: torch.Tensor, mats: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """The parts' outputs (views of one fused output, or one call each)."""
        out = []
        for name, rows in mats:
            y = self.matmul(x, name)
            out.extend(y.split(rows, dim=-1) if len(rows) > 1 else [y])
        return out

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding rows times sqrt(hidden) in fp32, rounded to dtype: [..., hidden]."""
        w, gguf_type = self._mats["model.embed_tokens.weight"]
        rows = torch.ops.mtp.embedding(tokens, w, gguf_type=gguf_type, dtype=torch.float32)
        return (rows * torch.tensor(self.embed_scale, dtype=torch.float32)).to(self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w, gguf_type = self._mats[self.lm_head_name]
        return torch.ops.mtp.linear(hidden, w, None, None, gguf_type=gguf_type)

    def _tables(self, sliding: bool, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE cos/sin [P >= need, D] of a layer kind (fp64 angles rounded to fp32, as
        gemma3.rope_cos_sin), grown to the cache's capacity: the full context's tables would
        be 4 x 32 MB at head_dim 256."""
        have = self._rope.get(sliding)
        if have is None or have[0].shape[0] < need:
            from .gemma3 import rope_cos_sin

            theta = self.cfg.rope_local_theta if sliding else self.cfg.rope_theta
            self._rope[sliding] = rope_cos_sin(torch.arange(need), self.cfg.head_dim, theta)
        return self._rope[sliding]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        if max_len > self.cfg.max_position:
            raise ValueError(f"a cache of {max_len} positions exceeds the model's context of {self.cfg.max_position}")
        for sliding in set(self.cfg.sliding_layers):
            self._tables(sliding, max_len)
        return KVCache(self.cfg, batch, max_len, self.dtype)

    def _attention(self, i: int, h: torch.Tensor, cache: KVCache, angles, lens: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = h.shape
        attn, _, norms = self.layers[i]
        q, k, v = self._project(h, attn)
        q = torch.ops.mtp.rms_norm(
            q.view(B, T, cfg.num_heads, cfg.head_dim), norms["self_attn.q_norm"], cfg.rms_norm_eps
        )
        k = torch.ops.mtp.rms_norm(
            k.view(B, T, cfg.num_kv_heads, cfg.head_dim), norms["self_attn.k_norm"], cfg.rms_norm_eps
        )
        cos, sin = angles[cfg.sliding_layers[i]]
        torch.ops.mtp.rope_(q, cos, sin)
        torch.ops.mtp.rope_(k, cos, sin)
        v = v.reshape(B, T, cfg.num_kv_heads, cfg.head_dim)
        torch.ops.mtp.cache_append(cache.k[i], cache.v[i], k, v, cache.lens)
        window = cfg.sliding_window if cfg.sliding_layers[i] else None
        a = torch.ops.mtp.head_attention(
            q, cache.k[i], cache.v[i], lens, None, None, self.attention_scale, True, window=window
        )
        return self.matmul(a.view(B, T, -1), f"model.layers.{i}.self_attn.o_proj.weight")

    def layer_weights(self) -> tuple[list[torch.Tensor], list[int] | None]:
        """mtp.decoder_layers(layer="gemma3")'s weights (per layer reference.GEMMA3_DECODER_PARTS,
        then the final norm) and weight_types (per layer the GGML types of qkv, o_proj, gate_up,
        down_proj, -1 for a float one; None when none is block-quantized). Needs self.fused."""
        if not self.fused:
            raise ValueError("Gemma3Backbone: a layer's q/k/v or gate/up are not one matrix: run forward_ops")
        weights, types = [], []
        for i, (attn, mlp, norms) in enumerate(self.layers):
            p = f"model.layers.{i}."
            mats = [attn[0][0], p + "self_attn.o_proj.weight", mlp[0][0], p + "mlp.down_proj.weight"]
            qkv, o, gate_up, down = (self._mats[n][0] for n in mats)
            weights += [
                norms["input_layernorm"],
                qkv,
                norms["self_attn.q_norm"],
                norms["self_attn.k_norm"],
                o,
                norms["post_attention_layernorm"],
                norms["pre_feedforward_layernorm"],
                gate_up,
                down,
                norms["post_feedforward_layernorm"],
            ]
            types += [-1 if self._mats[n][1] is None else self._mats[n][1] for n in mats]
        weights.append(self.final_norm)
        return weights, (types if any(t >= 0 for t in types) else None)

    def _check_step(self, tokens: torch.Tensor, cache: KVCache, tree_parents) -> None:
        if tree_parents is not None and not self.fused:
            raise ValueError(
                "Gemma3Backbone: tree drafts run in the one-call pass, and this file's layers mix types "
                "(they run op by op): verify chains (--branches 1)"
            )
        B, T = tokens.shape
        if B != cache.lens.shape[0]:
            raise ValueError(f"tokens has {B} requests but the cache has {cache.lens.shape[0]}")
        if int(cache.lens.max()) + T > cache.capacity:
            raise ValueError(f"{T} more tokens do not fit the cache: {int(cache.lens.max())} used of {cache.capacity}")

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        tree_parents: torch.Tensor | None = None,
        taps: list[int] | None = None,
        tap_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Runs tokens [B, T] at positions cache.lens[b] + t, appends their K/V to the cache
        and advances cache.lens by T. Returns the final normed hidden states [B, T, hidden].
        One mtp.decoder_layers(layer="gemma3") call when self.fused (the bits of forward_ops),
        else forward_ops. taps, tap_out: mtp.decoder_layers' (fused only)."""
        if not self.fused:
            if taps:
                raise ValueError("the residual streams of chosen layers (taps) need the fused pass")
            return self.forward_ops(tokens, cache, tree_parents)
        self._check_step(tokens, cache, tree_parents)
        cfg = self.cfg
        if self._decoder_weights is None:
            self._decoder_weights = self.layer_weights()
        weights, types = self._decoder_weights
        cos, sin = self._tables(False, cache.capacity)  # the global layers' (Gemma 3 always has some)
        local = {}
        if any(cfg.sliding_layers):
            cos_l, sin_l = self._tables(True, cache.capacity)
            local = {"rope_cos_local": cos_l, "rope_sin_local": sin_l}
        h = torch.ops.mtp.decoder_layers(
            self.embed(tokens),
            cache.k,
            cache.v,
            cache.lens,
            cos,
            sin,
            weights,
            [],
            cfg.num_heads,
            cfg.rms_norm_eps,
            weight_types=types,
            layer="gemma3",
            windows=[cfg.sliding_window if s else 0 for s in cfg.sliding_layers],
            attention_scale=self.attention_scale,
            tree_parents=tree_parents,
            **local,
            **({"taps": taps, "tap_out": tap_out} if taps else {}),
        )
        cache.lens.add_(tokens.shape[1])
        return h

    @torch.no_grad()
    def forward_ops(
        self, tokens: torch.Tensor, cache: KVCache, tree_parents: torch.Tensor | None = None
    ) -> torch.Tensor:
        """forward op by op (~16 calls per layer): the path of layers whose parts are not one
        matrix each, and the oracle of the fused call."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        self._check_step(tokens, cache, tree_parents)
        B, T = tokens.shape
        positions = cache.lens[:, None] + torch.arange(T)  # [B, T]
        angles = {}
        for sliding in set(cfg.sliding_layers):
            cos, sin = self._tables(sliding, cache.capacity)
            angles[sliding] = (cos[positions], sin[positions])
        lens = cache.lens + T  # the lengths once the tokens are in
        x = self.embed(tokens)
        h = torch.ops.mtp.rms_norm(x, self.layers[0][2]["input_layernorm"], eps)
        for i in range(cfg.num_layers):
            _, mlp, norms = self.layers[i]
            a = self._attention(i, h, cache, angles, lens)
            a = torch.ops.mtp.rms_norm(a, norms["post_attention_layernorm"], eps)
            x, h = torch.ops.mtp.add_rms_norm(x, a, norms["pre_feedforward_layernorm"], eps)
            outs = [self.matmul(h, name) for name, _ in mlp]  # [gate; up] fused, or gate and up
            gate_up = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
            m = self.matmul(torch.ops.mtp.gelu_tanh_mul(gate_up), f"model.layers.{i}.mlp.down_proj.weight")
            m = torch.ops.mtp.rms_norm(m, norms["post_feedforward_layernorm"], eps)
            nxt = self.layers[i + 1][2]["input_layernorm"] if i + 1 < cfg.num_layers else self.final_norm
            x, h = torch.ops.mtp.add_rms_norm(x, m, nxt, eps)
        cache.lens.add_(T)
        return h


def _widened(w):
    """A Q5_0 matrix as Q8_0 (x8 layout where its rows come in groups of 8); others as they are."""
    if not isinstance(w, QuantTensor) or w.gguf_type != TYPE_NUMBERS["Q5_0"]:
        return w
    wide = QuantTensor(widen_q5_0(w.data), TYPE_NUMBERS["Q8_0"])
    return wide.x8(out=wide.data) if can_x8(wide) else wide

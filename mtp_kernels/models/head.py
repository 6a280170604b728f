"""The frozen-MTP draft head.

Input: [embedding of the next token ; the backbone's last hidden state] -> projection ->
dense block(s) whose attention has queries only: they read the backbone's KV cache of one
layer in place (`mtp.head_attention`, zero-copy: no cache, no prefill of its own), plus a
small local segment holding the head's own K/V of the draft steps so far. Recurrent over K
steps: step j feeds its own hidden state and its own draft token to step j + 1. It shares
the backbone's frozen embedding and LM head (optionally restricted to the N most frequent
tokens, a draft vocabulary, to cut the cost of the draft LM head).
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch

from .config import LlamaConfig
from .llama import Backbone, KVCache


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int = 1
    kv_layer: int = -1  # which backbone layer's cache the head reads (negative: from the end)
    rms_norm_eps: float = 1e-5
    draft_vocab_size: int = 0  # 0: the full vocabulary
    trained: bool = False  # False: random weights, drafts are noise (labelled in every output)

    @classmethod
    def for_backbone(cls, cfg: LlamaConfig, **overrides) -> "HeadConfig":
        return cls(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads,
                   num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, **overrides)


class HeadBlock(torch.nn.Module):
    def __init__(self, c: HeadConfig, init: bool = True):
        super().__init__()
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def lin(n, k):  # init=False: uninitialised (never touched: weights about to be loaded)
            return torch.nn.Parameter(torch.randn(n, k) / k ** 0.5 if init else torch.empty(n, k))

        self.attn_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        self.q_proj, self.k_proj, self.v_proj = lin(q, c.hidden_size), lin(kv, c.hidden_size), lin(kv, c.hidden_size)
        self.o_proj = lin(c.hidden_size, q)
        self.mlp_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        self.gate_proj, self.up_proj = lin(c.intermediate_size, c.hidden_size), lin(c.intermediate_size, c.hidden_size)
        self.down_proj = lin(c.hidden_size, c.intermediate_size)


class MTPHead(torch.nn.Module):
    def __init__(self, c: HeadConfig, init: bool = True):
        super().__init__()
        self.cfg = c
        self.embed_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        self.hidden_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        self.proj = torch.nn.Parameter(torch.randn(c.hidden_size, 2 * c.hidden_size) / (2 * c.hidden_size) ** 0.5
                                       if init else torch.empty(c.hidden_size, 2 * c.hidden_size))
        self.blocks = torch.nn.ModuleList(HeadBlock(c, init) for _ in range(c.num_blocks))
        self.out_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        # Token ids of the draft vocabulary (empty: full vocabulary).
        self.register_buffer("draft_vocab", torch.zeros(0, dtype=torch.int64))

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        self.draft_vocab = ids.to(torch.int64).contiguous()

    # ---- save / load: config.json + head.safetensors -----------------------------------
    def save(self, folder: str, dtype: torch.dtype = torch.float32) -> None:
        """dtype: of the stored weights (bf16 halves a shipped head; loading casts back)."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.cfg), f, indent=2)
        save_file({k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v.contiguous()
                   for k, v in self.state_dict().items()}, os.path.join(folder, "head.safetensors"))

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype | None = None) -> "MTPHead":
        """dtype None: fp32 parameters (trainable). A dtype: the stored weights in that dtype,
        built without the random initialisation of a new head (no fp32 copy: a shipped bf16 head
        loaded in bf16 is the file's tensors themselves)."""
        from safetensors.torch import load_file

        from .checkpoint import CheckpointError

        try:
            with open(os.path.join(folder, "config.json")) as f:
                cfg = HeadConfig(**json.load(f))
            state = load_file(os.path.join(folder, "head.safetensors"))
        except (OSError, TypeError, ValueError) as e:
            raise CheckpointError(f"{folder}: not an MTP head checkpoint ({type(e).__name__}: {e})") from e
        try:
            if dtype is None:
                head = cls(cfg)
                head.draft_vocab = state.get("draft_vocab", head.draft_vocab)
                missing, unexpected = head.load_state_dict(state, strict=False)
            else:
                head = cls(cfg, init=False)  # not torch.device("meta"): its kernels import sympy & co (+150 MB)
                state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
                head.draft_vocab = state.pop("draft_vocab", torch.zeros(0, dtype=torch.int64))
                missing, unexpected = head.load_state_dict(state, strict=False, assign=True)
                missing = [k for k in missing if k != "draft_vocab"]
        except RuntimeError as e:  # shapes that do not match the config
            raise CheckpointError(f"{folder}: head weights do not match its config ({e})") from e
        if missing or unexpected:
            raise CheckpointError(f"{folder}: head weights do not match its config (missing {missing}, "
                                  f"unexpected {unexpected})")
        return head

    def check_fits(self, backbone_cfg: LlamaConfig) -> None:
        c = self.cfg
        mine = (c.hidden_size, c.num_kv_heads, c.head_dim)
        theirs = (backbone_cfg.hidden_size, backbone_cfg.num_kv_heads, backbone_cfg.head_dim)
        if mine != theirs or not -backbone_cfg.num_layers <= c.kv_layer < backbone_cfg.num_layers:
            raise ValueError(f"this head (hidden, kv heads, head dim = {mine}, kv_layer {c.kv_layer}) does not fit "
                             f"the backbone ({theirs}, {backbone_cfg.num_layers} layers)")

    # ---- drafting ----------------------------------------------------------------------
    def draft_weights(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """mtp.head_draft's weights in `dtype`: embed_norm, hidden_norm, proj, per block its
        decoder-layer parts (q/k/v and gate/up fused into one matrix each), out_norm. Cached
        until a parameter changes (in place or replaced) or the dtype does. When the head is
        already in `dtype` (cli.load_head puts it there) nothing is copied: the fused
        matrices become the parameters' storage (each projection a row view of its fused one)."""
        if getattr(self, "_draft_weights", (None,))[0] != self._draft_key(dtype):
            with torch.no_grad():
                out = [self.embed_norm, self.hidden_norm, self.proj]
                for b in self.blocks:
                    out += [b.attn_norm, _fused(dtype, b.q_proj, b.k_proj, b.v_proj), b.o_proj, b.mlp_norm,
                            _fused(dtype, b.gate_proj, b.up_proj), b.down_proj]
                out.append(self.out_norm)
                self._draft_weights = (self._draft_key(dtype), [w.detach().to(dtype).contiguous() for w in out])
        return self._draft_weights[1]

    def _draft_key(self, dtype: torch.dtype) -> tuple:
        return dtype, tuple((id(p), p.data_ptr(), p._version) for p in self.parameters())

    def draft_args(self, backbone: Backbone, cache: KVCache, hidden: torch.Tensor, token: torch.Tensor,
                   k: int) -> dict:
        """mtp.head_draft's arguments (by name) for `draft`'s inputs."""
        c, dt = self.cfg, backbone.dtype
        layer = c.kv_layer % backbone.cfg.num_layers
        name = "model.embed_tokens.weight"
        return dict(hidden=hidden.to(dt), token=token, k_cache=cache.k[layer], v_cache=cache.v[layer],
                    cache_lens=cache.lens, rope_cos=backbone.rope_cos, rope_sin=backbone.rope_sin,
                    embedding=backbone.w(name), embedding_scale=backbone.scale(name), weights=self.draft_weights(dt),
                    lm_head=backbone.w(backbone.lm_head_name), lm_head_scale=backbone.scale(backbone.lm_head_name),
                    draft_vocab=self.draft_vocab if self.draft_vocab.numel() else None, k=k, num_heads=c.num_heads,
                    eps=c.rms_norm_eps)

    @torch.no_grad()
    def draft(self, backbone: Backbone, cache: KVCache, hidden: torch.Tensor, token: torch.Tensor, k: int,
              alternatives: int = 0) -> torch.Tensor:
        """K draft tokens [B, K] after `token` [B] (the backbone's next token, not yet in
        the cache), from the backbone's last hidden state `hidden` [B, H] at position
        cache.lens - 1, then `alternatives` more columns: the first step's next best drafts
        (a tree's other first drafts). Reads the cache in place and changes nothing in it: one
        mtp.head_draft call (reference.head_draft is its op-by-op composition)."""
        return torch.ops.mtp.head_draft(**self.draft_args(backbone, cache, hidden, token, k), alternatives=alternatives,
                                        **self.draft_types(backbone))

    @staticmethod
    def draft_types(backbone: Backbone) -> dict:
        """mtp.head_draft's embedding_type / lm_head_type for a native backbone (its embedding
        and LM head are the GGUF file's uint8 rows of that GGML type); {} otherwise."""
        emb, head = backbone.gguf_type("model.embed_tokens.weight"), backbone.gguf_type(backbone.lm_head_name)
        return {} if emb is None and head is None else {
            "embedding_type": -1 if emb is None else emb, "lm_head_type": -1 if head is None else head}

def _fused(dtype: torch.dtype, *parts: torch.nn.Parameter) -> torch.Tensor:
    """The parts' rows stacked in `dtype`; parts already in `dtype` then live in it as row views
    (one copy of the weights, not two)."""
    fused = torch.cat([p.detach().to(dtype) for p in parts])
    if all(p.dtype == dtype for p in parts):
        for p, view in zip(parts, fused.split([p.shape[0] for p in parts])):
            p.data = view
    return fused

"""The frozen-MTP draft head.

Input: [embedding of the next token ; the backbone's last hidden state] -> projection ->
dense block(s) whose attention has queries only: they read the backbone's KV cache of one
layer in place (`mtp.head_attention`, zero-copy: no cache, no prefill of its own), plus a
small local segment holding the head's own K/V of the draft steps so far. Recurrent over K
steps: step j feeds its own hidden state and its own draft token to step j + 1. It shares
the backbone's frozen embedding and LM head (optionally restricted to the N most frequent
tokens, a draft vocabulary, to cut the cost of the draft LM head).

Optionally (fuse_layers, EAGLE-3's idea) the first step's hidden input also carries the
residual streams of a few backbone layers (low, middle, high; the pass computes them anyway,
`mtp.decoder_layers(taps=...)`): hidden + fuse @ [norm(tap_1); ...; norm(tap_n)], the
projection starting at zero, so such a head starts as the plain one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref

import torch

from .config import MAX_DIM, MAX_LAYERS, ConfigError, LlamaConfig, check_int, check_positive_float
from ..gguf import BLOCK_TYPES, as_x8, file_rows
from ..reference import rms_norm
from .llama import Backbone, KVCache
from .loading import release_freed_memory

# The GGUF block types a head's matrices can be drafted in (MTPHead.matrix_dtype): GGML numbers.
HEAD_BLOCK_TYPES = {"q8_0": 8, "q4_1": 3}

MAX_BLOCKS = 64  # dense blocks of one head (the shipped one has 1)


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
    fuse_layers: tuple[int, ...] = ()  # backbone layers whose residual streams feed the first step

    def __post_init__(self):
        if isinstance(self.fuse_layers, list):  # as config.json stores it
            object.__setattr__(self, "fuse_layers", tuple(self.fuse_layers))
        if not isinstance(self.fuse_layers, tuple):
            raise ConfigError("fuse_layers", self.fuse_layers, "must be a list of layer indices")
        for i in self.fuse_layers:
            check_int("fuse_layers", i, 0, MAX_LAYERS - 1)
        if list(self.fuse_layers) != sorted(set(self.fuse_layers)):
            raise ConfigError("fuse_layers", list(self.fuse_layers), "must be strictly increasing")
        for f in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"):
            check_int(f, getattr(self, f))
        check_int("num_blocks", self.num_blocks, 1, MAX_BLOCKS)
        check_int("kv_layer", self.kv_layer, -MAX_LAYERS, MAX_LAYERS - 1)
        check_int("draft_vocab_size", self.draft_vocab_size, 0, MAX_DIM)
        check_positive_float("rms_norm_eps", self.rms_norm_eps, hi=1.0)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise ConfigError("head_dim", self.head_dim, "must be even (RoPE rotates pairs)")
        if not isinstance(self.trained, bool):
            raise ConfigError("trained", self.trained, "must be true or false")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (MTPHead's state dict, draft_vocab aside), from the config
        alone: a head file is compared with it before any module is built."""
        h, q, kv, i = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.intermediate_size,
        )
        out = {"embed_norm": (h,), "hidden_norm": (h,), "proj": (h, 2 * h), "out_norm": (h,)}
        if self.fuse_layers:
            n = len(self.fuse_layers)
            out.update(fuse_norm=(n, h), fuse=(h, n * h))
        for b in range(self.num_blocks):
            out.update(
                {
                    f"blocks.{b}.{n}": s
                    for n, s in (
                        ("attn_norm", (h,)),
                        ("q_proj", (q, h)),
                        ("k_proj", (kv, h)),
                        ("v_proj", (kv, h)),
                        ("o_proj", (h, q)),
                        ("mlp_norm", (h,)),
                        ("gate_proj", (i, h)),
                        ("up_proj", (i, h)),
                        ("down_proj", (h, i)),
                    )
                }
            )
        return out

    @classmethod
    def for_backbone(cls, cfg: LlamaConfig, **overrides) -> "HeadConfig":
        return cls(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            rms_norm_eps=cfg.rms_norm_eps,
            **overrides,
        )


class HeadBlock(torch.nn.Module):
    def __init__(self, c: HeadConfig, init: bool = True):
        super().__init__()
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def lin(n, k):  # init=False: uninitialised (never touched: weights about to be loaded)
            return torch.nn.Parameter(torch.randn(n, k) / k**0.5 if init else torch.empty(n, k))

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
        self.proj = torch.nn.Parameter(
            torch.randn(c.hidden_size, 2 * c.hidden_size) / (2 * c.hidden_size) ** 0.5
            if init
            else torch.empty(c.hidden_size, 2 * c.hidden_size)
        )
        self.blocks = torch.nn.ModuleList(HeadBlock(c, init) for _ in range(c.num_blocks))
        self.out_norm = torch.nn.Parameter(torch.ones(c.hidden_size))
        if c.fuse_layers:  # zero: the tapped layers add nothing until training finds a use
            n = len(c.fuse_layers)
            self.fuse_norm = torch.nn.Parameter(torch.ones(n, c.hidden_size))
            self.fuse = torch.nn.Parameter(torch.zeros(c.hidden_size, n * c.hidden_size))
        # Token ids of the draft vocabulary (empty: full vocabulary).
        self.register_buffer("draft_vocab", torch.zeros(0, dtype=torch.int64))
        # The dtype its matrices are read in when drafting (None: the backbone's; "q8_0" / "q4_1":
        # GGUF Q8_0 / Q4_1 blocks; see draft_weights).
        self.matrix_dtype: torch.dtype | str | None = None
        # Drafting only (models.loading.load_head sets it): block-type matrices, once made,
        # free the float ones (see freeze_for_drafting); _frozen: (dtype, matrix_dtype) then.
        self.drafting_only = False
        self._frozen: tuple | None = None

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        self.draft_vocab = ids.to(torch.int64).contiguous()

    # ---- save / load: config.json + head.safetensors -----------------------------------
    def save(self, folder: str, dtype: torch.dtype = torch.float32) -> None:
        """dtype: of the stored weights (bf16 halves a shipped head; loading casts back)."""
        from safetensors.torch import save_file

        if self._frozen:
            raise ValueError(
                "this head was frozen for drafting (its float matrices freed): save the head it was loaded from"
            )

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.cfg), f, indent=2)
        save_file(
            {
                k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v.contiguous()
                for k, v in self.state_dict().items()
            },
            os.path.join(folder, "head.safetensors"),
        )

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype | None = None, backbone_cfg: LlamaConfig | None = None) -> "MTPHead":
        """dtype None: fp32 parameters (trainable). A dtype: the stored weights in that dtype,
        built without the random initialisation of a new head (no fp32 copy: a shipped bf16 head
        loaded in bf16 is the file's matrices themselves, mapped until freed). The config (and,
        given backbone_cfg, its fit: check_fits), the weights' names, shapes and dtypes are
        checked first, from the file's header: nothing is built or read for a head that would be
        refused."""
        from safetensors import safe_open

        from .checkpoint import CheckpointError, check_float_tensors, read_json

        folder = str(folder)
        config_path, weights_path = os.path.join(folder, "config.json"), os.path.join(folder, "head.safetensors")
        for p in (config_path, weights_path):
            if not os.path.isfile(p):
                raise CheckpointError(f"{folder}: not an MTP head checkpoint (no {os.path.basename(p)})")
        raw = read_json(config_path)
        if not isinstance(raw, dict):
            raise CheckpointError(f"{config_path}: not an MTP head config (a JSON object)")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(HeadConfig)})
        missing = sorted(
            {f.name for f in dataclasses.fields(HeadConfig) if f.default is dataclasses.MISSING} - set(raw)
        )
        if unknown or missing:
            raise CheckpointError(
                f"{config_path}: not an MTP head config ("
                + (f"unknown field {unknown[0]!r}" if unknown else f"{missing[0]!r} is missing")
                + ")"
            )
        try:
            cfg = HeadConfig(**raw)
        except ConfigError as e:
            raise CheckpointError(f"{config_path}: {e}") from None
        if backbone_cfg is not None:
            try:
                _check_fits(cfg, backbone_cfg)
            except ValueError as e:
                raise CheckpointError(f"{folder}: {e}") from None
        try:
            with safe_open(weights_path, framework="pt") as f:
                header = {k: f.get_slice(k) for k in f.keys()}
                stored = {k: (tuple(s.get_shape()), s.get_dtype()) for k, s in header.items()}
        except Exception as e:
            raise CheckpointError(
                f"{weights_path}: unreadable safetensors ({type(e).__name__}: {' '.join(str(e).split())})"
            ) from None
        expected = cfg.shapes()
        for name, shape in expected.items():
            if name not in stored:
                raise CheckpointError(
                    f"{weights_path}: weight {name!r} is missing (config.json: {cfg.num_blocks} block(s))"
                )
            if stored[name][0] != shape:
                raise CheckpointError(
                    f"{weights_path}: weight {name!r} has shape {stored[name][0]}, expected {shape} from config.json"
                )
        extra = sorted(set(stored) - set(expected) - {"draft_vocab"})
        if extra:
            raise CheckpointError(f"{weights_path}: unexpected weight {extra[0]!r}")
        if "draft_vocab" in stored:
            shape, dt = stored["draft_vocab"]
            if dt not in ("I64", "I32") or len(shape) != 1:
                raise CheckpointError(
                    f"{weights_path}: draft_vocab ({dt} {list(shape)}) must be a 1-D list of integer token ids"
                )
        try:
            from safetensors.torch import load_file

            state = load_file(weights_path)
        except Exception as e:
            raise CheckpointError(
                f"{weights_path}: unreadable safetensors ({type(e).__name__}: {' '.join(str(e).split())})"
            ) from None
        check_float_tensors(weights_path, state, skip=("draft_vocab",))
        # What outlives the float matrices a drafting-only head frees (draft_vocab, the norms) is
        # copied: one view left on load_file's mapping would keep the whole file mapped, and
        # every page of it the first draft read resident (RSS) for good.
        vocab = state.pop("draft_vocab", torch.zeros(0, dtype=torch.int64)).to(torch.int64, copy=True)
        if vocab.numel() and (int(vocab.min()) < 0 or vocab.unique().numel() != vocab.numel()):
            raise CheckpointError(f"{weights_path}: draft_vocab must hold distinct non-negative token ids")
        if vocab.numel() and backbone_cfg is not None and int(vocab.max()) >= backbone_cfg.vocab_size:
            raise CheckpointError(
                f"{weights_path}: draft_vocab has token id {int(vocab.max())}, outside the "
                f"backbone's vocabulary of {backbone_cfg.vocab_size}"
            )
        if dtype is None:
            head = cls(cfg)
            head.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        else:
            head = cls(cfg, init=False)  # not torch.device("meta"): its kernels import sympy & co (+150 MB)
            state = {k: v.to(dtype, copy=v.dim() < 2) for k, v in state.items()}  # the matrices as mapped
            head.load_state_dict(state, strict=False, assign=True)
        head.draft_vocab = vocab.contiguous()
        return head

    def check_fits(self, backbone_cfg: LlamaConfig) -> None:
        _check_fits(self.cfg, backbone_cfg)
        if self.draft_vocab.numel() and int(self.draft_vocab.max()) >= backbone_cfg.vocab_size:
            raise ValueError(
                f"this head's draft vocabulary has token id {int(self.draft_vocab.max())}, outside the "
                f"backbone's vocabulary of {backbone_cfg.vocab_size}"
            )

    # ---- drafting ----------------------------------------------------------------------
    def draft_weights(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """mtp.head_draft's weights: embed_norm, hidden_norm, proj, per block its decoder-layer
        parts (q/k/v and gate/up fused into one matrix each), out_norm; the norms in `dtype` (the
        backbone's), the matrices in `matrix_dtype` when it is set (else `dtype`): a torch dtype,
        or a key of HEAD_BLOCK_TYPES: each matrix quantized once to those GGUF blocks (x8 layout;
        the GGML types in draft_weight_types), Q8_0 half a bf16 draft's bytes, Q4_1 under a
        third. Cached until a parameter changes (in place or replaced) or a dtype does. When the
        head is already in a torch matrix dtype (models.loading.load_head puts it there) nothing
        is copied: the fused matrices become the parameters' storage (each projection a row view
        of its fused one)."""
        return self._draft_cached(dtype)[0]

    def draft_weight_types(self, dtype: torch.dtype) -> list[int] | None:
        """mtp.head_draft's weight_types for draft_weights(dtype): per matrix (proj, then qkv,
        o_proj, gate_up, down_proj of each block) its GGML type; None for float matrices."""
        return self._draft_cached(dtype)[1]

    def _draft_cached(self, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[int] | None]:
        mats = self.matrix_dtype or dtype
        block = HEAD_BLOCK_TYPES.get(mats) if isinstance(mats, str) else None
        if isinstance(mats, str) and block is None:
            raise ValueError(f"matrix_dtype {mats!r}: a torch dtype or one of {sorted(HEAD_BLOCK_TYPES)}")
        if block is not None and not self.fits_block_type(mats):
            raise ValueError(
                f"matrix_dtype {mats!r}: this head's matrices have rows of {sorted(set(self._matrix_widths()))} "
                f"values; {mats} needs multiples of {BLOCK_TYPES[block][1]}"
            )
        if self._frozen:
            if self._frozen != (dtype, self.matrix_dtype):
                raise ValueError(
                    f"this head drafts only with {self._frozen[1]} matrices and {self._frozen[0]} norms: its float "
                    "matrices were freed (freeze_for_drafting); load it again for another dtype"
                )
            return self._draft_weights[1]
        free = self.drafting_only and block is not None
        if getattr(self, "_draft_weights", (None,))[0] != self._draft_key(dtype):
            with torch.no_grad():
                parts, types = self._matrix_parts(), None
                if block is not None:  # from the parameters' values, a few rows at a time
                    matrices, types = [], []
                    for ps in parts:
                        matrix, code = _gguf_matrix(ps, block)
                        matrices.append(matrix)
                        types.append(code)
                        for p in ps if free else ():  # drafting only: one matrix's float values at a time
                            p.data = torch.empty(0, dtype=p.dtype)
                else:
                    matrices = [_fused(mats, *ps) if len(ps) > 1 else ps[0].to(mats) for ps in parts]
                out = [self.embed_norm.to(dtype), self.hidden_norm.to(dtype), matrices[0]]
                for i, b in enumerate(self.blocks):
                    out += [b.attn_norm.to(dtype), *matrices[1 + 4 * i : 3 + 4 * i], b.mlp_norm.to(dtype)]
                    out += matrices[3 + 4 * i : 5 + 4 * i]
                out.append(self.out_norm.to(dtype))
                self._draft_weights = (
                    self._draft_key(dtype),
                    ([w.detach().contiguous() for w in out], None if types is None else list(types)),
                )
        if free:
            for p in (p for ps in self._matrix_parts() for p in ps):  # (all of them, if drafts had made the weights)
                p.data = torch.empty(0, dtype=p.dtype)
            self._frozen = (dtype, self.matrix_dtype)
            release_freed_memory()  # once: the float matrices and the quantizer's scratch, after the load's trim
        return self._draft_weights[1]

    def freeze_for_drafting(self, dtype: torch.dtype) -> None:
        """Drafting only from here on, now: with block-type matrices (matrix_dtype "q4_1" or
        "q8_0") the draft weights are made and the parameters' float matrices freed, one matrix
        at a time (SmolLM2's head: 8.4 MB of bf16 beside its 2.6 MB of Q4_1). draft_weights then
        serves this dtype and matrix_dtype only; save refuses. Float matrices are the parameters'
        own storage already: nothing to free, nothing frozen. models.loading.load_head sets
        drafting_only instead, which does this at the first draft (after loading's peak)."""
        self.drafting_only = True
        self._draft_cached(dtype)

    def _matrix_parts(self) -> list[list[torch.nn.Parameter]]:
        """The parameters of each matrix draft_weights gives, stacked in this order: proj, then
        per block q/k/v, o_proj, gate/up, down_proj."""
        parts = [[self.proj]]
        for b in self.blocks:
            parts += [[b.q_proj, b.k_proj, b.v_proj], [b.o_proj], [b.gate_proj, b.up_proj], [b.down_proj]]
        return parts

    def _matrix_widths(self) -> list[int]:
        """The row length K of each matrix draft_weights gives (proj 2H; qkv H, o_proj Hq D,
        gate_up H, down_proj I per block)."""
        c = self.cfg
        return [2 * c.hidden_size, c.hidden_size, c.num_heads * c.head_dim, c.hidden_size, c.intermediate_size]

    def fits_block_type(self, name: str) -> bool:
        """Whether matrix_dtype `name` (a key of HEAD_BLOCK_TYPES) takes this head's matrices:
        every row a whole number of its blocks."""
        return all(k % BLOCK_TYPES[HEAD_BLOCK_TYPES[name]][1] == 0 for k in self._matrix_widths())

    def _draft_key(self, dtype: torch.dtype) -> tuple:
        return dtype, self.matrix_dtype, tuple((id(p), p.data_ptr(), p._version) for p in self.parameters())

    def first_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The first step's hidden input [..., H] from the backbone's features [..., 1 + n, H]:
        its final hidden state, then the residual streams of the n fuse_layers (what
        `Backbone.features` returns). Without fuse_layers the hidden state as it is; with them
        in fp32 and differentiable: training runs it too."""
        n = len(self.cfg.fuse_layers)
        if features.dim() < 2 or features.shape[-2] != 1 + n:
            raise ValueError(
                f"this head fuses {n} backbone layer(s) {list(self.cfg.fuse_layers)}: its features are "
                f"[..., {1 + n}, H], got {list(features.shape)}"
            )
        if not n:  # no copy nor cast on the drafting path of a plain head
            return features[..., 0, :]
        normed = rms_norm(features[..., 1:, :].float(), self.fuse_norm.float(), self.cfg.rms_norm_eps)
        return features[..., 0, :].float() + normed.flatten(-2) @ self.fuse.float().T

    def draft_args(self, backbone: Backbone, cache: KVCache, hidden: torch.Tensor, token: torch.Tensor, k: int) -> dict:
        """mtp.head_draft's arguments (by name) for `draft`'s inputs."""
        c, dt = self.cfg, backbone.dtype
        layer = c.kv_layer % backbone.cfg.num_layers
        name = "model.embed_tokens.weight"
        lm_head, lm_head_scale, _ = self.draft_lm_head(backbone)
        return dict(
            hidden=(self.first_hidden(hidden) if hidden.dim() == 3 or self.cfg.fuse_layers else hidden).to(dt),
            token=token,
            k_cache=cache.k[layer],
            v_cache=cache.v[layer],
            cache_lens=cache.lens,
            rope_cos=backbone.rope_cos,
            rope_sin=backbone.rope_sin,
            embedding=backbone.w(name),
            embedding_scale=backbone.scale(name),
            weights=self.draft_weights(dt),
            lm_head=lm_head,
            lm_head_scale=lm_head_scale,
            draft_vocab=self.draft_vocab if self.draft_vocab.numel() else None,
            k=k,
            num_heads=c.num_heads,
            eps=c.rms_norm_eps,
        )

    @torch.no_grad()
    def draft(
        self,
        backbone: Backbone,
        cache: KVCache,
        hidden: torch.Tensor,
        token: torch.Tensor,
        k: int,
        alternatives: int = 0,
        probs_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """K draft tokens [B, K] after `token` [B] (the backbone's next token, not yet in
        the cache), from the backbone's last hidden state `hidden` [B, H] at position
        cache.lens - 1 (or its features [B, 1 + n, H], see first_hidden), then `alternatives`
        more columns: the first step's next best drafts (a tree's other first drafts); each
        draft's probability under the head into probs_out [B, K] float32 when given. Reads
        the cache in place and changes nothing in it: one mtp.head_draft call
        (reference.head_draft is its op-by-op composition)."""
        return torch.ops.mtp.head_draft(
            **self.draft_args(backbone, cache, hidden, token, k),
            alternatives=alternatives,
            probs_out=probs_out,
            **self.draft_types(backbone),
        )

    def draft_lm_head(self, backbone: Backbone) -> tuple[torch.Tensor, torch.Tensor | None, int | None]:
        """mtp.head_draft's lm_head, lm_head_scale and the GGUF type of lm_head (None: not a
        block type): with a draft vocabulary (Vd < V), its rows of the backbone's LM head
        gathered once (row i token draft_vocab[i]'s; in the x8 layout when the type has one
        and Vd is a multiple of 8) and cached while the same LM head, scales and vocabulary
        tensors are unchanged (weak references and versions), so that no draft gathers them
        again: on Gemma 3 that gather (4096 of 262,144 rows of an x8 LM head) was ~5 ms of a
        ~6 ms draft. Else the backbone's own. The same logits, so the same drafts."""
        name, vocab = backbone.lm_head_name, self.draft_vocab
        w, scale, code = backbone.w(name), backbone.scale(name), backbone.gguf_type(name)
        if not 0 < vocab.numel() < w.shape[0]:
            return w, scale, code
        sources = (w, scale, vocab)
        key = (code, *(None if t is None else t._version for t in sources))
        cached = getattr(self, "_draft_lm_head", None)
        if cached is None or cached[1] != key or any(r() is not t for r, t in zip(cached[0], sources)):
            if code is None:
                rows = (w[vocab].contiguous(), None if scale is None else scale[vocab].contiguous(), None)
            else:
                data, code = as_x8(*file_rows(w, code, vocab))
                rows = (data, None, code)
            refs = tuple((lambda: None) if t is None else weakref.ref(t) for t in sources)
            self._draft_lm_head = (refs, key, rows)
            release_freed_memory()  # the gather's index and file-layout rows (~60 MB on Gemma 3), once
        return self._draft_lm_head[2]

    def draft_types(self, backbone: Backbone) -> dict:
        """mtp.head_draft's keyword arguments of block-type matrices: embedding_type /
        lm_head_type for a native backbone (its embedding and LM head are the GGUF file's uint8
        rows of that GGML type; the LM head's as draft_lm_head gives it), weight_types when the
        head's own matrices are (a block-type matrix_dtype); {} when none is."""
        emb, head = backbone.gguf_type("model.embed_tokens.weight"), self.draft_lm_head(backbone)[2]
        types = {} if emb is None and head is None else {"embedding_type": emb, "lm_head_type": head}
        mine = self.draft_weight_types(backbone.dtype)
        return {k: -1 if v is None else v for k, v in types.items()} | ({"weight_types": mine} if mine else {})


def check_global_layer(kv_layer: int, backbone_cfg, what: str) -> None:
    """Refuses a head reading a sliding-window layer (Gemma 3): that cache was written to be
    read through a window. Llama configs have no global_layers: every layer serves."""
    layers = getattr(backbone_cfg, "global_layers", None)
    if layers is not None and kv_layer % backbone_cfg.num_layers not in layers:
        raise ValueError(
            f"{what} {kv_layer % backbone_cfg.num_layers}, a sliding-window layer of the backbone: "
            f"it must read a global one ({layers})"
        )


def _check_fits(c: HeadConfig, backbone_cfg: LlamaConfig) -> None:
    mine = (c.hidden_size, c.num_kv_heads, c.head_dim)
    theirs = (backbone_cfg.hidden_size, backbone_cfg.num_kv_heads, backbone_cfg.head_dim)
    if mine != theirs or not -backbone_cfg.num_layers <= c.kv_layer < backbone_cfg.num_layers:
        raise ValueError(
            f"this head (hidden, kv heads, head dim = {mine}, kv_layer {c.kv_layer}) does not fit "
            f"the backbone ({theirs}, {backbone_cfg.num_layers} layers)"
        )
    check_global_layer(c.kv_layer, backbone_cfg, "this head reads layer")
    if c.fuse_layers and c.fuse_layers[-1] >= backbone_cfg.num_layers:
        raise ValueError(
            f"this head fuses layer {c.fuse_layers[-1]}; the backbone has {backbone_cfg.num_layers} layers"
        )
    if c.draft_vocab_size > backbone_cfg.vocab_size:
        raise ValueError(
            f"this head's draft_vocab_size {c.draft_vocab_size} exceeds the backbone's vocabulary of "
            f"{backbone_cfg.vocab_size}"
        )


_QUANTIZE_ROWS = 256  # rows per call of the quantizer: its fp32 temporaries stay < 1 MB


def _gguf_matrix(parts: list[torch.Tensor], code: int) -> tuple[torch.Tensor, int]:
    """The parts' rows stacked [N, K] as the bytes of GGML type `code` (gguf's quantizer,
    llama.cpp's rule; fp32 first; a block never spans rows, so row chunks give the same bytes)
    and their type: in the x8 layout when it has one and N is a multiple of 8."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType(code)
    chunks = [
        gguf.quants.quantize(p.detach()[i : i + _QUANTIZE_ROWS].float().cpu().numpy(), qtype)
        for p in parts
        for i in range(0, p.shape[0], _QUANTIZE_ROWS)
    ]
    return as_x8(torch.from_numpy(np.concatenate(chunks)), code)


def _fused(dtype: torch.dtype, *parts: torch.nn.Parameter) -> torch.Tensor:
    """The parts' rows stacked in `dtype`; parts already in `dtype` then live in it as row views
    (one copy of the weights, not two)."""
    fused = torch.cat([p.detach().to(dtype) for p in parts])
    if all(p.dtype == dtype for p in parts):
        for p, view in zip(parts, fused.split([p.shape[0] for p in parts])):
            p.data = view
    return fused

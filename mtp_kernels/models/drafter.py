"""The standalone drafter: the baseline the frozen-MTP head is compared against.

A small separate Llama with its OWN embedding (tied LM head), OWN KV cache and prefill, run
by the same `Backbone` class (so through `mtp.linear`, `mtp.cache_append` and
`mtp.head_attention`). Its vocabulary is a draft vocabulary (backbone token ids, most
frequent first) plus one UNK row (the last) for any other token; UNK is never drafted.

Runtime protocol of `decoding.generate`: `begin(prompts, capacity)` after the backbone's
prefill (the drafter's own prefill), then `draft(model, cache, hidden, token, k)` per pass.
The drafter keeps, per request, the tokens it believes in (prompt, then each pass's pending
token and drafts); the backbone's `cache.lens[b]` says how many of them were committed, so
it rolls its own cache back to that prefix, feeds what is missing plus `token`, and drafts
greedily one token per forward.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

from .checkpoint import CheckpointError, _check_weights, expected_shapes
from .config import LlamaConfig
from .head import HeadConfig, MTPHead
from .llama import Backbone, KVCache

KIND = "mtp-standalone-drafter"
FAMILIES = ("llama", "gemma3")  # the backbones whose token ids a drafter can draft
WEIGHTS_FILE = "drafter.safetensors"


def default_config(vocab_len: int, max_position: int, **overrides) -> LlamaConfig:
    """The default drafter: hidden 256, 2 layers, 4 heads / 2 KV heads of 64, MLP 768, a
    vocabulary of `vocab_len` draft tokens + UNK (about 3.7M parameters at 8192)."""
    kw = dict(
        vocab_size=vocab_len + 1,
        hidden_size=256,
        intermediate_size=768,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        max_position=max_position,
        tie_embeddings=True,
    )
    return LlamaConfig(**{**kw, **overrides})


def config_near(vocab_len: int, max_position: int, params: int) -> LlamaConfig:
    """The default drafter when its parameters are within 25% of `params` (the head's), else the
    one nearest to them among widths 256..768 (heads of 64, MLP 3x, 2 layers): the head and the
    drafter are compared at about the same size."""
    from .checkpoint import expected_shapes

    def size(c: LlamaConfig) -> int:
        return sum(math.prod(s) for s in expected_shapes(c).values())

    default = default_config(vocab_len, max_position)
    if abs(size(default) / params - 1) <= 0.25:
        return default
    widths = [
        default_config(
            vocab_len, max_position, hidden_size=h, intermediate_size=3 * h, num_heads=h // 64, num_kv_heads=h // 128
        )
        for h in range(256, 769, 128)
    ]
    return min(widths, key=lambda c: abs(size(c) - params))


def parameter_counts(drafter_cfg: LlamaConfig, head_cfg: HeadConfig) -> dict:
    """Parameters of the drafter (its embedding included) and of the MTP head (which has
    none: it shares the backbone's), and their ratio."""
    drafter = sum(math.prod(s) for s in expected_shapes(drafter_cfg).values())
    head = sum(p.numel() for p in MTPHead(head_cfg).parameters())
    return {"drafter": drafter, "head": head, "ratio": drafter / head}


class StandaloneDrafter:
    def __init__(
        self,
        cfg: LlamaConfig,
        vocab: torch.Tensor,
        weights: dict[str, torch.Tensor] | None = None,
        trained: bool = False,
        seed: int = 0,
        family: str = "llama",
    ):
        vocab = torch.as_tensor(vocab, dtype=torch.int64)
        if vocab.dim() != 1 or not 0 < vocab.numel() == cfg.vocab_size - 1 or not cfg.tie_embeddings:
            raise ValueError(
                f"a drafter needs a 1-D vocabulary of vocab_size - 1 = {cfg.vocab_size - 1} ids and tied "
                f"embeddings, got {tuple(vocab.shape)} ids, tie_embeddings={cfg.tie_embeddings}"
            )
        if int(vocab.min()) < 0 or vocab.unique().numel() != vocab.numel():
            raise ValueError("the drafter's vocabulary must hold distinct non-negative token ids")
        # family: the backbone family whose token ids `vocab` holds (its tokenizer's).
        self.cfg, self.vocab, self.trained, self.family = cfg, vocab, trained, family
        if weights is None:
            g = torch.Generator().manual_seed(seed)
            weights = {
                n: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02
                for n, s in expected_shapes(cfg).items()
            }
        self.weights = weights  # fp32 master copy (trained in place by train_drafter)
        # Backbone id -> drafter index; int32 (the drafter's vocabulary is small): half the bytes.
        self._index = torch.full((int(vocab.max()) + 1,), self.unk, dtype=torch.int32)
        self._index[vocab] = torch.arange(vocab.numel(), dtype=torch.int32)
        self.model: Backbone | None = None
        self.cache: KVCache | None = None
        self.seq: list[list[int]] = []

    @classmethod
    def create(cls, vocab: torch.Tensor, max_position: int, seed: int = 0, **overrides) -> "StandaloneDrafter":
        """A randomly initialised drafter of the default size over `vocab`."""
        return cls(default_config(len(vocab), max_position, **overrides), vocab, seed=seed)

    @property
    def unk(self) -> int:
        return self.cfg.vocab_size - 1

    def num_parameters(self) -> int:
        return sum(w.numel() for w in self.weights.values())

    def to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Backbone ids -> drafter indices (UNK for ids outside the vocabulary)."""
        ids = torch.as_tensor(ids, dtype=torch.int64)
        n = self._index.numel()
        return torch.where((ids >= 0) & (ids < n), self._index[ids.clamp(0, n - 1)], self.unk).long()

    def to(self, dtype: torch.dtype) -> "StandaloneDrafter":
        """(Re)builds the runtime model in `dtype` from the current weights."""
        self.model = Backbone(self.cfg, {n: w.detach() for n, w in self.weights.items()}, dtype)
        return self

    def check_fits(self, backbone_cfg: LlamaConfig, family: str = "llama") -> None:
        if family != self.family:
            raise ValueError(f"this drafter drafts {self.family} token ids: it cannot draft for a {family} backbone")
        if int(self.vocab.max()) >= backbone_cfg.vocab_size:
            raise ValueError(
                f"the drafter's vocabulary has token id {int(self.vocab.max())}, outside the "
                f"backbone's vocabulary of {backbone_cfg.vocab_size}"
            )

    # ---- save / load: config.json + drafter.safetensors (weights and the vocabulary) -----
    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            meta = {"kind": KIND, "trained": self.trained, "family": self.family, "model": dataclasses.asdict(self.cfg)}
            json.dump(meta, f, indent=2)
        tensors = {n: w.detach().float().contiguous() for n, w in self.weights.items()}
        save_file({**tensors, "draft_vocab": self.vocab.contiguous()}, os.path.join(folder, WEIGHTS_FILE))

    @classmethod
    def load(cls, folder: str) -> "StandaloneDrafter":
        """config.json checked first (a LlamaConfig: sizes, heads, context), then the weights'
        header (layers, names, dtypes: float weights, integer draft_vocab) before any tensor is read."""
        from safetensors import safe_open

        from .checkpoint import _check_layer_count, _one_line, check_float_tensors, read_json

        folder = str(folder)
        config_path, weights_path = os.path.join(folder, "config.json"), os.path.join(folder, WEIGHTS_FILE)
        for p in (config_path, weights_path):
            if not os.path.isfile(p):
                raise CheckpointError(f"{folder}: not a standalone drafter (no {os.path.basename(p)})")
        meta = read_json(config_path)
        if not isinstance(meta, dict) or meta.get("kind") != KIND or not isinstance(meta.get("model"), dict):
            raise CheckpointError(
                f'{config_path}: not a standalone drafter config (an object with "kind": "{KIND}" and "model")'
            )
        family = meta.get("family", "llama")  # drafters saved before Gemma 3 were SmolLM2's
        if not isinstance(family, str) or family not in FAMILIES:
            raise CheckpointError(f'{config_path}: "family" must be one of {list(FAMILIES)}')
        try:
            cfg = LlamaConfig.from_json(json.dumps(meta["model"]))
        except ValueError as e:
            raise CheckpointError(f"{config_path}: model.{e}") from None
        try:
            with safe_open(weights_path, framework="pt") as f:
                names = list(f.keys())
                vocab_dtype = f.get_slice("draft_vocab").get_dtype() if "draft_vocab" in names else None
        except Exception as e:
            raise CheckpointError(
                f"{weights_path}: not a standalone drafter (unreadable safetensors: {type(e).__name__}: {_one_line(e)})"
            ) from None
        if vocab_dtype is None:
            raise CheckpointError(f"{weights_path}: no draft_vocab")
        if vocab_dtype not in ("I64", "I32"):
            raise CheckpointError(f"{weights_path}: draft_vocab is {vocab_dtype}: it must hold integer token ids")
        _check_layer_count(config_path, "model.num_layers", cfg.num_layers, names, r"model\.layers\.(\d+)\.")
        try:
            from safetensors.torch import load_file

            state = load_file(weights_path)
        except Exception as e:
            raise CheckpointError(
                f"{weights_path}: not a standalone drafter (unreadable safetensors: {type(e).__name__}: {_one_line(e)})"
            ) from None
        vocab = state.pop("draft_vocab")
        check_float_tensors(weights_path, state)
        _check_weights(folder, cfg, state)
        try:
            weights = {n: w.float() for n, w in state.items()}
            return cls(cfg, vocab, weights, trained=bool(meta.get("trained")), family=family)
        except ValueError as e:
            raise CheckpointError(f"{folder}: {e}") from e

    # ---- runtime -------------------------------------------------------------------------
    def _hidden_after(self, tokens: list[list[int]], cache: KVCache) -> torch.Tensor:
        """Feeds each request's tokens (backbone ids, ragged) into its own cache row;
        returns the last hidden states [B, H]."""
        return torch.stack([self.model(self.to_draft([ids]), cache.select(b))[0, -1] for b, ids in enumerate(tokens)])

    def _pick(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy draft index [B] over the vocabulary without UNK."""
        return torch.ops.mtp.linear(hidden, self.model.lm_head[: self.unk]).argmax(-1)

    @torch.no_grad()
    def begin(self, prompts: list[list[int]], capacity: int) -> None:
        """The drafter's own prefill: a fresh cache of `capacity` positions per request."""
        if self.model is None:
            self.to(torch.float32)
        self.cache = self.model.new_cache(len(prompts), capacity)
        self.seq = [list(p) for p in prompts]
        self._hidden_after(self.seq, self.cache)

    @torch.no_grad()
    def draft(self, model: Backbone, cache: KVCache, hidden: torch.Tensor, token: torch.Tensor, k: int) -> torch.Tensor:
        """K drafts [B, K] (backbone ids) after the pending `token` [B]; `hidden` is unused."""
        if self.cache is None or self.cache.lens.shape[0] != token.shape[0]:
            raise RuntimeError("StandaloneDrafter.draft before begin() for this batch")
        feed = []
        for b in range(token.shape[0]):
            n = int(cache.lens[b])  # committed tokens: the first n of what this drafter believed
            if n > len(self.seq[b]):
                raise RuntimeError(f"request {b}: the backbone has {n} tokens, more than this drafter saw")
            self.seq[b] = self.seq[b][:n] + [int(token[b])]
            self.cache.lens[b] = min(int(self.cache.lens[b]), n)
            feed.append(self.seq[b][int(self.cache.lens[b]) :])
        step = self._pick(self._hidden_after(feed, self.cache))
        drafts = [step]
        for _ in range(k - 1):
            step = self._pick(self.model(step[:, None], self.cache)[:, 0])
            drafts.append(step)
        out = self.vocab[torch.stack(drafts, dim=1)]
        for b in range(token.shape[0]):
            self.seq[b] += out[b].tolist()
        return out

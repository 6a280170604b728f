"""The GGUF's own 4-/8-bit weights, run in place: the loader's zero-copy QuantTensors (equal to
the dequantizing loader's weights), the native backbone (MTP output equals its greedy), bad
files (each a clear CheckpointError, exit 2 from `mtp generate`), and the peak RSS of
`mtp generate` on the default model."""

import os
import subprocess
import sys

import pytest
import torch

from mtp_kernels import cli, decoding
from mtp_kernels.gguf import QuantTensor
from mtp_kernels.models import checkpoint, loading
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.llama import Backbone
from tiny_model import TINY, assert_verify_pass_equals_steps, tiny_weights

gguf = pytest.importorskip("gguf")

# Our weight name -> the GGUF's (tiny files written below).
_GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
for _ours, _theirs in checkpoint._GGUF_LAYER_NAMES.items():
    for _i in range(TINY.num_layers):
        _GGUF_NAMES[f"model.layers.{_i}.{_theirs}.weight"] = f"blk.{_i}.{_ours}.weight"


def write_tiny_gguf(
    path, block_count=TINY.num_layers, matrix_type=gguf.GGMLQuantizationType.Q4_1, skip=(), overrides=None
):
    """A tiny Llama GGUF: Q8_0 embedding, `matrix_type` layer matrices, F32 norms."""
    overrides = overrides or {}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(TINY.max_position)
    w.add_embedding_length(TINY.hidden_size)
    if "feed_forward_length" not in skip:
        w.add_feed_forward_length(TINY.intermediate_size)
    w.add_block_count(block_count)
    w.add_head_count(TINY.num_heads)
    w.add_head_count_kv(TINY.num_kv_heads)
    w.add_layer_norm_rms_eps(TINY.rms_norm_eps)
    w.add_rope_freq_base(TINY.rope_theta)
    tokens = [chr(ord("a") + i) if i < 26 else "ab" if i == 26 else f"<t{i}>" for i in range(TINY.vocab_size)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * TINY.vocab_size)
    w.add_token_merges(["a b"])
    w.add_eos_token_id(TINY.eos_token_ids[0])
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name, t in tiny_weights().items():
        arr = t.numpy()
        if t.dim() == 1:
            w.add_tensor(_GGUF_NAMES[name], arr)
            continue
        qtype = overrides.get(name, gguf.GGMLQuantizationType.Q8_0 if "embed" in name else matrix_type)
        w.add_tensor(_GGUF_NAMES[name], gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def patch_tensor_info(path, gguf_name, row_length=None, type_=None, offset_delta=0):
    """Rewrites fields of one tensor's entry in the tensor table, in place."""
    data = bytearray(open(path, "rb").read())
    key = len(gguf_name).to_bytes(8, "little") + gguf_name.encode()
    at = data.index(key) + len(key)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    dims_at, type_at = at + 4, at + 4 + 8 * n_dims
    if row_length is not None:
        data[dims_at : dims_at + 8] = row_length.to_bytes(8, "little")
    if type_ is not None:
        data[type_at : type_at + 4] = type_.to_bytes(4, "little")
    offset = int.from_bytes(data[type_at + 4 : type_at + 12], "little") + offset_delta
    data[type_at + 4 : type_at + 12] = offset.to_bytes(8, "little")
    open(path, "wb").write(bytes(data))


def test_tiny_gguf_native_equals_dequantized(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    cfg, native, _ = checkpoint.load(path, native=True)
    cfg32, fp32, tok = checkpoint.load(path)
    file_order = checkpoint.load(path, native=True, x8=False)[1]
    assert cfg == cfg32 and set(native) == set(fp32) == set(file_order)
    assert tok.encode("abc") == [26, 2] and tok.decode([26, 2]) == "abc"
    for name, w in native.items():
        if isinstance(w, torch.Tensor):  # the norms
            assert torch.equal(w.float(), fp32[name]), name
        else:  # the layers' Q4_1 matrices in their x8 layout (whole groups of 8 rows), else as stored
            stored = 8 if "embed" in name else 3  # Q8_0 embedding, Q4_1 layers: x8 in whole groups of 8 rows
            assert isinstance(w, QuantTensor) and w.gguf_type == stored + (100 if w.shape[0] % 8 == 0 else 0), name
            assert file_order[name].gguf_type == w.gguf_type % 100, name
            assert torch.equal(w.dequantize(), fp32[name]) and torch.equal(file_order[name].dequantize(), fp32[name])


BAD_FILES = {
    "unknown type": (
        lambda p: patch_tensor_info(p, "blk.0.ffn_up.weight", type_=99),
        r"tensor 'blk.0.ffn_up.weight' has an unknown GGML type 99",
    ),
    "data past the end": (
        lambda p: open(p, "r+b").truncate(os.path.getsize(p) - 100),
        r"tensor '[^']+' .* lies past the end of the file",
    ),
    "misaligned": (
        lambda p: patch_tensor_info(p, "blk.1.attn_v.weight", offset_delta=4),
        r"tensor 'blk.1.attn_v.weight': its data offset \d+ is not aligned to 32 bytes",
    ),
    "partial block": (
        lambda p: patch_tensor_info(p, "blk.0.attn_q.weight", row_length=48),
        r"tensor 'blk.0.attn_q.weight': its row length 48 is not a multiple of Q4_1's blocks of 32",
    ),
    "overlap": (lambda p: patch_tensor_info(p, "blk.0.attn_q.weight", row_length=128), r"overlap"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_gguf_files(tmp_path, capsys, case):
    path = write_tiny_gguf(tmp_path / "bad.gguf")
    damage, message = BAD_FILES[case]
    damage(path)
    for native in (True, False):
        with pytest.raises(CheckpointError, match=message):
            checkpoint.load(path, native=native)
    assert cli.main(["generate", "--model", path, "--prompt", "a", "--max-new-tokens", "2", "--no-mtp"]) == 2
    assert "bad.gguf" in capsys.readouterr().err


def test_bad_gguf_metadata(tmp_path, capsys):
    path = write_tiny_gguf(tmp_path / "zero.gguf", block_count=0)
    with pytest.raises(CheckpointError, match="'llama.block_count' = 0 must be a positive integer"):
        checkpoint.load(path, native=True)
    assert cli.main(["generate", "--model", path, "--prompt", "a", "--no-mtp"]) == 2
    assert "llama.block_count" in capsys.readouterr().err
    path = write_tiny_gguf(tmp_path / "nofeed.gguf", skip=("feed_forward_length",))
    with pytest.raises(CheckpointError, match="lacks 'llama.feed_forward_length'"):
        checkpoint.load(path)


def test_unsupported_block_type_native(tmp_path):
    """A block type the kernels do not read (Q5_1): native loading names it; dequantized works."""
    name = "model.layers.1.mlp.down_proj.weight"
    path = write_tiny_gguf(tmp_path / "q5.gguf", overrides={name: gguf.GGMLQuantizationType.Q5_1})
    with pytest.raises(checkpoint.NotNativeError, match=r"tensor 'blk.1.ffn_down.weight' is Q5_1 \(GGML type 7\)"):
        checkpoint.load(path, native=True)
    assert checkpoint.load(path)[1][name].dtype == torch.float32


# ---- the default model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def default_native():
    return checkpoint.load(native=True)


def _in_map(t: torch.Tensor, path: str) -> bool:
    storage = t.untyped_storage()
    return (
        storage.nbytes() == os.path.getsize(path)
        and storage.data_ptr() <= t.data_ptr() < storage.data_ptr() + storage.nbytes()
    )


def _huge_page_advice(t: torch.Tensor) -> bool | None:
    """Whether the mapping holding t may be backed by transparent huge pages (smaps'
    THPeligible); None where the system cannot tell (not Linux, THP off)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return None
        smaps = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    at = t.data_ptr()
    for i, line in enumerate(smaps):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= at < hi:
                for entry in smaps[i + 1 :]:
                    if entry.startswith("THPeligible:"):
                        return entry.split()[1] == "1"
    return None


def test_default_native_is_one_arena_and_equals_dequantized(default_native):
    path = checkpoint.default_gguf_path()
    cfg, native, _ = default_native
    quant = {n: w for n, w in native.items() if isinstance(w, QuantTensor)}
    assert len(quant) == 1 + 7 * cfg.num_layers
    assert quant["model.embed_tokens.weight"].gguf_type == 108  # Q8_0, repacked: x8
    assert quant["model.layers.0.mlp.up_proj.weight"].gguf_type == 103  # Q4_1, repacked: x8
    # every matrix in one arena (not the file's map), each fused projection's parts back to back
    arena = quant["model.embed_tokens.weight"].data.untyped_storage()
    assert arena.nbytes() == sum(w.nbytes for w in quant.values())
    for name, w in quant.items():
        assert w.data.untyped_storage().data_ptr() == arena.data_ptr() and not _in_map(w.data, path), name
    for i in (0, cfg.num_layers - 1):
        for parts in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            ends = tuple(f"{p}.weight" for p in parts)
            ws = [quant[n] for n in quant if n.startswith(f"model.layers.{i}.") and n.endswith(ends)]
            ws = sorted(ws, key=lambda w: w.data.data_ptr())
            assert len(ws) == len(parts)
            assert all(b.data.data_ptr() == a.data.data_ptr() + a.nbytes for a, b in zip(ws, ws[1:]))
    assert _huge_page_advice(quant["model.layers.0.mlp.up_proj.weight"].data) in (True, None)
    cfg32, fp32, _ = checkpoint.load()
    assert cfg32 == cfg
    some = ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.", "model.layers.17.", "model.layers.29.")
    for name, w in native.items():
        if not name.startswith(some):  # a few layers: the rest is the same code on the same types (time)
            continue
        assert torch.equal(w.dequantize() if isinstance(w, QuantTensor) else w.float(), fp32[name]), name


@pytest.fixture(scope="module")
def native_backbone(default_native):
    cfg, weights, tok = default_native
    return Backbone(cfg, weights, torch.bfloat16), tok


def test_native_backbone_keeps_the_file_in_place(native_backbone):
    model, _ = native_backbone
    path = checkpoint.default_gguf_path()
    assert model.native
    arena = model.embedding.untyped_storage().data_ptr()  # the loader's (x8_weights), not the map
    for i in (0, model.cfg.num_layers - 1):
        for fused, first in (("gate_up", "mlp.gate_proj"), ("qkv", "self_attn.q_proj")):
            w = model.w(f"model.layers.{i}.{fused}")  # one view over its parts' bytes, no copy
            assert w.dtype == torch.uint8 and w.untyped_storage().data_ptr() == arena
            assert w.data_ptr() == model.w(f"model.layers.{i}.{first}.weight").data_ptr()
    assert not _in_map(model.embedding, path) and model.gguf_type(model.lm_head_name) == 108
    assert model.decoder_weight_types() == [103] * 4 * model.cfg.num_layers  # Q4_1 in its x8 layout
    floats = [b for b in model.buffers() if b.is_floating_point() and b.numel() > 10 * model.cfg.hidden_size]
    assert all(b.numel() <= model.cfg.max_position * model.cfg.head_dim for b in floats)  # rope tables only
    tokens = torch.tensor([[5, 77, 49151]])
    from mtp_kernels.reference import gguf_dequantize, x8_file_rows

    want = x8_file_rows(model.embedding, 108)[tokens[0]]  # the rows in the file's order
    assert torch.equal(model.embed(tokens)[0], gguf_dequantize(want, 8).to(torch.bfloat16))


def test_native_mtp_equals_greedy(native_backbone):
    model, tok = native_backbone
    head = loading.load_head(None, model, lambda m: None)
    # the shipped head drafts with its matrices in Q4_1 x8 (quantized at load; proj + 4 per block)
    assert head.matrix_dtype == "q4_1" and head.draft_weight_types(model.dtype) == [103] * (1 + 4 * head.cfg.num_blocks)
    eos = tuple(model.cfg.eos_token_ids)
    runs = {"Write a haiku about the sea.": ((3, 1, 0), (3, 3, 0)), "What is 12 times 7?": ((2, 1, 6),)}
    for prompt, configs in runs.items():
        ids = tok.encode(tok.apply_chat_template(prompt))
        want = decoding.generate(model, [ids], 16, eos_token_ids=eos)[0].tokens
        for k, branches, lookup in configs:  # a chain, a tree, a chain beside prompt lookup
            got = decoding.generate(
                model, [ids], 16, head=head, k=k, eos_token_ids=eos, branches=branches, lookup=lookup
            )[0]
            assert got.tokens == want, (prompt, k, branches, lookup)
            assert got.passes < len(want)


# Runs `mtp generate` in a fresh interpreter after `import torch, mtp_kernels`, and prints, in MB:
# RSS after the imports, the peak RSS (VmHWM), and how much of torch's own shared libraries
# was faulted in after the imports (their code pages; torch's, not ours).
_PEAK_PROBE = """
import runpy, sys
import torch, mtp_kernels

def rss():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}

def torch_lib_rss():
    total, in_torch_lib = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if not head[0].endswith(":"):  # a mapping's first line: address range ... path
            in_torch_lib = "/torch/lib/" in line
        elif head[0] == "Rss:" and in_torch_lib:
            total += int(head[1]) / 1024
    return total

base, lib0 = rss()["VmRSS"], torch_lib_rss()
sys.argv = ["mtp", "generate", "--prompt", "hi", "--max-new-tokens", "8"]
try:
    runpy.run_module("mtp_kernels.cli", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(base, rss()["VmHWM"], torch_lib_rss() - lib0)
"""


def test_generate_peak_rss_within_the_budget():
    """`mtp generate` on the default model: the file's own weights, mapped, not copied. Budget:
    400 MB with torch's import at ~230 MB, i.e. <= 170 MB of peak RSS beyond `import torch,
    mtp_kernels`, measured in the same process (torch's share varies by ~50 MB with the page
    cache: 218 MB in a long-lived venv, 254-276 MB in a freshly installed one, which fault-around
    maps more of), not counting torch's own library pages faulted in later (10-25 MB, the same
    fault-around effect)."""
    r = subprocess.run([sys.executable, "-c", _PEAK_PROBE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "weights as stored" in r.stderr
    base, peak, torch_pages = map(float, r.stdout.split()[-3:])
    ours = peak - base - torch_pages
    assert ours <= 170, (
        f"peak RSS {peak:.0f} MB: {ours:.0f} MB beyond importing torch ({base:.0f} MB)"
        f" and {torch_pages:.0f} MB of torch's library pages"
    )


def test_tiny_native_backbone_verify_pass_equals_one_token_steps(tmp_path):
    """A native backbone keeps the bits of a row whatever the rows beside it (so speculative
    decoding is its greedy)."""
    cfg, weights, _ = checkpoint.load(write_tiny_gguf(tmp_path / "tiny.gguf"), native=True)
    model = Backbone(cfg, weights, torch.bfloat16)
    assert model.native and set(model.decoder_weight_types()) <= {3, 103}
    assert_verify_pass_equals_steps(model, 2, 9, 5)


def test_mixed_types_fall_back_to_dequantized(tmp_path, capsys):
    """q/k/v (or gate/up) run as one matrix of one type: parts stored in different types cannot
    run natively; `mtp generate` says so and runs the model dequantized."""
    from mtp_kernels.models.llama import MixedTypesError

    path = write_tiny_gguf(
        tmp_path / "mixed.gguf", overrides={"model.layers.0.self_attn.v_proj.weight": gguf.GGMLQuantizationType.Q8_0}
    )
    cfg, weights, _ = checkpoint.load(path, native=True)
    with pytest.raises(MixedTypesError, match=r"model.layers.0.qkv have different types \(Q4_1, Q4_1, Q8_0\)"):
        Backbone(cfg, weights, torch.bfloat16)
    assert cli.main(["generate", "--model", path, "--prompt", "abc", "--max-new-tokens", "3", "--no-mtp"]) == 0
    err = capsys.readouterr().err
    assert "different types" in err and "running it dequantized (bfloat16)" in err and "dequantized, bfloat16" in err

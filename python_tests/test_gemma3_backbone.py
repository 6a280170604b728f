"""Gemma 3 on the kernels (models/gemma3_backbone.py), through `mtp generate`.

Always run: the tiny synthetic gemma3 GGUF of test_gemma3 (7 layers, 6 sliding with a window of
4 and 1 global; Q8_0 / Q5_0 / Q4_K / Q6_K / F16 matrices). The kernels' backbone is held to
gemma3.Gemma3 (the fp32 reference checked against transformers): with the weights dequantized,
within fp32 rounding; with the file's blocks as stored, within the int8 activation rounding of
mtp.linear's GGUF path, and the same greedy tokens. Exactness is bitwise: a pass over T tokens
gives each the bits of T one-token steps, a batch each request's bits alone, and prompt-lookup
decoding the tokens of plain greedy decoding.

With `make gemma` (skipped otherwise): the 270M's greedy tokens on the kernels against the
reference's, and speculative (lookup) decoding equal to plain on it.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from mtp_kernels import cli, decoding
from mtp_kernels.models import gemma3
from mtp_kernels.models.gemma3_backbone import Gemma3Backbone
from test_gemma3 import tiny_gemma3_gguf


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma3k") / "tiny.gguf")


@pytest.fixture(scope="module")
def loaded(tiny_file):
    return gemma3.load(tiny_file, native=True), gemma3.load(tiny_file)


PROMPT = [2, 11, 12, 13, 14, 15, 16, 17, 11, 12, 13, 18]  # 12 tokens: past the window of 4


def run(model, ids, cache=None):
    cache = cache or model.new_cache(1, 64)
    return model.logits(model(torch.tensor([ids]), cache)), cache


def test_native_load_keeps_the_blocks(loaded):
    (cfg, native, _), _ = loaded
    from mtp_kernels.gguf import QuantTensor, type_name

    types = {type_name(w.gguf_type) for w in native.values() if isinstance(w, QuantTensor)}
    assert types == {"Q8_0_X8", "Q8_0", "Q5_0", "Q4_K_X8", "Q6_K_X8"}, types
    assert type_name(native["model.layers.0.self_attn.v_proj.weight"].gguf_type) == "Q8_0_X8"  # repacked in place
    assert type_name(native["model.layers.0.mlp.gate_proj.weight"].gguf_type) == "Q4_K_X8"  # the K-quants too
    assert type_name(native["model.embed_tokens.weight"].gguf_type) == "Q8_0"  # 60 rows: not groups of 8
    assert native["model.layers.0.self_attn.o_proj.weight"].dtype == torch.float16  # F16 as stored


def assert_widened_into_one_arena(cfg, weights):
    """gemma3.load(widen=True): no Q5_0 left, each a Q8_0 x8 matrix that says it was one, every x8
    matrix in one storage (the loader's arena), and the backbone's fused q/k/v and gate/up views
    of it (adjacent parts), not copies."""
    from mtp_kernels.gguf import TYPE_NUMBERS, QuantTensor, type_name

    quant = {n: w for n, w in weights.items() if isinstance(w, QuantTensor)}
    widened = [n for n, w in quant.items() if w.widened_from == TYPE_NUMBERS["Q5_0"]]
    assert widened and all(type_name(quant[n].gguf_type) == "Q8_0_X8" for n in widened)
    assert not any(w.gguf_type == TYPE_NUMBERS["Q5_0"] for w in quant.values())
    x8 = [w for w in quant.values() if w.gguf_type >= 100]
    arena = x8[0].data.untyped_storage().data_ptr()
    assert all(w.data.untyped_storage().data_ptr() == arena for w in x8)
    model = Gemma3Backbone(cfg, weights)
    assert model.widened and model.fused
    for name, (data, _) in model._mats.items():
        if "+" in name:  # a fused matrix: a view of the arena
            assert data.untyped_storage().data_ptr() == arena, name
    return model


def test_widened_at_load_into_the_arena_gives_the_same_bits(tiny_file, loaded):
    """Q5_0 widened to Q8_0 by the loader (into its arena, the backbone's fused matrices views)
    against widened by the backbone (copies): the same logits, bitwise."""
    (cfg, native, _), _ = loaded
    model = assert_widened_into_one_arena(cfg, gemma3.load(tiny_file, native=True, widen=True)[1])
    want = Gemma3Backbone(cfg, native)
    for m in (model, want):
        assert m.fused
    assert torch.equal(run(model, PROMPT)[0], run(want, PROMPT)[0])


def test_dequantized_backbone_matches_the_reference(loaded):
    """Float weights: mtp.linear in fp32 against torch's matmul, every layer kind, the window."""
    _, (cfg, weights, _) = loaded
    want = gemma3.Gemma3(cfg, weights)(torch.tensor([PROMPT]))
    got, _ = run(Gemma3Backbone(cfg, weights, torch.float32), PROMPT)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


def test_native_backbone_is_close_and_greedy_agrees(loaded):
    """The file's blocks as stored: activations are quantized to int8 blocks inside mtp.linear
    (as llama.cpp does), so the logits move by that rounding; the greedy tokens stay."""
    (cfg, native, _), (_, weights, _) = loaded
    ref = gemma3.Gemma3(cfg, weights)
    model = Gemma3Backbone(cfg, native, torch.float32)
    want = ref(torch.tensor([PROMPT]))
    got, _ = run(model, PROMPT)
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.05, float(err)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_equals_one_token_steps_bitwise(loaded, dtype):
    """The verify property: T tokens in one pass give each the hidden state, logits and cache
    entries of T one-token steps (sliding and global layers, the window crossed)."""
    (cfg, native, _), _ = loaded
    model = Gemma3Backbone(cfg, native, dtype)
    _, c1 = run(model, PROMPT)
    _, c2 = run(model, PROMPT)
    new = [20, 21, 22, 23, 24]
    h1 = model(torch.tensor([new]), c1)
    h2 = torch.cat([model(torch.tensor([[t]]), c2) for t in new], dim=1)
    assert torch.equal(h1, h2)
    assert torch.equal(model.logits(h1), model.logits(h2))
    n = len(PROMPT) + len(new)
    assert torch.equal(c1.k[:, :, :, :n], c2.k[:, :, :, :n]) and torch.equal(c1.v[:, :, :, :n], c2.v[:, :, :, :n])


def test_a_batch_gives_each_request_its_own_bits(loaded):
    (cfg, native, _), _ = loaded
    model = Gemma3Backbone(cfg, native, torch.float32)
    short = PROMPT[:7]
    cache = model.new_cache(2, 64)
    model(torch.tensor([PROMPT]), cache.select(0))
    model(torch.tensor([short]), cache.select(1))
    h = model(torch.tensor([[30, 31], [32, 33]]), cache)
    for b, ids in enumerate((PROMPT + [30, 31], short + [32, 33])):
        alone = model(torch.tensor([ids]), model.new_cache(1, 64))
        assert torch.equal(h[b], alone[0, -2:]), b


def test_lookup_decoding_equals_plain_greedy(loaded):
    """Prompt-lookup drafts verified by the backbone: the tokens of plain greedy decoding, and
    drafts were offered (the repeated prompt) so the verify path ran."""
    (cfg, native, _), _ = loaded
    model = Gemma3Backbone(cfg, native, torch.float32)
    prompts = [PROMPT * 3, PROMPT[:5] * 4]
    plain = decoding.generate(model, prompts, 24, lookup=0)
    spec = decoding.generate(model, prompts, 24, lookup=5)
    for p, s in zip(plain, spec):
        assert p.tokens == s.tokens
    assert sum(sum(g.drafted) for g in spec) > 0
    assert sum(g.passes for g in spec) <= sum(g.passes for g in plain)


def fused_against_ops(model, prompts, new):
    """The fused forward (one mtp.decoder_layers call) against forward_ops, bitwise: a prefill of
    ragged prompts, a verify pass of T tokens, one-token steps; the hidden states and caches."""
    assert model.fused
    caches = []
    for forward in (model.forward, model.forward_ops):
        cache = model.new_cache(len(prompts), 64)
        hs = [forward(torch.tensor([ids]), cache.select(b)) for b, ids in enumerate(prompts)]
        hs.append(forward(torch.tensor(new), cache))  # a batch of T tokens each
        hs += [forward(torch.tensor([[t] for t in col]), cache) for col in zip(*new)]
        caches.append((hs, cache))
    (h1, c1), (h2, c2) = caches
    assert all(torch.equal(a, b) for a, b in zip(h1, h2))
    assert torch.equal(c1.k, c2.k) and torch.equal(c1.v, c2.v) and torch.equal(c1.lens, c2.lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("native", [True, False], ids=["as_stored", "dequantized"])
def test_fused_forward_equals_forward_ops_bitwise(loaded, dtype, native):
    """One mtp.decoder_layers(layer="gemma3") call per pass: forward_ops' bits (sliding and
    global layers, past the window of 4, a batch of ragged requests)."""
    (cfg, weights, _), (_, floats, _) = loaded
    model = Gemma3Backbone(cfg, weights if native else floats, dtype)
    fused_against_ops(model, [PROMPT, PROMPT[:7]], [[20, 21, 22], [23, 24, 25]])


def test_mixed_type_layers_run_op_by_op(loaded):
    """A layer whose q/k/v are of several types (widen=False keeps Q5_0 beside Q8_0 in the
    tiny file's layers): forward is forward_ops."""
    (cfg, native, _), _ = loaded
    model = Gemma3Backbone(cfg, native, torch.float32, widen=False)
    assert not model.fused and any(len(a) > 1 for a, _, _ in model.layers)
    with pytest.raises(ValueError, match="not one matrix"):
        model.layer_weights()
    c1, c2 = model.new_cache(1, 32), model.new_cache(1, 32)
    assert torch.equal(model(torch.tensor([PROMPT]), c1), model.forward_ops(torch.tensor([PROMPT]), c2))


def test_bad_use_is_refused(loaded):
    (cfg, native, _), (_, weights, _) = loaded
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.bfloat16"):
        Gemma3Backbone(cfg, native, torch.float16)
    with pytest.raises(ValueError, match="'model.norm.weight' is missing"):
        Gemma3Backbone(cfg, {k: v for k, v in weights.items() if k != "model.norm.weight"})
    model = Gemma3Backbone(cfg, native)
    cache = model.new_cache(1, 16)
    with pytest.raises(ValueError, match="tree drafts run in the one-call pass"):
        Gemma3Backbone(cfg, native, widen=False)(torch.tensor([[1, 2]]), cache, torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="do not fit the cache"):
        model(torch.tensor([list(range(17))]), cache)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model.new_cache(1, cfg.max_position + 1)


def generate_json(capsys, *args):
    rc = cli.main(["generate", "--json", "--max-new-tokens", "12", *args])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_mtp_generate_runs_gemma3(tiny_file, capsys):
    """`mtp generate --model <gemma3 gguf>`: the MTP head and prompt lookup by default (the
    shipped 270M head does not fit the tiny file: an untrained one, labelled), the same tokens
    as --no-mtp, as stored and dequantized."""
    prompt = "the cat the cat the cat"
    for dtype in ([], ["--dtype", "float32"]):
        rc, spec, err = generate_json(capsys, "--model", tiny_file, "--prompt", prompt, *dtype)
        assert rc == 0, err
        assert "MTP, K=2" in err and "prompt lookup of 3 drafts, up to 8" in err and "UNTRAINED" in err
        rc, plain, err = generate_json(capsys, "--model", tiny_file, "--prompt", prompt, "--no-mtp", *dtype)
        assert rc == 0, err
        assert spec[0]["tokens"] == plain[0]["tokens"] and len(plain[0]["tokens"]) > 0
    assert "weights as stored" in err or "dequantized, float32" in err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--int8"], "--int8 re-quantizes a Llama-family backbone"),
        (["--branches", "3", "--no-mtp"], "branches > 1 (tree drafts) needs the MTP head"),
    ],
)
def test_mtp_generate_refuses_what_gemma3_lacks(tiny_file, capsys, args, fragment):
    rc = cli.main(["generate", "--model", tiny_file, "--prompt", "hi", "--max-new-tokens", "2", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1].startswith("mtp: error: ") and fragment in err, err


# ---- Gemma 3 270M (make gemma) -----------------------------------------------------------

needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec(gemma3.PACKAGE) is None,
    reason="Gemma 3 270M is not installed (make gemma)",
)
PROMPTS_270M = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain",
]


@needs_gemma
def test_270m_on_the_kernels():
    """The file's blocks on the kernels: the reference's greedy tokens (16 per prompt; a
    near-tie may flip after the 8th, as against transformers), and lookup decoding equal to
    plain."""
    cfg, native, tok = gemma3.load(native=True)
    model = Gemma3Backbone(cfg, native, torch.float32)
    ref = gemma3.Gemma3(cfg, gemma3.load()[1])
    prompts = [gemma3.prompt_ids(tok, cfg, p) for p in PROMPTS_270M]
    plain = decoding.generate(model, prompts, 16, lookup=0)
    spec = decoding.generate(model, prompts, 16, lookup=6)
    for ids, p, s in zip(prompts, plain, spec):
        assert p.tokens == s.tokens
        want = ref.greedy(ids, 16)
        assert p.tokens[:8] == want[:8], (tok.decode(p.tokens), tok.decode(want))


@needs_gemma
def test_270m_widened_at_load_gives_the_same_bits():
    """The default Gemma 3 load (models.loading: Q5_0 widened into the arena) against the
    backbone widening them itself: the same logits of a prompt and a 4-token step."""
    cfg, native, tok = gemma3.load(native=True, widen=True)
    model = assert_widened_into_one_arena(cfg, native)
    want = Gemma3Backbone(cfg, gemma3.load(native=True)[1])
    ids = gemma3.prompt_ids(tok, cfg, PROMPTS_270M[0])
    (a, ca), (b, cb) = run(model, ids), run(want, ids)
    assert torch.equal(a, b)
    step = torch.tensor([[100, 200, 300, 400]])
    assert torch.equal(model.logits(model(step, ca)), want.logits(want(step, cb)))


@needs_gemma
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_270m_fused_forward_equals_forward_ops_bitwise(dtype):
    cfg, native, tok = gemma3.load(native=True)
    model = Gemma3Backbone(cfg, native, dtype)
    prompts = [gemma3.prompt_ids(tok, cfg, p) for p in PROMPTS_270M[:2]]
    fused_against_ops(model, prompts, [[100, 200, 300, 400], [500, 600, 700, 800]])


def test_mtp_bench_runs_gemma3(tiny_file, tmp_path, capsys):
    """`mtp bench --model <gemma3 gguf>`: our greedy, head and lookup methods (identical outputs),
    the Llama-only methods refused by name."""
    eval_set = tmp_path / "set.jsonl"
    eval_set.write_text(json.dumps({"task": "story", "prompt": "the cat the cat the cat"}) + "\n")
    common = ["bench", "--model", tiny_file, "--eval-set", str(eval_set), "--per-task", "1", "--max-new-tokens", "6"]
    out = str(tmp_path / "e2e")
    rc = cli.main([*common, "--methods", "ours_greedy,ours_mtp,ours_lookup,ours_mtp_lookup_tree", "--out", out])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.load(open(out + ".json"))
    assert res["setup"].startswith("tiny.gguf, Q5_0 (run as Q8_0, the same bits)")
    for m in ("ours_mtp", "ours_lookup", "ours_mtp_lookup_tree"):
        assert res["methods"][m]["story"]["identical_to_greedy"] == 1, m
    rc = cli.main([*common, "--methods", "ours_greedy,ours_greedy_int8", "--out", out])
    err = capsys.readouterr().err
    assert rc == 2 and "ours_greedy_int8 does not run on a Gemma 3 backbone" in err, err


def test_mtp_generate_refuses_a_bad_gemma3_file(tmp_path, capsys):
    """A hostile gemma3 file through the CLI: the loader's one line naming the key, exit 2."""
    bad = tiny_gemma3_gguf(tmp_path / "bad.gguf", meta={"gemma3.attention.sliding_window": 0})
    rc = cli.main(["generate", "--model", bad, "--prompt", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1].startswith("mtp: error: "), err
    assert "'gemma3.attention.sliding_window' = 0" in err and "Traceback" not in err

"""The MTP head on a Gemma 3 backbone: drafting (mtp.head_draft reading a global layer's cache
in place), decoding equal to plain greedy, training (`mtp train --model`), loading and the
errors.

Always run: the tiny synthetic gemma3 GGUF of test_gemma3 (7 layers, 6 sliding with a window
of 4 and one global, layer 5). With `make gemma` (skipped otherwise): the shipped 270M head.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from mtp_kernels import cli, decoding, ops, reference, train
from mtp_kernels.models import gemma3, loading
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.gemma3_backbone import Gemma3Backbone
from mtp_kernels.models.head import HeadConfig, MTPHead
from test_gemma3 import tiny_gemma3_gguf

GLOBAL = 5  # the tiny file's one global layer
PROMPT = [2, 11, 12, 13, 14, 15, 16, 17, 11, 12, 13, 18]  # past the window of 4


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma3h") / "tiny.gguf")


@pytest.fixture(scope="module")
def native(tiny_file):
    return gemma3.load(tiny_file, native=True)


def random_head(cfg, dtype, vocab=None, seed=0, kv_layer=GLOBAL):
    torch.manual_seed(seed)
    head = MTPHead(HeadConfig.for_backbone(cfg, kv_layer=kv_layer, draft_vocab_size=0 if vocab is None else vocab))
    if vocab is not None:
        head.set_draft_vocab(torch.randperm(cfg.vocab_size)[:vocab])
    return head.to(dtype)


@pytest.mark.parametrize(
    "dtype, matrices",
    [
        (torch.float32, None),
        (torch.bfloat16, None),
        (torch.float32, torch.bfloat16),
        (torch.float32, "q8_0"),
        (torch.float32, "q4_1"),
    ],
    ids=["fp32", "bf16", "fp32_bf16_matrices", "fp32_q8_0_matrices", "fp32_q4_1_matrices"],
)
@pytest.mark.parametrize("vocab", [None, 17, 16])
def test_head_draft_on_gemma3_is_the_reference_bitwise(native, dtype, matrices, vocab):
    """mtp.head_draft over the Gemma backbone's own matrices (its Q8_0 x8 embedding and LM head,
    its global layer's cache, the global RoPE tables): reference.head_draft's drafts, batched
    and ragged, with alternatives; also with the head's matrices in bf16, Q8_0 or Q4_1 (what
    load_head runs on Gemma 3) beside fp32 activations and norms."""
    cfg, weights, _ = native
    model = Gemma3Backbone(cfg, weights, dtype)
    head = random_head(cfg, matrices if isinstance(matrices, torch.dtype) else dtype, vocab)
    head.matrix_dtype = matrices
    if matrices is not None:
        ws = head.draft_weights(dtype)
        stored = torch.uint8 if isinstance(matrices, str) else matrices  # Q8_0 / Q4_1 x8 bytes
        assert {w.dtype for w in ws if w.dim() == 2} == {stored} and {w.dtype for w in ws if w.dim() == 1} == {dtype}
    cache = model.new_cache(2, 48)
    h0 = model(torch.tensor([PROMPT]), cache.select(0))[:, -1]
    h1 = model(torch.tensor([PROMPT[:6]]), cache.select(1))[:, -1]
    hidden, token = torch.cat([h0, h1]), torch.tensor([21, 22])
    got = head.draft(model, cache, hidden, token, 3, alternatives=2)
    args = head.draft_args(model, cache, hidden, token, 3)
    want = reference.head_draft(**args, alternatives=2, **head.draft_types(model), ops=ops.KERNELS)
    assert torch.equal(got, want) and got.shape == (2, 5)
    assert model.gguf_type("model.embed_tokens.weight") is not None  # the file's blocks, read in place
    if vocab:  # the draft vocabulary's LM head rows, gathered once: Q8_0 (x8 for whole groups of 8)
        assert args["lm_head"].shape[0] == vocab and head.draft_types(model)["lm_head_type"] == 8 + 100 * (vocab == 16)
        through = dict(args, lm_head=model.w(model.lm_head_name))
        kinds = dict(head.draft_types(model), lm_head_type=model.gguf_type(model.lm_head_name))
        assert torch.equal(torch.ops.mtp.head_draft(**through, alternatives=2, **kinds), got)
    assert torch.equal(cache.lens, torch.tensor([len(PROMPT), 6]))  # drafting leaves the cache as it was


@pytest.mark.parametrize("branches, lookup", [(1, 0), (1, 5), (3, 0), (3, 5)])
def test_mtp_decoding_on_gemma3_equals_plain_greedy(native, branches, lookup):
    """Head drafts (chains or trees, with prompt lookup or not) verified by the Gemma backbone:
    the tokens of plain greedy decoding (a random head: its drafts are offered, and verified)."""
    cfg, weights, _ = native
    model = Gemma3Backbone(cfg, weights, torch.float32)
    assert model.fused
    prompts = [PROMPT * 2, PROMPT[:5]]
    plain = decoding.generate(model, prompts, 20, lookup=0)
    head = random_head(cfg, torch.float32, seed=1)
    # every draft verified (a random head is never sure: the default cut would drop them all)
    spec = decoding.generate(model, prompts, 20, head=head, k=3, branches=branches, lookup=lookup, draft_confidence=0)
    for p, s in zip(plain, spec):
        assert p.tokens == s.tokens
    assert sum(sum(g.drafted) for g in spec) > 0


def test_a_head_reading_a_sliding_layer_is_refused(native, tmp_path):
    cfg, _, _ = native
    head = random_head(cfg, torch.float32, kv_layer=0)
    with pytest.raises(ValueError, match="layer 0, a sliding-window layer of the backbone: it must read a global one"):
        head.check_fits(cfg)
    head.save(str(tmp_path / "h"))
    with pytest.raises(CheckpointError, match="sliding-window layer"):
        MTPHead.load(str(tmp_path / "h"), backbone_cfg=cfg)


def test_train_a_gemma3_head_then_draft_with_it(tiny_file, tmp_path):
    """train.run on a Gemma 3 file: distilled by the Gemma backbone (its answers cached under
    their own key), trained, saved; the head loads for that backbone (load_head --head),
    drafts, and decoding with it equals plain greedy. A sliding --kv-layer is refused first."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "ab cd ef " * (1 + i % 3) + str(i)}) + "\n" for i in range(10)))
    tc = train.TrainConfig(steps=2, batch=4, max_steps=30, minutes=5, lr=3e-3)
    common = dict(draft_vocab_size=40, max_new_tokens=8, model=tiny_file, log=lambda m: None)
    sliding = r"--kv-layer -1 reads layer 6, a sliding-window layer of the backbone: it must read a global one \(\[5"
    with pytest.raises(ValueError, match=sliding):
        train.run(str(prompts), str(tmp_path / "head"), str(tmp_path / "work"), tc, kv_layer=-1, **common)
    result = train.run(str(prompts), str(tmp_path / "head"), str(tmp_path / "work"), tc, kv_layer=GLOBAL, **common)
    assert result["distilled_by"] == "stored:gemma3" and result["steps"] == 30
    assert result["last_loss"] < result["first_loss"]
    cached = [json.loads(line) for line in (tmp_path / "work" / "distilled.jsonl").read_text().splitlines()]
    assert len(cached) == 10 and all(c["prompt_ids"][0] == 2 for c in cached)  # <bos> first: no chat template
    cfg, model, tok, _ = loading.load_backbone(tiny_file, None, print)
    head = loading.load_head(str(tmp_path / "head"), model, print)
    assert head.cfg.trained and head.cfg.kv_layer == GLOBAL and head.draft_vocab.numel() == 40
    ids = [c["prompt_ids"] for c in cached[:3]]
    plain = decoding.generate(model, ids, 8, lookup=0)
    spec = decoding.generate(model, ids, 8, head=head, k=3, lookup=0)
    assert [p.tokens for p in plain] == [s.tokens for s in spec]


def test_load_head_for_gemma3(tiny_file, capsys):
    """Without --head, `mtp generate` / `mtp bench` on a Gemma 3 file draft with the shipped
    270M head where it fits: it does not fit the tiny model (a note), so an untrained head
    reading the last global layer; as the default model (default_model) the shipped head must
    load; a SmolLM2 head given as --head is refused by shape."""
    _, model, _, _ = loading.load_backbone(tiny_file, None, print)
    notes = []
    head = loading.load_head(None, model, notes.append, default_model=False)
    assert any("the shipped gemma3-270m head does not fit this model" in n for n in notes)
    assert not head.cfg.trained and head.cfg.kv_layer == GLOBAL
    assert head.matrix_dtype == "q4_1" and model.dtype == torch.float32  # Q4_1 matrices, fp32 norms
    assert any("UNTRAINED" in n for n in notes)
    smollm2 = loading.os.path.join(loading.SHIPPED_HEADS, "smollm2-135m")
    with pytest.raises(CheckpointError, match="does not fit the backbone"):
        loading.load_head(smollm2, model, print)
    with pytest.raises(CheckpointError, match="does not fit the backbone"):
        loading.load_head(None, model, print, default_model=True)


def generate_json(capsys, *args):
    rc = cli.main(["generate", "--json", "--max-new-tokens", "12", *args])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_mtp_generate_with_a_head_on_gemma3(tiny_file, native, tmp_path, capsys):
    """`mtp generate --model <gemma3 gguf> --head DIR` drafts with the head and prompt lookup:
    the tokens of --no-mtp; --branches 3 verifies trees, the same tokens; a missing --head is
    one line."""
    random_head(native[0], torch.float32).save(str(tmp_path / "head"))
    prompt = "the cat the cat the cat"
    rc, plain, err = generate_json(capsys, "--model", tiny_file, "--prompt", prompt, "--no-mtp")
    assert rc == 0, err
    for extra in ([], ["--branches", "3"], ["--lookup", "0"]):
        rc, spec, err = generate_json(
            capsys, "--model", tiny_file, "--prompt", prompt, "--head", str(tmp_path / "head"), *extra
        )
        assert rc == 0, err
        assert "UNTRAINED MTP head" in err
        assert spec[0]["tokens"] == plain[0]["tokens"] and len(plain[0]["tokens"]) > 0
    rc = cli.main(["generate", "--model", tiny_file, "--prompt", "hi", "--head", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1].startswith("mtp: error: ") and "not an MTP head checkpoint" in err


def test_standalone_drafters_draft_their_own_family(tiny_file, tmp_path, capsys):
    """A drafter records the family whose token ids it drafts: SmolLM2's shipped one is refused
    on a Gemma 3 backbone (exit 2, one line); a drafter made for gemma3 drafts, and decoding with
    it equals plain greedy; a config.json with an unknown family is refused."""
    from mtp_kernels.models.drafter import StandaloneDrafter

    smollm2 = loading.os.path.join(loading.SHIPPED_HEADS, "smollm2-135m-drafter")
    args = ["generate", "--model", tiny_file, "--prompt", "hi", "--max-new-tokens", "2", "--drafter", "standalone"]
    rc = cli.main([*args, "--drafter-path", smollm2])
    err = capsys.readouterr().err
    assert rc == 2 and "drafts llama token ids: it cannot draft for a gemma3 backbone" in err, err
    drafter = StandaloneDrafter.create(torch.arange(4, 40), 64, seed=0)
    drafter.family = "gemma3"
    drafter.save(str(tmp_path / "d"))
    _, model, _, _ = loading.load_backbone(tiny_file, None, print)
    loaded = loading.load_drafter(str(tmp_path / "d"), model, print)
    plain = decoding.generate(model, [PROMPT], 12, lookup=0)
    spec = decoding.generate(model, [PROMPT], 12, head=loaded, k=3)
    assert plain[0].tokens == spec[0].tokens
    config = tmp_path / "d" / "config.json"
    config.write_text(config.read_text().replace('"gemma3"', '"mistral"'))
    with pytest.raises(CheckpointError, match='"family" must be one of'):
        loading.load_drafter(str(tmp_path / "d"), model, print)


def test_mtp_train_with_model_needs_out(tiny_file, capsys):
    rc = cli.main(["train", "--model", tiny_file])
    err = capsys.readouterr().err
    assert rc == 2 and "say where the head or drafter goes with --out" in err


# ---- Gemma 3 270M (make gemma) -----------------------------------------------------------

needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec(gemma3.PACKAGE) is None,
    reason="Gemma 3 270M is not installed (make gemma)",
)


@needs_gemma
def test_shipped_270m_head_drafts_tokens_greedy_keeps():
    """The shipped head on the 270M (what `mtp bench` loads): trained, reading layer 17 (global);
    MTP decoding equals plain greedy, and its drafts are accepted (tau 1.19 here with the head
    alone, K = 3; an untrained head's drafts are almost never accepted: ~1.0)."""
    cfg, model, tok, _ = loading.load_backbone(gemma3.default_gguf_path(), None, print)
    head = loading.load_head(None, model, print, default_model=True)
    assert head.cfg.trained and head.cfg.kv_layer % cfg.num_layers == 17
    prompts = [
        gemma3.prompt_ids(tok, cfg, p)
        for p in (
            "The best way to learn a new language is to",
            "Dear team,\n\nThank you all for the hard work this quarter. As we",
        )
    ]
    plain = decoding.generate(model, prompts, 32, lookup=0)
    spec = decoding.generate(model, prompts, 32, head=head, k=3, lookup=0)
    assert [p.tokens for p in plain] == [s.tokens for s in spec]
    assert sum(len(s.tokens) - 1 for s in spec) / sum(s.passes for s in spec) > 1.1

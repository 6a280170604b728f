"""The real backbone, SmolLM2-135M-Instruct from the shipped GGUF (a few seconds to load).

- Our loader + decoder agree with transformers' LlamaForCausalLM loaded from the same GGUF.
- Its verify pass is bitwise K+1 one-token steps (fp32 and bf16).
- MTP generation with the head gives exactly plain greedy's tokens.
"""

import os

import pytest
import torch

from mtp_kernels import decoding
from mtp_kernels.models.loading import load_head
from mtp_kernels.models import checkpoint
from mtp_kernels.models.llama import Backbone

PROMPTS = [
    "Summarize in one sentence: the team meeting moved from Tuesday to Thursday at 3pm because the room was booked.",
    "Fix the grammar: she don't like apples and they was late.",
    "Write a short reply: Are you coming to dinner tonight?",
]


@pytest.fixture(scope="module")
def smollm2():
    return checkpoint.load()


@pytest.fixture(scope="module")
def fp32_model(smollm2):
    cfg, weights, _ = smollm2
    return Backbone(cfg, weights, torch.float32)


def prompt_ids(tok):
    return [tok.encode(tok.apply_chat_template(p)) for p in PROMPTS]


def test_matches_transformers_from_the_same_gguf(smollm2, fp32_model, capsys):
    transformers = pytest.importorskip("transformers")
    cfg, _, tok = smollm2
    path = checkpoint.default_gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ref = transformers.LlamaForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32
    ).eval()
    max_new = 24
    agree = total = 0
    for ids in prompt_ids(tok):
        x = torch.tensor([ids])
        with torch.no_grad():
            ref_logits = ref(x).logits[0]
        cache = fp32_model.new_cache(1, len(ids) + 1)
        ours = fp32_model.logits(fp32_model(x, cache))[0]
        # Same weights, same math up to fp32 rounding order.
        torch.testing.assert_close(ours, ref_logits, rtol=0, atol=2e-3)
        want = ref.generate(
            x,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=cfg.eos_token_ids[0],
            pad_token_id=cfg.eos_token_ids[0],
        )[0, len(ids) :].tolist()
        got = decoding.generate(fp32_model, [ids], max_new, eos_token_ids=cfg.eos_token_ids)[0].tokens
        n = min(len(want), len(got))
        same = sum(a == b for a, b in zip(want[:n], got[:n]))
        agree, total = agree + same, total + n
        # Up to the first difference the sequences are equal; a difference can only come
        # from a near-tie flipped by fp32 rounding order, after which continuations differ.
        first = next((i for i in range(n) if want[i] != got[i]), n)
        assert first >= 8, (want, got)
    with capsys.disabled():
        print(f"\n[transformers agreement: {agree}/{total} greedy tokens]")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_pass_is_bitwise_one_token_steps(smollm2, dtype):
    cfg, weights, tok = smollm2
    model = Backbone(cfg, weights, dtype)
    ids = prompt_ids(tok)[0]
    block = torch.tensor([[tok.encode(" the")[0], 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]])
    one = model.new_cache(1, 128)
    model(torch.tensor([ids]), one)
    steps = torch.cat([model.logits(model(block[:, t : t + 1], one)) for t in range(block.shape[1])], dim=1)
    for T in (2, 5, 9):  # verify passes of K = 1, 4, 8 drafts
        many = model.new_cache(1, 128)
        model(torch.tensor([ids]), many)
        assert torch.equal(model.logits(model(block[:, :T], many)), steps[:, :T]), T


def test_mtp_generation_equals_greedy(smollm2, fp32_model):
    cfg, _, tok = smollm2
    head = load_head(None, fp32_model, log=lambda msg: None)
    ids = prompt_ids(tok)
    want = [g.tokens for g in decoding.generate(fp32_model, ids, 20, eos_token_ids=cfg.eos_token_ids)]
    for k in (2, 4):
        got = decoding.generate(fp32_model, ids, 20, head=head, k=k, eos_token_ids=cfg.eos_token_ids)
        assert [g.tokens for g in got] == want


def test_mtp_command_on_the_default_model():
    import json
    import subprocess
    import sys

    runs = []
    for flag in ([], ["--no-mtp"]):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "mtp_kernels.cli",
                "generate",
                "--prompt",
                PROMPTS[1],
                "--max-new-tokens",
                "12",
                "--json",
                *flag,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    assert runs[0]["tokens"] == runs[1]["tokens"] and runs[0]["text"]

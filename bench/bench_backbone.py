"""One backbone pass of the default model (SmolLM2-135M-Instruct, bf16) at a cache of CACHE
positions, LM head (logits of every position) included: a decode step (T=1) and the verify
passes of K=4 and K=8 drafts (T=5, T=9). Ours (`Backbone`: static cache, mtp.linear,
mtp.head_attention; also with Q8 int8 weights, and with int8 activations too: integer dot
products) against transformers' LlamaForCausalLM on the
same GGUF with its DynamicCache. Each round starts from the same CACHE positions (ours: the cache length is
set back; transformers: the cache is cropped back), so every round does the same work.

    python -m pytest bench/bench_backbone.py --benchmark-only -q --benchmark-json=backbone.json
    python bench/report.py backbone.json    # ms per pass and the ratio verify / step
"""

import pytest
import torch

CACHE = 200
ROUNDS = 30


@pytest.fixture(scope="module")
def prompt():
    """CACHE + 9 token ids (seeded, within the vocabulary): the cached prefix and the new tokens."""
    return torch.randint(0, 49152, (1, CACHE + 9), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def gguf_path():
    from mtp_kernels.models import checkpoint

    try:
        return checkpoint.default_gguf_path()
    except checkpoint.CheckpointError as e:
        pytest.skip(str(e))


def our_backbone(gguf_path, prompt, quantize, int8_dot=False):
    from mtp_kernels.models import checkpoint
    from mtp_kernels.models.llama import Backbone

    cfg, weights, _ = checkpoint.load(gguf_path)
    model = Backbone(cfg, weights, torch.bfloat16, quantize=quantize, int8_dot=int8_dot)
    cache = model.new_cache(1, CACHE + 16)
    model(prompt[:, :CACHE], cache)
    return model, cache


@pytest.fixture(scope="module")
def ours(gguf_path, prompt):
    return our_backbone(gguf_path, prompt, quantize=False)


@pytest.fixture(scope="module")
def ours_int8(gguf_path, prompt):
    """The same backbone with Q8 weights (int8 + one fp32 scale per 32), bf16 activations."""
    return our_backbone(gguf_path, prompt, quantize=True)


@pytest.fixture(scope="module")
def ours_int8dot(gguf_path, prompt):
    """Q8 weights and the activations entering them quantized per row (quantize_x)."""
    return our_backbone(gguf_path, prompt, quantize=True, int8_dot=True)


def their_backbone(gguf_path, prompt):
    from transformers import DynamicCache

    from mtp_kernels.evaluate import hf_backbone

    model = hf_backbone(gguf_path).to(torch.bfloat16)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt[:, :CACHE], cache=cache, use_cache=True)
    return model, cache


@pytest.fixture(scope="module")
def theirs(gguf_path, prompt):
    pytest.importorskip("transformers")
    return their_backbone(gguf_path, prompt)


def pass_of(impl, model, cache, tokens):
    """(reset, run): set the cache back to CACHE positions; one pass over `tokens` with logits."""
    if impl.startswith("ours"):

        def reset():
            cache.lens.fill_(CACHE)

        def run():
            return model.logits(model(tokens, cache))
    else:

        def reset():
            cache.crop(-(cache.get_seq_length() - CACHE))  # a negative count: the tokens to drop

        @torch.no_grad()
        def run():
            return model(input_ids=tokens, cache=cache, use_cache=True).logits

    return reset, run


@pytest.mark.parametrize("impl", ["ours", "ours_int8", "ours_int8dot", "transformers"])
@pytest.mark.parametrize("T", [1, 5, 9])
def test_backbone_pass(benchmark, request, prompt, impl, T):
    model, cache = request.getfixturevalue(impl if impl.startswith("ours") else "theirs")
    reset, run = pass_of(impl, model, cache, prompt[:, CACHE : CACHE + T])
    benchmark.group = f"backbone T={T} cache={CACHE} bfloat16"
    benchmark.extra_info.update({"backbone_tokens": T, "cache": CACHE, "model": "SmolLM2-135M-Instruct bf16"})
    reset()
    logits = benchmark.pedantic(run, setup=reset, rounds=ROUNDS, warmup_rounds=2)
    assert logits.shape == (1, T, 49152)

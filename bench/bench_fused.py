"""One call per pass against the same kernels called one op at a time (reference.decoder_layers
and reference.head_draft with ops=mtp_kernels.ops.KERNELS, which give the same bits): a
SmolLM2-135M backbone pass (bf16, and Q8 weights with int8 activations) of T = 1 and 3 tokens
at a cache of CACHE positions, and the shipped MTP head's draft of K = 1 and 2 tokens. And
what a tree costs: the generate loop's tree pass (t0, the head's chain of 3, two leaves: 6
rows) against chain passes of 3 rows (K = 2) and 6 rows (also in fp32 and with Q8 weights
alone), and the head's draft of 3 with and without its 2 alternative first drafts.

    python -m pytest bench/bench_fused.py --benchmark-only -q --benchmark-json=fused.json
    python bench/report.py fused.json    # ms per call, op by op / one call
"""

import pytest
import torch

from mtp_kernels import ops, reference

CACHE = 200
ROUNDS = 30


@pytest.fixture(scope="module")
def loaded():
    from mtp_kernels.models import checkpoint

    try:
        return checkpoint.load(checkpoint.default_gguf_path())
    except checkpoint.CheckpointError as e:
        pytest.skip(str(e))


# bf16 and int8dot for every case; the tree cases also in fp32 and with Q8 weights alone.
MODES = {
    "bf16": (torch.bfloat16, False, False),
    "int8dot": (torch.bfloat16, True, True),
    "fp32": (torch.float32, False, False),
    "q8": (torch.bfloat16, True, False),
}


def _backbone(mode, loaded):
    """(mode, model, cache holding CACHE positions, the next tokens, the last hidden state)."""
    from mtp_kernels.models.llama import Backbone

    cfg, weights, _ = loaded
    dtype, quantize, int8_dot = MODES[mode]
    model = Backbone(cfg, weights, dtype, quantize=quantize, int8_dot=int8_dot)
    prompt = torch.randint(0, cfg.vocab_size, (1, CACHE + 6), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(1, CACHE + 16)
    hidden = model(prompt[:, :CACHE], cache)[:, -1]
    return mode, model, cache, prompt[:, CACHE:], hidden


@pytest.fixture(scope="module", params=["bf16", "int8dot"])
def backbone(request, loaded):
    return _backbone(request.param, loaded)


@pytest.fixture(scope="module", params=list(MODES))
def any_backbone(request, loaded):
    return _backbone(request.param, loaded)


@pytest.mark.parametrize("impl", ["one_call", "op_by_op"])
@pytest.mark.parametrize("T", [1, 3])
def test_decoder_pass(benchmark, backbone, impl, T):
    mode, model, cache, tokens, _ = backbone
    x = model.embed(tokens[:, :T])
    weights, scales = model.decoder_weights()
    args = (
        x,
        cache.k,
        cache.v,
        cache.lens,
        model.rope_cos,
        model.rope_sin,
        weights,
        scales,
        model.cfg.num_heads,
        model.cfg.rms_norm_eps,
    )
    if impl == "one_call":

        def run():
            return torch.ops.mtp.decoder_layers(*args, quantize_x=model.int8_dot)
    else:

        def run():
            return reference.decoder_layers(*args, quantize_x=model.int8_dot, ops=ops.KERNELS)

    benchmark.group = f"decoder pass T={T} cache={CACHE} {mode}"
    benchmark.extra_info.update({"fused": "decoder_layers", "tokens": T})

    def reset():  # every round appends at the same positions
        cache.lens.fill_(CACHE)

    h = benchmark.pedantic(run, setup=reset, rounds=ROUNDS, warmup_rounds=2)
    cache.lens.fill_(CACHE)
    assert torch.equal(h, torch.ops.mtp.decoder_layers(*args, quantize_x=model.int8_dot))


@pytest.mark.parametrize("impl", ["one_call", "op_by_op"])
@pytest.mark.parametrize("k", [1, 2])
def test_head_draft(benchmark, backbone, impl, k):
    from mtp_kernels.models.loading import load_head

    mode, model, cache, tokens, hidden = backbone
    head = load_head(None, model, log=lambda m: None)
    args = head.draft_args(model, cache, hidden, tokens[:, 0], k)
    if impl == "one_call":

        def run():
            return torch.ops.mtp.head_draft(**args)
    else:

        def run():
            return reference.head_draft(**args, ops=ops.KERNELS)

    benchmark.group = f"head draft k={k} cache={CACHE} {mode}"
    benchmark.extra_info.update({"fused": "head_draft", "tokens": k})
    drafts = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=2)
    assert torch.equal(drafts, torch.ops.mtp.head_draft(**args))


@pytest.mark.parametrize("impl", ["chain3", "chain6", "tree6"])
def test_tree_pass(benchmark, any_backbone, impl):
    mode, model, cache, tokens, _ = any_backbone
    T = int(impl[-1])
    parents = torch.tensor([[-1, 0, 1, 2, 0, 0]]) if impl == "tree6" else None

    def run():
        return model(tokens[:, :T], cache, parents)

    def reset():
        cache.lens.fill_(CACHE)

    benchmark.group = f"tree pass cache={CACHE} {mode}"
    benchmark.extra_info.update({"tree": "decoder_layers", "tokens": T})
    h = benchmark.pedantic(run, setup=reset, rounds=ROUNDS, warmup_rounds=2)
    assert h.shape[1] == T


@pytest.mark.parametrize("impl", ["chain", "tree"])
def test_head_draft_alternatives(benchmark, backbone, impl):
    from mtp_kernels.models.loading import load_head

    mode, model, cache, tokens, hidden = backbone
    head = load_head(None, model, log=lambda m: None)
    alternatives = 2 if impl == "tree" else 0

    def run():
        return head.draft(model, cache, hidden, tokens[:, 0], 3, alternatives)

    benchmark.group = f"head draft k=3 (+2 alternatives) cache={CACHE} {mode}"
    benchmark.extra_info.update({"tree": "head_draft", "tokens": 3 + alternatives})
    drafts = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=2)
    assert drafts.shape == (1, 3 + alternatives)

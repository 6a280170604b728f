"""mtp.embedding against its torch composition (reference.embedding, which gives the same
bits) on the default backbone's embedding table as `mtp generate` holds it (SmolLM2-135M's
Q8_0 rows in the x8 layout, 49152 x 576, rounded to bf16): the rows of a decode pass (1, 3 and 9
tokens) and of a 256-token prefill. Before the op, Backbone.embed gathered those rows in Python.

    python -m pytest bench/bench_embedding.py --benchmark-only -q --benchmark-columns=median,rounds
"""

import pytest
import torch

from mtp_kernels import reference

NAME = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def table():
    from mtp_kernels.models import checkpoint
    from mtp_kernels.models.loading import load_backbone

    try:
        _, model, _, _ = load_backbone(None, None, lambda s: None)
    except checkpoint.CheckpointError as e:
        pytest.skip(str(e))
    return model.w(NAME), model.gguf_type(NAME), model.dtype


@pytest.mark.parametrize("impl", ["composition", "op"])
@pytest.mark.parametrize("T", [1, 3, 9, 256])
def test_embedding_rows(benchmark, table, impl, T):
    torch.set_num_threads(2)
    w, code, dtype = table
    tokens = torch.randint(0, w.shape[0], (1, T), generator=torch.Generator().manual_seed(T))
    fn = torch.ops.mtp.embedding if impl == "op" else reference.embedding
    out = benchmark(fn, tokens, w, gguf_type=code, dtype=dtype)
    assert torch.equal(out, reference.embedding(tokens, w, gguf_type=code, dtype=dtype))

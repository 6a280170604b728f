"""mtp.embedding (csrc/include/mtp/embedding.h): rows of an embedding table gathered and
dequantized in one call. Bitwise reference.embedding for float, Q8 and every GGUF block type
in the file's and the x8 layout, for any token shape and stride; the x8 layout's rows equal
the file layout's; reference.embedding's GGUF rows are the `gguf` package's dequantizer; the
Backbone's embed is the op; opcheck and torch.compile; bad input raises clear errors (the
CUDA fallback's checks say the same)."""

import re

import gguf as gguf_pkg
import numpy as np
import pytest
import torch
from test_gguf import random_rows

import mtp_kernels
from mtp_kernels import fallback, reference
from mtp_kernels.gguf import BLOCK_TYPES, X8_TYPES, repack_x8

V = 40  # a multiple of 8: an x8 layout of the table exists


def token_cases(gen):
    """Token ids of several shapes, dtypes and strides, edges (0, V - 1) included."""
    ids = torch.randint(0, V, (6, 4), generator=gen)
    ids[0, 0], ids[1, 1] = 0, V - 1
    return [ids, ids.int(), ids[:, 1], ids.t(), ids[::2, ::3], ids[0, 0], ids[:0], torch.tensor([V - 1] * 3)]


def same(a, b):
    """a and b bitwise (signed zeros, infinities), NaN where the other has NaN (its payload
    is the rounding's: torch gives bf16 NaN 0xFFFF, the kernels 0x7FC0)."""
    nan = a.isnan()
    bits = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.dtype == b.dtype and torch.equal(nan, b.isnan()) and torch.equal(a.view(bits)[~nan], b.view(bits)[~nan])


def check_rows(tokens, weight, scale=None, gguf_type=None, dtype=None):
    got = torch.ops.mtp.embedding(tokens, weight, scale, gguf_type=gguf_type, dtype=dtype)
    want = reference.embedding(tokens, weight, scale, gguf_type=gguf_type, dtype=dtype)
    assert got.shape == (*tokens.shape, want.shape[-1]) and got.dtype == want.dtype
    assert same(got, want) and got.is_contiguous()
    return got


@pytest.mark.parametrize("table", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bfloat16])
def test_float_and_q8_rows_equal_the_reference(gen, table, dtype):
    w = torch.randn(V, 72, generator=gen).to(table)
    w[3, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    for tokens in token_cases(gen):
        got = check_rows(tokens, w, dtype=dtype)
        assert same(got, w[tokens].to(dtype or table))  # a gather and one rounding
        check_rows(tokens, w[:, 5:69], dtype=dtype)  # rows 72 elements apart
        q, s = mtp_kernels.quantize_q8(w[4:, :70].float().repeat(2, 1)[:V])  # finite; 70: a partial last block
        got = check_rows(tokens, q, s, dtype=dtype)
        assert got.dtype == (dtype or torch.float32)
        assert same(got, mtp_kernels.dequantize_q8(q, s)[tokens].to(got.dtype))


@pytest.mark.parametrize("code", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_gguf_rows_equal_the_reference_in_both_layouts(gen, code, dtype):
    H = 2 * BLOCK_TYPES[code][1]
    data = random_rows(gen, code, V, H)
    # reference.embedding's rows are the gguf package's dequantizer, rounded once
    want_all = torch.from_numpy(
        np.asarray(gguf_pkg.quants.dequantize(data.numpy(), gguf_pkg.GGMLQuantizationType(code)), dtype=np.float32)
    ).to(dtype or torch.float32)
    x8 = repack_x8(data, code) if code + 100 in X8_TYPES else None  # Q5_0 has none (widened to Q8_0)
    for tokens in token_cases(gen):
        got = check_rows(tokens, data, gguf_type=code, dtype=dtype)
        assert torch.equal(got, want_all[tokens])
        if x8 is not None:
            assert torch.equal(check_rows(tokens, x8, gguf_type=code + 100, dtype=dtype), got)
    wide = torch.zeros(V, data.shape[1] + 6, dtype=torch.uint8)
    wide[:, : data.shape[1]] = data  # rows further apart than their bytes
    assert torch.equal(check_rows(tokens, wide[:, : data.shape[1]], gguf_type=code, dtype=dtype), want_all[tokens])


@pytest.mark.parametrize("dtype,quantize", [(torch.float32, False), (torch.bfloat16, True)])
def test_the_backbones_embed_is_the_op(gen, dtype, quantize):
    from tiny_model import tiny_backbone

    model = tiny_backbone(dtype, quantize=quantize)
    name = "model.embed_tokens.weight"
    w, s, code = model.w(name), model.scale(name), model.gguf_type(name)
    assert (s is not None) == quantize
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=gen)
    assert torch.equal(model.embed(tokens), reference.embedding(tokens, w, s, gguf_type=code, dtype=dtype))


def test_opcheck_and_compile(gen):
    w = torch.randn(V, 64, generator=gen)
    q, s = mtp_kernels.quantize_q8(w)
    data = random_rows(gen, 8, V, 64)
    tokens = torch.randint(0, V, (3, 2), generator=gen)
    for args, kwargs in [
        ((tokens, w), {}),
        ((tokens.int(), w.bfloat16(), None), {"dtype": torch.float32}),
        ((tokens, q, s), {"dtype": torch.bfloat16}),
        ((tokens, data), {"gguf_type": 8}),
        ((tokens, repack_x8(data, 8)), {"gguf_type": 108, "dtype": torch.bfloat16}),
        ((tokens[:0], w), {}),
    ]:
        torch.library.opcheck(torch.ops.mtp.embedding.default, args, kwargs)

    def first_layer_input(tokens):
        return mtp_kernels.embedding(tokens, q, s, dtype=torch.bfloat16) * 2

    assert torch.equal(torch.compile(first_layer_input, fullgraph=True)(tokens), first_layer_input(tokens))


def _w():
    return torch.randn(V, 64)


BAD = [
    (
        lambda: (torch.tensor([0, V]), _w()),
        {},
        f"tokens must hold token ids in [0, V (weight.size(0))) = [0, {V}), got tokens[1] = {V}",
    ),
    (lambda: (torch.tensor([[1], [-1]]), _w()), {}, "got tokens[1] = -1"),
    (lambda: (torch.tensor([1.0]), _w()), {}, "tokens must be Int or Long, got Float"),
    (lambda: (torch.tensor([1]), torch.randn(64)), {}, "weight must be 2-D [V, H], got shape [64]"),
    (lambda: (torch.tensor([1]), _w().double()), {}, "weight must be Float or BFloat16 or Char, got Double"),
    (lambda: (torch.tensor([1]), _w().to(torch.int8)), {}, "int8 (Q8) weights need their scales"),
    (lambda: (torch.tensor([1]), _w(), torch.ones(V, 2)), {}, "scales go with int8 (Q8) weights only"),
    (lambda: (torch.tensor([1]), _w()), {"dtype": torch.float16}, "dtype must be torch.float32 or torch.bfloat16"),
]
GGUF_BAD = [
    (
        lambda: (torch.tensor([1]), torch.zeros(V, 35, dtype=torch.uint8)),
        {"gguf_type": 8},
        "weight: rows of 35 bytes are not whole Q8_0 blocks (34 bytes per 32 elements)",
    ),
    (
        lambda: (torch.tensor([1]), torch.zeros(V, 33, dtype=torch.uint8)),
        {"gguf_type": 103},
        "weight: rows of 33 bytes are not whole Q4_1_X8 blocks (20 bytes per 32 elements)",
    ),
    (
        lambda: (torch.tensor([1]), torch.zeros(V, 40, dtype=torch.uint8)[:, ::2]),
        {"gguf_type": 3},
        "weight: weight bytes must be contiguous along a row (stride 1), got strides [40, 2]",
    ),
    (lambda: (torch.tensor([1]), torch.zeros(V, 34)), {"gguf_type": 8}, "must be its uint8 bytes"),
    (
        lambda: (torch.tensor([1]), torch.zeros(V, 34, dtype=torch.uint8)),
        {"gguf_type": 7},
        "GGML type 7 is not supported: expected 2 (Q4_0), 3 (Q4_1)",
    ),
    (lambda: (torch.tensor([V]), torch.zeros(V, 34, dtype=torch.uint8)), {"gguf_type": 8}, f"got tokens[0] = {V}"),
    (
        lambda: (torch.tensor([1]), torch.zeros(V, 34, dtype=torch.uint8), torch.ones(V, 1)),
        {"gguf_type": 8},
        "weight_scale is not empty",
    ),
]


@pytest.mark.parametrize("args,kwargs,message", BAD + GGUF_BAD, ids=[str(i) for i in range(len(BAD + GGUF_BAD))])
def test_bad_input_raises_a_clear_error(args, kwargs, message):
    with pytest.raises(RuntimeError, match="mtp.embedding: .*" + re.escape(message)):
        torch.ops.mtp.embedding(*args(), **kwargs)


@pytest.mark.parametrize("args,kwargs,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_the_cuda_fallback_checks_say_the_same(args, kwargs, message):
    with pytest.raises(RuntimeError, match="mtp.embedding: .*" + re.escape(message)):
        fallback.embedding(*args(), **kwargs)


def test_the_cuda_fallback_gives_the_same_rows(gen):
    w = torch.randn(V, 64, generator=gen)
    q, s = mtp_kernels.quantize_q8(w)
    tokens = torch.randint(0, V, (3, 2), generator=gen)
    for args, dtype in [((tokens, w), None), ((tokens.int(), q, s), torch.bfloat16)]:
        assert torch.equal(fallback.embedding(*args, dtype=dtype), torch.ops.mtp.embedding(*args, dtype=dtype))
    with pytest.raises(RuntimeError, match="mtp.embedding: GGUF block-type weights"):
        fallback.embedding(tokens, random_rows(gen, 8, V, 64), gguf_type=8)

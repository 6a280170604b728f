"""The x8 layouts of GGUF weights (csrc/include/mtp/gguf.h, mtp_kernels.gguf.repack_x8): the
same bytes with 8 rows interleaved. Every op gives bitwise the file layout's results (one
canonical order per output element) and reference.gguf_linear's; the layout itself is checked
against the reference's byte-by-byte definition; bad shapes raise clear errors."""

import pytest
import torch
from test_gguf import decoder_case, random_rows

from mtp_kernels import ops, reference
from mtp_kernels.gguf import BLOCK_TYPES, X8_TYPES, QuantTensor, can_x8, file_rows, repack_x8, unpack_x8

FILE_TYPES = [2, 3, 8, 12, 14]  # Q4_0, Q4_1, Q8_0, Q4_K, Q6_K: the types with an x8 layout


@pytest.mark.parametrize("code", FILE_TYPES)
def test_layout_is_the_references_definition(gen, code):
    w = random_rows(gen, code, 24, 3 * BLOCK_TYPES[code][1])
    packed = repack_x8(w, code)
    assert packed.shape == w.shape and not torch.equal(packed, w)
    assert torch.equal(reference.x8_file_rows(packed, code + 100), w)
    assert torch.equal(unpack_x8(packed, code + 100), w)
    q = QuantTensor(w.clone(), code)
    x8 = q.x8()
    assert x8.gguf_type == code + 100 and torch.equal(x8.data, packed) and x8.shape == q.shape
    assert torch.equal(x8.dequantize(), q.dequantize())
    index = torch.tensor([[17, 0], [9, 23]])  # the embedding's gather: only those rows' groups unpacked
    got, t = file_rows(packed, code + 100, index)
    assert t == code and torch.equal(got, w[index]) and file_rows(w, code, index)[1] == code
    rows = x8.rows(torch.tensor([17, 0, 9]))  # rows of an x8 matrix: a copy in the file layout
    assert rows.gguf_type == code and torch.equal(rows.data, w[[17, 0, 9]])
    in_place = q.x8(out=q.data)  # the same storage, the new order
    assert in_place.data.data_ptr() == q.data.data_ptr() and torch.equal(in_place.data, packed)


@pytest.mark.parametrize("code", FILE_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_equals_the_file_layout_bitwise(isa, gen, code, dtype):
    for K in (32, 576) if BLOCK_TYPES[code][1] == 32 else (256, 768):
        w = random_rows(gen, code, 40, K)
        w8 = repack_x8(w, code)
        for M in (1, 2, 5, 9, 17):  # 17: a prefill's tile (two groups a vector from 16 rows, AVX-512 VNNI)
            x = torch.randn(M, K, generator=gen).to(dtype)
            bias = torch.randn(40, generator=gen) if M % 2 else None
            got = torch.ops.mtp.linear(x, w8, bias, gguf_type=code + 100)
            assert torch.equal(got, torch.ops.mtp.linear(x, w, bias, gguf_type=code))
            assert torch.equal(got, reference.gguf_linear(x, w8, code + 100, bias))
            for m in range(M):  # each row alone: the same bits
                assert torch.equal(torch.ops.mtp.linear(x[m : m + 1], w8, bias, gguf_type=code + 100), got[m : m + 1])


def test_linear_threads_and_opcheck(gen, threads):
    w = random_rows(gen, 3, 64, 128)
    w8 = repack_x8(w, 3)
    for M in (5, 19):  # 19: the two-group tile of many rows
        x = torch.randn(M, 128, generator=gen)
        want = torch.ops.mtp.linear(x, w, gguf_type=3)
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(torch.ops.mtp.linear(x, w8, gguf_type=103), want)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, w8), {"gguf_type": 103})


def x8_weights(weights, flat):
    """decoder_case's weights with each matrix that has an x8 layout repacked (its type + 100)."""
    mats = iter(range(len(flat)))
    out, types = [], []
    for i, w in enumerate(weights):
        if w.dtype == torch.uint8:
            t = flat[next(mats)]
            x8 = can_x8(QuantTensor(w, t))
            out.append(repack_x8(w, t) if x8 else w)
            types.append(t + 100 if x8 else t)
        else:
            out.append(w)
    return out, types


@pytest.mark.parametrize("types", [[[3, 3, 3, 3], [8, 2, 3, 8]], [[12, 3, 14, 8]], [[6, 12, 8, 14]]])
def test_decoder_layers_equal_the_file_layout_bitwise(isa, gen, types):
    small = all(BLOCK_TYPES[t][1] == 32 for t in types[0])
    H, Hq, Hkv, D, I = (64, 4, 2, 16, 96) if small else (256, 8, 2, 32, 256)
    args, flat = decoder_case(gen, H, Hq, Hkv, D, I, types, torch.bfloat16, [3, 7], 4)
    w8, flat8 = x8_weights(args[6], flat)
    assert any(t in X8_TYPES for t in flat8)
    k1, v1, k2, v2 = args[1].clone(), args[2].clone(), args[1].clone(), args[2].clone()
    want = torch.ops.mtp.decoder_layers(args[0], k1, v1, *args[3:], weight_types=flat)
    got = torch.ops.mtp.decoder_layers(args[0], k2, v2, *args[3:6], w8, *args[7:], weight_types=flat8)
    assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(v1, v2)
    k3, v3 = args[1].clone(), args[2].clone()
    composed = reference.decoder_layers(args[0], k3, v3, *args[3:6], w8, *args[7:], weight_types=flat8, ops=ops.KERNELS)
    assert torch.equal(composed, got)


@pytest.mark.parametrize("emb_type,lm_type", [(8, 8), (3, 2)])
def test_head_draft_equals_the_file_layout_bitwise(isa, gen, emb_type, lm_type):
    H, Hq, Hkv, D, I, V, B, k = 64, 4, 2, 16, 96, 48, 2, 3
    dtype = torch.bfloat16
    (x, kc, vc, lens, cos, sin, _, _, _, eps), _ = decoder_case(gen, H, Hq, Hkv, D, I, [[3, 3, 3, 3]], dtype, [4, 6], 1)
    norm = lambda: (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype)  # noqa: E731
    mats = [(Hq + 2 * Hkv) * D, H], [H, Hq * D], [2 * I, H], [H, I]
    block = [norm(), *[(torch.randn(*s, generator=gen) / 16).to(dtype) for s in mats[:2]], norm()]
    block += [(torch.randn(*s, generator=gen) / 16).to(dtype) for s in mats[2:]]
    weights = [norm(), norm(), (torch.randn(H, 2 * H, generator=gen) / 16).to(dtype)] + block + [norm()]
    emb, lm = random_rows(gen, emb_type, V, H), random_rows(gen, lm_type, V, H)
    hidden, token = torch.randn(B, H, generator=gen).to(dtype), torch.tensor([3, 41])
    vocabs = (torch.tensor([7, 1, 40, 22, 3, 47, 41]), torch.tensor([7, 1, 40, 22, 3, 47, 41, 30]), None)
    for vocab in vocabs:  # a row map over the groups (7 rows, then whole groups of 8), then none
        args = (hidden, token, kc[0], vc[0], lens, cos, sin, emb, None, weights, lm, None, vocab, k, Hq, eps)
        want = torch.ops.mtp.head_draft(*args, alternatives=2, embedding_type=emb_type, lm_head_type=lm_type)
        args8 = args[:7] + (repack_x8(emb, emb_type),) + args[8:10] + (repack_x8(lm, lm_type),) + args[11:]
        kw8 = dict(alternatives=2, embedding_type=emb_type + 100, lm_head_type=lm_type + 100)
        got = torch.ops.mtp.head_draft(*args8, **kw8)
        assert torch.equal(got, want)
        assert torch.equal(reference.head_draft(*args8, **kw8, ops=ops.KERNELS), got)
        if vocab is None:
            continue
        # lm_head as the draft vocabulary's rows [Vd, H] (file layout; x8 when Vd is whole groups)
        rows, x8 = lm[vocab], len(vocab) % 8 == 0
        drafted = args8[:10] + (repack_x8(rows, lm_type) if x8 else rows,) + args8[11:]
        kw = dict(kw8, lm_head_type=lm_type + 100 * x8)
        assert torch.equal(torch.ops.mtp.head_draft(*drafted, **kw), want)
        assert torch.equal(reference.head_draft(*drafted, **kw, ops=ops.KERNELS), want)


def test_bad_x8_shapes_raise_clear_errors(gen):
    w8 = repack_x8(random_rows(gen, 3, 16, 64), 3)
    x = torch.randn(2, 64, generator=gen)
    with pytest.raises(
        RuntimeError, match="a Q4_1_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 1"
    ):
        torch.ops.mtp.linear(x, w8[:12], gguf_type=103)
    wide = torch.zeros(16, 80, dtype=torch.uint8)
    with pytest.raises(
        RuntimeError, match=r"a Q4_1_X8 matrix must be contiguous \(rows 40 bytes apart\), got strides \[80"
    ):
        torch.ops.mtp.linear(x, wide[:, :40], gguf_type=103)
    with pytest.raises(ValueError, match="a Q4_1_X8 matrix is contiguous groups of 8 rows, got 12 rows"):
        QuantTensor(w8[:12], 103)
    assert not can_x8(QuantTensor(random_rows(gen, 3, 12, 64), 3))  # 12 rows: no whole groups
    assert not can_x8(QuantTensor(random_rows(gen, 6, 16, 64), 6))  # Q5_0: no x8 layout (widened to Q8_0)
    k8 = repack_x8(random_rows(gen, 12, 16, 256), 12)
    with pytest.raises(RuntimeError, match="a Q4_K_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8"):
        torch.ops.mtp.linear(torch.randn(2, 256, generator=gen), k8[:4], gguf_type=112)
    with pytest.raises(RuntimeError, match="K = 128 is not a multiple of Q6_K_X8's blocks of 256 elements"):
        torch.ops.mtp.linear(torch.randn(2, 128, generator=gen), torch.zeros(8, 105, dtype=torch.uint8), gguf_type=114)

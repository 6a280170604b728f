"""GGUF block-quantized weights read as stored (mtp_kernels.gguf, csrc/include/mtp/gguf.h):
reference.gguf_dequantize is the `gguf` package's dequantizer bitwise; mtp.linear(gguf_type=)
is reference.gguf_linear bitwise on every instruction set, thread count, row stride and row
count (shape invariance); decoder_layers / head_draft with block-type matrices are the
op-by-op composition bitwise; opcheck; bad input raises clear errors."""

import gguf as gguf_pkg
import numpy as np
import pytest
import torch

from mtp_kernels import ops, reference
from mtp_kernels.gguf import BLOCK_TYPES, QuantTensor, row_bytes

TYPES = sorted(BLOCK_TYPES)  # 2 Q4_0, 3 Q4_1, 6 Q5_0, 8 Q8_0, 12 Q4_K, 14 Q6_K
# where each block's fp16 scales sit: (offset in the block, signed?)
SCALES = {
    "Q4_0": [(0, True)],
    "Q4_1": [(0, True), (2, True)],
    "Q5_0": [(0, True)],
    "Q8_0": [(0, True)],
    "Q4_K": [(0, False), (2, False)],
    "Q6_K": [(208, True)],
}


def random_rows(gen, code, N, K):
    """N rows of random blocks: random quant bytes, normal fp16 scales of realistic size."""
    name, elems, nbytes = BLOCK_TYPES[code]
    data = torch.randint(0, 256, (N, K // elems, nbytes), generator=gen, dtype=torch.uint8)
    for offset, signed in SCALES[name]:
        s = torch.rand(N, K // elems, generator=gen) * 0.02 + 0.001
        if signed:
            s = s * torch.where(torch.rand(N, K // elems, generator=gen) < 0.3, -1.0, 1.0)
        data[:, :, offset : offset + 2] = s.half().view(torch.uint8).view(N, K // elems, 2)
    return data.view(N, -1)


def k_values(code):
    e = BLOCK_TYPES[code][1]
    return [e, 2 * e] + ([576] if e == 32 else [768])


@pytest.mark.parametrize("code", TYPES)
def test_dequantize_is_the_gguf_packages_bitwise(gen, code):
    for K in k_values(code):
        data = random_rows(gen, code, 7, K)
        want = gguf_pkg.quants.dequantize(data.numpy(), gguf_pkg.GGMLQuantizationType(code))
        got = reference.gguf_dequantize(data, code)
        assert got.shape == (7, K) and torch.equal(got, torch.from_numpy(np.asarray(want, dtype=np.float32)))
        assert torch.equal(QuantTensor(data, code).dequantize(), got) and QuantTensor(data, code).shape == (7, K)


def test_fma32_rounds_once():
    a = torch.tensor([1 + 2**-23, 3.0, 0.1, 1e30])
    b = torch.tensor([1 - 2**-23, 1 / 3, 0.2, 1e30])
    c = torch.tensor([-1.0, -1.0, 0.3, -float("inf")])
    got = reference.fma32(a, b, c)
    exact = [
        (1 + 2**-23) * (1 - 2**-23) - 1,
        float(np.float32(3.0)) * float(np.float32(1 / 3)) - 1,
        float(np.float32(0.1)) * float(np.float32(0.2)) + float(np.float32(0.3)),
    ]
    assert got[:3].tolist() == [float(np.float32(v)) for v in exact] and got[3] == -float("inf")
    # a product exactly between two fp32 neighbours after an fp64 rounding: round-to-odd settles it
    a, b, c = torch.tensor([1 + 2**-12]), torch.tensor([1 + 2**-12]), torch.tensor([2**-60])
    assert reference.fma32(a, b, c).item() == float(np.float32(1 + 2**-11 + 2**-23))


@pytest.mark.parametrize("code", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_is_the_reference_bitwise(isa, gen, code, dtype):
    for K in k_values(code):
        for M in (1, 2, 5, 9):
            x = torch.randn(M, K, generator=gen).to(dtype)
            w = random_rows(gen, code, 45, K)
            bias = torch.randn(45, generator=gen) if M % 2 else None
            got = torch.ops.mtp.linear(x, w, bias, gguf_type=code)
            assert got.dtype == dtype and got.shape == (M, 45)
            assert torch.equal(got, reference.gguf_linear(x, w, code, bias))
            for m in range(M):  # each row alone: the same bits
                assert torch.equal(torch.ops.mtp.linear(x[m : m + 1], w, bias, gguf_type=code), got[m : m + 1])


def test_linear_close_to_the_dequantized_product(gen):
    for code in TYPES:
        x = torch.randn(3, 512, generator=gen)
        w = random_rows(gen, code, 20, 512)
        got = torch.ops.mtp.linear(x, w, gguf_type=code).double()
        exact = x.double() @ reference.gguf_dequantize(w, code).double().T
        # int8 activations: each element within half a step of x's block scale
        bound = (x.abs().amax() / 127 / 2).double() * reference.gguf_dequantize(w, code).double().abs().sum(1)
        assert ((got - exact).abs() <= bound[None] + 1e-5).all()


def test_strides_threads_and_leading_dims(gen, threads):
    code, K = 3, 96
    base = random_rows(gen, code, 30, K + 256)  # rows 20 bytes x (K + 256) / 32 apart: a strided view
    w = base[:, : row_bytes(code, K)]
    assert w.stride(0) != w.shape[1]
    # x with a non-unit inner stride (copied); 20 rows: from kParallelRows (linear.h) they
    # are quantized over the threads too
    x = torch.randn(4, 5, 2 * K, generator=gen)[..., ::2]
    want = reference.gguf_linear(x, w.contiguous(), code)
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        got = torch.ops.mtp.linear(x, w, gguf_type=code)
        assert got.shape == (4, 5, 30) and torch.equal(got, want)


def test_nan_row_stays_in_its_row(gen):
    x = torch.randn(3, 64, generator=gen)
    x[1, 5] = float("nan")
    y = torch.ops.mtp.linear(x, random_rows(gen, 8, 6, 64), gguf_type=8)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()


def test_opcheck_and_compile(gen):
    x, w = torch.randn(3, 64, generator=gen), random_rows(gen, 3, 8, 64)
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, w), {"gguf_type": 3})
    f = torch.compile(lambda a: torch.ops.mtp.linear(a, w, gguf_type=3), backend="eager", fullgraph=True)
    assert torch.equal(f(x), torch.ops.mtp.linear(x, w, gguf_type=3))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(gguf_type=5),
            "GGML type 5 is not supported: expected 2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 8 (Q8_0), 12 (Q4_K), 14 (Q6_K), "
            "102 (Q4_0_X8), 103 (Q4_1_X8), 108 (Q8_0_X8), 112 (Q4_K_X8) or 114 (Q6_K_X8)",
        ),
        (
            dict(gguf_type=3, w=torch.zeros(4, 40)),
            "weight of GGML type 3 (Q4_1) must be its uint8 bytes [N, row bytes], got Float",
        ),
        (
            dict(gguf_type=3, w=torch.zeros(4, 41, dtype=torch.uint8)),
            "a Q4_1 row of K = 64 elements is 40 bytes, got weight rows of 41 bytes",
        ),
        (dict(gguf_type=12), "K = 64 is not a multiple of Q4_K's blocks of 256 elements"),
        (dict(gguf_type=3, w=torch.zeros(40, 4, dtype=torch.uint8).T), "weight bytes must be contiguous along a row"),
        (dict(gguf_type=3, w=torch.zeros(40, dtype=torch.uint8)), "weight must be 2-D [N, row bytes]"),
        (
            dict(gguf_type=3, weight_scale=torch.ones(4, 2)),
            "a GGUF block-type weight carries its scales; weight_scale must be None",
        ),
        (dict(gguf_type=3, quantize_x=True), "quantize_x is for Q8 (int8) weights"),
    ],
)
def test_linear_bad_input(kwargs, message):
    w = kwargs.pop("w", torch.zeros(4, 40, dtype=torch.uint8))
    with pytest.raises(RuntimeError) as e:
        torch.ops.mtp.linear(torch.randn(2, 64), w, **kwargs)
    assert "mtp.linear: " in str(e.value) and message in str(e.value)


def test_gpu_paths_refuse_clearly():
    from mtp_kernels import fallback

    with pytest.raises(RuntimeError, match="GGUF block-type weights .* run on the CPU only"):
        fallback.head_draft(*([None] * 13), 1, 1, 1e-5, embedding_type=3)


def test_quant_tensor_checks():
    with pytest.raises(ValueError, match="GGML type 7 is not supported"):
        QuantTensor(torch.zeros(2, 22, dtype=torch.uint8), 7)
    with pytest.raises(ValueError, match="must be a 2-D uint8 tensor"):
        QuantTensor(torch.zeros(2, 20), 3)
    with pytest.raises(ValueError, match="21 bytes per row is not a whole number of Q4_1 blocks"):
        QuantTensor(torch.zeros(2, 21, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="K = 100 is not a multiple of Q4_K's blocks of 256"):
        row_bytes(12, 100)


# ---- decoder_layers / head_draft with block-type matrices -----------------------------------

# (H, Hq, Hkv, D, I, types of qkv, o_proj, gate_up, down_proj per layer)
DECODERS = [(64, 4, 2, 16, 96, [[3, 3, 3, 3], [8, 2, 3, 8]]), (256, 8, 2, 32, 256, [[12, 14, 12, 14]])]


def decoder_case(gen, H, Hq, Hkv, D, I, types, dtype, lens, T):
    weights = []
    for t in types:
        norm = lambda: (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype)  # noqa: E731
        weights += [
            norm(),
            random_rows(gen, t[0], (Hq + 2 * Hkv) * D, H),
            random_rows(gen, t[1], H, Hq * D),
            norm(),
            random_rows(gen, t[2], 2 * I, H),
            random_rows(gen, t[3], H, I),
        ]
    weights.append((1 + 0.1 * torch.randn(H, generator=gen)).to(dtype))
    L, B = 24, len(lens)
    k = torch.randn(len(types), B, Hkv, L, D, generator=gen).to(dtype)
    angles = torch.arange(L)[:, None] * 0.1 * torch.arange(1, D // 2 + 1)[None] / D
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
    x = torch.randn(B, T, H, generator=gen).to(dtype)
    flat = [c for t in types for c in t]
    return (
        x,
        k,
        torch.randn(k.shape, generator=gen).to(dtype),
        torch.tensor(lens),
        cos,
        sin,
        weights,
        [],
        Hq,
        1e-5,
    ), flat


@pytest.mark.parametrize("H,Hq,Hkv,D,I,types", DECODERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layers_is_the_composition_bitwise(isa, gen, H, Hq, Hkv, D, I, types, dtype):
    for lens, T in [([5], 1), ([3, 7], 4)]:
        args, flat = decoder_case(gen, H, Hq, Hkv, D, I, types, dtype, lens, T)
        k1, v1, k2, v2 = args[1].clone(), args[2].clone(), args[1].clone(), args[2].clone()
        got = torch.ops.mtp.decoder_layers(args[0], k1, v1, *args[3:], weight_types=flat)
        want = reference.decoder_layers(args[0], k2, v2, *args[3:], weight_types=flat, ops=ops.KERNELS)
        assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(v1, v2)
        if T > 1:  # a verify pass: each token's bits are those of one-token steps
            k3, v3, lens3 = args[1].clone(), args[2].clone(), args[3].clone()
            for t in range(T):
                step = torch.ops.mtp.decoder_layers(
                    args[0][:, t : t + 1].contiguous(), k3, v3, lens3, *args[4:], weight_types=flat
                )
                assert torch.equal(step, got[:, t : t + 1])
                lens3 += 1


def test_decoder_layers_opcheck_and_bad_types(gen):
    args, flat = decoder_case(gen, *DECODERS[0][:5], [[3, 3, 3, 3]], torch.float32, [2], 2)
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, args, {"weight_types": flat})
    with pytest.raises(RuntimeError, match=r"weight_types must hold one GGML type number .* 4 values, got 3"):
        torch.ops.mtp.decoder_layers(*args, weight_types=flat[:3])
    with pytest.raises(RuntimeError, match=r"weight_types\[1\]: GGML type 9 is not supported"):
        torch.ops.mtp.decoder_layers(*args, weight_types=[3, 9, 3, 3])
    with pytest.raises(
        RuntimeError,
        match=r"weights\[2\] \(layer 0's o_proj\): a Q8_0 row of K = 64 elements is 68 "
        r"bytes, got weight rows of 40 bytes",
    ):
        torch.ops.mtp.decoder_layers(*args, weight_types=[3, 8, 3, 3])
    with pytest.raises(RuntimeError, match=r"weights\[1\] \(layer 0's qkv\) of GGML type 3 \(Q4_1\) must be its uint8"):
        torch.ops.mtp.decoder_layers(
            *args[:6], [args[6][0], args[6][1].float()] + args[6][2:], *args[7:], weight_types=flat
        )


@pytest.mark.parametrize("emb_type,lm_type", [(8, 8), (3, 14), (8, -1)])
def test_head_draft_with_block_type_embedding_and_lm_head(isa, gen, emb_type, lm_type):
    H, Hq, Hkv, D, I, V, B, k = 256, 8, 2, 32, 256, 50, 2, 3
    dtype = torch.bfloat16
    (x, kc, vc, lens, cos, sin, _, _, _, eps), _ = decoder_case(gen, H, Hq, Hkv, D, I, [[3, 3, 3, 3]], dtype, [4, 6], 1)
    norm = lambda: (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype)  # noqa: E731
    block = [
        norm(),
        (torch.randn((Hq + 2 * Hkv) * D, H, generator=gen) / 16).to(dtype),
        (torch.randn(H, Hq * D, generator=gen) / 16).to(dtype),
        norm(),
        (torch.randn(2 * I, H, generator=gen) / 16).to(dtype),
        (torch.randn(H, I, generator=gen) / 16).to(dtype),
    ]
    weights = [norm(), norm(), (torch.randn(H, 2 * H, generator=gen) / 16).to(dtype)] + block + [norm()]
    emb = random_rows(gen, emb_type, V, H)
    lm = random_rows(gen, lm_type, V, H) if lm_type >= 0 else torch.randn(V, H, generator=gen).to(dtype)
    hidden, token = torch.randn(B, H, generator=gen).to(dtype), torch.tensor([3, 41])
    vocab = torch.tensor([7, 1, 40, 22, 3, 49, 41])
    args = (hidden, token, kc[0], vc[0], lens, cos, sin, emb, None, weights, lm, None, vocab, k, Hq, eps)
    kw = dict(alternatives=2, embedding_type=emb_type, lm_head_type=lm_type)
    got = torch.ops.mtp.head_draft(*args, **kw)
    assert got.shape == (B, k + 2)
    assert torch.equal(got, reference.head_draft(*args, **kw, ops=ops.KERNELS))
    torch.library.opcheck(torch.ops.mtp.head_draft.default, args, kw)
    with pytest.raises(RuntimeError, match="embedding_type: GGML type 4 is not supported"):
        torch.ops.mtp.head_draft(*args, embedding_type=4)


def test_head_draft_full_vocabulary_wider_than_the_layers_bf16(gen):
    """A head without a draft vocabulary in bf16: its LM head (V rows) is wider than every layer
    buffer; the fp32 logits before rounding must get their own room (this overflowed a heap
    buffer before)."""
    H, Hq, Hkv, D, I, V = 64, 4, 2, 16, 96, 1500
    dtype = torch.bfloat16
    (x, kc, vc, lens, cos, sin, _, _, _, eps), _ = decoder_case(gen, H, Hq, Hkv, D, I, [[3, 3, 3, 3]], dtype, [4], 1)
    norm = lambda: (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype)  # noqa: E731
    block = [
        norm(),
        (torch.randn((Hq + 2 * Hkv) * D, H, generator=gen) / 8).to(dtype),
        (torch.randn(H, Hq * D, generator=gen) / 8).to(dtype),
        norm(),
        (torch.randn(2 * I, H, generator=gen) / 8).to(dtype),
        (torch.randn(H, I, generator=gen) / 8).to(dtype),
    ]
    weights = [norm(), norm(), (torch.randn(H, 2 * H, generator=gen) / 8).to(dtype)] + block + [norm()]
    emb, lm = random_rows(gen, 8, V, H), random_rows(gen, 8, V, H)
    args = (
        torch.randn(1, H, generator=gen).to(dtype),
        torch.tensor([7]),
        kc[0],
        vc[0],
        lens,
        cos,
        sin,
        emb,
        None,
        weights,
        lm,
        None,
        None,
        3,
        Hq,
        eps,
    )
    kw = dict(embedding_type=8, lm_head_type=8)
    got = torch.ops.mtp.head_draft(*args, **kw)
    assert torch.equal(got, reference.head_draft(*args, **kw, ops=ops.KERNELS))


def test_widened_q5_0_gives_q5_0s_bits(gen, isa):
    """gguf.widen_q5_0 (the Gemma backbone's Q5_0 -> Q8_0): the same values, and mtp.linear's
    bits as Q5_0 as stored, in Q8_0's file and x8 layouts, at every row count."""
    from mtp_kernels.gguf import widen_q5_0

    for K in k_values(6):
        data = random_rows(gen, 6, 16, K)
        wide = QuantTensor(widen_q5_0(data), 8)
        assert wide.data.shape == (16, K // 32 * 34)
        assert torch.equal(wide.dequantize(), reference.gguf_dequantize(data, 6))
        x8 = wide.x8()
        for M in (1, 3, 8, 17):
            x = torch.randn(M, K, generator=gen) * 2
            want = ops.linear(x, data, gguf_type=6)
            assert torch.equal(ops.linear(x, wide.data, gguf_type=8), want), (K, M)
            assert torch.equal(ops.linear(x, x8.data, gguf_type=x8.gguf_type), want), (K, M)

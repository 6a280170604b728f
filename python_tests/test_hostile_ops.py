"""Hostile arguments to the torch ops: sizes whose products or sums overflow int64,
outputs aliasing inputs or each other (or expanded, stride 0), float arguments that are
non-finite or overflow when narrowed to the kernels' float32. Each call raises RuntimeError
with one sentence naming the argument, writes nothing, and the Python checks of the Triton /
fallback paths (mtp_kernels._checks) say the same words."""

import re

import pytest
import torch

import mtp_kernels  # noqa: F401  (registers torch.ops.mtp)
from mtp_kernels import _checks as C
from mtp_kernels import fallback

mtp = torch.ops.mtp
BIG_HEADS = 2**62  # (Hq + 2 Hkv) D wraps to 8 and Hq D to 0 with Hkv = 1, D = 4


def decoder_args(H=8, Hkv=1, D=4, I=4, L=4, P=4, qkv_rows=None, o_cols=None, heads=2):
    qkv_rows = (heads + 2 * Hkv) * D if qkv_rows is None else qkv_rows
    o_cols = heads * D if o_cols is None else o_cols
    norm = torch.ones(H)
    weights = [
        norm,
        torch.full((qkv_rows, H), 0.01),
        torch.full((H, o_cols), 0.01),
        norm,
        torch.full((2 * I, H), 0.01),
        torch.full((H, I), 0.01),
        norm,
    ]
    return dict(
        x=torch.full((1, 1, H), 0.5),
        k_cache=torch.zeros(1, 1, Hkv, L, D),
        v_cache=torch.zeros(1, 1, Hkv, L, D),
        cache_lens=torch.zeros(1, dtype=torch.long),
        rope_cos=torch.ones(P, D),
        rope_sin=torch.zeros(P, D),
        weights=weights,
        weight_scales=[],
        num_heads=heads,
        eps=1e-5,
    )


def run_decoder(a, op=None):
    return (op or mtp.decoder_layers)(
        a["x"],
        a["k_cache"],
        a["v_cache"],
        a["cache_lens"],
        a["rope_cos"],
        a["rope_sin"],
        a["weights"],
        a["weight_scales"],
        a["num_heads"],
        a["eps"],
    )


def head_draft_args(k=2, heads=2, eps=1e-5, lens=0):
    H, Hkv, D, L, P, V = 8, 1, 4, 4, 4, 6
    return (
        torch.zeros(1, H),
        torch.zeros(1, dtype=torch.long),
        torch.zeros(1, Hkv, L, D),
        torch.zeros(1, Hkv, L, D),
        torch.full((1,), lens, dtype=torch.long),
        torch.ones(P, D),
        torch.zeros(P, D),
        torch.zeros(V, H),
        None,
        [torch.ones(H)] * 4,
        torch.zeros(V, H),
        None,
        None,
        k,
        heads,
        eps,
    )


# ---- sizes: checked arithmetic --------------------------------------------------------------
def test_decoder_valid_call():
    out = run_decoder(decoder_args())
    assert out.shape == (1, 1, 8) and out.isfinite().all()


def test_decoder_num_heads_overflow():
    a = decoder_args(heads=BIG_HEADS, qkv_rows=8, o_cols=0)  # the matrices the wrapped widths would match
    with pytest.raises(
        RuntimeError,
        match=r"mtp.decoder_layers: num_heads = 4611686018427387904 is too large: the "
        r"qkv rows \(Hq \+ 2 Hkv\) D with Hkv = 1 and D = 4 overflow int64",
    ):
        run_decoder(a)
    assert not a["k_cache"].any()


def test_head_draft_num_heads_overflow():
    with pytest.raises(RuntimeError, match=r"mtp.head_draft: num_heads = 4611686018427387904 is too large"):
        mtp.head_draft(*head_draft_args(heads=BIG_HEADS))


def test_head_draft_positions_do_not_wrap():
    # cache_lens[b] + k near 2^63 would wrap past the RoPE check
    with pytest.raises(
        RuntimeError,
        match=r"request 0's drafts would pass the RoPE tables: cache_lens\[0\] \+ k = "
        r"1 \+ 9223372036854775806 > P = 4",
    ):
        mtp.head_draft(*head_draft_args(k=2**63 - 2, lens=1))


def test_verify_k_plus_one_overflow():
    draft = torch.zeros(1, 1, dtype=torch.long).expand(1, 2**63 - 1)
    with pytest.raises(
        RuntimeError,
        match=r"mtp.verify: draft_tokens.size\(1\) = K = 9223372036854775807 is too "
        r"large \(K \+ 1 overflows int64\)",
    ):
        mtp.verify(draft, torch.zeros(1, 1, 1))
    with pytest.raises(RuntimeError, match=r"mtp.accept_prefix: draft_tokens.size\(1\) = K = 9223372036854775807"):
        mtp.accept_prefix(draft, torch.zeros(1, 1, dtype=torch.long))


def test_linear_row_length_bound():
    x = torch.zeros(1, 1).expand(1, 2**62)
    with pytest.raises(
        RuntimeError,
        match=r"mtp.linear: K \(x.size\(-1\)\) = 4611686018427387904 is beyond the "
        r"72057594037927936 \(2\^56\) elements a row may have",
    ):
        mtp.linear(x, torch.empty(0, 2**62, dtype=torch.int8), None, torch.empty(0, 2**57))


# ---- aliasing ----------------------------------------------------------------------------------
def append_args():
    return (
        torch.zeros(1, 1, 4, 2),
        torch.zeros(1, 1, 4, 2),
        torch.ones(1, 2, 1, 2),
        torch.ones(1, 2, 1, 2),
        torch.zeros(1, dtype=torch.long),
    )


def test_cache_append_same_tensor_for_k_and_v():
    kc, _, kn, vn, lens = append_args()
    with pytest.raises(
        RuntimeError,
        match=r"mtp.cache_append: k_cache and v_cache overlap in memory: k_cache is "
        r"written in place and must share no memory with another argument",
    ):
        mtp.cache_append(kc, kc, kn, vn, lens)
    assert not kc.any()


def test_cache_append_k_new_overlaps_k_cache():
    kc, vc, _, vn, lens = append_args()
    kn = kc[:, :, 2:4].transpose(1, 2)  # [1, 2, 1, 2] read from the cache's own rows
    with pytest.raises(RuntimeError, match=r"k_cache and k_new overlap in memory"):
        mtp.cache_append(kc, vc, kn, vn, lens)
    assert not vc.any()


def test_cache_append_expanded_cache():
    _, vc, kn, vn, lens = append_args()
    kc = torch.zeros(1, 1, 1, 2).expand(1, 1, 4, 2)
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "k_cache must not have overlapping elements (it is written in "
            "place), got strides [2, 2, 0, 1] for sizes [1, 1, 4, 2]"
        ),
    ):
        mtp.cache_append(kc, vc, kn, vn, lens)


def test_rope_x_overlapping_cos():
    buf = torch.zeros(64)
    x, cos = buf[:32].view(1, 2, 4, 4), buf[16:24].view(1, 2, 4)
    with pytest.raises(RuntimeError, match=r"mtp.rope_: x and cos overlap in memory"):
        mtp.rope_(x, cos, torch.zeros(1, 2, 4))


def test_rope_expanded_x_keeps_its_message():
    x = torch.zeros(1, 2, 1, 4).expand(1, 2, 3, 4)
    with pytest.raises(
        RuntimeError,
        match=re.escape("x must not have overlapping elements (it is rotated in place), got strides [8, 4, 0, 1]"),
    ):
        mtp.rope_(x, torch.ones(1, 2, 4), torch.zeros(1, 2, 4))


def test_decoder_caches_aliasing():
    a = decoder_args()
    a["v_cache"] = a["k_cache"]
    with pytest.raises(RuntimeError, match=r"mtp.decoder_layers: k_cache and v_cache overlap in memory"):
        run_decoder(a)
    a = decoder_args()
    a["weights"][0] = a["k_cache"].view(-1)[:8]  # a norm weight inside the cache that is written
    with pytest.raises(RuntimeError, match=r"k_cache and weights\[0\] \(layer 0's input_norm\) overlap in memory"):
        run_decoder(a)
    with pytest.raises(RuntimeError, match=r"k_cache and weights\[0\] \(layer 0's input_norm\) overlap in memory"):
        run_decoder(a, fallback.decoder_layers)  # the CUDA fallback's check, the same words
    a = decoder_args()
    a["k_cache"] = torch.zeros(1, 1, 1, 1, 4).expand(1, 1, 1, 4, 4)  # every position the same memory
    for op in (None, fallback.decoder_layers):
        with pytest.raises(
            RuntimeError,
            match=re.escape(
                "mtp.decoder_layers: k_cache must not have overlapping elements (it is written in place), got "
                "strides [4, 4, 4, 0, 1] for sizes [1, 1, 1, 4, 4]"
            ),
        ):
            run_decoder(a, op)
    a = decoder_args()
    a["x"] = a["k_cache"].view(-1)[:8].view(1, 1, 8)  # the input inside the cache it writes
    with pytest.raises(RuntimeError, match=r"mtp.decoder_layers: k_cache and x overlap in memory"):
        run_decoder(a)
    assert not a["k_cache"].any()


# ---- float arguments at the kernels' width --------------------------------------------------
def attention_args():
    return torch.ones(1, 1, 2, 4), torch.ones(1, 1, 3, 4), torch.ones(1, 1, 3, 4), torch.full((1,), 3)


@pytest.mark.parametrize(
    "scale,shown",
    [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"), (1e300, "1e+300 (inf as float32)")],
)
def test_attention_scale_not_finite(scale, shown):
    q, k, v, lens = attention_args()
    with pytest.raises(RuntimeError, match=re.escape(f"mtp.head_attention: scale must be finite, got {shown}")):
        mtp.head_attention(q, k, v, lens, scale=scale)


def test_attention_scale_large_but_finite_as_float():
    q, k, v, lens = attention_args()
    assert mtp.head_attention(q, k, v, lens, scale=1e38).shape == q.shape


@pytest.mark.parametrize("op", ["rms_norm", "decoder_layers", "head_draft"])
def test_eps_overflowing_float32(op):
    want = re.escape(f"mtp.{op}: eps must be a finite number >= 0, got 1e+300 (inf as float32)")
    with pytest.raises(RuntimeError, match=want):
        if op == "rms_norm":
            mtp.rms_norm(torch.ones(2, 4), torch.ones(4), 1e300)
        elif op == "decoder_layers":
            a = decoder_args()
            a["eps"] = 1e300
            run_decoder(a)
        else:
            mtp.head_draft(*head_draft_args(eps=1e300))


# ---- the Python checks (Triton / fallback paths) say the same words -------------------------
def message(fn):
    with pytest.raises(RuntimeError) as e:
        fn()
    return str(e.value).splitlines()[0]


def test_python_checks_same_words():
    kc, vc, kn, vn, lens = append_args()
    assert message(lambda: C.check_append_inputs("mtp.cache_append", kc, kc, kn, vn, lens)) == message(
        lambda: mtp.cache_append(kc, kc, kn, vn, lens)
    )
    ke = torch.zeros(1, 1, 1, 2).expand(1, 1, 4, 2)
    assert message(lambda: C.check_append_inputs("mtp.cache_append", ke, vc, kn, vn, lens)) == message(
        lambda: mtp.cache_append(ke, vc, kn, vn, lens)
    )
    kn2 = kc[:, :, 2:4].transpose(1, 2)
    assert message(lambda: C.check_append_inputs("mtp.cache_append", kc, vc, kn2, vn, lens)) == message(
        lambda: mtp.cache_append(kc, vc, kn2, vn, lens)
    )
    buf = torch.zeros(64)
    x, cos, sin = buf[:32].view(1, 2, 4, 4), buf[16:24].view(1, 2, 4), torch.zeros(1, 2, 4)
    assert message(lambda: C.check_rope_inputs("mtp.rope_", x, cos, sin)) == message(lambda: mtp.rope_(x, cos, sin))
    xe = torch.zeros(1, 2, 1, 4).expand(1, 2, 3, 4)
    assert message(lambda: C.check_rope_inputs("mtp.rope_", xe, torch.ones(1, 2, 4), sin)) == message(
        lambda: mtp.rope_(xe, torch.ones(1, 2, 4), sin)
    )
    for eps in (1e300, float("nan"), -1.0):
        assert message(lambda: C.check_norm_inputs("mtp.rms_norm", torch.ones(2, 4), torch.ones(4), eps)) == message(
            lambda: mtp.rms_norm(torch.ones(2, 4), torch.ones(4), eps)
        )
    q, k, v, lens = attention_args()
    for scale in (1e300, float("nan"), float("inf")):
        assert message(lambda: C.check_attention_inputs("mtp.head_attention", q, k, v, lens, scale=scale)) == message(
            lambda: mtp.head_attention(q, k, v, lens, scale=scale)
        )


def test_python_checks_accept_valid_views():
    kc, vc, kn, vn, lens = append_args()
    assert C.check_append_inputs("mtp.cache_append", kc, vc, kn, vn, lens) == [0]
    kv = torch.zeros(2, 1, 1, 4, 2)  # k and v as two halves of one buffer: disjoint ranges
    assert C.check_append_inputs("mtp.cache_append", kv[0], kv[1], kn, vn, lens) == [0]
    mtp.cache_append(kv[0], kv[1], kn, vn, lens)
    assert kv[0, 0, 0, :2].eq(1).all() and kv[1, 0, 0, :2].eq(1).all()
    C.check_rope_inputs("mtp.rope_", torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 4), torch.zeros(1, 2, 4))
    C.check_norm_inputs("mtp.rms_norm", torch.ones(2, 4), torch.ones(4), 3e38)  # finite as float32


def test_huge_stride_over_a_size_one_dimension():
    """torch's as_strided accepts any stride over a size-1 dimension; the kernels would form
    stride * element bytes from it (an int64 overflow): refused by name."""
    x = torch.randn(4, 64).as_strided((1, 64), (2**61, 1))
    with pytest.raises(RuntimeError, match=r"mtp.linear: x.stride\(0\) = 2305843009213693952 is too large"):
        mtp.linear(x, torch.randn(8, 64))
    drafts = torch.zeros(4, 2, dtype=torch.long).as_strided((1, 2), (2**61, 1))
    with pytest.raises(RuntimeError, match=r"mtp.verify: draft_tokens.stride\(0\) = 2305843009213693952 is too large"):
        mtp.verify(drafts, torch.randn(1, 3, 10))


def test_set_isa_names_every_instruction_set():
    """The error lists what set_isa accepts, written from the one table (it once missed avx512_bf16)."""
    with pytest.raises(
        ValueError,
        match=r"unknown instruction set 'sse9' \(expected one of generic, avx2, avx512, "
        r"avx512_bf16, neon, neon_fp16\)",
    ):
        mtp_kernels.set_isa("sse9")


def test_x8_weights_of_partial_groups_refused():
    """The GGUF x8 layout interleaves whole groups of 8 rows: a matrix declared x8 whose row
    count is not a multiple of 8 (the native loader keeps such a matrix in the file's layout)
    is refused by name in decoder_layers and head_draft, never read past its rows."""
    from mtp_kernels.gguf import repack_x8
    from test_gguf import decoder_case, random_rows

    gen = torch.Generator().manual_seed(32)
    args, flat = decoder_case(gen, 64, 4, 2, 16, 96, [[3, 3, 3, 3]], torch.bfloat16, [3, 7], 4)
    weights = list(args[6])
    weights[1] = repack_x8(weights[1], 3)[:-4]  # qkv: 124 rows
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "mtp.decoder_layers: weights[1] (layer 0's qkv): a Q4_1_X8 matrix interleaves groups of 8 rows: N must be "
            "a multiple of 8, got 124"
        ),
    ):
        mtp.decoder_layers(*args[:6], weights, *args[7:], weight_types=[t + 100 for t in flat])
    x, kc, vc, lens, cos, sin = args[:6]
    H, dtype = 64, torch.bfloat16
    mat = lambda *s: (torch.randn(*s, generator=gen) / 16).to(dtype)  # noqa: E731
    block = [torch.ones(H, dtype=dtype), mat(128, H), mat(H, 64), torch.ones(H, dtype=dtype), mat(192, H), mat(H, 96)]
    head = [torch.ones(H, dtype=dtype), torch.ones(H, dtype=dtype), mat(H, 2 * H), *block, torch.ones(H, dtype=dtype)]
    emb = lm = random_rows(gen, 8, 45, H)  # 45 rows: no whole groups of 8
    hidden, token = torch.randn(2, H, generator=gen).to(dtype), torch.tensor([3, 41])
    call = (hidden, token, kc[0], vc[0], lens, cos, sin, emb, None, head, lm, None, None, 3, 4, 1e-5)
    for kw, name in [(dict(embedding_type=108, lm_head_type=8), "embedding"), (dict(lm_head_type=108), "lm_head")]:
        with pytest.raises(
            RuntimeError,
            match=re.escape(
                f"mtp.head_draft: {name}: a Q8_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, "
                "got 45"
            ),
        ):
            mtp.head_draft(*call, **{"embedding_type": 8, **kw})


# ---- the CUDA fallbacks of decoder_layers / head_draft (plain torch, run here on CPU tensors):
# the C++ op's checks and words (_checks.check_decoder_heads, check_positions,
# check_draft_positions), not torch's reshape or storage-size errors
def test_fallback_decoder_hostile_sizes_same_words():
    cases = [decoder_args(heads=BIG_HEADS, qkv_rows=8, o_cols=0)]
    a = decoder_args()
    a["cache_lens"] = torch.tensor([2**63 - 1])  # a position near 2^63
    cases.append(a)
    a = decoder_args()
    a["x"] = torch.full((1, 1, 8), 0.5).expand(1, 2**59, 8)  # T = 2^59: cache_lens + T past L
    cases.append(a)
    a = decoder_args()
    a["eps"] = 1e300
    cases.append(a)
    for a in cases:
        want = message(lambda: run_decoder(a))
        assert want.startswith("mtp.decoder_layers: ")
        assert message(lambda: run_decoder(a, fallback.decoder_layers)) == want
        assert not a["k_cache"].any()


def test_fallback_head_draft_hostile_sizes_same_words():
    for kw in (dict(heads=BIG_HEADS), dict(k=2**63 - 2, lens=1), dict(eps=1e300), dict(eps=float("nan")), dict(k=-1)):
        want = message(lambda: mtp.head_draft(*head_draft_args(**kw)))
        assert want.startswith("mtp.head_draft: ")  # eps too: not the composition's mtp.rms_norm
        assert message(lambda: fallback.head_draft(*head_draft_args(**kw))) == want
    args = head_draft_args()
    cache_lens = torch.tensor([2**63 - 1])  # a position near 2^63
    args = args[:4] + (cache_lens,) + args[5:]
    want = message(lambda: mtp.head_draft(*args))
    assert "cache_lens must lie in [0, L (k_cache.size(2))] = [0, 4]" in want
    assert message(lambda: fallback.head_draft(*args)) == want


def test_checks_decoder_heads_same_words():
    assert message(lambda: C.check_decoder_heads("mtp.head_draft", BIG_HEADS, 1, 4, 1e-5)) == (
        "mtp.head_draft: num_heads = 4611686018427387904 is too large: the qkv rows (Hq + 2 Hkv) D with Hkv = 1 "
        "and D = 4 overflow int64"
    )
    for heads, want in [
        (0, "num_heads must be >= 1, got 0"),
        (3, "q's head count Hq = 3 must be a multiple of k_cache's head count Hkv = 2"),
    ]:
        a = decoder_args(Hkv=2, heads=heads, qkv_rows=8, o_cols=8)
        assert want in message(lambda: run_decoder(a))
        assert message(lambda: run_decoder(a, fallback.decoder_layers)) == message(lambda: run_decoder(a))

"""Triton (and, on a GPU, C++ CUDA) kernels of verify, accept_prefix, linear, head_attention
and cache_append against reference.py: verify/accept_prefix/cache_append bitwise, linear and
head_attention within tolerance and bitwise shape-invariant.

Without a GPU the Triton kernels run under TRITON_INTERPRET=1 (set in conftest.py) on CPU
tensors: the `cpu` variants. The `cuda` variants (Triton launched on the GPU, and the
dispatched torch.ops.mtp.* kernel: C++ CUDA when built with MTP_WITH_CUDA, else Triton) are
skipped, and reported as skipped, where torch.cuda.is_available() is False; bench/gpu_check.sh
runs them on a GPU. Sizes are small: the interpreter is slow.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_attention import (
    BAD_APPEND,
    BAD_ATTENTION,
    EXTREME,
    _bad,
    assert_equal_nan,
    close,
    extreme_case,
    extreme_dtypes,
    inputs,
    make_cache,
)
from test_linear import BAD_LINEAR
from test_linear_q8 import BAD_Q8
from test_verify import BAD_VERIFY, FLOATS, IDS, accept_cases, make_case
from test_verify_sampled_ragged import BAD as BAD_SAMPLED_RAGGED
from test_verify_sampled_ragged import good_args as sampled_ragged_args
from test_verify_sampled_ragged import ragged_case

triton_mod = pytest.importorskip("mtp_kernels.triton")

HAS_CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CPU = pytest.mark.skipif(not INTERPRETED, reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (no GPU here)")
ON_GPU = pytest.mark.skipif(not HAS_CUDA, reason="GPU-only: needs CUDA (run by bench/gpu_check.sh)")
DEVICE = "cuda" if HAS_CUDA else "cpu"  # where the Triton kernels of the backend-free tests run

# (implementation, device): "triton" = mtp_kernels.triton.*, "op" = torch.ops.mtp.* dispatched on CUDA.
BACKENDS = [
    pytest.param(("triton", "cpu"), marks=ON_CPU, id="triton-interpreter"),
    pytest.param(("triton", "cuda"), marks=ON_GPU, id="triton-cuda"),
    pytest.param(("op", "cuda"), marks=ON_GPU, id="op-cuda"),
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def ops_of(impl):
    if impl == "triton":
        return triton_mod.verify, triton_mod.accept_prefix, triton_mod.linear
    return torch.ops.mtp.verify, torch.ops.mtp.accept_prefix, torch.ops.mtp.linear


def check_verify(backend, drafts, logits, num_drafts=None, pad_id=-1, **kw):
    impl, device = backend
    verify = ops_of(impl)[0]
    want = reference.verify(drafts, logits, num_drafts, pad_id)

    def to(t):
        return None if t is None else t.to(device)

    got = verify(to(drafts), logits.to(device) if device != "cpu" else logits, to(num_drafts), pad_id, **kw)
    for g, w in zip(got, want):
        assert g.device.type == device and g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w), (g, w)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_verify_random(backend, gen, dtype, id_dtype):
    for B, K, V in [(0, 3, 10), (1, 0, 5), (3, 0, 100), (1, 1, 1), (2, 4, 7), (5, 3, 300), (3, 2, 2049)]:
        drafts, logits = make_case(gen, B, K, V, dtype, id_dtype)
        check_verify(backend, drafts, logits)


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_ragged_num_drafts_and_pad(backend, gen, dtype):
    drafts, logits = make_case(gen, 6, 4, 700, dtype, torch.int64, match_rate=0.9)
    num_drafts = torch.tensor([0, 1, 2, 3, 4, 4], dtype=torch.int32)
    check_verify(backend, drafts, logits, num_drafts, pad_id=0)
    check_verify(backend, drafts.int(), logits, num_drafts.long(), pad_id=49151)


def test_verify_unreachable_rows_are_not_read(backend, gen):
    """Rows t > num_drafts[b] hold NaN everywhere; they must not change anything."""
    drafts, logits = make_case(gen, 3, 4, 300, torch.float32, torch.int64, match_rate=1.0)
    num_drafts = torch.tensor([1, 0, 2])
    for b, n in enumerate(num_drafts.tolist()):
        logits[b, n + 1 :] = float("nan")
    check_verify(backend, drafts, logits, num_drafts)


def test_verify_strided_logits(backend, gen):
    B, K, V = 3, 2, 1500
    big = torch.randn(B, 2 * (K + 1), V + 50, generator=gen)
    sliced = big[:, ::2, 17 : 17 + V]
    drafts = sliced.argmax(-1)[:, :K].clone()
    drafts[1, 1] += 1
    check_verify(backend, drafts, sliced)
    transposed = torch.randn(V, K + 1, B, generator=gen).bfloat16().permute(2, 1, 0)  # vocabulary stride B*(K+1)
    check_verify(backend, transposed.argmax(-1)[:, :K], transposed)
    expanded = torch.randn(1, K + 1, V, generator=gen).expand(B, K + 1, V)  # batch stride 0
    check_verify(backend, expanded.argmax(-1)[:, :K].t().contiguous().t(), expanded)


def edge_case_logits(dtype, V, pairs):
    """Two requests per index pair (i, j), i < j: ties, NaN, infinities and signed zeros."""
    logits = torch.zeros(2 * len(pairs), 4, V, dtype=dtype)
    drafts = torch.zeros(2 * len(pairs), 3, dtype=torch.long)
    for p, (i, j) in enumerate(pairs):
        a, b = logits[2 * p], logits[2 * p + 1]
        a[0, i] = a[0, j] = 3.0  # tie: the first wins
        a[1, j] = float("nan")  # NaN beats +inf
        a[1, i] = float("inf")
        a[2, i] = a[2, j] = float("inf")  # tied infinities
        a[3] = float("-inf")  # all -inf -> 0
        b.fill_(-1.0)
        b[0, j] = 0.0  # +0.0 later ...
        b[0, i] = -0.0  # ... ties -0.0 earlier
        b[1, i] = b[1, j] = float("nan")  # two NaN: the first
        drafts[2 * p] = torch.tensor([i, j, i])
        drafts[2 * p + 1] = torch.tensor([i, i, 0])
    return drafts, logits


@pytest.mark.parametrize("splits,block_v", [(1, 64), (2, 64), (3, 32), (5, 16)])
def test_verify_merge_of_slices_is_exact(splits, block_v):
    """Forced vocabulary slicings and tiles, with the planted values on their edges."""
    pairs = [(0, 1), (0, 299), (63, 64), (100, 200), (127, 128), (298, 299)]
    device = DEVICE
    for dtype in FLOATS:
        drafts, logits = edge_case_logits(dtype, 300, pairs)
        want = reference.verify(drafts, logits)
        got = triton_mod.verify(drafts.to(device), logits.to(device), splits=splits, block_v=block_v)
        assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want)), (dtype, got, want)


def test_verify_edge_values_default_slicing(backend):
    for dtype in FLOATS:
        drafts, logits = edge_case_logits(dtype, 3000, [(0, 2999), (1023, 1024), (2047, 2048)])
        check_verify(backend, drafts, logits)


@pytest.mark.parametrize(
    "id_dtype,target_dtype", [(torch.int32, torch.int64), (torch.int64, torch.int32), (torch.int64, torch.int64)]
)
def test_accept_prefix(backend, gen, id_dtype, target_dtype):
    impl, device = backend
    accept_prefix = ops_of(impl)[1]
    for drafts, tgt, nd in accept_cases(gen, id_dtype, target_dtype):
        got = accept_prefix(drafts.to(device), tgt.to(device), None if nd is None else nd.to(device))
        assert got.dtype == id_dtype and torch.equal(got.cpu(), reference.accept_prefix(drafts, tgt, nd))


@pytest.mark.parametrize("drafts,logits,num_drafts,message", BAD_VERIFY)
def test_verify_bad_input(drafts, logits, num_drafts, message):
    """The Triton launcher fails like the C++ bindings (the same messages)."""
    with pytest.raises(RuntimeError, match=r"mtp\.verify: .*" + re.escape(message)):
        triton_mod.verify(drafts, logits, num_drafts)


def test_accept_prefix_bad_input():
    d = torch.zeros(2, 3, dtype=torch.long)
    for target, nd, message in [
        (torch.zeros(2, 5, dtype=torch.long), None, "target_tokens.size(1) must be K+1 = 4 or K = 3, got 5"),
        (torch.zeros(2, 4), None, "target_tokens must be Int or Long, got Float"),
        (
            torch.zeros(2, 4, dtype=torch.long),
            torch.tensor([0, 9]),
            "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 9",
        ),
    ]:
        with pytest.raises(RuntimeError, match=r"mtp\.accept_prefix: .*" + re.escape(message)):
            triton_mod.accept_prefix(d, target, nd)


LINEAR_DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("x_dtype", LINEAR_DTYPES)
@pytest.mark.parametrize("w_dtype", LINEAR_DTYPES)
def test_linear_against_reference(backend, gen, x_dtype, w_dtype):
    impl, device = backend
    linear = ops_of(impl)[2]
    for N, K in [(70, 150), (5, 7), (3, 1), (33, 64), (40, 2 * 1024 + 83)]:  # the last: CUDA's K chunks
        for M in (1, 3, 6):
            x = torch.randn(M, K, generator=gen).to(x_dtype)
            w = (torch.randn(N, K, generator=gen) / K**0.5).to(w_dtype)
            bias = torch.randn(N, generator=gen) if M % 2 else None
            got = linear(x.to(device), w.to(device), None if bias is None else bias.to(device))
            want = reference.linear(x, w, bias)
            assert got.dtype == x_dtype and got.shape == (M, N) and got.device.type == device
            tol = dict(rtol=1e-5, atol=1e-6 * K) if x_dtype == torch.float32 else dict(rtol=2**-7, atol=1e-3)
            torch.testing.assert_close(got.cpu(), want, **tol)


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)],
)
@pytest.mark.parametrize("K", [64 * 2 + 19, 1024 * 2 + 83])  # tails in both dimensions; CUDA: 1 and 3 chunks of K
def test_linear_shape_invariance_bitwise(backend, gen, x_dtype, w_dtype, K):
    impl, device = backend
    linear = ops_of(impl)[2]
    N = 70
    x = torch.randn(11, K, generator=gen).to(x_dtype).to(device)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(w_dtype).to(device)
    bias = torch.randn(N, generator=gen).to(device)
    full = linear(x, w, bias)
    for i in range(11):
        assert torch.equal(linear(x[i : i + 1], w, bias), full[i : i + 1]), i
    for start, M in [(0, 2), (3, 3), (2, 5), (1, 9)]:
        assert torch.equal(linear(x[start : start + M], w, bias), full[start : start + M]), M
    assert torch.equal(linear(x.reshape(11, 1, K), w, bias).reshape(11, N), full)
    # 22 rows: past CUDA's 16, where a block sums the chunks of K itself instead of one block each
    assert torch.equal(linear(torch.cat([x, x]), w, bias), torch.cat([full, full]))


def test_linear_layout_and_degenerate(gen):
    def rand(*shape):  # made on the CPU (seeded), then put where the kernels run
        return torch.randn(*shape, generator=gen).to(DEVICE)

    x = rand(2, 3, 100)
    w = rand(40, 100)
    full = triton_mod.linear(x, w)
    assert full.shape == (2, 3, 40)
    strided = rand(2, 3, 300)[..., 7:107]
    strided.copy_(x)
    assert torch.equal(triton_mod.linear(strided, w), full)
    big = rand(40, 150)
    big[:, :100] = w
    assert torch.equal(triton_mod.linear(x, big[:, :100]), full)  # weight row stride 150, read in place
    assert triton_mod.linear(rand(0, 3), rand(4, 3)).shape == (0, 4)
    assert triton_mod.linear(rand(2, 3), rand(0, 3)).shape == (2, 0)
    ones = torch.ones(4, device=DEVICE)
    assert torch.equal(triton_mod.linear(rand(2, 0), rand(4, 0), ones), torch.ones(2, 4, device=DEVICE))


@pytest.mark.parametrize("args,message", BAD_LINEAR)
def test_linear_bad_input(args, message):
    with pytest.raises(RuntimeError, match="mtp.linear: .*" + re.escape(message)):
        triton_mod.linear(*args)


@pytest.mark.parametrize("args,message", BAD_Q8)
def test_linear_q8_bad_input(args, message):
    """The C++ op's checks and messages for weight_scale, in the Triton launcher."""
    with pytest.raises(RuntimeError, match="mtp.linear: " + re.escape(message)):
        triton_mod.linear(*args)


@pytest.mark.parametrize(
    "backend", [("triton", DEVICE), pytest.param(("op", "cuda"), marks=ON_GPU, id="op-cuda")], ids=lambda b: "-".join(b)
)
def test_linear_int8_is_cpu_only(backend, gen):
    """No GPU kernel for int8 weights: a valid Q8 call is refused with one clear line."""
    impl, device = backend
    q, s = mtp_kernels.quantize_q8(torch.randn(8, 40, generator=gen))
    x = torch.randn(2, 40, generator=gen)
    with pytest.raises(RuntimeError, match=re.escape("mtp.linear: int8 weights run on the CPU only")):
        ops_of(impl)[2](x.to(device), q.to(device), None, s.to(device))


@pytest.mark.parametrize(
    "backend", [("triton", DEVICE), pytest.param(("op", "cuda"), marks=ON_GPU, id="op-cuda")], ids=lambda b: "-".join(b)
)
def test_linear_quantize_x_is_cpu_only(backend, gen):
    """quantize_x (integer dot products) has no GPU kernel: with an int8 weight the int8 line,
    with a float weight the quantize_x line."""
    impl, device = backend
    q, s = mtp_kernels.quantize_q8(torch.randn(8, 40, generator=gen))
    x = torch.randn(2, 40, generator=gen).to(device)
    linear = ops_of(impl)[2]
    with pytest.raises(RuntimeError, match=re.escape("mtp.linear: int8 weights run on the CPU only")):
        linear(x, q.to(device), None, s.to(device), quantize_x=True)
    with pytest.raises(RuntimeError, match=re.escape("mtp.linear: quantize_x=True needs an int8 weight")):
        linear(x, torch.randn(8, 40, device=device), None, None, quantize_x=True)


def test_register_cuda_kernels_fills_only_missing_keys():
    """In a fresh process: the Triton launchers become the ops' CUDA kernels when none is
    compiled in, and a second call registers nothing."""
    code = (
        "import torch, mtp_kernels, mtp_kernels.triton as t\n"
        "has = lambda: [torch._C._dispatch_has_kernel_for_dispatch_key(f'mtp::{n}', 'CUDA') for n in t._OPS]\n"
        "before = has(); first = t.register_cuda_kernels(); print(before, first, has(), t.register_cuda_kernels())\n"
    )
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "0"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    before, first, after, second = out.strip().replace("] [", "]|[").split("|")
    every = str([True] * len(triton_mod._OPS))
    if HAS_CUDA:  # already done at import (by the C++ kernels or the Triton ones)
        assert before == after == every and first == second == "[]"
    else:
        assert before == str([False] * len(triton_mod._OPS)) and first == str(list(triton_mod._OPS))
        assert after == every and second == "[]"
        assert "head_attention" in first and "cache_append" in first


@ON_GPU
def test_cuda_backend_is_the_one_built():
    """bench/gpu_check.sh says which backend it built (MTP_EXPECT_CUDA_KERNELS=1: C++ CUDA)."""
    expect = os.environ.get("MTP_EXPECT_CUDA_KERNELS")
    if expect is not None:
        assert mtp_kernels._C.with_cuda == int(expect)
    for name in triton_mod._OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mtp::{name}", "CUDA"), name


@ON_GPU
def test_cuda_kernels_agree_with_triton_large():
    """The dispatched CUDA kernel (C++ when built with MTP_WITH_CUDA) and the Triton one, on a
    real vocabulary, equal each other and the reference."""
    gen = torch.Generator().manual_seed(1)
    for dtype in FLOATS:
        drafts, logits = make_case(gen, 8, 4, 128256, dtype, torch.int64, match_rate=0.8)
        d, lg = drafts.cuda(), logits.cuda()
        a = torch.ops.mtp.verify(d, lg)
        b = triton_mod.verify(d, lg)
        want = reference.verify(drafts, logits)
        for x, y, w in zip(a, b, want):
            assert torch.equal(x.cpu(), w) and torch.equal(y.cpu(), w)
    x = torch.randn(9, 576, device="cuda")
    w = torch.randn(1536, 576, device="cuda")
    y = torch.ops.mtp.linear(x, w)
    assert all(torch.equal(torch.ops.mtp.linear(x[i : i + 1], w), y[i : i + 1]) for i in range(9))


@ON_GPU
def test_cuda_opcheck_and_graph_capture():
    gen = torch.Generator().manual_seed(2)
    drafts, logits = make_case(gen, 3, 4, 500, torch.float32, torch.int64)
    d, lg, nd = drafts.cuda(), logits.cuda(), torch.tensor([4, 0, 2], device="cuda")
    torch.library.opcheck(torch.ops.mtp.verify.default, (d, lg, nd, -1))
    torch.library.opcheck(torch.ops.mtp.accept_prefix.default, (d, lg.argmax(-1), nd))
    # Finite x: opcheck compares eager and traced outputs with NaN != NaN (these logits hold NaN).
    x, w = torch.randn(5, 500, generator=gen).cuda(), torch.randn(8, 500, generator=gen).cuda()
    torch.library.opcheck(torch.ops.mtp.linear.default, (x, w))
    torch.ops.mtp.verify(d, lg, nd)  # warm up (compiles the Triton kernels when they serve CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accepted, out = torch.ops.mtp.verify(d, lg, nd)  # no host sync inside a capture
    lg.copy_(logits.flip(0).cuda())
    graph.replay()
    want = reference.verify(drafts, logits.flip(0), nd.cpu())
    assert torch.equal(accepted.cpu(), want[0]) and torch.equal(out.cpu(), want[1])


# ---------------------------------------------------------------- head_attention, cache_append
# Interpreter sizes: L = 600 is three 256-key chunks (the last partial), so the split-KV merge
# runs; G * T > 16 puts the rows of one kv head in two row blocks.
ATTN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def attn_ops(impl):
    if impl == "triton":
        return triton_mod.head_attention, triton_mod.cache_append
    return torch.ops.mtp.head_attention, torch.ops.mtp.cache_append


def on(device, *ts):
    return [None if t is None else t.to(device) for t in ts]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("causal,S,D", [(False, 0, 64), (True, 0, 40), (False, 3, 40), (True, 2, 64)])
def test_attention_matches_reference(backend, dtype, causal, S, D):
    impl, device = backend
    q, k, v, lens, kl, vl = inputs(B=3, T=3, Hq=6, Hkv=2, L=600, D=D, dtype=dtype, S=S, lens=[600, 3, 257])
    got = attn_ops(impl)[0](*on(device, q, k, v, lens, kl, vl), None, causal)
    assert got.device.type == device and got.shape == q.shape
    close(got.cpu(), reference.head_attention(q, k, v, lens, kl, vl, causal=causal), dtype)


def test_attention_strided_caches_and_scale(backend):
    impl, device = backend
    attn = attn_ops(impl)[0]
    for layout in ("layer", "permuted", "d_strided"):
        q, k, v, lens, kl, vl = inputs(B=2, L=300, layout=layout, S=2, lens=[300, 40], cache_device=device)
        q, lens, kl, vl = on(device, q, lens, kl, vl)
        assert not k.is_contiguous()
        got = attn(q, k, v, lens, kl, vl, 0.3)
        assert torch.equal(got, attn(q, k.contiguous(), v.contiguous(), lens, kl, vl, 0.3)), layout
        close(got.cpu(), reference.head_attention(*on("cpu", q, k, v, lens, kl, vl), scale=0.3), torch.float32)


@pytest.mark.parametrize("causal,S", [(False, 0), (True, 0), (False, 3)])
def test_attention_rows_bitwise_invariant(backend, causal, S):
    """Each (b, t, h) row has the same bits alone (B = 1, T = 1) as in the batch, whatever the
    other requests' lengths; a causal row equals one-token decoding at its position."""
    impl, device = backend
    attn = attn_ops(impl)[0]
    T = 3
    # G = 8, T = 3: 24 rows of one kv head, two row blocks.
    q, k, v, lens, kl, vl = on(device, *inputs(B=3, T=T, Hq=8, Hkv=1, L=600, D=40, S=S, lens=[600, 3, 300]))
    full = attn(q, k, v, lens, kl, vl, None, causal)
    for b in range(3):
        s = slice(b, b + 1)
        assert torch.equal(
            attn(q[s], k[s], v[s], lens[s], *(x if x is None else x[s] for x in (kl, vl)), None, causal), full[s]
        ), b
    other = lens.clone()
    other[1:] = lens[1:].flip(0)
    assert torch.equal(attn(q, k, v, other, kl, vl, None, causal)[0], full[0])
    for t in range(T):
        step_lens = lens - T + t + 1 if causal else lens
        local = [x if x is None else x[:, :, : S - T + t + 1] for x in (kl, vl)]
        one = attn(q[:, t : t + 1], k, v, step_lens, *local, None, causal)
        assert torch.equal(one[:, 0], full[:, t]), t


def test_attention_reads_only_visible_keys(backend):
    """NaN past each request's length, and an inf value that only the last causal query sees:
    no other row may change (an unseen key adds exactly nothing, not 0 * inf)."""
    impl, device = backend
    attn = attn_ops(impl)[0]
    q, k, v, lens, _, _ = inputs(B=2, T=3, L=600, D=40, lens=[520, 20])
    want = attn(*on(device, q, k, v, lens), None, None, None, True)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
        v[b, :, n - 1] = float("inf")  # seen by query T - 1 only
    got = attn(*on(device, q, k, v, lens), None, None, None, True)
    assert torch.equal(got[:, :2], want[:, :2])
    assert torch.isfinite(got[:, :2]).all() and torch.isnan(got[:, 2]).all()  # a seen inf value: a NaN row


@pytest.mark.parametrize("causal,window", [(True, 300), (False, 260), (True, 1)])
def test_attention_window(backend, causal, window):
    """A sliding window: against the reference; a verify row == its one-token step; a request
    alone == in the batch; keys older than every window are not read (NaN there: same bits)."""
    impl, device = backend
    attn = attn_ops(impl)[0]
    T = 3
    q, k, v, lens, _, _ = inputs(B=3, T=T, Hq=4, Hkv=1, L=600, D=40, lens=[600, 3, 290])
    full = attn(*on(device, q, k, v, lens), None, None, None, causal, window=window)
    close(full.cpu(), reference.head_attention(q, k, v, lens, causal=causal, window=window), torch.float32)
    dq, dk, dv, dl = on(device, q, k, v, lens)
    for t in range(T):
        step_lens = dl - T + t + 1 if causal else dl
        one = attn(dq[:, t : t + 1], dk, dv, step_lens, None, None, None, causal, window=window)
        assert torch.equal(one[:, 0], full[:, t]), t
    assert torch.equal(attn(dq[2:], dk[2:], dv[2:], dl[2:], None, None, None, causal, window=window), full[2:])
    for b, n in enumerate(lens.tolist()):
        oldest = max((n - T + 1 if causal else n) - window, 0)
        k[b, :, :oldest] = float("nan")
        v[b, :, :oldest] = float("nan")
    assert torch.equal(attn(*on(device, q, k, v, lens), None, None, None, causal, window=window), full)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf and NaN
@pytest.mark.parametrize("name", list(EXTREME))
def test_attention_extreme_values(backend, name):
    """reference.head_attention's extreme-value contract (test_attention.py: EXTREME), bitwise:
    no key -> zeros, a seen non-finite score (-inf too) or value -> the whole row NaN.
    The interpreter: fp32, D = 40 only (slow); on a GPU every dtype and D = 40, 64, 128."""
    impl, device = backend
    attn = attn_ops(impl)[0]
    for dtype in extreme_dtypes(name) if device == "cuda" else [torch.float32]:
        for D in (40, 64, 128) if device == "cuda" else (40,):
            args, want = extreme_case(name, D, dtype)
            assert_equal_nan(attn(*on(device, *args)).cpu(), want)


def test_attention_no_visible_key_gives_zeros(backend):
    impl, device = backend
    attn = attn_ops(impl)[0]
    q, k, v, _, kl, vl = inputs(B=3, L=50, S=2)
    lens = torch.tensor([0, 50, 0])
    out = attn(*on(device, q, k, v, lens)).cpu()
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert out[1].abs().sum() > 0
    close(
        attn(*on(device, q, k, v, lens, kl, vl)).cpu(), reference.head_attention(q, k, v, lens, kl, vl), torch.float32
    )
    empty = attn(*on(device, q[:, :0], k, v, lens))
    assert empty.shape == (3, 0, 6, 64)


def test_attention_unchecked_lengths_are_clamped(monkeypatch):
    """Under CUDA-graph capture the host cannot check cache_lens: the kernels clamp to [0, L]
    (simulated here by skipping the host check)."""
    q, k, v, _, _, _ = on(DEVICE, *inputs(B=2, L=300, D=40))
    want = triton_mod.head_attention(q, k, v, torch.tensor([300, 0], device=DEVICE))
    monkeypatch.setattr(triton_mod.C, "checked_counts", lambda *args: None)
    assert torch.equal(triton_mod.head_attention(q, k, v, torch.tensor([10**6, -5], device=DEVICE)), want)


@pytest.mark.parametrize("change,message", BAD_ATTENTION)
def test_attention_bad_input(change, message):
    a, _ = _bad(**change)
    with pytest.raises(RuntimeError, match="mtp.head_attention: .*" + message):
        triton_mod.head_attention(**a)


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
def test_cache_append_matches_reference(backend, dtype):
    impl, device = backend
    append = attn_ops(impl)[1]
    gen = torch.Generator().manual_seed(3)
    B, T, Hkv, L, D = 3, 4, 2, 20, 40
    for layout in ("contiguous", "layer", "permuted", "d_strided"):
        k, v = (
            make_cache(B, Hkv, L, D, dtype, layout, gen, device),
            make_cache(B, Hkv, L, D, dtype, layout, gen, device),
        )
        kn = torch.randn(B, T, Hkv, D, generator=gen).to(dtype)
        vn = torch.randn(B, Hkv, T, D, generator=gen).to(dtype).transpose(1, 2)
        kn[0, 1, 0, 3] = float("nan")  # copied as bits
        lens = torch.tensor([0, 7, 16], dtype=torch.int32)
        k_ref, v_ref = k.cpu().clone(), v.cpu().clone()
        reference.cache_append(k_ref, v_ref, kn, vn, lens)
        kd, vd = k, v  # made on the device in their layout
        ptr = kd.data_ptr()
        append(kd, vd, *on(device, kn, vn, lens))
        assert kd.data_ptr() == ptr
        assert torch.equal(triton_mod._raw_bits(kd.cpu().contiguous()), triton_mod._raw_bits(k_ref.contiguous())), (
            layout
        )
        assert torch.equal(vd.cpu(), v_ref), layout


def test_cache_append_overflow_writes_nothing(backend, monkeypatch):
    impl, device = backend
    append = attn_ops(impl)[1]
    # The C++ CUDA kernels check lengths on the device (test_cuda_checks.py); here at the call.
    monkeypatch.setenv("MTP_CUDA_SYNC_CHECKS", "1")
    q, k, v, _, _, _ = on(device, *inputs(B=2, L=10))
    kn, vn = torch.randn(2, 3, 2, 64, device=device), torch.randn(2, 3, 2, 64, device=device)
    k0, v0 = k.clone(), v.clone()
    lens = torch.tensor([0, 8], device=device)
    with pytest.raises(RuntimeError, match=r"mtp.cache_append: request 1 would pass the cache capacity.*L = 10"):
        append(k, v, kn, vn, lens)
    assert torch.equal(k, k0) and torch.equal(v, v0)
    if impl == "triton":  # the kernel's own guard, as under CUDA-graph capture (no host check)
        monkeypatch.setattr(triton_mod.C, "checked_counts", lambda *args: None)
        append(k, v, kn, vn, lens)
        assert torch.equal(k, k0) and torch.equal(v, v0)
        append(k, v, kn, vn, torch.tensor([0, 7], device=device))
        assert torch.equal(k[1, :, 7:10], kn[1].transpose(0, 1))


@pytest.mark.parametrize("change,message", BAD_APPEND)
def test_cache_append_bad_input(change, message):
    a = dict(
        k_cache=torch.zeros(2, 2, 20, 64),
        v_cache=torch.zeros(2, 2, 20, 64),
        k_new=torch.zeros(2, 3, 2, 64),
        v_new=torch.zeros(2, 3, 2, 64),
        cache_lens=torch.tensor([0, 5]),
    )
    a.update(change)
    with pytest.raises(RuntimeError, match="mtp.cache_append: .*" + message):
        triton_mod.cache_append(**a)


@ON_GPU
def test_cuda_attention_long_cache_agrees():
    """A long cache (split over many chunks), GQA 4:1, bf16: the dispatched kernel and the Triton
    one against the reference, and each bitwise shape-invariant on the GPU."""
    q, k, v, lens, kl, vl = on(
        "cuda", *inputs(B=2, T=4, Hq=16, Hkv=4, L=5000, D=128, dtype=torch.bfloat16, S=4, lens=[5000, 2100])
    )
    want = reference.head_attention(*on("cpu", q, k, v, lens, kl, vl), causal=True)
    for attn in attn_ops("op")[0], attn_ops("triton")[0]:
        full = attn(q, k, v, lens, kl, vl, None, True)
        close(full.cpu(), want, torch.bfloat16)
        one = attn(q[1:, 3:], k[1:], v[1:], lens[1:], kl[1:], vl[1:], None, True)
        assert torch.equal(one[:, 0], full[1:, 3])


@ON_GPU
def test_cuda_attention_opcheck_and_graph_capture():
    q, k, v, lens, kl, vl = on("cuda", *inputs(B=2, T=2, L=700, S=2, layout="permuted", lens=[300, 20]))
    torch.library.opcheck(torch.ops.mtp.head_attention.default, (q, k, v, lens, kl, vl, None, True))
    kn, vn = torch.randn(2, 2, 2, 64, device="cuda"), torch.randn(2, 2, 2, 64, device="cuda")
    torch.library.opcheck(torch.ops.mtp.cache_append.default, (k.clone(), v.clone(), kn, vn, lens))

    def step():
        torch.ops.mtp.cache_append(k, v, kn, vn, lens)
        return torch.ops.mtp.head_attention(q, k, v, lens + 2, kl, vl, None, True)

    step()  # warm up (compiles the Triton kernels when they serve CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()  # no host sync inside a capture
    lens.copy_(torch.tensor([500, 100]))
    kn.normal_()
    graph.replay()
    kc, vc = k.cpu(), v.cpu()
    assert torch.equal(kc[0, :, 500:502], kn[0].transpose(0, 1).cpu())
    close(
        out.cpu(),
        reference.head_attention(q.cpu(), kc, vc, lens.cpu() + 2, kl.cpu(), vl.cpu(), causal=True),
        torch.float32,
    )
    lens.copy_(torch.tensor([699, 100]))  # 699 + 2 > L: the replay writes nothing
    k_before = k.clone()
    graph.replay()
    assert torch.equal(k, k_before)
    if mtp_kernels._C.with_cuda:  # the C++ kernels recorded both lengths (test_cuda_checks.py)
        with pytest.raises(RuntimeError, match=re.escape("mtp.head_attention: cache_lens must lie in")):
            mtp_kernels.cuda_check()
        with pytest.raises(
            RuntimeError,
            match=re.escape("mtp.cache_append: cache_lens must lie in [0, L - T], got cache_lens[0] = 699"),
        ):
            mtp_kernels.cuda_check()
        mtp_kernels.cuda_check()


# ---------------------------------------------------------------- verify_sampled
# The Triton kernel mirrors verify_sampled.h step for step: its tokens must equal the CPU op's
# (torch.equal), not merely follow the same distribution.


def sampled_case(gen, B, K, V, dtype, id_dtype, with_q, q_dtype=None):
    drafts, logits = make_case(gen, B, K, V, dtype, id_dtype, match_rate=0.6)
    drafts[:, ::3] = torch.randint(-1, V + 1, drafts[:, ::3].shape, generator=gen, dtype=drafts.dtype)
    q = None
    if with_q:
        q = torch.softmax(torch.randn(B, K, V, generator=gen) * 2, -1).to(q_dtype or dtype)
    temp = torch.rand(B, generator=gen) * 2
    temp[::3] = 0.0
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
    offsets = torch.randint(0, 10**6, (B,), generator=gen)
    nd = torch.randint(0, K + 1, (B,), generator=gen)
    return drafts, q, logits, temp, seeds, offsets, nd


def check_sampled(backend, *args, pad_id=-1):
    """args: verify_sampled's up to num_drafts, or all of them (pad_id given among them)."""
    impl, device = backend
    fn = triton_mod.verify_sampled if impl == "triton" else torch.ops.mtp.verify_sampled
    args = args if len(args) > 7 else (*args, pad_id)
    want = torch.ops.mtp.verify_sampled(*args)  # the CPU op
    got = fn(*[a.to(device) if isinstance(a, torch.Tensor) else a for a in args])
    for g, w in zip(got, want):
        assert g.device.type == device and g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w), (g, w)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot", "draft_probs"])
def test_verify_sampled_equals_cpu_op(backend, gen, dtype, with_q):
    for B, K, V, id_dtype in [
        (0, 2, 5, torch.int64),
        (3, 0, 40, torch.int32),
        (4, 1, 300, torch.int64),
        (5, 4, 700, torch.int32),
        (2, 2, 1, torch.int64),
    ]:
        drafts, q, logits, temp, seeds, offsets, nd = sampled_case(gen, B, K, V, dtype, id_dtype, with_q)
        check_sampled(backend, drafts, q, logits, temp, seeds, offsets, nd, pad_id=7)
        check_sampled(backend, drafts, q, logits, temp, seeds, None, None)


def test_verify_sampled_mixed_dtypes_strides_and_special_rows(backend, gen):
    """bf16 logits with fp16 draft_probs; strided views; rows with NaN, +inf, all -inf, ties;
    high temperatures (flat rows: every block matters) and near-greedy ones."""
    B, K, V = 6, 3, 600
    big = torch.randn(B, 2 * (K + 1), V + 5, generator=gen).bfloat16()
    logits = big[:, ::2, 3 : 3 + V]
    logits[0, 1, 17] = float("nan")
    logits[1, 0, 599] = float("inf")
    logits[2, 2] = float("-inf")
    logits[3, 0, :] = 1.0
    q = torch.softmax(torch.randn(V, K, B, generator=gen), 0).permute(2, 1, 0).half()
    drafts = torch.randint(0, V, (K, B), generator=gen).t()
    temp = torch.tensor([1.0, 0.7, 50.0, 1e-3, 3.0, 0.0])
    seeds, offsets = torch.arange(B) * 977, torch.arange(B) + 5
    for probs in (None, q):
        check_sampled(backend, drafts, probs, logits, temp, seeds, offsets, None)


@pytest.mark.parametrize("with_q", [False, True], ids=["onehot", "draft_probs"])
def test_verify_sampled_filters_equal_cpu_op(backend, gen, with_q):
    """top_k / top_p / min_p: the cuts (bit searches over keys, dense sums) and the filtered
    draws are the CPU op's bits; ties at the cuts, a point-mass row, every filter off."""
    B, K, V = 6, 2, 300
    drafts, q, logits, temp, seeds, offsets, nd = sampled_case(gen, B, K, V, torch.float32, torch.int64, with_q)
    logits[1, 0, :5] = logits[1, 0].max()  # a tie at the top: top_p's edge
    logits[2, 1, 17] = float("nan")
    temp[:] = torch.tensor([0.9, 1.0, 0.5, 2.0, 0.0, 1.3])
    top_k = torch.tensor([0, 3, 40, 1, 5, 0])
    top_p = torch.tensor([0.7, 0.05, 1.0, 0.95, 0.5, 1.0])
    min_p = torch.tensor([0.0, 0.1, 0.01, 0.0, 0.2, 0.0])
    check_sampled(backend, drafts, q, logits, temp, seeds, offsets, nd, -1, top_k, top_p, min_p)
    check_sampled(backend, drafts, q, logits, temp, seeds, offsets, nd, -1, top_k.int(), None, None)


@pytest.mark.parametrize("with_q", [False, True], ids=["onehot", "draft_probs"])
def test_verify_sampled_ragged_equals_cpu_op(backend, gen, with_q):
    """The flattened layout (HAS_FIRST): per-request drafts, q rows and logits rows, the CPU
    op's bits; K_b = 0 among others, filters on and off, strided views, max_num_drafts."""
    impl, device = backend
    fn = triton_mod.verify_sampled_ragged if impl == "triton" else torch.ops.mtp.verify_sampled_ragged
    for counts, V, dtype, filt, width in [
        ([2, 0, 3], 300, torch.float32, True, None),
        ([0, 1, 0, 2], 40, torch.bfloat16, False, 4),
        ([], 5, torch.float32, True, None),
    ]:
        flat, _, filters = ragged_case(gen, counts, V, dtype, torch.int64, with_q, filt)
        if counts:
            flat = (flat[0].int(), flat[1], flat[2], flat[3].t().contiguous().t(), *flat[4:])
        want = torch.ops.mtp.verify_sampled_ragged(*flat, 7, **filters, max_num_drafts=width)

        def to(t):
            return t.to(device) if isinstance(t, torch.Tensor) else t

        got = fn(*[to(a) for a in flat], 7, **{k: to(v) for k, v in filters.items()}, max_num_drafts=width)
        for g, w in zip(got, want):
            assert g.device.type == device and g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g.cpu(), w), (g, w)


@pytest.mark.parametrize("change,message", BAD_SAMPLED_RAGGED[:8], ids=[m[:40] for _, m in BAD_SAMPLED_RAGGED[:8]])
def test_verify_sampled_ragged_bad_input(change, message):
    with pytest.raises(RuntimeError, match=r"mtp\.verify_sampled_ragged: .*" + re.escape(message)):
        triton_mod.verify_sampled_ragged(**sampled_ragged_args(**change))


def test_verify_sampled_temperature_zero_is_verify(backend, gen):
    drafts, _, logits, _, seeds, _, nd = sampled_case(gen, 5, 3, 300, torch.float32, torch.int64, False)
    impl, device = backend
    fn = triton_mod.verify_sampled if impl == "triton" else torch.ops.mtp.verify_sampled
    got = fn(
        drafts.to(device),
        None,
        logits.to(device),
        torch.zeros(5, device=device),
        seeds.to(device),
        None,
        nd.to(device),
        9,
    )
    want = reference.verify(drafts, logits, nd, 9)
    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want))


BAD_SAMPLED = [
    (dict(temperature=torch.tensor([1.0, -0.5])), "temperature must be finite and >= 0, got temperature[1] = -0.5"),
    (dict(temperature=torch.ones(3)), "temperature.size(0) must equal B"),
    (dict(seeds=torch.zeros(2, dtype=torch.int32)), "seeds must be Long"),
    (dict(offsets=torch.zeros(1, dtype=torch.long)), "offsets.size(0) must equal B"),
    (dict(num_drafts=torch.tensor([0, 4])), "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 4"),
    (dict(draft_probs=torch.zeros(2, 3, 9)), "draft_probs.size(2) must equal V"),
    (dict(draft_probs=torch.full((2, 3, 10), float("nan"))), "draft_probs must be probabilities"),
    (dict(target_logits=torch.zeros(2, 3, 10)), "target_logits.size(1) must equal K+1"),
]


@pytest.mark.parametrize("override,message", BAD_SAMPLED, ids=[m for _, m in BAD_SAMPLED])
def test_verify_sampled_bad_input(override, message):
    args = dict(
        draft_tokens=torch.zeros(2, 3, dtype=torch.long),
        draft_probs=None,
        target_logits=torch.zeros(2, 4, 10),
        temperature=torch.ones(2),
        seeds=torch.zeros(2, dtype=torch.long),
        offsets=None,
        num_drafts=None,
    )
    args.update(override)
    for fn in (triton_mod.verify_sampled, torch.ops.mtp.verify_sampled):
        with pytest.raises(RuntimeError, match=r"mtp\.verify_sampled: .*" + re.escape(message)):
            fn(*args.values())


import triton  # noqa: E402  (importable: mtp_kernels.triton was)
import triton.language as tl  # noqa: E402

from mtp_kernels.triton.kernels.verify_sampled import exp_fixed  # noqa: E402


@triton.jit
def _exp_fixed_kernel(y, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, exp_fixed(tl.load(y + i)))


def test_exp_fixed_bits_equal_reference():
    """The Triton exp_fixed gives reference.exp_fixed's bits (the C++ one is its mirror)."""
    y = torch.cat(
        [
            -torch.rand(4093, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 720,
            torch.tensor([0.0, -708.0, float("-inf")], dtype=torch.float64),
        ]
    )
    out = torch.empty_like(y, device=DEVICE)
    # As verify_sampled's launcher: no FMA contraction on a GPU (the interpreter rejects the option).
    opts = {"enable_fp_fusion": False} if DEVICE == "cuda" else {}
    _exp_fixed_kernel[(1,)](y.to(DEVICE), out, N=4096, **opts)
    want = reference.exp_fixed(y)
    assert torch.equal(out.cpu().view(torch.int64), want.view(torch.int64))
    ok = y >= -708  # below: 0 (< 1e-307)
    assert torch.allclose(want[ok], torch.exp(y[ok]), rtol=4e-16, atol=0) and not want[~ok].any()


def test_kernels_read_only_constexpr_globals():
    """A @triton.jit body may read a module-level value only as a tl.constexpr (or a module,
    another kernel function, a builtin): the GPU compiler refuses a plain int global, while
    the interpreter accepts it, so this is checked here, without a GPU."""
    import ast
    import builtins
    import importlib
    import inspect
    import pkgutil

    import mtp_kernels.triton.kernels as kernels
    from triton.runtime.jit import KernelInterface

    allowed = (tl.constexpr, KernelInterface, type(tl))
    bad, checked = [], 0
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if not (isinstance(obj, KernelInterface) and obj.fn.__module__ == module.__name__):
                continue
            checked += 1
            fn = ast.parse(inspect.getsource(obj.fn).lstrip()).body[0]
            body = [*fn.args.args, *fn.body]  # not the decorator's arguments: those run in Python
            names = [n for part in body for n in ast.walk(part) if isinstance(n, ast.Name)]
            local = {a.arg for a in fn.args.args} | {n.id for n in names if isinstance(n.ctx, ast.Store)}
            for n in names:
                if n.id in local or hasattr(builtins, n.id):
                    continue
                value = obj.fn.__globals__[n.id]
                if not isinstance(value, allowed):
                    bad.append(f"{module.__name__}.{name} reads {n.id} = {value!r}")
    assert checked >= 10 and not bad, bad

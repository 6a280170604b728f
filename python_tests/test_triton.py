"""Triton (and, on a GPU, C++ CUDA) kernels of verify, accept_prefix and linear against
reference.py: verify/accept_prefix bitwise, linear within tolerance and bitwise
shape-invariant.

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
from test_linear import BAD_LINEAR
from test_verify import BAD_VERIFY, FLOATS, IDS, accept_cases, make_case

triton_mod = pytest.importorskip("mtp_kernels.triton")

HAS_CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CPU = pytest.mark.skipif(not INTERPRETED, reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (no GPU here)")
ON_GPU = pytest.mark.skipif(not HAS_CUDA, reason="GPU-only: needs CUDA (run by bench/gpu_check.sh)")

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
    to = (lambda t: None if t is None else t.to(device))
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
        logits[b, n + 1:] = float("nan")
    check_verify(backend, drafts, logits, num_drafts)


def test_verify_strided_logits(backend, gen):
    B, K, V = 3, 2, 1500
    big = torch.randn(B, 2 * (K + 1), V + 50, generator=gen)
    sliced = big[:, ::2, 17:17 + V]
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
        a[0, i] = a[0, j] = 3.0                      # tie: the first wins
        a[1, j] = float("nan")                       # NaN beats +inf
        a[1, i] = float("inf")
        a[2, i] = a[2, j] = float("inf")             # tied infinities
        a[3] = float("-inf")                         # all -inf -> 0
        b.fill_(-1.0)
        b[0, j] = 0.0                                # +0.0 later ...
        b[0, i] = -0.0                               # ... ties -0.0 earlier
        b[1, i] = b[1, j] = float("nan")             # two NaN: the first
        drafts[2 * p] = torch.tensor([i, j, i])
        drafts[2 * p + 1] = torch.tensor([i, i, 0])
    return drafts, logits


@pytest.mark.parametrize("splits,block_v", [(1, 64), (2, 64), (3, 32), (5, 16)])
def test_verify_merge_of_slices_is_exact(splits, block_v):
    """Forced vocabulary slicings and tiles, with the planted values on their edges."""
    pairs = [(0, 1), (0, 299), (63, 64), (100, 200), (127, 128), (298, 299)]
    device = "cuda" if HAS_CUDA else "cpu"
    for dtype in FLOATS:
        drafts, logits = edge_case_logits(dtype, 300, pairs)
        want = reference.verify(drafts, logits)
        got = triton_mod.verify(drafts.to(device), logits.to(device), splits=splits, block_v=block_v)
        assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want)), (dtype, got, want)


def test_verify_edge_values_default_slicing(backend):
    for dtype in FLOATS:
        drafts, logits = edge_case_logits(dtype, 3000, [(0, 2999), (1023, 1024), (2047, 2048)])
        check_verify(backend, drafts, logits)


@pytest.mark.parametrize("id_dtype,target_dtype", [(torch.int32, torch.int64), (torch.int64, torch.int32),
                                                     (torch.int64, torch.int64)])
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
    for target, nd, message in [(torch.zeros(2, 5, dtype=torch.long), None, "target_tokens.size(1) must be K+1 = 4 or K = 3, got 5"),
                                (torch.zeros(2, 4), None, "target_tokens must be Int or Long, got Float"),
                                (torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 9]), "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 9")]:
        with pytest.raises(RuntimeError, match=r"mtp\.accept_prefix: .*" + re.escape(message)):
            triton_mod.accept_prefix(d, target, nd)


LINEAR_DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("x_dtype", LINEAR_DTYPES)
@pytest.mark.parametrize("w_dtype", LINEAR_DTYPES)
def test_linear_against_reference(backend, gen, x_dtype, w_dtype):
    impl, device = backend
    linear = ops_of(impl)[2]
    for N, K in [(70, 150), (5, 7), (3, 1), (33, 64)]:
        for M in (1, 3, 6):
            x = torch.randn(M, K, generator=gen).to(x_dtype)
            w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(w_dtype)
            bias = torch.randn(N, generator=gen) if M % 2 else None
            got = linear(x.to(device), w.to(device), None if bias is None else bias.to(device))
            want = reference.linear(x, w, bias)
            assert got.dtype == x_dtype and got.shape == (M, N) and got.device.type == device
            tol = dict(rtol=1e-5, atol=1e-6 * K) if x_dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-3)
            torch.testing.assert_close(got.cpu(), want, **tol)


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float32, torch.bfloat16)])
def test_linear_shape_invariance_bitwise(backend, gen, x_dtype, w_dtype):
    impl, device = backend
    linear = ops_of(impl)[2]
    N, K = 70, 64 * 2 + 19  # tails in both dimensions
    x = torch.randn(11, K, generator=gen).to(x_dtype).to(device)
    w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(w_dtype).to(device)
    bias = torch.randn(N, generator=gen).to(device)
    full = linear(x, w, bias)
    for i in range(11):
        assert torch.equal(linear(x[i:i + 1], w, bias), full[i:i + 1]), i
    for start, M in [(0, 2), (3, 3), (2, 5), (1, 9)]:
        assert torch.equal(linear(x[start:start + M], w, bias), full[start:start + M]), M
    assert torch.equal(linear(x.reshape(11, 1, K), w, bias).reshape(11, N), full)


def test_linear_layout_and_degenerate(gen):
    x = torch.randn(2, 3, 100, generator=gen)
    w = torch.randn(40, 100, generator=gen)
    full = triton_mod.linear(x, w)
    assert full.shape == (2, 3, 40)
    strided = torch.randn(2, 3, 300, generator=gen)[..., 7:107]
    strided.copy_(x)
    assert torch.equal(triton_mod.linear(strided, w), full)
    big = torch.randn(40, 150, generator=gen)
    big[:, :100] = w
    assert torch.equal(triton_mod.linear(x, big[:, :100]), full)  # weight row stride 150, read in place
    assert triton_mod.linear(torch.randn(0, 3), torch.randn(4, 3)).shape == (0, 4)
    assert triton_mod.linear(torch.randn(2, 3), torch.randn(0, 3)).shape == (2, 0)
    assert torch.equal(triton_mod.linear(torch.randn(2, 0), torch.randn(4, 0), torch.ones(4)), torch.ones(2, 4))


@pytest.mark.parametrize("args,message", BAD_LINEAR)
def test_linear_bad_input(args, message):
    with pytest.raises(RuntimeError, match="mtp.linear: .*" + re.escape(message)):
        triton_mod.linear(*args)


def test_register_cuda_kernels_fills_only_missing_keys():
    """In a fresh process: the Triton launchers become the ops' CUDA kernels when none is
    compiled in, and a second call registers nothing."""
    code = (
        "import torch, mtp_kernels, mtp_kernels.triton as t\n"
        "has = lambda: [torch._C._dispatch_has_kernel_for_dispatch_key(f'mtp::{n}', 'CUDA') for n in t._OPS]\n"
        "before = has(); first = t.register_cuda_kernels(); print(before, first, has(), t.register_cuda_kernels())\n")
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "0"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    before, first, after, second = out.strip().replace("] [", "]|[").split("|")
    if HAS_CUDA:  # already done at import (by the C++ kernels or the Triton ones)
        assert before == after == "[True, True, True]" and first == second == "[]"
    else:
        assert before == "[False, False, False]" and first == "['verify', 'accept_prefix', 'linear']"
        assert after == "[True, True, True]" and second == "[]"


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
    assert all(torch.equal(torch.ops.mtp.linear(x[i:i + 1], w), y[i:i + 1]) for i in range(9))


@ON_GPU
def test_cuda_opcheck_and_graph_capture():
    gen = torch.Generator().manual_seed(2)
    drafts, logits = make_case(gen, 3, 4, 500, torch.float32, torch.int64)
    d, lg, nd = drafts.cuda(), logits.cuda(), torch.tensor([4, 0, 2], device="cuda")
    torch.library.opcheck(torch.ops.mtp.verify.default, (d, lg, nd, -1))
    torch.library.opcheck(torch.ops.mtp.accept_prefix.default, (d, lg.argmax(-1), nd))
    torch.library.opcheck(torch.ops.mtp.linear.default, (lg[0], torch.randn(8, 500, device="cuda")))
    torch.ops.mtp.verify(d, lg, nd)  # warm up (compiles the Triton kernels when they serve CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accepted, out = torch.ops.mtp.verify(d, lg, nd)  # no host sync inside a capture
    lg.copy_(logits.flip(0).cuda())
    graph.replay()
    want = reference.verify(drafts, logits.flip(0), nd.cpu())
    assert torch.equal(accepted.cpu(), want[0]) and torch.equal(out.cpu(), want[1])

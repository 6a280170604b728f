"""mtp.verify_ragged (the flattened ragged layout of continuous batching) against reference.py,
bitwise, and against padding + mtp.verify on the same work; the Triton kernels under the
interpreter; opcheck, torch.compile; every bad-input message."""

import os
import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_verify import FLOATS, IDS, make_case

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def flatten(drafts, logits, counts, cu_dtype=torch.int64):
    """verify's padded [B, K] drafts and [B, K+1, V] logits, request b cut to its counts[b]
    drafts and counts[b] + 1 rows, as the flattened (draft_token_ids, cu, target_logits)."""
    V = logits.shape[2]
    flat_d = torch.cat([drafts[b, :k] for b, k in enumerate(counts)] + [drafts.new_zeros(0)])
    flat_l = torch.cat([logits[b, : k + 1] for b, k in enumerate(counts)] + [logits.new_zeros(0, V)])
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(cu_dtype)
    return flat_d, cu, flat_l


def make_ragged(gen, counts, V, dtype, id_dtype, match_rate=0.7, cu_dtype=torch.int64):
    """A flattened case with test_verify's planted ties, NaN, -inf and signed zeros; also its
    padded form (drafts [B, K], logits [B, K+1, V], K = the widest request)."""
    drafts, logits = make_case(gen, len(counts), max(counts, default=0), V, dtype, id_dtype, match_rate)
    return flatten(drafts, logits, counts, cu_dtype), (drafts, logits)


def check_ragged(d, cu, lg, pad_id=-1, max_num_drafts=None, fn=None):
    got = (fn or torch.ops.mtp.verify_ragged)(d, cu, lg, pad_id, max_num_drafts)
    want = reference.verify_ragged(d, cu, lg, pad_id, max_num_drafts)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == d.dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)
    return got


COUNTS = [
    [],
    [0],
    [0, 0, 0],
    [3],
    [2, 0, 5, 1],
    [0, 4, 0],
    [1] * 9,
    [8, 0, 3, 0, 0, 6, 2, 7],
]


def test_example_from_contract():
    # Request 0: drafts [1, 2, 3], backbone [1, 5, 3, 4]; request 1: no drafts, backbone [9];
    # request 2: drafts [7, 8], backbone [7, 8, 2] (a full match and its bonus token).
    drafts = torch.tensor([1, 2, 3, 7, 8])
    cu = torch.tensor([3, 3, 5])
    logits = torch.zeros(5 + 3, 10)
    for row, tok in enumerate([1, 5, 3, 4, 9, 7, 8, 2]):
        logits[row, tok] = 1.0
    accepted, out = torch.ops.mtp.verify_ragged(drafts, cu, logits)
    assert accepted.tolist() == [1, 0, 2]
    assert out.tolist() == [[1, 5, -1, -1], [9, -1, -1, -1], [7, 8, 2, -1]]
    accepted, out = mtp_kernels.verify_ragged(drafts, cu, logits, pad_id=0, max_num_drafts=5)
    assert out.tolist() == [[1, 5, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0], [7, 8, 2, 0, 0, 0]]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_against_reference_and_padded_verify(isa, gen, dtype, id_dtype):
    for i, counts in enumerate(COUNTS):
        for V in (1, 7, 300, 2049):
            cu_dtype = IDS[(i + V) % 2]
            (d, cu, lg), (pd, pl) = make_ragged(gen, counts, V, dtype, id_dtype, cu_dtype=cu_dtype)
            got = check_ragged(d, cu, lg)
            # The same work as verify on the padded batch, num_drafts = the counts.
            nd = torch.tensor(counts, dtype=torch.int64)
            want = torch.ops.mtp.verify(pd, pl, nd)
            assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_uneven_drafts_large_vocab(isa, gen):
    """The benchmark's shape: B = 32, K_b uniform in 0..8, V = 49152, bf16."""
    counts = torch.randint(0, 9, (32,), generator=gen).tolist()
    (d, cu, lg), (pd, pl) = make_ragged(gen, counts, 49152, torch.bfloat16, torch.int64, match_rate=0.9)
    got = check_ragged(d, cu, lg)
    want = torch.ops.mtp.verify(pd, pl, torch.tensor(counts))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("id_dtype", IDS)
def test_max_num_drafts_and_pad(isa, gen, id_dtype):
    counts = [2, 0, 5, 1, 3]
    (d, cu, lg), _ = make_ragged(gen, counts, 1500, torch.float32, id_dtype, match_rate=0.9)
    for cap in (5, 6, 11):
        for pad in (-1, 0, 49151):
            accepted, out = check_ragged(d, cu, lg, pad, cap)
            assert out.shape == (5, cap + 1)
            assert (out[:, 6:] == pad).all()
    # int64 ids take any int64 pad_id
    if id_dtype == torch.int64:
        check_ragged(d, cu, lg, -(2**63), 5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_strided_inputs_are_read_in_place(isa, gen, dtype):
    counts = [3, 0, 2, 4]
    (d, cu, lg), _ = make_ragged(gen, counts, 3000, dtype, torch.int64)
    R, V = lg.shape
    # Logits rows as a slice of a bigger buffer (row stride > V, unit vocabulary stride).
    big = torch.full((2 * R, V + 50), float("nan"), dtype=dtype)
    rows = big[::2, 17 : 17 + V]
    rows.copy_(lg)
    assert not rows.is_contiguous()
    # Vocabulary not unit-stride: a [V, R] buffer seen as [R, V].
    transposed = torch.empty(V, R, dtype=dtype).t()
    transposed.copy_(lg)
    # Drafts and cu with stride 2, cu as int32.
    d2 = torch.full((2 * d.numel(),), -7, dtype=d.dtype)[::2]
    d2.copy_(d)
    cu2 = torch.zeros(2 * cu.numel(), dtype=torch.int32)[::2]
    cu2.copy_(cu)
    want = reference.verify_ragged(d, cu, lg)
    for logits in (rows, transposed):
        for drafts, cus in ((d, cu), (d2, cu2)):
            got = check_ragged(drafts, cus, logits)
            assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_every_tie_and_nan_position(isa):
    """Small rows across the 256-element vector block: tie pairs, NaN, infinities, per request."""
    V = 300
    for dtype in FLOATS:
        for i, j in [(0, 1), (0, 299), (255, 256), (100, 200), (256, 299), (298, 299)]:
            logits = torch.zeros(3 + 2, V, dtype=dtype)  # requests of 2 and 1 drafts
            logits[0, i] = logits[0, j] = 3.0
            logits[1, j] = float("nan")
            logits[1, i] = float("inf")
            logits[2, i] = logits[2, j] = float("inf")
            logits[3, (i + j) // 2 + 1] = float("nan")
            logits[4, i] = logits[4, j] = -0.0
            logits[4, (i + j) // 2] = float("-inf")
            check_ragged(torch.tensor([i, j, j]), torch.tensor([2, 3]), logits)


def test_thread_count_does_not_change_result(gen, threads):
    (d, cu, lg), _ = make_ragged(gen, [0, 3, 1], 100_000, torch.float32, torch.int64)
    many = torch.ops.mtp.verify_ragged(d, cu, lg)
    torch.set_num_threads(1)
    one = torch.ops.mtp.verify_ragged(d, cu, lg)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


def test_empty_batches():
    for id_dtype in IDS:
        empty = torch.zeros(0, dtype=id_dtype)
        accepted, out = check_ragged(empty, torch.zeros(0, dtype=torch.int64), torch.zeros(0, 5))
        assert accepted.shape == (0,) and out.shape == (0, 1)
        accepted, out = check_ragged(empty, torch.zeros(0, dtype=torch.int32), torch.zeros(0, 5), -1, 3)
        assert out.shape == (0, 4)
        # N = 0: every request is only its bonus row.
        logits = torch.zeros(3, 5)
        logits[1, 4] = 1.0
        accepted, out = check_ragged(empty, torch.zeros(3, dtype=torch.int64), logits)
        assert accepted.tolist() == [0, 0, 0] and out.tolist() == [[0], [4], [0]]


def test_opcheck(gen):
    (d, cu, lg), _ = make_ragged(gen, [2, 0, 3], 500, torch.float32, torch.int64)
    op = torch.ops.mtp.verify_ragged.default
    torch.library.opcheck(op, (d, cu, lg, -1, 4))
    torch.library.opcheck(op, (d.int(), cu.int(), lg.bfloat16(), 0, 3))
    torch.library.opcheck(op, (d, cu, lg), test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph(gen):
    counts = [2, 0, 3, 1]
    (d, cu, lg), _ = make_ragged(gen, counts, 1000, torch.float32, torch.int64)

    @torch.compile(fullgraph=True)
    def step(d, cu, lg):
        accepted, out = mtp_kernels.verify_ragged(d, cu, lg * 2.0, max_num_drafts=8)
        return accepted + 1, out

    accepted, out = step(d, cu, lg)
    want_acc, want_out = reference.verify_ragged(d, cu, lg * 2.0, max_num_drafts=8)
    assert out.shape == (4, 9)
    assert torch.equal(accepted, want_acc + 1) and torch.equal(out, want_out)


def test_fake_width_without_max_is_dynamic(gen):
    """Without max_num_drafts the fake kernel's width is an unbacked size (cu's values decide)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    (d, cu, lg), _ = make_ragged(gen, [2, 0, 3], 50, torch.float32, torch.int64)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fd, fcu, flg = (mode.from_tensor(t) for t in (d, cu, lg))
        accepted, out = torch.ops.mtp.verify_ragged(fd, fcu, flg)
        assert accepted.shape[0] == 3 and out.shape[0] == 3
        assert isinstance(out.shape[1], torch.SymInt)
        _, out = torch.ops.mtp.verify_ragged(fd, fcu, flg, -1, 7)
        assert out.shape[1] == 8


# ---------------------------------------------------------------- Triton (interpreter)
@pytest.fixture
def triton_mod():
    if not INTERPRETED:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 (no GPU here)")
    return pytest.importorskip("mtp_kernels.triton")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_triton_against_reference(triton_mod, gen, dtype, id_dtype):
    for counts, V in (([], 5), ([0], 3), ([2, 0, 5, 1], 300), ([0, 0], 7), ([3, 1, 0, 2], 2500)):
        (d, cu, lg), _ = make_ragged(gen, counts, V, dtype, id_dtype)
        check_ragged(d, cu, lg, fn=triton_mod.verify_ragged)
        check_ragged(d, cu.int(), lg, 7, 6, fn=triton_mod.verify_ragged)


@pytest.mark.parametrize("splits,block_v", [(1, 64), (3, 64), (5, 32)])
def test_triton_slices_strides_and_edge_values(triton_mod, gen, splits, block_v):
    (d, cu, lg), _ = make_ragged(gen, [1, 3, 0, 2], 700, torch.bfloat16, torch.int64, match_rate=0.9)
    transposed = torch.empty(lg.shape[1], lg.shape[0], dtype=lg.dtype).t()
    transposed.copy_(lg)
    d2 = torch.zeros(2 * d.numel(), dtype=d.dtype)[::2]
    d2.copy_(d)
    for logits, drafts in ((lg, d), (transposed, d2)):
        got = triton_mod.verify_ragged(drafts, cu, logits, splits=splits, block_v=block_v)
        want = reference.verify_ragged(d, cu, lg)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_triton_clamps_an_unchecked_layout(triton_mod):
    """What the kernels get under CUDA-graph capture (cu not checked): clamped, in range."""
    counts, first, rows = triton_mod.ragged_device_layout(torch.tensor([3, 1, 9, -2]), 4, 4)
    N, B = 4, 4
    assert (first >= 0).all() and (first <= N).all()
    assert ((first + counts) <= N).all() and (counts <= 3).all()
    assert ((rows + counts) <= N + B - 1).all()


# ---------------------------------------------------------------- bad input
def _args(**change):
    args = dict(
        d=torch.tensor([1, 2, 3, 4], dtype=torch.int32),
        cu=torch.tensor([2, 2, 4]),
        lg=torch.zeros(7, 5),
        pad_id=-1,
        max_num_drafts=None,
    )
    args.update(change)
    return args


BAD_RAGGED = [
    (_args(d=torch.zeros(4)), "draft_token_ids must be Int or Long, got Float"),
    (_args(d=torch.zeros(2, 2, dtype=torch.long)), "draft_token_ids must be 1-D [N], got shape [2, 2]"),
    (_args(cu=torch.tensor([2.0, 2.0, 4.0])), "cu_num_draft_tokens must be Int or Long"),
    (_args(cu=torch.tensor([[2, 2, 4]])), "cu_num_draft_tokens must be 1-D [B]"),
    (_args(lg=torch.zeros(7, 5, dtype=torch.float64)), "target_logits must be Float or BFloat16 or Half, got Double"),
    (_args(lg=torch.zeros(1, 7, 5)), "target_logits must be 2-D [N + B, V]"),
    (
        _args(lg=torch.zeros(6, 5)),
        "target_logits.size(0) must equal N + B (N = 4 drafts plus one bonus row per request, B = 3) = 7, got 6",
    ),
    (_args(lg=torch.zeros(7, 0)), "target_logits must have a vocabulary of V >= 1 entries, got V = 0"),
    (
        _args(cu=torch.tensor([2, 1, 4])),
        "cu_num_draft_tokens must hold non-decreasing inclusive cumulative counts, got cu_num_draft_tokens[1] = 1 "
        "< cu_num_draft_tokens[0] = 2: request 1 would have -1 drafts",
    ),
    (
        _args(cu=torch.tensor([-1, 2, 4])),
        "got cu_num_draft_tokens[0] = -1 < 0: request 0 would have -1 drafts",
    ),
    (
        _args(cu=torch.tensor([2, 2, 3])),
        "cu_num_draft_tokens must end at N (draft_token_ids.size(0)) = 4, got cu_num_draft_tokens[2] = 3",
    ),
    (
        _args(cu=torch.tensor([5, 5, 5])),
        "cu_num_draft_tokens must end at N (draft_token_ids.size(0)) = 4, got cu_num_draft_tokens[0] = 5 > N "
        "(request 0)",
    ),
    (
        _args(d=torch.zeros(2, dtype=torch.int32), cu=torch.zeros(0, dtype=torch.long), lg=torch.zeros(2, 5)),
        "cu_num_draft_tokens must end at N (draft_token_ids.size(0)) = 2, got no requests (B = 0 holds no drafts)",
    ),
    (_args(max_num_drafts=-1), "max_num_drafts must be >= 0, got -1"),
    (
        _args(max_num_drafts=1),
        "max_num_drafts = 1 is smaller than request 0's 2 drafts (cu_num_draft_tokens[0] - 0)",
    ),
    (
        _args(cu=torch.tensor([1, 1, 4]), max_num_drafts=2),
        "max_num_drafts = 2 is smaller than request 2's 3 drafts (cu_num_draft_tokens[2] - cu_num_draft_tokens[1])",
    ),
    (
        _args(max_num_drafts=2**63 - 1),
        "max_num_drafts = 9223372036854775807 is too large (max_num_drafts + 1 overflows int64)",
    ),
    (
        _args(pad_id=2**31),
        "pad_id must fit draft_token_ids' dtype int32, [-2147483648, 2147483647], got 2147483648",
    ),
    (_args(lg=torch.zeros(7, 5, device="meta")), "target_logits must be on"),
    (_args(cu=torch.tensor([2, 2, 4], device="meta")), "cu_num_draft_tokens must be on"),
]


@pytest.mark.parametrize("args,message", BAD_RAGGED, ids=[m[:40] for _, m in BAD_RAGGED])
def test_bad_input(args, message):
    with pytest.raises(RuntimeError, match=r"mtp\.verify_ragged: .*" + re.escape(message)):
        torch.ops.mtp.verify_ragged(*args.values())


@pytest.mark.parametrize("args,message", BAD_RAGGED, ids=[m[:40] for _, m in BAD_RAGGED])
def test_triton_bad_input(triton_mod, args, message):
    with pytest.raises(RuntimeError, match=r"mtp\.verify_ragged: .*" + re.escape(message)):
        triton_mod.verify_ragged(*args.values())


def test_hostile_sizes_and_strides():
    """Sizes whose sum overflows int64 and strides whose byte offset would: refused, named."""
    huge = torch.zeros(1, dtype=torch.long).expand(2**63 - 1)  # stride 0: no memory behind it
    with pytest.raises(RuntimeError, match=r"mtp\.verify_ragged: N \+ B \(draft_token_ids' N = 9223372036854775807"):
        torch.ops.mtp.verify_ragged(huge, torch.tensor([2**63 - 1]), torch.zeros(1, 5))
    drafts = torch.zeros(4, dtype=torch.long).as_strided((1,), (2**61,))
    with pytest.raises(RuntimeError, match=r"mtp\.verify_ragged: draft_token_ids.stride\(0\) = 2305843009213693952"):
        torch.ops.mtp.verify_ragged(drafts, torch.tensor([1]), torch.zeros(2, 5))
    # cu far past N (int64 extremes): a clear message, nothing read
    with pytest.raises(RuntimeError, match=r"got cu_num_draft_tokens\[0\] = 9223372036854775807 > N \(request 0\)"):
        torch.ops.mtp.verify_ragged(torch.zeros(1, dtype=torch.long), torch.tensor([2**63 - 1]), torch.zeros(2, 5))

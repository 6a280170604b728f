"""mtp.verify and mtp.accept_prefix against reference.py, bitwise."""

import itertools
import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
IDS = [torch.int32, torch.int64]


def make_case(gen, B, K, V, dtype, id_dtype, match_rate=0.7):
    """Logits with planted ties, NaN, -inf and signed zeros; drafts that mostly match."""
    logits = torch.randn(B, K + 1, V, generator=gen).to(dtype)
    if B * V > 0:
        # Ties: copy a row's max to a later index.
        rows = torch.randint(0, B, (max(1, B // 2),), generator=gen)
        for b in rows.tolist():
            t = int(torch.randint(0, K + 1, (1,), generator=gen))
            i = int(logits[b, t].float().argmax())
            j = int(torch.randint(0, V, (1,), generator=gen))
            logits[b, t, j] = logits[b, t, i]
        # NaN (first one wins), -inf rows, signed zeros as the maximum.
        b0 = int(torch.randint(0, B, (1,), generator=gen))
        logits[b0, 0, V // 3] = float("nan")
        logits[b0, -1, V // 2 :] = float("nan")
        b1 = int(torch.randint(0, B, (1,), generator=gen))
        logits[b1, K // 2] = float("-inf")
        b2 = int(torch.randint(0, B, (1,), generator=gen))
        logits[b2, 0] = -1.0
        logits[b2, 0, V - 1] = 0.0
        logits[b2, 0, V // 2] = -0.0
    target = logits.argmax(-1)[:, :K]
    noise = torch.randint(-2, V + 2, (B, K), generator=gen)  # includes ids outside [0, V)
    keep = torch.rand(B, K, generator=gen) < match_rate
    drafts = torch.where(keep, target, noise).to(id_dtype)
    return drafts, logits


def check_verify(drafts, logits, num_drafts=None, pad_id=-1):
    got = torch.ops.mtp.verify(drafts, logits, num_drafts, pad_id)
    want = reference.verify(drafts, logits, num_drafts, pad_id)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)
    return got


def test_example_from_contract():
    drafts = torch.tensor([[1, 2, 3]])
    logits = torch.zeros(1, 4, 10)
    for t, tok in enumerate([1, 5, 3, 4]):
        logits[0, t, tok] = 1.0
    accepted, out = torch.ops.mtp.verify(drafts, logits)
    assert accepted.tolist() == [1]
    assert out.tolist() == [[1, 5, -1, -1]]
    # Full match: the bonus token follows.
    accepted, out = torch.ops.mtp.verify(torch.tensor([[1, 5, 3]]), logits, pad_id=0)
    assert accepted.tolist() == [3] and out.tolist() == [[1, 5, 3, 4]]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_random_shapes(isa, gen, dtype, id_dtype):
    for B, K, V in [
        (0, 3, 10),
        (1, 0, 5),
        (3, 0, 1000),
        (1, 1, 1),
        (2, 4, 7),
        (5, 3, 300),
        (17, 8, 2049),
        (64, 16, 129),
        (8, 4, 32000),
        (4, 2, 49152),
    ]:
        drafts, logits = make_case(gen, B, K, V, dtype, id_dtype)
        check_verify(drafts, logits)


@pytest.mark.parametrize("V", [128256])
def test_large_vocab(isa, gen, V):
    drafts, logits = make_case(gen, 2, 3, V, torch.bfloat16, torch.int64, match_rate=1.0)
    check_verify(drafts, logits)


@pytest.mark.parametrize("dtype", FLOATS)
def test_ragged_num_drafts_and_pad(isa, gen, dtype):
    B, K, V = 9, 5, 1500
    drafts, logits = make_case(gen, B, K, V, dtype, torch.int64, match_rate=0.9)
    num_drafts = torch.tensor([0, 1, 2, 3, 4, 5, 5, 0, 3], dtype=torch.int32)
    check_verify(drafts, logits, num_drafts, pad_id=0)
    check_verify(drafts, logits, num_drafts.long(), pad_id=49151)


@pytest.mark.parametrize("dtype", FLOATS)
def test_strided_logits_are_read_in_place(isa, gen, dtype):
    B, K, V = 4, 3, 3000
    big = torch.randn(B, 2 * (K + 1), V + 50, generator=gen).to(dtype)
    sliced = big[:, ::2, 17 : 17 + V]  # a slice of a bigger buffer, rows not contiguous
    assert not sliced.is_contiguous()
    drafts = sliced.argmax(-1)[:, :K].clone()
    drafts[1, 1] += 1
    check_verify(drafts, sliced)
    # Vocabulary not unit-stride: [V, K+1, B] buffer seen as [B, K+1, V].
    transposed = torch.randn(V, K + 1, B, generator=gen).to(dtype).permute(2, 1, 0)
    check_verify(transposed.argmax(-1)[:, :K], transposed)
    # Expanded (stride 0) batch and strided drafts.
    expanded = torch.randn(1, K + 1, V, generator=gen).to(dtype).expand(B, K + 1, V)
    drafts = expanded.argmax(-1)[:, :K].t().contiguous().t()
    check_verify(drafts, expanded)


def test_every_tie_and_nan_position(isa):
    """Exhaustive over small rows: all positions of a tie pair and of a NaN, across block edges."""
    V = 300  # crosses the 256-element vector block and leaves a scalar tail
    for dtype in FLOATS:
        for i, j in [(0, 1), (0, 299), (255, 256), (100, 200), (256, 299), (298, 299)]:
            logits = torch.zeros(1, 3, V, dtype=dtype)
            logits[0, 0, i] = logits[0, 0, j] = 3.0
            logits[0, 1, j] = float("nan")
            logits[0, 1, i] = float("inf")
            logits[0, 2, i] = logits[0, 2, j] = float("inf")  # infinities, no NaN
            logits[0, 2, (i + j) // 2 + 1] = float("-inf")
            drafts = torch.tensor([[i, j]])
            check_verify(drafts, logits)


def test_thread_count_does_not_change_result(gen, threads):
    drafts, logits = make_case(gen, 2, 4, 100_000, torch.float32, torch.int64)
    many = torch.ops.mtp.verify(drafts, logits)
    torch.set_num_threads(1)
    one = torch.ops.mtp.verify(drafts, logits)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


def accept_cases(gen, id_dtype, target_dtype):
    """(drafts, target_tokens, num_drafts) over shapes, [B, K+1] and [B, K] targets, with and
    without num_drafts."""
    for B, K in [(0, 4), (1, 0), (7, 1), (33, 8)]:
        target = torch.randint(0, 5, (B, K + 1), generator=gen).to(target_dtype)
        drafts = torch.where(
            torch.rand(B, K, generator=gen) < 0.8,
            target[:, :K],
            torch.randint(0, 5, (B, K), generator=gen).to(target_dtype),
        ).to(id_dtype)
        num_drafts = torch.randint(0, K + 1, (B,), generator=gen)
        for tgt in (target, target[:, :K]):
            for nd in (None, num_drafts):
                yield drafts, tgt, nd


@pytest.mark.parametrize("id_dtype,target_dtype", list(itertools.product(IDS, IDS)))
def test_accept_prefix(gen, id_dtype, target_dtype):
    for drafts, tgt, nd in accept_cases(gen, id_dtype, target_dtype):
        got = torch.ops.mtp.accept_prefix(drafts, tgt, nd)
        assert got.dtype == id_dtype and torch.equal(got, reference.accept_prefix(drafts, tgt, nd))


def test_opcheck(gen):
    drafts, logits = make_case(gen, 3, 4, 500, torch.float32, torch.int64)
    num_drafts = torch.tensor([4, 0, 2])
    torch.library.opcheck(torch.ops.mtp.verify.default, (drafts, logits, num_drafts, -1))
    torch.library.opcheck(torch.ops.mtp.verify.default, (drafts.int(), logits.bfloat16()))
    torch.library.opcheck(torch.ops.mtp.accept_prefix.default, (drafts, logits.argmax(-1), num_drafts))


def test_torch_compile_fullgraph(gen):
    drafts, logits = make_case(gen, 4, 3, 1000, torch.float32, torch.int64)

    @torch.compile(fullgraph=True)
    def step(drafts, logits):
        accepted, out = mtp_kernels.verify(drafts, logits * 2.0)
        return accepted + 1, out, mtp_kernels.accept_prefix(drafts, out)

    accepted, out, again = step(drafts, logits)
    want_acc, want_out = reference.verify(drafts, logits * 2.0)
    assert torch.equal(accepted, want_acc + 1) and torch.equal(out, want_out)
    assert torch.equal(again, reference.accept_prefix(drafts, want_out))


BAD_VERIFY = [
    # (draft_tokens, target_logits, num_drafts, message fragment)
    (torch.zeros(2, 3, dtype=torch.float32), torch.zeros(2, 4, 10), None, "draft_tokens must be Int or Long"),
    (torch.zeros(2, dtype=torch.long), torch.zeros(2, 4, 10), None, "draft_tokens must be 2-D"),
    (
        torch.zeros(2, 3, dtype=torch.long),
        torch.zeros(2, 4, 10, dtype=torch.float64),
        None,
        "target_logits must be Float",
    ),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4), None, "target_logits must be 3-D"),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 4, 10), None, "target_logits.size(0) must equal B"),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 10), None, "target_logits.size(1) must equal K+1"),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, 0), None, "V = 0"),
    (
        torch.zeros(2, 3, dtype=torch.long),
        torch.zeros(2, 4, 10),
        torch.tensor([1, 4]),
        "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 4",
    ),
    (
        torch.zeros(2, 3, dtype=torch.long),
        torch.zeros(2, 4, 10),
        torch.tensor([-1, 0]),
        "num_drafts must lie in [0, K]",
    ),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, 10), torch.tensor([1]), "num_drafts.size(0) must equal B"),
    (
        torch.zeros(2, 3, dtype=torch.long),
        torch.zeros(2, 4, 10),
        torch.tensor([1.0, 2.0]),
        "num_drafts must be Int or Long",
    ),
    (
        torch.zeros(2, 3, dtype=torch.long),
        torch.zeros(2, 4, 10, device="meta"),
        None,
        "target_logits must be on draft_tokens's device",
    ),
]


@pytest.mark.parametrize("drafts,logits,num_drafts,message", BAD_VERIFY)
def test_verify_bad_input(drafts, logits, num_drafts, message):
    with pytest.raises(RuntimeError, match=r"mtp\.verify: .*" + re.escape(message)):
        torch.ops.mtp.verify(drafts, logits, num_drafts)


def test_accept_prefix_bad_input():
    d = torch.zeros(2, 3, dtype=torch.long)
    cases = [
        (d, torch.zeros(2, 5, dtype=torch.long), None, "target_tokens.size(1) must be K+1 = 4 or K = 3, got 5"),
        (d, torch.zeros(2, 4), None, "target_tokens must be Int or Long"),
        (d, torch.zeros(3, 4, dtype=torch.long), None, "target_tokens.size(0) must equal B"),
        (d, torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 9]), "num_drafts must lie in"),
        (d.float(), torch.zeros(2, 4, dtype=torch.long), None, "draft_tokens must be Int or Long"),
    ]
    for drafts, target, nd, message in cases:
        with pytest.raises(RuntimeError, match=r"mtp\.accept_prefix: .*" + re.escape(message)):
            torch.ops.mtp.accept_prefix(drafts, target, nd)

"""mtp.verify_lenient (NOT lossless): equal to reference.py bitwise, top_k=1 is mtp.verify
bitwise, leniency accepts exactly what the rule says, opcheck, compile, bad input."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_verify import FLOATS, IDS, make_case


def check(drafts, logits, nd=None, top_k=1, min_ratio=1.0, pad_id=-1):
    got = torch.ops.mtp.verify_lenient(drafts, logits, nd, top_k, min_ratio, pad_id)
    want = reference.verify_lenient(drafts, logits, nd, top_k, min_ratio, pad_id)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (g, w)
    return got


def near_top_drafts(gen, logits, K):
    # Drafts among each row's top 4 (some outside V): where leniency decides.
    B, V = logits.shape[0], logits.shape[2]
    top = logits[:, :K].float().topk(min(4, V), -1).indices
    pick = torch.randint(0, top.shape[-1], (B, K, 1), generator=gen)
    drafts = top.gather(-1, pick)[..., 0]
    drafts[:, ::4] = V
    return drafts


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_top1_is_verify_bitwise(gen, dtype, id_dtype):
    for B, K, V in [(0, 2, 5), (3, 0, 40), (5, 3, 300), (4, 4, 2049)]:
        drafts, logits = make_case(gen, B, K, V, dtype, id_dtype)
        nd = torch.randint(0, K + 1, (B,), generator=gen)
        want = torch.ops.mtp.verify(drafts, logits, nd, 5)
        for min_ratio in (1.0, 0.3, 0.0):
            got = torch.ops.mtp.verify_lenient(drafts, logits, nd, 1, min_ratio, 5)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("top_k,min_ratio", [(2, 1.0), (2, 0.0), (3, 0.5), (4, 0.05), (1000, 0.2)])
def test_matches_reference(gen, dtype, top_k, min_ratio):
    for B, K, V in [(4, 3, 50), (6, 2, 700)]:
        _, logits = make_case(gen, B, K, V, dtype, torch.int64)
        drafts = near_top_drafts(gen, logits, K)
        nd = torch.randint(0, K + 1, (B,), generator=gen)
        check(drafts, logits, nd, top_k, min_ratio, pad_id=3)
        check(drafts.int(), logits, None, top_k, min_ratio)


def test_rule_on_a_hand_made_row():
    # Row 0: logits log(p) with p = [0.5, 0.3, 0.15, 0.05] (+ a tie for second place at 4).
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.3])
    logits = p.log().expand(1, 2, 5).contiguous()

    def accepted(draft, top_k, min_ratio):
        return int(torch.ops.mtp.verify_lenient(torch.tensor([[draft]]), logits, None, top_k, min_ratio)[0][0])

    assert accepted(0, 1, 1.0) == 1  # the argmax, always
    assert accepted(1, 1, 0.0) == 0  # top_k = 1: greedy only
    assert accepted(1, 2, 0.59) == 1 and accepted(1, 2, 0.61) == 0  # p1/p0 = 0.6
    assert accepted(4, 2, 0.5) == 0 and accepted(4, 3, 0.5) == 1  # tie: index 1 ranks above 4
    assert accepted(3, 4, 0.0) == 0 and accepted(3, 5, 0.0) == 1  # rank 4 (the tie ranks above)
    assert accepted(5, 10, 0.0) == 0 and accepted(-1, 10, 0.0) == 0  # outside V: never
    _, out = torch.ops.mtp.verify_lenient(torch.tensor([[2]]), logits, None, 2, 0.0, pad_id=-9)
    assert out.tolist() == [[0, -9]]  # rejected: the argmax, then pad


def test_nan_row_is_strict():
    logits = torch.zeros(1, 2, 6)
    logits[0, 0, 1:3] = torch.tensor([5.0, 4.0])
    logits[0, 0, 4] = float("nan")
    for draft, want in [(1, 0), (4, 1), (2, 0)]:
        acc, _ = check(torch.tensor([[draft]]), logits, top_k=6, min_ratio=0.0)
        assert int(acc[0]) == want


def test_opcheck_and_compile(gen):
    drafts, logits = make_case(gen, 3, 4, 200, torch.float32, torch.int64)
    nd = torch.tensor([4, 0, 2])
    torch.library.opcheck(torch.ops.mtp.verify_lenient.default, (drafts, logits, nd, 3, 0.5, -1))
    torch.library.opcheck(torch.ops.mtp.verify_lenient.default, (drafts.int(), logits.bfloat16()))

    @torch.compile(fullgraph=True)
    def step(drafts, logits):
        accepted, out = mtp_kernels.verify_lenient(drafts, logits * 2.0, top_k=3, min_ratio=0.25)
        return accepted + 1, out

    accepted, out = step(drafts, logits)
    want_acc, want_out = reference.verify_lenient(drafts, logits * 2.0, None, 3, 0.25)
    assert torch.equal(accepted, want_acc + 1) and torch.equal(out, want_out)


D, L = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, 10)
BAD = [
    (dict(top_k=0), "top_k must be >= 1, got 0"),
    (dict(min_ratio=1.5), "min_ratio must lie in [0, 1], got 1.5"),
    (dict(min_ratio=float("nan")), "min_ratio must lie in [0, 1]"),
    (dict(min_ratio=-0.1), "min_ratio must lie in [0, 1]"),
    (dict(draft_tokens=D.float()), "draft_tokens must be Int or Long"),
    (dict(target_logits=torch.zeros(2, 3, 10)), "target_logits.size(1) must equal K+1"),
    (dict(target_logits=torch.zeros(2, 4, 0)), "vocabulary of V >= 1"),
    (dict(num_drafts=torch.tensor([0, 4])), "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 4"),
    (dict(target_logits=torch.zeros(2, 4, 10, device="meta")), "target_logits must be on draft_tokens's device"),
]


@pytest.mark.parametrize("override,message", BAD, ids=[m for _, m in BAD])
def test_bad_input(override, message):
    args = dict(draft_tokens=D, target_logits=L, num_drafts=None, top_k=2, min_ratio=0.5)
    args.update(override)
    with pytest.raises(RuntimeError, match=r"mtp\.verify_lenient: .*" + re.escape(message)):
        torch.ops.mtp.verify_lenient(*args.values())


@pytest.mark.parametrize(
    "min_ratio,shown", [(1e300, "1e+300"), (-1e-300, "-1e-300"), (1 + 1e-12, "1.000000000001"), (1.5, "1.5")]
)
def test_min_ratio_shown_in_shortest_round_trip_digits(min_ratio, shown):
    """The refused min_ratio in the fewest digits that read back (Python's repr, reference.py's
    message): not std::to_string's 300 digits, -0.000000 or 1.000000 next to [0, 1]."""
    with pytest.raises(RuntimeError) as e:
        torch.ops.mtp.verify_lenient(D, L, None, 2, min_ratio, 0)
    assert str(e.value).splitlines()[0] == f"mtp.verify_lenient: min_ratio must lie in [0, 1], got {shown}"
    assert repr(min_ratio) == shown
    with pytest.raises(ValueError, match=re.escape(f"min_ratio must lie in [0, 1], got {shown}") + "$"):
        reference.verify_lenient(D, L, None, 2, min_ratio, 0)

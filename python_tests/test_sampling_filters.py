"""mtp.verify_sampled's filters (top_k, top_p, min_p): equal to reference.py bitwise, lossless
against the filtered distribution (chi-square), ties at the cuts kept, temperature 0 still
mtp.verify, tokens independent of the batch, bad values refused."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_verify import FLOATS, make_case
from test_verify_sampled import P_MIN, chi2_pvalue

N = 60_000  # samples per distribution check


def filtered_probs(logits_row, T, top_k=0, top_p=1.0, min_p=0.0):
    """The filtered target law written the plain way (vLLM's order: softmax at T, min_p
    against the max, top_k by value, top_p on a descending sort), independent of reference.py;
    exact only away from ties at the cuts, which the chi-square cases avoid."""
    p = torch.softmax(logits_row.double() / T, -1)
    keep = p >= min_p * p.max()
    if top_k:
        keep &= logits_row >= logits_row[keep].topk(min(top_k, int(keep.sum()))).values[-1]
    if top_p < 1:
        q = torch.where(keep, p, 0.0)
        q = q / q.sum()
        order = q.argsort(descending=True)
        before = q[order].cumsum(0) - q[order]  # mass strictly above each token
        nucleus = torch.zeros_like(keep)
        nucleus[order[before < top_p]] = True
        keep &= nucleus
    p = torch.where(keep, p, 0.0)
    return p / p.sum()


def follows(tokens, probs) -> bool:
    """tokens follow probs: chi-square, or all on the one token when the support is one."""
    if int((probs > 0).sum()) == 1:
        return bool((tokens == int(probs.argmax())).all())
    return chi2_pvalue(tokens, probs) > P_MIN


def filters(B, top_k=0, top_p=1.0, min_p=0.0):
    return (
        torch.full((B,), top_k, dtype=torch.long),
        torch.full((B,), top_p, dtype=torch.float32),
        torch.full((B,), min_p, dtype=torch.float32),
    )


FILTERS = [
    dict(top_k=5),
    dict(top_p=0.6),
    dict(min_p=0.15),
    dict(top_k=8, top_p=0.8, min_p=0.02),
    dict(top_k=1),
]


@pytest.mark.parametrize("f", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("drafts_from", ["argmax", "unlikely", "q"])
def test_lossless_chi_square_with_filters(f, drafts_from):
    """Whatever the drafts, the first token follows the filtered p_0, never a removed token,
    and after an accepted draft the second follows the filtered p_1."""
    g = torch.Generator().manual_seed(5)
    K, V, T = 2, 16, 0.9
    logits = torch.randn(K + 1, V, generator=g) * 1.5
    if drafts_from == "q":
        q = torch.softmax(torch.randn(K, V, generator=g), -1)
        drafts = torch.multinomial(q, N, replacement=True, generator=g).t().contiguous()
        probs = q.expand(N, K, V)
    else:
        ids = logits[:K].argmax(-1) if drafts_from == "argmax" else logits[:K].argmin(-1)
        drafts, probs = ids.expand(N, K), None
    seeds = torch.arange(N) * 7 + 3
    accepted, out = torch.ops.mtp.verify_sampled(
        drafts, probs, logits.expand(N, K + 1, V), torch.full((N,), T), seeds, None, None, -1, *filters(N, **f)
    )
    p0, p1 = filtered_probs(logits[0], T, **f), filtered_probs(logits[1], T, **f)
    assert follows(out[:, 0], p0)
    assert chi2_pvalue(out[:, 0], torch.softmax(logits[0].double() / T, -1)) < P_MIN  # the test can fail
    went_on = accepted >= 1
    if int(went_on.sum()) > 2000:
        assert follows(out[went_on, 1], p1)


def random_filters(gen, B, V):
    top_k = torch.randint(0, V + 2, (B,), generator=gen)
    top_k[::2] = 0
    top_p = torch.rand(B, generator=gen).clamp_min(0.01)
    top_p[1::3] = 1.0
    min_p = torch.rand(B, generator=gen) * 0.5
    min_p[::3] = 0.0
    return top_k, top_p, min_p


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_q", [False, True])
def test_filters_match_reference(isa, gen, dtype, with_q):
    for B, K, V, id_dtype in [(3, 0, 40, torch.int32), (6, 2, 300, torch.int64), (4, 3, 700, torch.int32)]:
        drafts, logits = make_case(gen, B, K, V, dtype, id_dtype, match_rate=0.7)
        q = torch.softmax(torch.randn(B, K, V, generator=gen) * 2, -1).to(dtype) if with_q else None
        temp = torch.rand(B, generator=gen) * 2
        temp[::4] = 0.0
        seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
        top_k, top_p, min_p = random_filters(gen, B, V)
        if id_dtype == torch.int32:
            top_k = top_k.int()
        args = (drafts, q, logits, temp, seeds, None, None, 5, top_k, top_p, min_p)
        got, want = torch.ops.mtp.verify_sampled(*args), reference.verify_sampled(*args)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)


def test_ties_at_the_cuts_are_all_kept():
    """top_k = 2 over [5, 4, 4, 4, 1, ...] keeps the three 4s; top_p = 0.1 over two equal tops
    keeps both; min_p keeps a token exactly at min_p * max (w == min_p)."""
    V, B = 8, 4000
    row = torch.tensor([5.0, 4.0, 4.0, 4.0, 1.0, 0.0, -1.0, -2.0])
    seeds = torch.arange(B)
    drafts = torch.zeros(B, 0, dtype=torch.long)

    def draws(logits, T, **f):
        _, out = torch.ops.mtp.verify_sampled(
            drafts, None, logits.expand(B, 1, V), torch.full((B,), T), seeds, None, None, -1, *filters(B, **f)
        )
        want = reference.verify_sampled(
            drafts[:50], None, logits.expand(50, 1, V), torch.full((50,), T), seeds[:50], None, None, -1,
            *filters(50, **f),
        )[1]  # fmt: skip
        assert torch.equal(out[:50], want)
        return set(out[:, 0].tolist())

    assert draws(row, 1.0, top_k=2) == {0, 1, 2, 3}
    assert draws(row, 1.0, top_k=1) == {0}
    two_tops = torch.tensor([3.0, 3.0, 0.0, 0.0, -1.0, -1.0, -2.0, -9.0])
    assert draws(two_tops, 1.0, top_p=0.1) == {0, 1}
    # min_p: the fp32 just at or below x = -1's weight; w >= min_p keeps it, not the -3s.
    at_cut = torch.tensor([0.0, -1.0, -1.0, -3.0, -3.0, -3.0, -3.0, -3.0])
    w = reference.exp_fixed(torch.tensor(-1.0, dtype=torch.float64))
    min_p = w.float()
    if min_p.double() > w:
        min_p = torch.nextafter(min_p, torch.tensor(0.0))
    assert draws(at_cut, 1.0, min_p=float(min_p)) == {0, 1, 2}


def test_temperature_zero_with_filters_is_verify(gen):
    drafts, logits = make_case(gen, 6, 3, 500, torch.bfloat16, torch.int64, match_rate=0.7)
    nd = torch.randint(0, 4, (6,), generator=gen)
    got = torch.ops.mtp.verify_sampled(
        drafts, None, logits, torch.zeros(6), torch.arange(6), None, nd, 9, *random_filters(gen, 6, 500)
    )
    want = torch.ops.mtp.verify(drafts, logits, nd, 9)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("threads", [1, 2])
def test_same_request_same_tokens_in_any_batch(gen, threads):
    """A request's tokens depend on its own seed, logits and filters only."""
    B, K, V = 8, 3, 400
    drafts, logits = make_case(gen, B, K, V, torch.float32, torch.int64, match_rate=0.8)
    temp, seeds = torch.rand(B, generator=gen) + 0.3, torch.arange(B) * 31
    top_k, top_p, min_p = random_filters(gen, B, V)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = torch.ops.mtp.verify_sampled(drafts, None, logits, temp, seeds, None, None, -1, top_k, top_p, min_p)
        for b in (0, 5):
            s = slice(b, b + 1)
            alone = torch.ops.mtp.verify_sampled(
                drafts[s], None, logits[s], temp[s], seeds[s], None, None, -1, top_k[s], top_p[s], min_p[s]
            )
            assert torch.equal(alone[1][0], whole[1][b])
    finally:
        torch.set_num_threads(previous)


def test_opcheck_and_compile_with_filters(gen):
    drafts, logits = make_case(gen, 3, 2, 200, torch.float32, torch.int64, match_rate=0.7)
    q = torch.softmax(torch.randn(3, 2, 200, generator=gen), -1)
    temp, seeds = torch.ones(3), torch.arange(3)
    f = random_filters(gen, 3, 200)
    torch.library.opcheck(torch.ops.mtp.verify_sampled.default, (drafts, q, logits, temp, seeds, None, None, -1, *f))

    @torch.compile(fullgraph=True)
    def step(logits, top_k, top_p, min_p):
        return mtp_kernels.verify_sampled(drafts, q, logits * 2.0, temp, seeds, top_k=top_k, top_p=top_p, min_p=min_p)

    got = step(logits, *f)
    want = reference.verify_sampled(drafts, q, logits * 2.0, temp, seeds, None, None, -1, *f)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


B2 = 2
BAD = [
    (dict(top_k=torch.tensor([0, -1])), "top_k must be >= 0 (0: off), got top_k[1] = -1"),
    (dict(top_k=torch.zeros(B2)), "top_k must be Int or Long"),
    (dict(top_k=torch.zeros(3, dtype=torch.long)), "top_k.size(0) must equal B"),
    (dict(top_p=torch.tensor([0.0, 1.0])), "top_p must lie in (0, 1] (1: off), got top_p[0] = 0"),
    (dict(top_p=torch.tensor([1.0, 1.5])), "got top_p[1] = 1.5"),
    (dict(top_p=torch.tensor([1.0, float("nan")])), "got top_p[1] = nan"),
    (dict(top_p=torch.ones(B2, dtype=torch.float64)), "top_p must be Float"),
    (dict(min_p=torch.tensor([1.0, 0.0])), "min_p must lie in [0, 1) (0: off), got min_p[0] = 1"),
    (dict(min_p=torch.tensor([0.0, -0.5])), "got min_p[1] = -0.5"),
    (dict(min_p=torch.zeros(B2, 1)), "min_p must be 1-D"),
]


@pytest.mark.parametrize("override,message", BAD, ids=[m for _, m in BAD])
def test_bad_filters(override, message):
    args = dict(
        draft_tokens=torch.zeros(B2, 3, dtype=torch.long),
        draft_probs=None,
        target_logits=torch.zeros(B2, 4, 10),
        temperature=torch.ones(B2),
        seeds=torch.zeros(B2, dtype=torch.long),
        offsets=None,
        num_drafts=None,
        pad_id=-1,
        top_k=None,
        top_p=None,
        min_p=None,
    )
    args.update(override)
    with pytest.raises(RuntimeError, match=r"mtp\.verify_sampled: .*" + re.escape(message)):
        torch.ops.mtp.verify_sampled(*args.values())

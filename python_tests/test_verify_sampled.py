"""mtp.verify_sampled: lossless (chi-square against the target distribution), equal to
reference.py on token ids, keyed only by (seed, position), temperature 0 == mtp.verify."""

import math
import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_verify import FLOATS, IDS, make_case

N = 120_000  # samples per distribution check (one call, one request per sample)
P_MIN = 1e-4  # a p-value below this fails; deterministic at the fixed seeds


def chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit of `tokens` to `probs` (cells with p > 0; a token
    in a p == 0 cell gives p-value 0)."""
    counts = torch.bincount(tokens.long(), minlength=probs.numel()).double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    n = counts.sum()
    expected = n * probs[support]
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def target_probs(logits_row, T):
    return torch.softmax(logits_row.double() / T, -1)


def sampled(drafts, probs, logits, T, seeds, offsets=None, num_drafts=None, pad_id=-1):
    B = drafts.shape[0]
    return torch.ops.mtp.verify_sampled(drafts, probs, logits, torch.full((B,), T), seeds, offsets, num_drafts, pad_id)


def pair_cases():
    """(name, logits [K+1, V], q [K, V] or None, one-hot draft ids [K] or None) for K in {1, 3}."""
    g = torch.Generator().manual_seed(7)
    V = 12
    for K in (1, 3):
        logits = torch.randn(K + 1, V, generator=g) * 1.5
        yield f"onehot-argmax-K{K}", logits, None, logits[:K].argmax(-1)
        yield f"onehot-unlikely-K{K}", logits, None, logits[:K].argmin(-1)
        yield f"onehot-outside-V-K{K}", logits, None, torch.tensor([V, -1, 3][:K])
        q = torch.softmax(torch.randn(K, V, generator=g) * 2, -1)
        yield f"q-random-K{K}", logits, q, None
        yield f"q-equals-p-K{K}", logits, torch.softmax(logits[:K].double() / 0.8, -1).float(), None
        sharp = torch.zeros(K, V)
        sharp[:, :3] = 1 / 3  # most mass where p has little
        yield f"q-disjointish-K{K}", logits, sharp, None


@pytest.mark.parametrize("case", list(pair_cases()), ids=lambda c: c[0])
def test_lossless_chi_square(case):
    """Whatever the draft, the first emitted token follows p_0, the token at a rejection at
    t = 0 follows normalize(max(0, p_0 - q_0)), and after an accepted first draft the second
    token follows p_1 (the target's next-step law)."""
    _, logits, q, ids = case
    K, V = logits.shape[0] - 1, logits.shape[1]
    T = 0.8
    g = torch.Generator().manual_seed(11)
    if q is None:
        drafts = ids.expand(N, K)
        q0 = torch.zeros(V, dtype=torch.float64)
        if 0 <= int(ids[0]) < V:
            q0[int(ids[0])] = 1.0
    else:
        # Drafts sampled from q (as the draft model would), fixed generator.
        drafts = torch.multinomial(q, N, replacement=True, generator=g).t().contiguous()
        q0 = q[0].double()
    # One request per sample: distinct seeds (half) or one seed at distinct offsets (half).
    seeds = torch.cat([torch.arange(N // 2), torch.full((N - N // 2,), 99)])
    offsets = torch.cat([torch.zeros(N // 2, dtype=torch.long), torch.arange(N - N // 2) * 5])
    probs = None if q is None else q.expand(N, K, V)
    accepted, out = sampled(drafts, probs, logits.expand(N, K + 1, V), T, seeds, offsets)
    p0, p1 = target_probs(logits[0], T), target_probs(logits[1], T)
    assert chi2_pvalue(out[:, 0], p0) > P_MIN
    # The test can fail: the drafts themselves (q's law), or the target at another temperature.
    if q is not None and not torch.allclose(q0, p0, atol=1e-3):
        assert chi2_pvalue(drafts[:, 0], p0) < P_MIN
    assert chi2_pvalue(out[:, 0], target_probs(logits[0], 1.3)) < P_MIN
    rejected = accepted == 0
    residual = (p0 - q0).clamp_min(0)
    if int(rejected.sum()) > 2000:
        assert chi2_pvalue(out[rejected, 0], residual / residual.sum()) > P_MIN
        if not torch.allclose(residual / residual.sum(), p0, atol=1e-3):
            assert chi2_pvalue(out[rejected, 0], p0) < P_MIN  # the residual law is not p itself
    went_on = accepted >= 1
    if int(went_on.sum()) > 2000:
        assert chi2_pvalue(out[went_on, 1], p1) > P_MIN
    # Acceptance rate at t = 0 is sum(min(p, q)) (binomial, 5 sigma).
    rate = float(went_on.double().mean())
    want = float(torch.minimum(p0, q0).sum())
    assert abs(rate - want) < 5 * math.sqrt(want * (1 - want) / N) + 1e-9


def random_case(gen, B, K, V, dtype, id_dtype, with_q):
    drafts, logits = make_case(gen, B, K, V, dtype, id_dtype, match_rate=0.8)
    q = torch.softmax(torch.randn(B, K, V, generator=gen) * 2, -1).to(dtype) if with_q else None
    temp = torch.rand(B, generator=gen) * 2
    temp[::3] = 0.0  # greedy rows among sampled ones
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
    offsets = torch.randint(0, 10**6, (B,), generator=gen)
    nd = torch.randint(0, K + 1, (B,), generator=gen)
    return drafts, q, logits, temp, seeds, offsets, nd


def check_reference(*args, pad_id=-1):
    got = torch.ops.mtp.verify_sampled(*args, pad_id)
    want = reference.verify_sampled(*args, pad_id)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)
    return got


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_q", [False, True])
def test_matches_reference_on_token_ids(gen, dtype, with_q):
    for B, K, V, id_dtype in [
        (0, 2, 5, torch.int64),
        (3, 0, 40, torch.int32),
        (7, 1, 300, torch.int64),
        (9, 4, 1000, torch.int32),
    ]:
        check_reference(*random_case(gen, B, K, V, dtype, id_dtype, with_q), pad_id=7)


def test_strided_inputs_match_reference(gen):
    B, K, V = 4, 3, 500
    big = torch.randn(B, 2 * (K + 1), V + 9, generator=gen)
    logits = big[:, ::2, 4 : 4 + V]
    q = torch.softmax(torch.randn(V, K, B, generator=gen), 0).permute(2, 1, 0)
    drafts = torch.randint(0, V, (K, B), generator=gen).t()
    temp, seeds = torch.ones(B), torch.arange(B)
    check_reference(drafts, q, logits, temp, seeds, None, None)
    check_reference(drafts, None, logits, temp, seeds, None, None)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
def test_temperature_zero_is_verify_bitwise(gen, dtype, id_dtype):
    for B, K, V in [(5, 3, 300), (17, 8, 2049), (4, 2, 49152)]:
        drafts, logits = make_case(gen, B, K, V, dtype, id_dtype)
        nd = torch.randint(0, K + 1, (B,), generator=gen)
        want = torch.ops.mtp.verify(drafts, logits, nd, 5)
        q = torch.softmax(torch.randn(B, K, V, generator=gen), -1)
        for probs in (None, q):
            got = torch.ops.mtp.verify_sampled(drafts, probs, logits, torch.zeros(B), torch.arange(B), None, nd, 5)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))


def test_same_seed_same_tokens_any_batch_or_threads(gen, threads):
    B, K, V = 16, 3, 5000
    drafts, q, logits, temp, seeds, offsets, nd = random_case(gen, B, K, V, torch.float32, torch.int64, True)
    temp.fill_(1.5)
    full = torch.ops.mtp.verify_sampled(drafts, q, logits, temp, seeds, offsets, nd)
    again = torch.ops.mtp.verify_sampled(drafts, q, logits, temp, seeds, offsets, nd)
    assert all(torch.equal(a, b) for a, b in zip(full, again))
    # Request 5 alone, then among different other requests (other seeds, drafts, logits).
    b = 5
    sl = slice(b, b + 1)
    alone = torch.ops.mtp.verify_sampled(drafts[sl], q[sl], logits[sl], temp[sl], seeds[sl], offsets[sl], nd[sl])
    o_d, o_q, o_l, o_t, o_s, o_o, o_n = random_case(gen, 6, K, V, torch.float32, torch.int64, True)
    mixed = torch.ops.mtp.verify_sampled(
        torch.cat([o_d[:3], drafts[sl], o_d[3:]]),
        torch.cat([o_q[:3], q[sl], o_q[3:]]),
        torch.cat([o_l[:3], logits[sl], o_l[3:]]),
        torch.cat([o_t[:3], temp[sl], o_t[3:]]),
        torch.cat([o_s[:3], seeds[sl], o_s[3:]]),
        torch.cat([o_o[:3], offsets[sl], o_o[3:]]),
        torch.cat([o_n[:3], nd[sl], o_n[3:]]),
    )
    for whole, one, mix in zip(full, alone, mixed):
        assert torch.equal(whole[b], one[0]) and torch.equal(whole[b], mix[3])
    torch.set_num_threads(1)
    single = torch.ops.mtp.verify_sampled(drafts, q, logits, temp, seeds, offsets, nd)
    assert all(torch.equal(a, b) for a, b in zip(full, single))


def test_different_seeds_or_offsets_differ(gen):
    B, K, V = 64, 2, 1000
    logits = torch.zeros(1, K + 1, V).expand(B, K + 1, V)  # uniform: every token equally likely
    drafts = torch.zeros(B, K, dtype=torch.long)
    _, out1 = sampled(drafts, None, logits, 1.0, torch.full((B,), 1))
    _, out2 = sampled(drafts, None, logits, 1.0, torch.full((B,), 2))
    _, out3 = sampled(drafts, None, logits, 1.0, torch.full((B,), 1), torch.full((B,), 10))
    assert (out1[:, 0] != out2[:, 0]).float().mean() > 0.9
    assert (out1[:, 0] != out3[:, 0]).float().mean() > 0.9
    assert len(set(out1[:, 0].tolist())) == 1  # same key, same token


def test_rng_formula():
    """The documented formula, for other backends to reproduce (values fixed here)."""
    assert reference.mix64(0) == 0xE220A8397B1DCDAF
    u = [reference.sample_uniform(s, p, st) for s, p, st in [(0, 0, 0), (0, 0, 1), (-1, 5, 0), (2**62, 7, 1)]]
    assert all(0 <= x < 1 and x * 2**24 == int(x * 2**24) for x in u)
    assert len(set(u)) == 4
    # The kernel uses the same uniforms: one uniform logits row of 2^24 tokens maps u to
    # floor(u * 2^24) only if the formula agrees; a row of 4096 keeps it quick.
    V = 4096
    seeds = torch.tensor([0, -1, 2**62, 12345])
    offsets = torch.tensor([0, 5, 7, 99])
    _, out = sampled(torch.zeros(4, 0, dtype=torch.long), None, torch.zeros(4, 1, V), 1.0, seeds, offsets)
    want = [int(reference.sample_uniform(int(s), int(o), 1) * V) for s, o in zip(seeds, offsets)]
    assert out[:, 0].tolist() == want


def test_opcheck(gen):
    drafts, q, logits, temp, seeds, offsets, nd = random_case(gen, 3, 4, 200, torch.float32, torch.int64, True)
    torch.library.opcheck(torch.ops.mtp.verify_sampled.default, (drafts, q, logits, temp, seeds, offsets, nd, -1))
    torch.library.opcheck(torch.ops.mtp.verify_sampled.default, (drafts.int(), None, logits.bfloat16(), temp, seeds))


def test_torch_compile_fullgraph(gen):
    drafts, q, logits, temp, seeds, offsets, nd = random_case(gen, 4, 3, 300, torch.float32, torch.int64, True)

    @torch.compile(fullgraph=True)
    def step(drafts, q, logits, temp, seeds):
        accepted, out = mtp_kernels.verify_sampled(drafts, q, logits * 2.0, temp, seeds, offsets=seeds + 1)
        return accepted + 1, out

    accepted, out = step(drafts, q, logits, temp, seeds)
    want_acc, want_out = reference.verify_sampled(drafts, q, logits * 2.0, temp, seeds, seeds + 1)
    assert torch.equal(accepted, want_acc + 1) and torch.equal(out, want_out)


D, L, T1, S = (
    torch.zeros(2, 3, dtype=torch.long),
    torch.zeros(2, 4, 10),
    torch.ones(2),
    torch.zeros(2, dtype=torch.long),
)
BAD = [
    # (kwargs overriding the good call, message fragment)
    (dict(draft_tokens=D.float()), "draft_tokens must be Int or Long"),
    (dict(target_logits=torch.zeros(2, 4)), "target_logits must be 3-D"),
    (dict(target_logits=torch.zeros(2, 3, 10)), "target_logits.size(1) must equal K+1"),
    (dict(temperature=torch.tensor([1.0, -0.5])), "temperature must be finite and >= 0, got temperature[1] = -0.5"),
    (dict(temperature=torch.tensor([float("nan"), 1.0])), "temperature must be finite and >= 0, got temperature[0]"),
    (dict(temperature=torch.tensor([float("inf"), 1.0])), "temperature must be finite and >= 0"),
    (dict(temperature=torch.ones(3)), "temperature.size(0) must equal B"),
    (dict(temperature=torch.ones(2, dtype=torch.float64)), "temperature must be Float"),
    (dict(seeds=torch.zeros(2, dtype=torch.int32)), "seeds must be Long"),
    (dict(seeds=torch.zeros(2, 1, dtype=torch.long)), "seeds must be 1-D"),
    (dict(seeds=torch.zeros(3, dtype=torch.long)), "seeds.size(0) must equal B"),
    (dict(offsets=torch.zeros(2)), "offsets must be Long"),
    (dict(offsets=torch.zeros(1, dtype=torch.long)), "offsets.size(0) must equal B"),
    (dict(num_drafts=torch.tensor([0, 4])), "num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 4"),
    (dict(draft_probs=torch.zeros(2, 3, 9)), "draft_probs.size(2) must equal V"),
    (dict(draft_probs=torch.zeros(2, 4, 10)), "draft_probs.size(1) must equal K"),
    (dict(draft_probs=torch.zeros(2, 3)), "draft_probs must be 3-D"),
    (dict(draft_probs=torch.zeros(2, 3, 10, dtype=torch.float64)), "draft_probs must be Float"),
    (dict(draft_probs=torch.full((2, 3, 10), -0.1)), "draft_probs must be probabilities"),
    (dict(draft_probs=torch.full((2, 3, 10), float("nan"))), "draft_probs must be probabilities"),
    (dict(draft_probs=torch.full((2, 3, 10), float("inf"))), "draft_probs must be probabilities"),
    (dict(target_logits=torch.zeros(2, 4, 10, device="meta")), "target_logits must be on draft_tokens's device"),
]


@pytest.mark.parametrize("override,message", BAD, ids=[m for _, m in BAD])
def test_bad_input(override, message):
    args = dict(
        draft_tokens=D, draft_probs=None, target_logits=L, temperature=T1, seeds=S, offsets=None, num_drafts=None
    )
    args.update(override)
    with pytest.raises(RuntimeError, match=r"mtp\.verify_sampled: .*" + re.escape(message)):
        torch.ops.mtp.verify_sampled(*args.values())

"""mtp.verify_sampled_ragged (verify_sampled in verify_ragged's flattened layout) against
reference.py and against mtp.verify_sampled on the padded equivalent, bitwise, on every
instruction set; opcheck, torch.compile; bad input. The Triton kernel: test_triton.py."""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference
from test_verify import FLOATS, IDS, make_case

COUNTS = [[], [0], [0, 0, 0], [3], [2, 0, 5, 1], [0, 4, 0], [1] * 7, [6, 0, 3, 0, 0, 5, 2]]


def ragged_case(gen, counts, V, dtype, id_dtype, with_q, with_filters):
    """A padded verify_sampled case (drafts [B, K], q [B, K, V], logits [B, K+1, V], K = the
    widest request, num_drafts = counts) and its flattened form."""
    B, K = len(counts), max(counts, default=0)
    drafts, logits = make_case(gen, B, K, V, dtype, id_dtype, match_rate=0.8)
    q = torch.softmax(torch.randn(B, K, V, generator=gen) * 2, -1).to(dtype) if with_q else None
    temp = torch.rand(B, generator=gen) * 2
    temp[::3] = 0.0  # greedy requests among sampled ones
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
    offsets = torch.randint(0, 10**6, (B,), generator=gen)
    filters = dict(top_k=None, top_p=None, min_p=None)
    if with_filters:
        filters = dict(
            top_k=torch.randint(0, 6, (B,), generator=gen, dtype=torch.int64).to(id_dtype),
            top_p=torch.rand(B, generator=gen).clamp_min(0.05),
            min_p=torch.rand(B, generator=gen) * 0.3,
        )
    nd = torch.tensor(counts, dtype=torch.int64)
    padded = (drafts, q, logits, temp, seeds, offsets, nd)
    flat_d = torch.cat([drafts[b, :k] for b, k in enumerate(counts)] + [drafts.new_zeros(0)])
    flat_q = None if q is None else torch.cat([q[b, :k] for b, k in enumerate(counts)] + [q.new_zeros(0, V)])
    flat_l = torch.cat([logits[b, : k + 1] for b, k in enumerate(counts)] + [logits.new_zeros(0, V)])
    cu = nd.cumsum(0)
    flat = (flat_d, flat_q, cu, flat_l, temp, seeds, offsets)
    return flat, padded, filters


def check(flat, padded, filters, pad_id=-1, max_num_drafts=None, fn=None):
    """The op against the reference (bitwise) and against verify_sampled on the padded batch."""
    got = (fn or torch.ops.mtp.verify_sampled_ragged)(*flat, pad_id, **filters, max_num_drafts=max_num_drafts)
    want = reference.verify_sampled_ragged(*flat, pad_id, **filters, max_num_drafts=max_num_drafts)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == flat[0].dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)
    acc, out = torch.ops.mtp.verify_sampled(*padded, pad_id, **filters)
    W = got[1].shape[1]
    assert torch.equal(got[0], acc)
    K1 = out.shape[1]
    assert torch.equal(got[1][:, : min(K1, W)], out[:, : min(K1, W)])
    assert (got[1][:, K1:] == pad_id).all() and (out[:, W:] == pad_id).all()
    return got


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", IDS)
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("with_filters", [False, True])
def test_against_reference_and_padded_verify_sampled(isa, gen, dtype, id_dtype, with_q, with_filters):
    for i, counts in enumerate(COUNTS):
        V = (1, 7, 300, 1000)[i % 4]
        flat, padded, filters = ragged_case(gen, counts, V, dtype, id_dtype, with_q, with_filters)
        if i % 2:
            flat = flat[:2] + (flat[2].int(),) + flat[3:]
        check(flat, padded, filters, pad_id=i - 1)


def test_random_counts(isa, gen):
    for _ in range(6):
        B = int(torch.randint(1, 9, (1,), generator=gen))
        counts = torch.randint(0, 6, (B,), generator=gen).tolist()
        flat, padded, filters = ragged_case(gen, counts, 257, torch.float32, torch.int64, True, True)
        check(flat, padded, filters, max_num_drafts=7)


def test_strided_views(isa, gen):
    counts = [3, 0, 2, 4]
    flat, padded, filters = ragged_case(gen, counts, 300, torch.bfloat16, torch.int32, True, True)
    d, q, cu, lg, temp, seeds, offsets = flat
    # Every input a non-contiguous view of a larger tensor, read in place.
    d2 = torch.stack([d, d], 1)[:, 1]
    q2 = torch.cat([q, q], 1)[:, 300:]
    lg2 = lg.t().contiguous().t()
    cu2 = torch.stack([cu, cu], 1)[:, 0]
    per = [torch.stack([t, t], 1)[:, 0] for t in (temp, seeds, offsets)]
    filt = {k: torch.stack([v, v], 1)[:, 1] for k, v in filters.items()}
    assert not (d2.is_contiguous() or q2.is_contiguous() or lg2.is_contiguous() or per[0].is_contiguous())
    check((d2, q2, cu2, lg2, *per), padded, filt)


def test_max_num_drafts_pads(isa, gen):
    flat, padded, filters = ragged_case(gen, [2, 0, 3], 100, torch.float32, torch.int64, True, False)
    accepted, out = check(flat, padded, filters, pad_id=5, max_num_drafts=6)
    assert out.shape == (3, 7) and (out[:, 4:] == 5).all()


def test_thread_count_does_not_change_result(gen, threads):
    flat, padded, filters = ragged_case(gen, [5, 1, 0, 4, 3, 2], 2000, torch.float32, torch.int64, True, True)
    want = torch.ops.mtp.verify_sampled_ragged(*flat, **filters)
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        got = torch.ops.mtp.verify_sampled_ragged(*flat, **filters)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_opcheck(gen):
    flat, _, filters = ragged_case(gen, [2, 0, 3], 200, torch.float32, torch.int64, True, True)
    op = torch.ops.mtp.verify_sampled_ragged.default
    torch.library.opcheck(op, (*flat, -1, filters["top_k"], filters["top_p"], filters["min_p"], 4))
    d, _, cu, lg, temp, seeds, _ = flat
    torch.library.opcheck(op, (d.int(), None, cu.int(), lg.bfloat16(), temp, seeds, None, 0, None, None, None, 3))
    torch.library.opcheck(op, (d, None, cu, lg, temp, seeds), test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph(gen):
    flat, _, filters = ragged_case(gen, [2, 0, 3, 1], 300, torch.float32, torch.int64, True, True)
    d, q, cu, lg, temp, seeds, _ = flat

    @torch.compile(fullgraph=True)
    def step(d, q, cu, lg, temp, seeds, top_p):
        accepted, out = mtp_kernels.verify_sampled_ragged(
            d, q, cu, lg * 2.0, temp, seeds, offsets=seeds + 1, top_p=top_p, max_num_drafts=8
        )
        return accepted + 1, out

    accepted, out = step(d, q, cu, lg, temp, seeds, filters["top_p"])
    want_acc, want_out = reference.verify_sampled_ragged(
        d, q, cu, lg * 2.0, temp, seeds, seeds + 1, top_p=filters["top_p"], max_num_drafts=8
    )
    assert out.shape == (4, 9)
    assert torch.equal(accepted, want_acc + 1) and torch.equal(out, want_out)


def test_fake_width_without_max_is_dynamic(gen):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    flat, _, _ = ragged_case(gen, [2, 0, 3], 50, torch.float32, torch.int64, True, False)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake = [mode.from_tensor(t) for t in flat]
        accepted, out = torch.ops.mtp.verify_sampled_ragged(*fake)
        assert accepted.shape[0] == 3 and isinstance(out.shape[1], torch.SymInt)
        _, out = torch.ops.mtp.verify_sampled_ragged(*fake, max_num_drafts=7)
        assert out.shape[1] == 8


def good_args(**change):
    args = dict(
        draft_token_ids=torch.zeros(5, dtype=torch.long),
        draft_probs=None,
        cu_num_draft_tokens=torch.tensor([3, 3, 5]),
        target_logits=torch.zeros(8, 10),
        temperature=torch.ones(3),
        seeds=torch.zeros(3, dtype=torch.long),
        offsets=None,
        pad_id=-1,
        top_k=None,
        top_p=None,
        min_p=None,
        max_num_drafts=None,
    )
    args.update(change)
    return args


BAD = [
    (dict(cu_num_draft_tokens=torch.tensor([3, 2, 5])), "cu_num_draft_tokens must hold non-decreasing"),
    (dict(cu_num_draft_tokens=torch.tensor([-1, 3, 5])), "cu_num_draft_tokens[0] = -1 < 0"),
    (dict(cu_num_draft_tokens=torch.tensor([3, 3, 4]), target_logits=torch.zeros(8, 10)), "must end at N"),
    (dict(target_logits=torch.zeros(7, 10)), "target_logits.size(0) must equal N + B"),
    (dict(target_logits=torch.zeros(8, 0)), "V >= 1"),
    (dict(draft_token_ids=torch.zeros(5)), "draft_token_ids must be Int or Long"),
    (dict(draft_probs=torch.full((4, 10), 0.1)), "draft_probs.size(0) must equal N"),
    (dict(draft_probs=torch.full((5, 9), 0.1)), "draft_probs.size(1) must equal V"),
    (dict(draft_probs=torch.full((1, 5, 10), 0.1)), "draft_probs must be 2-D"),
    (
        dict(draft_probs=torch.full((5, 10), -0.1)),
        "draft_probs must be probabilities (finite, >= 0), got draft_probs[0, 0]",
    ),
    (
        dict(temperature=torch.tensor([1.0, -0.5, 1.0])),
        "temperature must be finite and >= 0, got temperature[1] = -0.5",
    ),
    (dict(temperature=torch.ones(2)), "temperature.size(0) must equal B (cu_num_draft_tokens.size(0))"),
    (dict(seeds=torch.zeros(3, dtype=torch.int32)), "seeds must be Long"),
    (dict(offsets=torch.zeros(4, dtype=torch.long)), "offsets.size(0) must equal B"),
    (dict(top_p=torch.tensor([1.0, 0.0, 1.0])), "top_p must lie in (0, 1] (1: off), got top_p[1] = 0"),
    (dict(top_k=torch.tensor([0, 0, -1])), "top_k must be >= 0 (0: off), got top_k[2] = -1"),
    (dict(min_p=torch.tensor([1.0, 0.0, 0.0])), "min_p must lie in [0, 1) (0: off), got min_p[0] = 1"),
    (dict(max_num_drafts=2), "max_num_drafts = 2 is smaller than request 0's 3 drafts"),
    (dict(max_num_drafts=-1), "max_num_drafts must be >= 0"),
    (dict(draft_token_ids=torch.zeros(5, dtype=torch.int32), pad_id=2**40), "pad_id must fit"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_input(change, message):
    with pytest.raises(RuntimeError, match=r"mtp\.verify_sampled_ragged: .*" + re.escape(message)):
        torch.ops.mtp.verify_sampled_ragged(**good_args(**change))

"""One speculative-decoding step captured in a CUDA graph: cache_append of the T = K + 1 new
key/value rows, head_attention over the cache (causal, the T queries the last T positions),
an LM-head-like linear on its output and verify (or verify_ragged) on those logits. Each
replay must give the bits of an eager run of the same step on the same inputs (torch.equal):
attention output, logits, accepted counts, out tokens, and the caches it wrote. Replayed three
times, with new inputs copied into the captured tensors each time (queries, new rows, drafts,
and in the ragged variants the cache lengths and draft counts), each against a fresh eager run.

GPU-only (skipped, and reported as skipped, without CUDA; bench/gpu_check.sh runs it). The
dispatched torch.ops.mtp.* (C++ CUDA when built with MTP_WITH_CUDA, else the Triton launchers)
in fp32 and bf16, and the Triton launchers called directly in bf16. Under capture the ops do no
host sync (the C++ bindings and the Triton launchers check torch's capture status).
"""

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="GPU-only: needs CUDA (run by bench/gpu_check.sh)"
)

# Small shapes: L = 600 is three 256-key chunks (the last partial); G * T = 8 query rows per kv head.
B, K, HQ, HKV, D, L, V = 3, 3, 4, 2, 64, 600, 1000
T = K + 1
N_RAGGED = 5  # draft tokens in the ragged layout: fixed by the captured shapes, split differently per replay
NAMES = ("attention output", "logits", "accepted", "out_tokens")

# Per replay round: cache lengths before the append (<= L - T), num_drafts, ragged counts (sum N_RAGGED).
ROUNDS = [
    ([300, 0, L - T], [3, 0, 2], [3, 0, 2]),
    ([17, L - T, 256], [1, 3, 3], [1, 3, 1]),
    ([L - T - 1, 255, 1], [0, 2, 1], [2, 1, 2]),
]


def ops(impl):
    if impl == "op":
        m = torch.ops.mtp
        return m.head_attention, m.cache_append, m.linear, m.verify, m.verify_ragged
    t = pytest.importorskip("mtp_kernels.triton")
    return t.head_attention, t.cache_append, t.linear, t.verify, t.verify_ragged


class DecodeStep:
    """The static tensors of one decode step (what the graph reads and writes) and the step."""

    def __init__(self, impl, dtype, variant, gen):
        self.attention, self.append, self.linear, self.verify, self.verify_ragged = ops(impl)
        self.variant = variant
        cuda = {"device": "cuda"}
        # The caches: [B, L, Hkv, D] buffers read in place as [B, Hkv, L, D] (a model's layout).
        self.kbuf = torch.randn(B, L, HKV, D, generator=gen).to("cuda", dtype)
        self.vbuf = torch.randn(B, L, HKV, D, generator=gen).to("cuda", dtype)
        self.k, self.v = self.kbuf.permute(0, 2, 1, 3), self.vbuf.permute(0, 2, 1, 3)
        self.w = (torch.randn(V, HQ * D, generator=gen) / (HQ * D) ** 0.5).to("cuda", dtype)
        self.q = torch.empty(B, T, HQ, D, dtype=dtype, **cuda)
        self.kn = torch.empty(B, T, HKV, D, dtype=dtype, **cuda)
        self.vn = torch.empty_like(self.kn)
        self.lens = torch.empty(B, dtype=torch.int64, **cuda)
        self.drafts = torch.empty(B, K, dtype=torch.int64, **cuda)
        self.nd = torch.empty(B, dtype=torch.int64, **cuda)
        self.cu = torch.empty(B, dtype=torch.int64, **cuda)
        self.rows = torch.empty(N_RAGGED + B, dtype=torch.int64, **cuda)  # logits rows of the ragged layout
        self.draft_ids = torch.empty(N_RAGGED, dtype=torch.int64, **cuda)
        self.counts = [K] * B

    def __call__(self):
        self.append(self.k, self.v, self.kn, self.vn, self.lens)
        att = self.attention(self.q, self.k, self.v, self.lens + T, None, None, None, True)
        logits = self.linear(att.reshape(B * T, HQ * D), self.w)
        if self.variant == "ragged":
            # Request b's K_b + 1 rows are rows b * T + j (j <= K_b) of the dense logits.
            ragged = logits.index_select(0, self.rows)
            accepted, out = self.verify_ragged(self.draft_ids, self.cu, ragged, -1, K)
        else:
            nd = self.nd if self.variant == "num_drafts" else None
            accepted, out = self.verify(self.drafts, logits.reshape(B, T, V), nd)
        return att, logits, accepted, out

    def fill(self, gen, lens, nd, counts):
        """New inputs, copied into the captured tensors."""
        for t in (self.q, self.kn, self.vn):
            t.copy_(torch.randn(t.shape, generator=gen))
        self.drafts.copy_(torch.randint(0, V, (B, K), generator=gen))
        self.lens.copy_(torch.tensor(lens))
        self.nd.copy_(torch.tensor(nd))
        self.counts = counts
        cu = torch.tensor(counts).cumsum(0)
        assert int(cu[-1]) == N_RAGGED
        self.cu.copy_(cu)
        self.rows.copy_(torch.tensor([b * T + j for b in range(B) for j in range(counts[b] + 1)]))
        self._ragged_drafts()

    def _ragged_drafts(self):
        d = self.drafts.tolist()
        self.draft_ids.copy_(torch.tensor([d[b][j] for b in range(B) for j in range(self.counts[b])]))

    def set_drafts(self, logits, gen):
        """Drafts that agree with the logits' argmax up to a random first mismatch per request,
        so that the accepted counts vary (K: all accepted)."""
        drafts = logits.reshape(B, T, V).argmax(-1)[:, :K].clone()
        for b, stop in enumerate(torch.randint(0, K + 1, (B,), generator=gen).tolist()):
            if stop < K:
                drafts[b, stop] = (drafts[b, stop] + 1) % V
        self.drafts.copy_(drafts)
        self._ragged_drafts()

    def caches(self):
        return self.kbuf.clone(), self.vbuf.clone()

    def restore(self, caches):
        self.kbuf.copy_(caches[0])
        self.vbuf.copy_(caches[1])

    def reference_verify(self, logits):
        """verify of these inputs by mtp_kernels.reference (on the CPU)."""
        lg = logits.cpu()
        if self.variant == "ragged":
            return reference.verify_ragged(self.draft_ids.cpu(), self.cu.cpu(), lg[self.rows.cpu()], -1, K)
        nd = self.nd.cpu() if self.variant == "num_drafts" else None
        return reference.verify(self.drafts.cpu(), lg.reshape(B, T, V), nd)


def capture(step):
    """torch's pattern: warm up on a side stream (compiles the Triton kernels, allocates the C++
    kernels' check flags: neither may happen under capture), then capture on the default path."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    torch.cuda.synchronize()
    return graph, static


@pytest.mark.parametrize("variant", ["dense", "num_drafts", "ragged"])
@pytest.mark.parametrize(
    "impl,dtype",
    [("op", torch.float32), ("op", torch.bfloat16), ("triton", torch.bfloat16)],
    ids=["op-fp32", "op-bf16", "triton-bf16"],
)
def test_decode_step_replay_equals_eager(impl, dtype, variant):
    gen = torch.Generator().manual_seed(3)
    step = DecodeStep(impl, dtype, variant, gen)
    lens0, nd0, counts0 = ROUNDS[0]
    step.fill(gen, lens0, nd0, counts0)
    graph, static = capture(step)
    accepted_seen = set()
    for r, (lens, nd, counts) in enumerate(ROUNDS):
        if variant == "dense":  # the same lengths and full drafts every time; new values
            lens, nd, counts = lens0, nd0, counts0
        step.fill(gen, lens, nd, counts)
        before = step.caches()
        step.set_drafts(step()[1], gen)  # an eager pass for the targets only
        step.restore(before)
        want = [t.clone() for t in step()]  # the eager run on this round's inputs
        want_caches = step.caches()
        step.restore(before)
        graph.replay()
        torch.cuda.synchronize()
        for name, got, w in zip(NAMES, static, want):
            assert got.shape == w.shape and got.dtype == w.dtype, (r, name)
            assert torch.equal(got, w), f"round {r}: the replay's {name} differs from the eager run's"
        assert torch.equal(step.kbuf, want_caches[0]) and torch.equal(step.vbuf, want_caches[1]), r
        # The appended rows are where the lengths say (the captured lengths are not baked in).
        for b, n in enumerate(lens):
            assert torch.equal(step.kbuf[b, n : n + T], step.kn[b]), (r, b)
        ref_accepted, ref_out = step.reference_verify(want[1])
        assert torch.equal(want[2].cpu(), ref_accepted) and torch.equal(want[3].cpu(), ref_out), r
        accepted_seen.update(want[2].tolist())
        mtp_kernels.cuda_check()  # every count and length was in range: nothing recorded
    assert len(accepted_seen) > 1, accepted_seen  # the drafts made the accepted counts vary

"""Value checks of the C++ CUDA kernels without a host sync (docs/gpu.md, "Value checks").

Counts and lengths live on the device, so by default the CUDA bindings do not read them: the
kernels record a bad value and compute on it clamped, and the next mtp call on that device
(or mtp_kernels.cuda_check()) raises. MTP_CUDA_SYNC_CHECKS=1 checks them at the call, with one
host sync, as on the CPU. GPU-only (run by bench/gpu_check.sh).
"""

import re

import pytest
import torch

import mtp_kernels
from mtp_kernels import reference

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and mtp_kernels._C.with_cuda),
    reason="GPU-only: needs CUDA and the C++ CUDA kernels (run by bench/gpu_check.sh)",
)


def clear():
    torch.cuda.synchronize()
    try:
        mtp_kernels._C.device_check(torch.cuda.current_device())
    except RuntimeError:
        pass


@pytest.fixture(autouse=True)
def device_checks(monkeypatch):
    monkeypatch.delenv("MTP_CUDA_SYNC_CHECKS", raising=False)
    clear()  # nothing left over from other tests
    yield
    clear()


def recorded(message):
    return pytest.raises(RuntimeError, match=re.escape(message))


def verify_case(B=3, K=3, V=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=gen)
    drafts = logits.argmax(-1)[:, :K].clone()
    drafts[1, 1] = (drafts[1, 1] + 1) % V  # request 1 stops at its second draft
    return drafts.cuda(), logits.cuda()


def test_good_calls_record_nothing():
    d, lg = verify_case()
    torch.ops.mtp.verify(d, lg, torch.tensor([3, 0, 2], device="cuda"))
    torch.ops.mtp.accept_prefix(d, lg.argmax(-1), torch.tensor([3, 3, 3], device="cuda"))
    k = torch.randn(3, 2, 40, 64, device="cuda")
    q = torch.randn(3, 2, 4, 64, device="cuda")
    lens = torch.tensor([2, 40, 17], device="cuda")
    torch.ops.mtp.head_attention(q, k, k, lens, None, None, None, True)
    torch.ops.mtp.cache_append(k, k.clone(), q[:, :, :2], q[:, :, :2], torch.tensor([0, 38, 3], device="cuda"))
    mtp_kernels.cuda_check()


def test_verify_num_drafts_recorded_and_clamped():
    d, lg = verify_case()
    got = torch.ops.mtp.verify(d, lg, torch.tensor([3, 9, -4], device="cuda"))
    want = reference.verify(d.cpu(), lg.cpu(), torch.tensor([3, 3, 0]))
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    with recorded("mtp.verify: num_drafts must lie in [0, K], got num_drafts["):
        mtp_kernels.cuda_check()
    mtp_kernels.cuda_check()  # cleared


def test_the_next_call_raises():
    d, lg = verify_case()
    torch.ops.mtp.accept_prefix(d, lg.argmax(-1), torch.tensor([0, 0, 7], device="cuda"))
    torch.cuda.synchronize()
    message = "mtp.accept_prefix: num_drafts must lie in [0, K], got num_drafts[2] = 7 in an earlier call on cuda:"
    with recorded(message):
        torch.ops.mtp.verify(d, lg)  # a good call: raises what the earlier one recorded
    torch.ops.mtp.verify(d, lg)
    mtp_kernels.cuda_check()


def test_sync_checks_raise_at_the_call(monkeypatch):
    monkeypatch.setenv("MTP_CUDA_SYNC_CHECKS", "1")
    d, lg = verify_case()
    with recorded("mtp.verify: num_drafts must lie in [0, K] = [0, 3], got num_drafts[1] = 9"):
        torch.ops.mtp.verify(d, lg, torch.tensor([3, 9, 0], device="cuda"))
    mtp_kernels.cuda_check()  # nothing recorded: the host checked


def test_attention_lengths_recorded_and_clamped():
    gen = torch.Generator().manual_seed(1)
    B, T, Hq, Hkv, L, D = 2, 1, 4, 2, 300, 64
    q = torch.randn(B, T, Hq, D, generator=gen).cuda()
    k = torch.randn(B, Hkv, L, D, generator=gen).cuda()
    v = torch.randn(B, Hkv, L, D, generator=gen).cuda()
    want = torch.ops.mtp.head_attention(q, k, v, torch.tensor([L, 0], device="cuda"))
    got = torch.ops.mtp.head_attention(q, k, v, torch.tensor([10**6, -5], device="cuda"))
    assert torch.equal(got, want)
    with recorded("mtp.head_attention: cache_lens must lie in [0, L] ([T, L] when causal), got cache_lens["):
        mtp_kernels.cuda_check()
    q4 = torch.randn(B, 4, Hq, D, generator=gen).cuda()
    torch.ops.mtp.head_attention(q4, k, v, torch.tensor([10, 3], device="cuda"), causal=True)  # 3 < T = 4
    with recorded("got cache_lens[1] = 3 in an earlier call"):
        mtp_kernels.cuda_check()


def test_attention_capacity_grid_equals_the_checked_grid(monkeypatch):
    """Without a host read of the lengths the grid covers the capacity (blocks loop over
    chunks); the rows' bits are those of the grid over the longest length."""
    gen = torch.Generator().manual_seed(2)
    B, T, Hq, Hkv, L, D = 3, 3, 8, 2, 2000, 128
    q = torch.randn(B, T, Hq, D, generator=gen).cuda().bfloat16()
    k = torch.randn(B, Hkv, L, D, generator=gen).cuda().bfloat16()
    v = torch.randn(B, Hkv, L, D, generator=gen).cuda().bfloat16()
    lens = torch.tensor([5, 700, 300], device="cuda")
    free = torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, True)
    monkeypatch.setenv("MTP_CUDA_SYNC_CHECKS", "1")
    checked = torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, True)
    assert torch.equal(free, checked)
    mtp_kernels.cuda_check()


def test_cache_append_overflow_recorded_writes_nothing():
    k = torch.randn(2, 2, 10, 64, device="cuda")
    v = torch.randn_like(k)
    kn, vn = torch.randn(2, 3, 2, 64, device="cuda"), torch.randn(2, 3, 2, 64, device="cuda")
    k0, v0 = k.clone(), v.clone()
    torch.ops.mtp.cache_append(k, v, kn, vn, torch.tensor([0, 8], device="cuda"))
    assert torch.equal(k, k0) and torch.equal(v, v0)
    with recorded("mtp.cache_append: cache_lens must lie in [0, L - T], got cache_lens[1] = 8"):
        mtp_kernels.cuda_check()


def test_verify_ragged_layout_recorded():
    gen = torch.Generator().manual_seed(3)
    V = 200
    logits = torch.randn(5 + 2, V, generator=gen).cuda()
    drafts = torch.randint(0, V, (5,), generator=gen).cuda()
    torch.ops.mtp.verify_ragged(drafts, torch.tensor([3, 5], device="cuda"), logits, -1, 3)
    mtp_kernels.cuda_check()
    torch.ops.mtp.verify_ragged(drafts, torch.tensor([4, 2], device="cuda"), logits, -1, 4)  # decreasing
    with recorded("mtp.verify_ragged: cu_num_draft_tokens must lie in"):
        mtp_kernels.cuda_check()


def test_graph_replay_records():
    d, lg = verify_case()
    nd = torch.tensor([3, 3, 3], device="cuda")
    torch.ops.mtp.verify(d, lg, nd)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.mtp.verify(d, lg, nd)
    graph.replay()
    mtp_kernels.cuda_check()
    nd.copy_(torch.tensor([3, 11, 3]))
    graph.replay()
    with recorded("mtp.verify: num_drafts must lie in [0, K], got num_drafts[1] = 11"):
        mtp_kernels.cuda_check()

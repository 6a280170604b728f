"""The row-local layer ops (mtp.add_rms_norm, mtp.rms_norm, mtp.rope_, mtp.silu_mul,
mtp.gelu_tanh_mul: Gemma 3's activation, at the same sizes) against
the torch composition the backbone ran before (fp32 upcast, pow, mean, rsqrt, ...), for
SmolLM2-135M's sizes (hidden 576, 9 query + 3 kv heads of 64, intermediate 1536) and the rows
of a decode step (T=1) and of verify passes (T=5, T=9), bf16 as the backbone runs. "layer":
everything one decoder layer does between its projections (two residual adds and norms, RoPE
of the q and k heads, the gated activation). Bytes = what the op reads and writes.

    python -m pytest bench/bench_rowwise.py --benchmark-only -q --benchmark-json=rowwise.json
    python bench/report.py rowwise.json
"""

import pytest
import torch

import mtp_kernels  # noqa: F401  (registers the ops)

HIDDEN, HQ, HKV, D, INTER, EPS = 576, 9, 3, 64, 1536, 1e-5
DTYPE = torch.bfloat16


def torch_rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w).to(x.dtype)


def torch_rope(x, cos, sin):
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


def torch_silu_mul(gate_up):
    gate, up = gate_up.split(INTER, dim=-1)
    return torch.nn.functional.silu(gate) * up


def torch_gelu_tanh_mul(gate_up):
    gate, up = gate_up.split(INTER, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def inputs(T):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(DTYPE)  # noqa: E731
    # RoPE's angles at positions 200..200+T (half-split: both halves turn alike, so repeated
    # in-place rotation keeps the magnitudes)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2) / D)
    angles = (torch.arange(200, 200 + T)[:, None] * inv).repeat(1, 2)[None]
    return dict(
        x=r(1, T, HIDDEN),
        o=r(1, T, HIDDEN),
        w=r(HIDDEN),
        qkv=r(1, T, HQ + 2 * HKV, D),
        cos=angles.cos(),
        sin=angles.sin(),
        gate_up=r(1, T, 2 * INTER),
    )


def case(op, impl, a):
    """(function to time, bytes read + written)."""
    n, qk = a["x"].numel() * 2, a["qkv"][:, :, : HQ + HKV]
    rope_bytes = 2 * qk.numel() * 2 + 2 * a["cos"].numel() * 4
    silu_bytes = a["gate_up"].numel() * 2 * 3 // 2
    if op == "rms_norm":
        return (lambda: torch.ops.mtp.rms_norm(a["x"], a["w"], EPS)) if impl == "mtp" else (
            lambda: torch_rms_norm(a["x"], a["w"])
        ), 2 * n
    if op == "add_rms_norm":
        return (lambda: torch.ops.mtp.add_rms_norm(a["x"], a["o"], a["w"], EPS)) if impl == "mtp" else (
            lambda: torch_rms_norm(a["x"] + a["o"], a["w"])
        ), 4 * n
    if op == "rope":
        return (lambda: torch.ops.mtp.rope_(qk, a["cos"], a["sin"])) if impl == "mtp" else (
            lambda: torch_rope(qk, a["cos"], a["sin"])
        ), rope_bytes
    if op == "silu_mul":
        return (lambda: torch.ops.mtp.silu_mul(a["gate_up"])) if impl == "mtp" else (
            lambda: torch_silu_mul(a["gate_up"])
        ), silu_bytes
    if op == "gelu_tanh_mul":
        return (lambda: torch.ops.mtp.gelu_tanh_mul(a["gate_up"])) if impl == "mtp" else (
            lambda: torch_gelu_tanh_mul(a["gate_up"])
        ), silu_bytes

    def layer_mtp():
        torch.ops.mtp.rope_(qk, a["cos"], a["sin"])
        x, h = torch.ops.mtp.add_rms_norm(a["x"], a["o"], a["w"], EPS)
        m = torch.ops.mtp.silu_mul(a["gate_up"])
        return torch.ops.mtp.add_rms_norm(x, a["o"], a["w"], EPS), m

    def layer_torch():
        torch_rope(qk, a["cos"], a["sin"])
        x = a["x"] + a["o"]
        torch_rms_norm(x, a["w"])
        m = torch_silu_mul(a["gate_up"])
        x = x + a["o"]
        return torch_rms_norm(x, a["w"]), m

    return (layer_mtp if impl == "mtp" else layer_torch), rope_bytes + silu_bytes + 8 * n


@pytest.mark.parametrize("impl", ["mtp", "torch"])
@pytest.mark.parametrize("op", ["add_rms_norm", "rms_norm", "rope", "silu_mul", "gelu_tanh_mul", "layer"])
@pytest.mark.parametrize("T", [1, 5, 9])
def test_rowwise(benchmark, op, impl, T):
    fn, nbytes = case(op, impl, inputs(T))
    benchmark.group = f"{op} T={T} bfloat16"
    benchmark.extra_info["bytes"] = nbytes
    benchmark(fn)

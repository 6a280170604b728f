"""GPU microbenchmarks: ours (the dispatched torch.ops.mtp kernel -- C++ CUDA when built with
MTP_WITH_CUDA -- and the Triton launcher) against the torch implementation, as GB/s next to
the bandwidth measured in the same run. Run by bench/gpu_check.sh; needs a CUDA GPU.

    python bench/gpu_bench.py RESULTS.md [RESULTS.json]

Writes RESULTS.md and the same figures as JSON (default: RESULTS.md's path with .json):
``records``, one per (case, implementation): {case, op, implementation, us, gbps, pct_copy,
ref_us, ratio_vs_ref}, where ref_us is the torch reference's time for the case (the third
implementation: reference.verify, F.linear, SDPA, index_put_) and ratio_vs_ref = us / ref_us
(below 1: faster than torch); and top-level device, torch, cuda, triton, copy_gbps, read_gbps,
host_overhead, graph_replay, errors, complete. Both files are rewritten after every section,
so a run stopped by its timeout leaves what it measured (``complete`` false). A section (or a
case, or one implementation of a case) that raises is recorded under ``errors`` and in the
markdown, and the others still run.

Sections:
- host overhead: the CPU time of one torch.ops.mtp call of verify, linear, head_attention and
  cache_append at decode sizes (the wall time of 200 back-to-back calls without a sync, after
  a warm-up, divided by 200: each call's GPU work is a few microseconds, so the queue stays
  short and the host is not held back by it; where host ~ eager ~ graph time the GPU may be
  the bound), next to the CUDA-event time per call of the same loop and the time per call
  inside a CUDA graph replay (20 calls captured: GPU time without launch overhead), and a
  torch.add as the floor of a torch op. Goal: <= 8 us per C++ op call.
- graph replay: one decode step (head_attention on a bf16 cache, an LM-head-like linear, verify
  of its logits as [B, K + 1, V]) captured in a torch.cuda.CUDAGraph and replayed: bitwise equal
  (torch.equal) to the eager step, on the capture's inputs and on new ones copied in; times of
  the eager step and of a replay.
- kernels: verify, linear, head_attention (against torch's scaled_dot_product_attention with
  enable_gqa=True on the same cache, every request at the full length L: SDPA takes no
  per-request lengths), cache_append (against index_put_). head_attention shapes: a
  Llama-8B-like (Hq 32, Hkv 8, D 128, with one long 128k-key case), SmolLM2's (9, 3, 64) and a
  Gemma-3-like (4, 1, 256) attention, decode (T = 1) and verify (T = 4, causal).

Timing: each time is the median of 5 repeats of the mean of n back-to-back calls between two
CUDA events, after a first call and 5 warm-up calls; n = 50, or fewer (at least 5) for calls
slower than 0.4 ms, so that a repeat takes about 20 ms. It includes launch overhead (a few
microseconds per launch, more for Triton's Python launcher), which dominates the smallest
cases. Inputs are rotated where a case's working set would fit in the GPU's L2 (60 MB on an
H200): the case allocates enough copies of its inputs to exceed 200 MB (at most 256 copies,
which only the cache_append cases reach) and the calls cycle through them, so no call reads what
the previous ones left in L2 (cache_append also writes to a different position per copy).
Bytes count what the op must read (logits / weights and activations / K and V rows) and write.
"""

import itertools
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import mtp_kernels
from mtp_kernels import reference

try:
    import triton

    import mtp_kernels.triton as mtp_triton

    TRITON = triton.__version__
except Exception as e:  # the C++ kernels and torch are still measured
    mtp_triton, TRITON = None, f"unavailable: {type(e).__name__}: {e}"

GB = 1e9
ROTATE_BYTES = 200e6  # rotate a case's inputs until they exceed this (> 3x the L2)
MAX_COPIES = 256
HOST_CALLS = 200  # back-to-back calls per host-overhead measurement
GRAPH_CALLS = 20  # calls captured in one graph for the per-call replay time
HOST_TARGET_US = 8.0


def copies_for(nbytes):
    """How many copies of a case's inputs the timing cycles through."""
    if nbytes >= ROTATE_BYTES:
        return 1
    return min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(nbytes, 1)))


def time_ms(fn, arg_sets=((),), iters=50, warmup=5, repeats=5, target_ms=20.0):
    """Median over `repeats` of the mean time of n back-to-back calls fn(*args), the args
    cycling through arg_sets (rotated copies), between two CUDA events."""
    sets = itertools.cycle(arg_sets)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(*next(sets))  # compiles (Triton), creates handles (cuBLAS)
    torch.cuda.synchronize()
    start.record()
    for _ in range(warmup):
        fn(*next(sets))
    end.record()
    end.synchronize()
    per_call = start.elapsed_time(end) / warmup
    n = max(5, min(iters, int(target_ms / max(per_call, 1e-6))))
    runs = []
    for _ in range(repeats):
        start.record()
        for _ in range(n):
            fn(*next(sets))
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / n)
    return statistics.median(runs)


def rotated(make, nbytes):
    """[make()] plus clones of its tensors up to copies_for(nbytes) sets (same values)."""
    first = tuple(make())
    copies = [
        tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in first) for _ in range(copies_for(nbytes) - 1)
    ]
    return [first] + copies


class Report:
    def __init__(self, md_path, json_path):
        self.md_path, self.json_path = md_path, json_path
        self.meta = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": TRITON,
            "backend": "C++ CUDA kernels (MTP_WITH_CUDA)" if mtp_kernels._C.with_cuda else "Triton kernels",
        }
        self.bandwidth = {}
        self.records = []
        self.host_overhead = {}
        self.host_detail = {}
        self.graph_replay = {}
        self.errors = []
        self.complete = False

    def error(self, where, exc):
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.errors.append({"where": where, "error": f"{type(exc).__name__}: {str(exc)[:1000]}", "trace": tb[-3:]})
        print(f"ERROR in {where}:", "".join(tb), file=sys.stderr, flush=True)

    def guarded(self, where, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            self.error(where, e)
            return None

    def add_case(self, op, case, nbytes, impls, arg_sets):
        """Times each (name, fn) of impls (the last one: torch's, the reference) over arg_sets."""
        times = []
        for impl, fn in impls:
            if fn is None:
                continue
            times.append((impl, self.guarded(f"{case} / {impl}", time_ms, fn, arg_sets)))
        ref = impls[-1][0]
        ref_ms = dict(times).get(ref)
        copy = self.bandwidth.get("copy_gbps")
        for impl, ms in times:
            gbps = nbytes / (ms * 1e-3) / GB if ms else None
            self.records.append(
                {
                    "case": case,
                    "op": op,
                    "implementation": impl,
                    "us": ms * 1e3 if ms else None,
                    "gbps": gbps,
                    "pct_copy": 100 * gbps / copy if gbps is not None and copy else None,
                    "ref_us": ref_ms * 1e3 if ref_ms else None,
                    "ratio_vs_ref": ms / ref_ms if ms and ref_ms else None,
                }
            )

    def as_json(self):
        return {
            **self.meta,
            "copy_gbps": self.bandwidth.get("copy_gbps"),
            "read_gbps": self.bandwidth.get("read_gbps"),
            "fields": {
                "us": "median over 5 repeats of the mean time per call (CUDA events), inputs rotated past L2",
                "gbps": "bytes the op must read and write / time",
                "pct_copy": "gbps as a percentage of copy_gbps (read + write bandwidth measured in this run)",
                "ref_us": "the torch reference's time for the same case",
                "ratio_vs_ref": "us / ref_us (below 1: faster than torch)",
                "host_overhead": f"host (CPU) us per torch.ops.mtp call, {HOST_CALLS} back-to-back calls, no sync",
                "graph_replay": "one decode step captured in a CUDA graph: replay == eager bitwise, and times",
            },
            "host_overhead": self.host_overhead,
            "host_overhead_detail": self.host_detail,
            "graph_replay": self.graph_replay,
            "records": self.records,
            "errors": self.errors,
            "complete": self.complete,
        }

    def markdown(self):
        m = self.meta
        lines = [
            f"# GPU microbenchmarks: {m['device']}",
            "",
            f"torch {m['torch']}, CUDA {m['cuda']}, triton {m['triton']}; "
            f"torch.ops.mtp on CUDA tensors: {m['backend']}.",
            "",
        ]
        if self.bandwidth:
            lines += [
                f"Measured ceilings: copy (read+write) {self.bandwidth['copy_gbps']:.0f} GB/s, "
                f"read (sum) {self.bandwidth['read_gbps']:.0f} GB/s.",
                "",
            ]
        if not self.complete:
            lines += ["**Incomplete**: the run stopped before its last section.", ""]
        if self.host_detail:
            lines += [
                f"## Host overhead per torch.ops.mtp call (goal <= {HOST_TARGET_US:.0f} us)",
                "",
                f"host: wall time of {HOST_CALLS} back-to-back calls without a sync / {HOST_CALLS} (median of 5); "
                "eager: CUDA-event time per call of the same loop (the larger of host and GPU time); "
                f"graph: GPU time per call inside a CUDA graph replay of {GRAPH_CALLS} captured calls.",
                "",
                "| op | shape | host us/call | eager us/call | graph us/call | goal |",
                "| --- | --- | ---: | ---: | ---: | --- |",
            ]
            for op, d in self.host_detail.items():
                goal = "" if op not in self.host_overhead else ("ok" if d["host_us"] <= HOST_TARGET_US else "over")
                lines.append(
                    f"| {op} | {d['shape']} | {_f(d.get('host_us'))} | {_f(d.get('eager_us'))} | "
                    f"{_f(d.get('graph_us'))} | {goal} |"
                )
            lines.append("")
        if self.graph_replay:
            g = self.graph_replay
            lines += [
                "## CUDA graph: one decode step",
                "",
                f"{g.get('step', '')}: replay bitwise equal to eager: **{g.get('bitwise_equal')}**; "
                f"eager {_f(g.get('eager_us'))} us, replay {_f(g.get('replay_us'))} us per step.",
                "",
            ]
            for r in g.get("rounds", []):
                lines.append(f"- {r['inputs']}: " + ", ".join(f"{k} {v}" for k, v in r["equal"].items()))
            if g.get("error"):
                lines.append(f"- error: {g['error']}")
            lines.append("")
        if self.records:
            lines += [
                "## Kernels: ours vs torch",
                "",
                "| case | implementation | time (us) | GB/s | % of copy bandwidth | time / torch's |",
                "| --- | --- | ---: | ---: | ---: | ---: |",
            ]
            for r in self.records:
                ratio = f"{r['ratio_vs_ref']:.2f}x" if r["ratio_vs_ref"] is not None else "-"
                pct = f"{r['pct_copy']:.0f}%" if r["pct_copy"] is not None else "-"
                gbps = f"{r['gbps']:.0f}" if r["gbps"] is not None else "-"
                lines.append(f"| {r['case']} | {r['implementation']} | {_f(r['us'])} | {gbps} | {pct} | {ratio} |")
            lines.append("")
        if self.errors:
            lines += ["## Errors", ""]
            lines += [f"- {e['where']}: `{e['error'][:300]}`" for e in self.errors]
            lines.append("")
        return "\n".join(lines)

    def write(self):
        text = self.markdown()
        with open(self.md_path, "w") as f:
            f.write(text)
        with open(self.json_path, "w") as f:
            json.dump(self.as_json(), f, indent=1)
            f.write("\n")
        return text


def _f(x):
    return "-" if x is None else f"{x:.1f}"


def bandwidth(report):
    n = (1 << 30) // 4
    src, dst = torch.ones(n, device="cuda"), torch.empty(n, device="cuda")
    copy = time_ms(dst.copy_, [(src,)], iters=10)
    read = time_ms(torch.sum, [(src,)], iters=10)
    report.bandwidth = {"copy_gbps": 2 * n * 4 / (copy * 1e-3) / GB, "read_gbps": n * 4 / (read * 1e-3) / GB}


def triton_fn(name):
    return getattr(mtp_triton, name) if mtp_triton is not None else None


# ---------------------------------------------------------------- host overhead
def host_cases():
    """op -> (shape, fn): decode-sized calls whose GPU work is a few microseconds."""
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    logits = torch.randn(1, 5, 49152, **bf16)
    drafts = logits.argmax(-1)[:, :4].contiguous()
    x, w = torch.randn(1, 576, **bf16), torch.randn(576, 576, **bf16) / 24
    q = torch.randn(1, 1, 9, 64, **bf16)
    k, v = torch.randn(1, 3, 1024, 64, **bf16), torch.randn(1, 3, 1024, 64, **bf16)
    lens = torch.tensor([1024], device="cuda")
    kc, vc = torch.zeros(1, 3, 1024, 64, **bf16), torch.zeros(1, 3, 1024, 64, **bf16)
    kn, vn = torch.randn(1, 1, 3, 64, **bf16), torch.randn(1, 1, 3, 64, **bf16)
    pos = torch.tensor([512], device="cuda")
    a, b = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
    return {
        "verify": ("B=1 K=4 V=49152 bf16", lambda: torch.ops.mtp.verify(drafts, logits)),
        "linear": ("M=1 N=576 K=576 bf16", lambda: torch.ops.mtp.linear(x, w)),
        "head_attention": (
            "B=1 T=1 Hq=9 Hkv=3 D=64 L=1024 bf16",
            lambda: torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, False),
        ),
        "cache_append": ("B=1 T=1 Hkv=3 D=64 L=1024 bf16", lambda: torch.ops.mtp.cache_append(kc, vc, kn, vn, pos)),
        "torch.add (baseline)": ("8 floats", lambda: torch.add(a, b)),
    }


def capture(fn, calls=1):
    """torch's pattern: warm up on a side stream, then capture `calls` calls of fn in a graph.
    Returns the graph and the outputs of the last captured call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    torch.cuda.synchronize()
    return graph, out


def host_one(report, op, shape, fn):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host, eager = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        host.append((t1 - t0) / HOST_CALLS * 1e6)
        eager.append(start.elapsed_time(end) / HOST_CALLS * 1e3)
    detail = {"shape": shape, "host_us": statistics.median(host), "eager_us": statistics.median(eager)}
    report.host_detail[op] = detail
    if op in ("verify", "linear", "head_attention", "cache_append"):
        report.host_overhead[op] = detail["host_us"]
    graph, _ = capture(fn, GRAPH_CALLS)
    graph.replay()
    torch.cuda.synchronize()
    detail["graph_us"] = time_ms(graph.replay, iters=10) * 1e3 / GRAPH_CALLS


def host_overhead(report):
    for op, (shape, fn) in host_cases().items():
        report.guarded(f"host overhead / {op}", host_one, report, op, shape, fn)


# ---------------------------------------------------------------- graph replay of a decode step
def graph_replay(report):
    g = report.graph_replay
    try:
        decode_step_graph(report, g)
    except Exception as e:
        g["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        raise


def decode_step_graph(report, g):
    B, K, Hq, Hkv, D, L, V = 4, 4, 9, 3, 64, 4096, 49152
    T = K + 1
    g.update(bitwise_equal=False, step=f"B={B} K={K} Hq={Hq} Hkv={Hkv} D={D} L={L} V={V} bf16")
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    gen = torch.Generator(device="cuda").manual_seed(0)
    kbuf, vbuf = torch.randn(B, L, Hkv, D, generator=gen, **bf16), torch.randn(B, L, Hkv, D, generator=gen, **bf16)
    k, v = kbuf.permute(0, 2, 1, 3), vbuf.permute(0, 2, 1, 3)
    w = torch.randn(V, Hq * D, generator=gen, **bf16) / (Hq * D) ** 0.5
    q = torch.randn(B, T, Hq, D, generator=gen, **bf16)
    lens = torch.tensor([L, 1000, T, 2500], device="cuda")
    nd = torch.tensor([4, 2, 0, 3], device="cuda")
    drafts = torch.zeros(B, K, dtype=torch.int64, device="cuda")

    def step():
        att = torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, True)
        logits = torch.ops.mtp.linear(att.reshape(B * T, Hq * D), w)
        accepted, out = torch.ops.mtp.verify(drafts, logits.reshape(B, T, V), nd)
        return att, logits, accepted, out

    def set_drafts():
        # The targets' argmax with a first mismatch at position b: request b accepts min(b, nd[b]).
        d = step()[1].reshape(B, T, V).argmax(-1)[:, :K].clone()
        for b in range(min(B, K)):
            d[b, b] = (d[b, b] + 1) % V
        drafts.copy_(d)

    set_drafts()
    eager = [t.clone() for t in step()]
    graph, static = capture(step)
    rounds = []
    for inputs in ("the capture's inputs", "new q, cache_lens, num_drafts, drafts"):
        if rounds:
            q.copy_(torch.randn(q.shape, generator=gen, **bf16))
            lens.copy_(torch.tensor([T, 3000, L, 17], device="cuda"))
            nd.copy_(torch.tensor([1, 4, 3, 0], device="cuda"))
            set_drafts()
            eager = [t.clone() for t in step()]
        graph.replay()
        torch.cuda.synchronize()
        names = ("attention", "logits", "accepted", "out_tokens")
        rounds.append({"inputs": inputs, "equal": {n: torch.equal(s, e) for n, s, e in zip(names, static, eager)}})
        rounds[-1]["accepted"] = eager[2].tolist()
    g["rounds"] = rounds
    g["bitwise_equal"] = all(all(r["equal"].values()) for r in rounds)
    report.guarded("graph replay / cuda_check", mtp_kernels.cuda_check)  # nothing out of range was recorded
    g["eager_us"] = time_ms(step) * 1e3
    g["replay_us"] = time_ms(graph.replay) * 1e3


# ---------------------------------------------------------------- kernels
def verify_case(report, dtype, B, K, V):
    logits = torch.randn(B, K + 1, V, device="cuda").to(dtype)
    drafts = logits.argmax(-1)[:, :K].contiguous()
    nbytes = logits.numel() * logits.element_size()
    sets = rotated(lambda: (drafts, logits), nbytes)
    impls = [
        ("mtp (torch.ops)", torch.ops.mtp.verify),
        ("triton", triton_fn("verify")),
        ("torch (reference.verify)", reference.verify),
    ]
    report.add_case("verify", f"verify B={B} K={K} V={V} {str(dtype)[6:]}", nbytes, impls, sets)


def verify_rows(report):
    for dtype in (torch.bfloat16, torch.float32):
        for B, K, V in [(1, 4, 128256), (8, 4, 128256), (64, 4, 128256), (8, 4, 49152), (64, 8, 49152)]:
            report.guarded(f"verify B={B} K={K} V={V} {dtype}", verify_case, report, dtype, B, K, V)


def linear_case(report, dtype, M, N, K):
    x = torch.randn(M, K, device="cuda").to(dtype)
    w = (torch.randn(N, K, device="cuda") / K**0.5).to(dtype)
    nbytes = (w.numel() + x.numel() + M * N) * x.element_size()
    sets = rotated(lambda: (x, w), nbytes)
    impls = [
        ("mtp (torch.ops)", torch.ops.mtp.linear),
        ("triton", triton_fn("linear")),
        ("torch (F.linear, not shape-invariant)", F.linear),
    ]
    report.add_case("linear", f"linear M={M} N={N} K={K} {str(dtype)[6:]}", nbytes, impls, sets)


def linear_rows(report):
    for dtype in (torch.bfloat16, torch.float32):
        # SmolLM2 shapes, its LM head, and Llama-8B-like ones of few columns (K in 4 and 14 chunks)
        for M, N, K in [
            (1, 1536, 576),
            (5, 1536, 576),
            (5, 576, 1536),
            (5, 49152, 576),
            (16, 4096, 4096),
            (4, 4096, 14336),
        ]:
            report.guarded(f"linear M={M} N={N} K={K} {dtype}", linear_case, report, dtype, M, N, K)


# (Hq, Hkv, D) -> [(B, T, L)]: Llama-8B-like (and one 128k-key cache), SmolLM2, Gemma-3-like.
ATTENTION_GRID = [
    ((32, 8, 128), [(1, 1, 32768), (8, 1, 8192), (32, 1, 4096), (8, 4, 8192), (1, 1, 131072)]),
    ((9, 3, 64), [(1, 1, 32768), (8, 1, 8192), (32, 1, 4096), (8, 4, 8192)]),
    ((4, 1, 256), [(1, 1, 8192), (1, 1, 32768), (8, 4, 4096)]),
]


def attention_case(report, Hq, Hkv, D, B, T, L):
    """Decode (T = 1) or verify (T = 4, causal) over bf16 caches [B, Hkv, L, D] read in place
    from a [B, L, Hkv, D] buffer; bytes: the K and V rows read, plus q and the output."""
    dtype = torch.bfloat16
    causal = T > 1
    lens = torch.full((B,), L, device="cuda")

    def make():
        kbuf = torch.randn(B, L, Hkv, D, device="cuda", dtype=dtype)
        vbuf = torch.randn(B, L, Hkv, D, device="cuda", dtype=dtype)
        return torch.randn(B, T, Hq, D, device="cuda", dtype=dtype), kbuf, vbuf

    nbytes = (2 * B * L * Hkv * D + 2 * B * T * Hq * D) * 2
    sets = [
        (q, kb.permute(0, 2, 1, 3), vb.permute(0, 2, 1, 3), q.transpose(1, 2)) for q, kb, vb in rotated(make, nbytes)
    ]
    # SDPA's is_causal aligns the mask top-left; with T << L the work is the same without it.
    impls = [
        ("mtp (torch.ops)", lambda q, k, v, qs: torch.ops.mtp.head_attention(q, k, v, lens, None, None, None, causal)),
        (
            "triton",
            None
            if mtp_triton is None
            else lambda q, k, v, qs: mtp_triton.head_attention(q, k, v, lens, None, None, None, causal),
        ),
        ("torch SDPA (enable_gqa)", lambda q, k, v, qs: F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)),
    ]
    case = f"head_attention Hq={Hq} Hkv={Hkv} D={D} B={B} T={T} L={L} bf16"
    report.add_case("head_attention", case, nbytes, impls, sets)


def attention_rows(report):
    for (Hq, Hkv, D), shapes in ATTENTION_GRID:
        for B, T, L in shapes:
            where = f"head_attention Hq={Hq} Hkv={Hkv} D={D} B={B} T={T} L={L}"
            report.guarded(where, attention_case, report, Hq, Hkv, D, B, T, L)


def append_case(report, B, T, Hkv, D, L):
    """cache_append of T new rows per request into a [B, Lmax, Hkv, D] buffer (bytes: read and
    write of the new K and V) vs torch's index_put_ at the same positions. Rotated: the new rows
    and the position they go to (L / 4 + T * copy)."""
    kbuf = torch.zeros(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vbuf = torch.zeros_like(kbuf)
    k, v = kbuf.permute(0, 2, 1, 3), vbuf.permute(0, 2, 1, 3)
    bidx = torch.arange(B, device="cuda")[:, None].expand(B, T)
    nbytes = 4 * B * T * Hkv * D * 2
    sets = []
    for i in range(copies_for(nbytes)):
        kn = torch.randn(B, T, Hkv, D, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((B,), min(L // 4 + T * i, L - T), device="cuda")
        pos = lens[:, None] + torch.arange(T, device="cuda")[None, :]  # [B, T]
        sets.append((kn, torch.randn_like(kn), lens, pos))

    def torch_append(kn, vn, lens, pos):
        kbuf.index_put_((bidx, pos), kn)
        vbuf.index_put_((bidx, pos), vn)

    impls = [
        ("mtp (torch.ops)", lambda kn, vn, lens, pos: torch.ops.mtp.cache_append(k, v, kn, vn, lens)),
        (
            "triton",
            None if mtp_triton is None else lambda kn, vn, lens, pos: mtp_triton.cache_append(k, v, kn, vn, lens),
        ),
        ("torch (index_put_)", torch_append),
    ]
    report.add_case("cache_append", f"cache_append B={B} T={T} Hkv={Hkv} D={D} bf16", nbytes, impls, sets)


def append_rows(report):
    for B, T, Hkv, D, L in [(1, 1, 8, 128, 32768), (32, 4, 8, 128, 4096)]:
        report.guarded(f"cache_append B={B} T={T}", append_case, report, B, T, Hkv, D, L)


SECTIONS = [
    ("bandwidth", bandwidth),
    ("host overhead", host_overhead),
    ("graph replay", graph_replay),
    ("verify", verify_rows),
    ("linear", linear_rows),
    ("head_attention", attention_rows),
    ("cache_append", append_rows),
]


def main(md_path, json_path=None):
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    json_path = json_path or (md_path[:-3] if md_path.endswith(".md") else md_path) + ".json"
    report = Report(md_path, json_path)
    if mtp_triton is None:
        report.errors.append({"where": "import mtp_kernels.triton", "error": TRITON, "trace": []})
    report.write()
    for name, section in SECTIONS:
        t0 = time.perf_counter()
        report.guarded(name, section, report)
        torch.cuda.empty_cache()
        print(f"section {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        report.write()
    report.complete = True
    print(report.write())
    print(f"wrote {md_path} and {json_path}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_results.md", sys.argv[2] if len(sys.argv) > 2 else None)

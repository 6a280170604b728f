"""Per-call cost of the real ops, two builds side by side: the C++-API extension (the venv of
a checkout before the port, e.g. commit d06b5ea) against the stable-ABI one (this tree's venv),
in alternating rounds of one run, one thread.

    python tools/stable_abi/ab_ops.py ../cxx-api-checkout/.venv/bin/python .venv/bin/python

Each round runs the child below once per interpreter (in turn, so that load from other work
falls on both): per op, the median of 7 runs of N calls. Printed: per interpreter and op,
the median over rounds of those medians, in us per call. The decoder_layers case has 30 tiny
layers, so its weights list holds 181 tensors like the default model's and the cost is
mostly the binding's.
"""

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, time, torch, mtp_kernels
torch.set_num_threads(1)
torch.manual_seed(0)
ops = torch.ops.mtp
B, K, V = 1, 4, 64
draft = torch.randint(0, V, (B, K))
logits = torch.randn(B, K + 1, V)
x = torch.randn(1, 64)
w = torch.ones(64)
lw = torch.randn(32, 64)
q = torch.randn(1, 1, 2, 32)
kc, vc = torch.randn(1, 1, 16, 32), torch.randn(1, 1, 16, 32)
lens = torch.tensor([8])
layers, H, Hq, Hkv, D, L, I = 30, 64, 2, 1, 32, 16, 128
weights = []
for _ in range(layers):
    weights += [torch.ones(H), torch.randn((Hq + 2 * Hkv) * D, H) * 0.05, torch.randn(H, Hq * D) * 0.05, torch.ones(H),
                torch.randn(2 * I, H) * 0.05, torch.randn(H, I) * 0.05]
weights.append(torch.ones(H))
xd = torch.randn(1, 1, H)
kcd, vcd = torch.zeros(layers, 1, Hkv, L, D), torch.zeros(layers, 1, Hkv, L, D)
cos, sin = torch.ones(L, D), torch.zeros(L, D)
dlens = torch.tensor([4])
cases = {
    "verify [1, 4] x 64": (lambda: ops.verify(draft, logits), 2000),
    "rms_norm [1, 64]": (lambda: ops.rms_norm(x, w, 1e-6), 2000),
    "linear [1, 64] x [32, 64]": (lambda: ops.linear(x, lw), 2000),
    "head_attention [1, 1, 2, 32], L 16": (lambda: ops.head_attention(q, kc, vc, lens), 2000),
    "decoder_layers 30 tiny layers (181 weights)": (
        lambda: ops.decoder_layers(xd, kcd, vcd, dlens, cos, sin, weights, [], Hq, 1e-6), 200),
}
out = {}
for name, (fn, n) in cases.items():
    for _ in range(n // 10):
        fn()
    runs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    out[name] = statistics.median(runs)
out["torch"] = torch.__version__
out["so"] = mtp_kernels._C.__file__
print(json.dumps(out))
"""


def main():
    pythons = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    results = {p: [] for p in pythons}
    for _ in range(rounds):
        for p in pythons:
            r = subprocess.run([p, "-c", CHILD], cwd="/tmp", capture_output=True, text=True, check=True)
            results[p].append(json.loads(r.stdout.strip().splitlines()[-1]))
    names = [k for k in results[pythons[0]][0] if k not in ("torch", "so")]
    for p in pythons:
        print(f"{p}: torch {results[p][0]['torch']}, {results[p][0]['so'].rsplit('/', 1)[-1]}")
    print(f"| op (one thread, {rounds} rounds) | " + " | ".join(f"{p} us/call" for p in pythons) + " |")
    for n in names:
        meds = [statistics.median(r[n] for r in results[p]) for p in pythons]
        print(f"| {n} | " + " | ".join(f"{m:.1f}" for m in meds) + " |")


if __name__ == "__main__":
    main()

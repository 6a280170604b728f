"""Per-call cost of the stable ABI's boxing against the C++ API's, the same probe op (one
thread): median of 7 runs of 2000 calls each, with an empty Tensor[] and with 180 tensors.

    python tools/stable_abi/percall.py build/stable_abi
"""

import importlib.util
import os
import statistics
import sys
import time

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "build/stable_abi"

torch.set_num_threads(1)  # no thread handoff in parallel_for: the binding's own cost
for name in ("_stable_poc", "classic"):
    path = os.path.join(OUT, "_stable_poc.abi3.so" if name == "_stable_poc" else "classic.so")
    if name == "_stable_poc":
        spec = importlib.util.spec_from_file_location(name, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    else:
        torch.ops.load_library(path)
x = torch.ones(4)
many = [torch.ones(8) for _ in range(180)]
print("torch", torch.__version__, "python", sys.version.split()[0])
for ns in ("mtpstable", "mtpclassic"):
    op = getattr(torch.ops, ns).probe
    for label, ws in (("0 tensors", []), ("180 tensors", many)):
        for _ in range(200):
            op(x, x, ws, [1, 2], 3, 0.5, True)
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(2000):
                op(x, x, ws, [1, 2], 3, 0.5, True)
            runs.append((time.perf_counter() - t) / 2000 * 1e6)
        print(f"{ns:10s} Tensor[] of {label:11s}: {statistics.median(runs):6.2f} us/call (min {min(runs):.2f})")

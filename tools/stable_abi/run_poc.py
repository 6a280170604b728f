"""The stable-ABI proof of concept (docs/torch-versions.md): its ops against torch's own
arithmetic, every argument kind of our schemas, an error, a fake kernel under torch.compile.

    python tools/stable_abi/run_poc.py build/stable_abi [mtp]   # mtp: also bitwise against mtp_kernels
"""

import importlib.util
import os
import sys

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "build/stable_abi"

spec = importlib.util.spec_from_file_location("_stable_poc", os.path.join(OUT, "_stable_poc.abi3.so"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print("torch", torch.__version__, "python", sys.version.split()[0], "isa", mod.get_isa())
g = torch.Generator().manual_seed(0)
ok = True
for dt in (torch.float32, torch.bfloat16, torch.float16):
    x = torch.randn(3, 5, 64, generator=g).to(dt)
    w = torch.randn(64, generator=g).to(dt)
    y = torch.ops.mtpstable.rms_norm(x, w, 1e-6)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dt)
    good = y.shape == x.shape and y.dtype == dt and torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
    print("rms_norm", dt, "ok" if good else "MISMATCH")
    ok &= good
    if "mtp" in sys.argv[2:]:  # the same bits as the mtp_kernels op (built with TORCH_LIBRARY)
        import mtp_kernels  # noqa: F401

        same = torch.equal(y, torch.ops.mtp.rms_norm(x, w, 1e-6))
        print("  bitwise equal to torch.ops.mtp.rms_norm:", same)
        ok &= same
f, xf = torch.ops.mtpstable.probe(
    torch.arange(6, dtype=torch.int32), torch.ones(4), [torch.ones(2), torch.ones(3, 3)], [1, 2, 3], 7, 0.25, True
)
print("probe", f.tolist(), xf.dtype)
ok &= f.tolist() == [4, 11, 3, 7, 250, 1, torch.get_num_threads(), 499500] and xf.dtype == torch.float32
f, _ = torch.ops.mtpstable.probe(torch.ones(1), None, [], None, None, None, False)
print("probe (Nones)", f.tolist()[:6])
ok &= f.tolist()[:6] == [-1, 0, -1, -1, -1, 0]
try:
    torch.ops.mtpstable.rms_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4), 1e-6)
    ok = False
except RuntimeError as e:
    print("error ->", type(e).__name__, repr(str(e).splitlines()[0]))
# torch.compile needs a fake kernel (Python, as ours in ops.py): registered the same way.
torch.library.register_fake("mtpstable::rms_norm")(lambda x, w, eps: torch.empty_like(x))
c = torch.compile(lambda x, w: torch.ops.mtpstable.rms_norm(x, w, 1e-6) * 2, fullgraph=True)
x = torch.randn(2, 64)
good = torch.equal(c(x, torch.ones(64)), torch.ops.mtpstable.rms_norm(x, torch.ones(64), 1e-6) * 2)
print("torch.compile + fake:", good)
ok &= good
print("POC", "PASS" if ok else "FAIL")

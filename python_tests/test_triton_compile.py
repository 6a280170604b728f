"""The Triton kernels compiled for a GPU (sm_90, Triton's own ptxas), without one.

The interpreter (test_triton.py) accepts code the GPU compiler refuses: a constexpr assigned
twice, a plain module-level int, a loop-carried value changing type. Those errors surfaced only
on a lent GPU (verify_sampled did not compile there). Here a stand-in driver reports an sm_90
device and launches nothing, so each launcher of mtp_kernels.triton runs its real argument
lists and specializations on CPU tensors through Triton's whole compiler, down to a cubin.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    class Utils:
        def load_binary(self, name, kernel, shared, device):
            return 0, 0, 0, 0, 1024  # module, function, registers, spills, max threads

        def get_device_properties(self, device):
            return {"max_shared_mem": 232448, "multiprocessor_count": 132, "warpSize": 32}

    class Sm90:  # the driver's calls a launch makes, with no device behind them
        utils = Utils()

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def launcher_cls(self, src, metadata):
            return lambda *args, **kwargs: None

    triton.runtime.driver.set_active(Sm90())

    import importlib
    import pkgutil

    import mtp_kernels.triton as T
    import mtp_kernels.triton.kernels as K

    # One call per kernel variant the ops use (each compile takes seconds: bf16, one head size).
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    logits = torch.randn(2, 3, 300, generator=g).to(dt)
    drafts = torch.randint(0, 300, (2, 2), generator=g)
    T.verify(drafts, logits, torch.tensor([2, 1]))
    T.accept_prefix(drafts, drafts.new_zeros(2, 3), torch.tensor([2, 1]))
    T.verify_ragged(torch.tensor([5, 7, 9]), torch.tensor([1, 3]), logits.reshape(6, 300)[:5])
    T.verify_sampled(drafts, torch.rand(2, 2, 300, generator=g), logits, torch.tensor([0.7, 1.0]),
                     torch.tensor([1, 2]), torch.tensor([0, 3]), top_k=torch.tensor([5, 0]))
    T.verify_sampled_ragged(torch.tensor([5, 7, 9]), None, torch.tensor([1, 3]), logits.reshape(6, 300)[:5],
                            torch.tensor([0.7, 0.0]), torch.tensor([1, 2]))
    T.linear(torch.randn(3, 64, generator=g).to(dt), torch.randn(40, 64, generator=g).to(dt),
             torch.randn(40, generator=g))
    q = torch.randn(2, 2, 4, 128, generator=g).to(dt)
    k, v, kl, vl = (torch.randn(2, 2, n, 128, generator=g).to(dt) for n in (300, 300, 2, 2))
    T.head_attention(q, k, v, torch.tensor([300, 40]), kl, vl, causal=True)
    T.cache_append(k, v, q[:, :, :2].clone(), q[:, :, :2].clone(), torch.tensor([3, 4]))

    def kernels(module):
        return [(module.__name__ + "." + n, f) for n, f in vars(module).items()
                if isinstance(f, JITFunction) and n.endswith("_kernel")]

    modules = [importlib.import_module(f"{K.__name__}.{m.name}") for m in pkgutil.iter_modules(K.__path__)]
    found = [kv for m in modules for kv in kernels(m)]  # every *_kernel of every module: launched above
    compiled = {name: sum(len(c[0]) for c in f.device_caches.values()) for name, f in found}
    assert found and all(compiled.values()), compiled
    print("compiled", sorted(compiled.items()))
    """
)


def test_every_triton_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mtp-triton-sm90-cache")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert "compiled" in run.stdout

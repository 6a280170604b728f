"""Every registration the package makes when it is imported, in one place (the ops themselves,
their schemas and C++ kernels, come from the ``_C`` extension):

- the fake (meta) kernels of ``ops.FAKES``, for torch.compile / FakeTensor;
- on a machine with a GPU, the Triton launchers of ``triton._OPS`` as the CUDA kernels of the
  ops the build has none for (``triton.register_cuda_kernels``);
- the torch compositions of ``fallback.FALLBACKS`` as the CUDA kernels of the row-local and
  whole-pass ops (``fallback.register_cuda_kernels``).
"""

import importlib.util

import torch

from . import fallback, ops


def _register_triton_for_cuda() -> None:
    # Only with a GPU: importing triton costs time, and the tests set TRITON_INTERPRET
    # before they import it on machines without one.
    if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        from . import triton as _triton

        _triton.register_cuda_kernels()


def register_all() -> None:
    """Called once by ``mtp_kernels/__init__.py``, after ``_C`` has defined the ops."""
    for name, fake in ops.FAKES.items():
        torch.library.register_fake(f"mtp::{name}")(fake)
    _register_triton_for_cuda()
    fallback.register_cuda_kernels()

import os

import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter on CPU tensors (test_triton.py).
# It is read when triton.jit decorates a kernel, so it is set before any test imports one;
# nothing else here uses triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mtp_kernels


@pytest.fixture(params=mtp_kernels.supported_isas())
def isa(request):
    """Runs a test once per CPU instruction-set path this machine supports."""
    previous = mtp_kernels.get_isa()
    mtp_kernels.set_isa(request.param)
    yield request.param
    mtp_kernels.set_isa(previous)


@pytest.fixture
def threads():
    """Restores torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)

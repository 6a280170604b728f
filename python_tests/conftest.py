import pytest
import torch

import mtp_kernels


@pytest.fixture(params=mtp_kernels.supported_isas())
def isa(request):
    """Runs a test once per CPU instruction-set path this machine supports."""
    previous = mtp_kernels.get_isa()
    mtp_kernels.set_isa(request.param)
    yield request.param
    mtp_kernels.set_isa(previous)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)

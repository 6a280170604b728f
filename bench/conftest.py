import torch

import mtp_kernels  # noqa: F401  (registers the ops)

torch.manual_seed(0)

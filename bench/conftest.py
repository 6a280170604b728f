import os

import torch

import mtp_kernels  # noqa: F401  (registers the ops)

torch.manual_seed(0)
# MTP_BENCH_THREADS=1: each implementation on one core (steadier on a shared machine).
if os.environ.get("MTP_BENCH_THREADS"):
    torch.set_num_threads(int(os.environ["MTP_BENCH_THREADS"]))

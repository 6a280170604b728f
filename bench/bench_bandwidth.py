"""The physical limit, measured in the same run as the kernels: memory bandwidth.

read: torch's multi-threaded sum over 1 GiB (bytes read / time) -- the ceiling of a
read-only kernel such as verify or attention. copy: dst.copy_(src) of 1 GiB, counting
read + write bytes.
"""

import torch

GIB = 1 << 30


def test_bandwidth_read(benchmark):
    x = torch.ones(GIB // 4)
    benchmark.group = "bandwidth"
    benchmark.extra_info["bytes"] = GIB
    benchmark.pedantic(torch.sum, args=(x,), rounds=10, warmup_rounds=1)


def test_bandwidth_copy(benchmark):
    src, dst = torch.ones(GIB // 4), torch.empty(GIB // 4)
    benchmark.group = "bandwidth"
    benchmark.extra_info["bytes"] = 2 * GIB
    benchmark.pedantic(dst.copy_, args=(src,), rounds=10, warmup_rounds=1)

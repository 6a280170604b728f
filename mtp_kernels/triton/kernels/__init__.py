"""Triton kernels of the ``mtp`` ops; the launchers are in ``mtp_kernels.triton``."""

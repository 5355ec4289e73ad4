"""The CPU backend: fused numba kernels, parallel over cores."""

"""CUDA kernel sources, shipped as package data (``spdnn_mpi.kernels`` when installed)."""

"""The CUDA backend: hand-written kernels compiled through CuPy (imported lazily)."""

"""GPU peers and device memory: a peer that does not fit beside our layouts (an 80 GB H100
at N = 65536) is reported as skipped, with the library's message, not a crash."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

from spdnn_mpi.errors import SpdnnError

F = TypeVar("F", bound=Callable)


def free_device_caches() -> None:
    """Hand cached device memory (CuPy's pool, PyTorch's cache) back to the driver."""
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    """CuPy's ``cupy.cuda.memory.OutOfMemoryError`` or PyTorch's ``torch.cuda.OutOfMemoryError``."""
    return type(exc).__name__ == "OutOfMemoryError"


def out_of_memory_is_a_skip(peer: str) -> Callable[[F], F]:
    """Decorate ``peer(network, rows, ...)``: running out of device memory raises
    ``SpdnnError`` naming the peer and the problem size, after the failed run's arrays
    and the libraries' caches are handed back."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(network, rows, *args, **kwargs):
            try:
                return fn(network, rows, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001  (only out-of-memory is caught)
                if not is_out_of_memory(exc):
                    raise
                message = (f"peer {peer} ran out of GPU memory at {rows.n_rows} images x "
                           f"{network.n_inputs} inputs beside our buffers ({exc})")
            gc.collect()
            free_device_caches()
            raise SpdnnError(message)

        return run  # type: ignore[return-value]

    return wrap

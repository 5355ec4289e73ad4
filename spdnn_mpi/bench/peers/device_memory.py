"""GPU peers and device memory: a peer that does not fit is a skip, not a crash.

A peer runs beside our backend: ``spdnn bench`` gives our batch buffers back
first (``release_buffers``), but the layouts stay. So on a card with less memory than the one a
configuration was sized on (an H100 of 80 GB against an H200 of 141 GB at
N = 65536) a peer can run out of memory where ours did not. The benchmark
then reports the peer as skipped, with the library's own message, and goes on
to the next case.
"""

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
    ``SpdnnError`` naming the peer and the problem size, after the failed run's
    arrays are released (its frames go with the handler; a collection takes
    any cycle) and the libraries' caches handed back."""

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

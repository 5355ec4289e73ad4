"""Truth backends: who computes the reference categories stored with a network (any
callable ``(network, rows) -> sorted 1-based ids``; ``generate`` and ``prepare``
pick one by name here)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.util.progress import Emit

#: Truth backends by name: "module:function" of the callable; "none" writes no truth.
TRUTH_BACKENDS: dict[str, str | None] = {
    "reference": "spdnn_mpi.reference:reference_categories",
    "cpu": "spdnn_mpi.backends.cpu.backend:cpu_categories",
    "none": None,
}

TruthFn = Callable[[Any, Any], Any]  # (Network, SparseRows) -> sorted 1-based ids


def resolve_truth_backend(backend: str | TruthFn | None) -> tuple[str, TruthFn | None]:
    """(name recorded as ``computed_by``, callable or None) for a name or a callable."""
    if backend is None:
        return "none", None
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__), backend
    if backend not in TRUTH_BACKENDS:
        raise SpdnnError(
            f"unknown truth backend {backend!r}; choose from {', '.join(TRUTH_BACKENDS)}"
        )
    target = TRUTH_BACKENDS[backend]
    if target is None:
        return backend, None
    module_name, func_name = target.split(":")
    return backend, getattr(importlib.import_module(module_name), func_name)


def truth_memory_bytes(truth_fn: TruthFn | None, n_rows: int, width: int) -> int:
    """Host memory a truth backend needs beyond the network and inputs (0 if it batches)."""
    from spdnn_mpi.reference import reference_categories, reference_memory_bytes

    if truth_fn is reference_categories:
        return reference_memory_bytes(n_rows, width)
    return 0  # the cpu backend sizes its batches to the memory available


def kept_layer_bytes(neurons: int, degree: int = 32) -> int:
    """Host bytes of one challenge layer held for the truth (int64 indptr, uint16
    indices at N <= 65536, int32 above; no values: the challenge's weights are uniform)."""
    index_bytes = 2 if neurons <= 65536 else 4
    return 8 * (neurons + 1) + index_bytes * degree * neurons


def check_truth_memory(truth_name: str, truth_fn: TruthFn | None, n_rows: int, width: int,
                       extra: int = 0) -> None:
    """Refuse before the long work starts when the truth computation cannot fit."""
    from spdnn_mpi.util.memory import require

    need = truth_memory_bytes(truth_fn, n_rows, width)
    if need:
        require(need + extra, f"truth by the {truth_name} backend ({n_rows} images x {width} "
                              "neurons, dense)",
                "use --truth-backend cpu (batched to fit), fewer --images, or a larger machine")


def truth_by_count(truth_fn: TruthFn, layers: list, rows, counts: Sequence[int],
                   emit: Emit | None = None, name: str = "") -> Iterator:
    """Yield (count, categories after the first ``count`` layers) for each count: in
    one pass with the plain reference, else one run a count; progress lines to ``emit``.
    """
    from spdnn_mpi.model import Network
    from spdnn_mpi.reference import reference_categories, reference_categories_at
    from spdnn_mpi.util.progress import Progress

    what = f"truth ({name or getattr(truth_fn, '__name__', 'custom')})"
    if truth_fn is reference_categories and counts:
        progress = Progress(what, max(counts), emit)
        yield from sorted(
            reference_categories_at(Network(layers), rows, list(counts), progress).items()
        )
        return
    if not counts:
        return
    takes_progress = emit is not None and "progress" in inspect.signature(truth_fn).parameters
    for n in counts:
        progress = Progress(what, n, emit)
        if takes_progress:
            yield n, truth_fn(Network(layers[:n]), rows, progress=progress)
        else:
            yield n, truth_fn(Network(layers[:n]), rows)

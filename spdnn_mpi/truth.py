"""Truth backends: who computes the reference categories stored with a network.

A truth backend is any callable ``(network, rows) -> sorted 1-based ids``;
``generate`` and ``prepare`` pick one by name here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from spdnn_mpi.errors import SpdnnError

#: Truth backends by name: "module:function" of a ``(network, rows) -> categories``
#: callable. "none" writes no truth. Faster backends register here.
TRUTH_BACKENDS: dict[str, str | None] = {
    "reference": "spdnn_mpi.reference:reference_categories",
    "cpu": "spdnn_mpi.backends.cpu:cpu_categories",
    "none": None,
}

TruthFn = Callable[[Any, Any], Any]  # (Network, SparseRows) -> sorted 1-based ids
ProgressFn = Callable[[str], None]  # one line of progress text


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


def truth_by_count(truth_fn: TruthFn, layers: list, rows, counts: Sequence[int]) -> Iterator:
    """Yield (count, categories after the first ``count`` layers) for each count.

    The plain reference does every count in one pass (shorter networks are
    prefixes of the deepest); other backends run once per count.
    """
    from spdnn_mpi.model import Network
    from spdnn_mpi.reference import reference_categories, reference_categories_at

    if truth_fn is reference_categories and counts:
        yield from sorted(reference_categories_at(Network(layers), rows, list(counts)).items())
        return
    for n in counts:
        yield n, truth_fn(Network(layers[:n]), rows)

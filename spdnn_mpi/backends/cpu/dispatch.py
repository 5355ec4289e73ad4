"""Which numba kernel runs a layer, and every kernel a network needs called once before
its run.

numba compiles a kernel, or loads it from its disk cache, at the first call
with each signature of argument types. Left to the run, that lands in the
layout, the warm-up and the timed inference: on an empty cache, 1.0 s of the
first run's 1.2 s of inference was compiling (real 1024 network cycled to
1920 layers, 2-core VM, 2026-12-05), and even from the cache the first load
costs about 0.2 s (numba's typing set-up). :class:`KernelCalls` calls each
kernel that the layers' own arrays will meet, once, on two scratch tiles, so
the cost is a phase of its own that the report names ("kernels compiled" or
"from the cache").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from spdnn_mpi.backends.cpu import kernels
from spdnn_mpi.backends.cpu import share as cpu_share
from spdnn_mpi.model import Layer

#: One layer as the kernels take it: (indptr, indices, values, uniform, bias, floor,
#: clip, n_out, share), ``share`` from :mod:`share` or None.
LayerEntry = tuple


def layer_entry(layer: Layer, share: tuple | None) -> LayerEntry:
    """``layer`` in the kernels' dtypes (uint16 indices stay uint16: no 2x copy)."""
    uniform = layer.values is None
    return (
        np.ascontiguousarray(layer.indptr, dtype=np.int64),
        np.ascontiguousarray(layer.indices),
        np.array([layer.uniform_value], np.float32) if uniform
        else np.asarray(layer.values, np.float32),
        uniform,
        np.ascontiguousarray(layer.bias_vector(), dtype=np.float32),
        np.float32(layer.floor),
        np.float32(np.inf if layer.clip is None else layer.clip),
        layer.n_out,
        share,
    )


def layer_kernel(entry: LayerEntry, n_tiles: int, n_active: int) -> tuple:
    """(kernel, its arguments between the two tile buffers and ``alive``) for a layer
    over ``n_tiles`` tiles holding ``n_active`` rows: all tiles over the threads, or
    one tile's rows on this thread (the few-rows form for a handful)."""
    indptr, indices, values, uniform, bias, floor, clip, _n_out, share = entry
    few = n_tiles <= 1 and n_active <= kernels.FEW_ROWS
    if share is not None:  # one sum per input list
        tail = (*share, values[0], bias, floor, clip)
        if n_tiles > 1:
            return kernels.layer_tiles_shared, (n_tiles, *tail)
        return (kernels.layer_few_rows_shared if few else kernels.layer_rows_shared,
                (n_active, *tail))
    tail = (indptr, indices, values, uniform, bias, floor, clip)
    if n_tiles > 1:
        return kernels.layer_tiles, (n_tiles, *tail)
    return kernels.layer_few_rows if few else kernels.layer_rows, (n_active, *tail)


#: the flags that numba's array types tell apart: C and F contiguous, aligned, writeable
_TYPED_FLAGS = 0x0001 | 0x0002 | 0x0100 | 0x0400


def _array_kind(a: np.ndarray) -> tuple:
    return a.dtype, a.ndim, a.flags.num & _TYPED_FLAGS


def entry_kind(entry: LayerEntry) -> tuple:
    """What decides the kernels' signatures for this entry: its arrays' dtypes,
    dimensions, flags, and whether it shares sums."""
    arrays = [a for a in entry[:-1] if isinstance(a, np.ndarray)]
    arrays += list(entry[-1]) if entry[-1] is not None else []
    return (entry[-1] is not None, entry[3], *(_array_kind(a) for a in arrays))


def _layer_kind(layer: Layer) -> tuple:
    """What decides a layer's entry kind, before its shared sums are looked for."""
    arrays = [np.asarray(layer.indptr), np.asarray(layer.indices)]
    arrays += [np.asarray(layer.values)] if layer.values is not None else []
    return (cpu_share.share_word_bytes(layer), layer.values is None,
            *(_array_kind(a) for a in arrays))


def _cache_misses() -> int:
    return sum(sum(d.stats.cache_misses.values())
               for module in (kernels, cpu_share) for d in vars(module).values()
               if hasattr(d, "stats") and hasattr(d, "signatures"))


class KernelCalls:
    """The kernels called so far by this backend, and what calling them cost."""

    def __init__(self) -> None:
        self._kinds: set[tuple] = set()
        self._common = False
        self.seconds = 0.0
        self.compiled = False

    def for_layers(self, layers: Sequence[Layer]) -> None:
        """Call the kernels of one layer of each kind (its shared sums found first)."""
        seen: dict[tuple, Layer] = {}
        for layer in layers:
            seen.setdefault(_layer_kind(layer), layer)
        self._timed(lambda: [layer_entry(lay, cpu_share.shared_inputs(lay))
                             for lay in seen.values()])

    def for_entries(self, entries: Iterable[LayerEntry]) -> None:
        """Call the kernels of the entries of a kind not met yet."""
        self._timed(lambda: entries)

    def take(self) -> tuple[float, bool]:
        """(seconds, whether numba compiled) of the calls since the last take."""
        taken = (self.seconds, self.compiled)
        self.seconds, self.compiled = 0.0, False
        return taken

    def _timed(self, make_entries) -> None:
        t0 = time.perf_counter()
        misses = _cache_misses()
        for entry in make_entries():
            kind = entry_kind(entry)
            if kind in self._kinds:
                continue
            self._kinds.add(kind)
            _call_layer_kernels(entry)
        if not self._common:
            _call_common_kernels()
            self._common = True
        self.compiled |= _cache_misses() > misses
        self.seconds += time.perf_counter() - t0


def _scratch(width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two zeroed two-tile buffers and their alive flags."""
    src = np.zeros((2, width, kernels.TILE_ROWS), dtype=np.float32)
    return src, np.zeros_like(src), np.zeros(2 * kernels.TILE_ROWS, dtype=np.bool_)


def _call_layer_kernels(entry: LayerEntry) -> None:
    """Each form of the entry's layer: all tiles, one tile's rows, a few rows."""
    indices = entry[-1][1] if entry[-1] is not None else entry[1]
    width = max(entry[7], int(indices.max()) + 1 if len(indices) else 1)
    src, dst, alive = _scratch(width)
    for n_tiles, n_active in ((2, 2 * kernels.TILE_ROWS), (1, kernels.FEW_ROWS + 1), (1, 1)):
        kernel, args = layer_kernel(entry, n_tiles, n_active)
        kernel(src, dst, *args, alive)


def _call_common_kernels() -> None:
    """The kernels every run calls whatever its layers: buffers, compaction, merges,
    features out (the inputs' scatter meets the inputs' own types in the warm-up)."""
    src, dst, _alive = _scratch(1)
    kernels.first_touch(dst)
    keep = np.arange(2, dtype=np.int64)
    kernels.compact(src, dst, 1, keep)
    bits = src.view(np.uint32)
    kernels.row_hashes(bits, 2, 1)
    kernels.equal_to_head(bits, keep, 1)
    kernels.gather_rows(src, keep, 1)

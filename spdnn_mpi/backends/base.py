"""The interface between the engine's layer loop and a compute backend.

A backend holds one network's layout and one batch of feature rows. Per batch the
engine calls ``load_features``, ``run_layer`` for every layer (``merge_duplicate_rows``
or ``flush`` at compression checkpoints), then ``finish``. The defaults suit a
backend that runs each call to completion on the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.compression import RowGroups
from spdnn_mpi.model import Layer, SparseRows


@dataclass
class BatchResult:
    """What a backend hands back after the last layer of one batch."""

    alive_rows: np.ndarray  # 0-based positions in the batch, sorted
    live_per_layer: list[int]  # live rows after each layer
    layer_seconds: list[float] | None = None  # per-layer time, if the backend measures it
    features: np.ndarray | None = None  # final rows of alive_rows, if asked for


class Backend(ABC):
    """A compute backend (CPU, CUDA, reference) as the engine sees it."""

    name: str = ""
    #: rows computed as one unit (merging below this saves nothing)
    tile_rows: int = 1
    #: fewest layers that must follow a checkpoint for the engine to look at it
    #: (a look costs this backend about as much as that many small layers)
    check_min_layers_left: int = 1
    #: the prior for what compression checks cost here (``check_policy``); free by
    #: default, so every due checkpoint checks
    check_costs: CheckCosts = CheckCosts()
    #: rows of the untimed warm-up before timed runs (None: all of them, where
    #: what is cached, such as CUDA graphs, depends on the batch's size)
    warm_up_rows: int | None = 512

    @abstractmethod
    def load_network(self, layers: Sequence[Layer],
                     progress: Callable[[int], None] | None = None) -> None:
        """Build the backend's layout of the weights (not timed as inference);
        ``progress(layers done)`` where the build is long."""

    @abstractmethod
    def load_features(self, rows: SparseRows, drop_empty: bool) -> None:
        """Replace the current features with these input rows, optionally dropping
        empty ones (uploading and densifying; may be asynchronous)."""

    @abstractmethod
    def run_layer(self, k: int, drop_dead: bool) -> None:
        """Apply 0-based layer ``k``; then drop all-zero rows if ``drop_dead``. May be async."""

    @abstractmethod
    def merge_duplicate_rows(self) -> RowGroups:
        """Keep one row per group of bit-identical rows held now; say who went where.
        Never trusts a hash alone (exact comparison); representatives keep their order."""

    @abstractmethod
    def live_count(self) -> int:
        """Rows alive now (may synchronise)."""

    @abstractmethod
    def finish(self, want_features: bool,
               meanwhile: Callable[[], None] | None = None) -> BatchResult:
        """Wait for the batch and return the surviving rows. ``meanwhile``: host work
        to do while the device runs what is queued (a synchronous backend runs it first)."""

    def prepare_kernels(self, layers: Sequence[Layer]) -> None:  # noqa: B027 - a default
        """Compile (or load from a disk cache) the kernels these layers need, before
        ``load_network`` (the driver runs it on one rank per node first)."""

    def synchronize(self) -> None:  # noqa: B027 - a default, not abstract
        """Wait until all queued work is done."""

    def flush(self) -> None:  # noqa: B027 - a default, not abstract
        """Start the queued layers now without waiting (called at every checkpoint
        that does not merge, so queued work is cut at the same layers in every run)."""

    def one_time_seconds(self) -> float:
        """Host seconds spent so far on one-time work that the device waited for
        (CUDA graph captures): a measured layer time leaves them out."""
        return 0.0

    def max_batch_rows(self, width: int) -> int | None:
        """Most rows whose features fit this backend's memory at this width (None: no limit)."""
        return None

    def release_buffers(self) -> None:  # noqa: B027 - a default, not abstract
        """Give back the batch's buffers (the network stays loaded), so a peer measured
        beside us has the memory; the next ``load_features`` allocates anew."""

    def describe(self) -> dict:
        """Device, threads and layout facts for the report."""
        return {"backend": self.name}

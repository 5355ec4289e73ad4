"""The layer loop, written once, over any backend.

Each layer is ``Y <- min(max(Y @ W + b, floor), clip)``; where every later layer
maps a zero row to zero, dead rows are dropped (``reference.droppable_after``).
Batches and compression (``compress="auto"``) leave the results bit for bit alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from spdnn_mpi.backends.base import Backend
from spdnn_mpi.check_policy import BatchChecks, CheckPlan
from spdnn_mpi.compression import COMPRESS_MODES, Compressor, is_checkpoint
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.reference import droppable_after


@dataclass
class InferenceResult:
    """Surviving rows of one rank's slice, with timings."""

    alive_ids: np.ndarray  # global 0-based image ids, sorted
    live_per_layer: np.ndarray  # summed over batches
    seconds: float  # inference time: features in place to surviving ids on the host
    layer_seconds: np.ndarray | None
    batches: int
    features: np.ndarray | None = None
    input_seconds: float = 0.0  # uploading and densifying the inputs (not in ``seconds``)
    computed_rows_per_layer: np.ndarray | None = None  # rows each layer computed, summed
    compression: list[dict] = field(default_factory=list)  # checks that ran, per batch
    extra: dict = field(default_factory=dict)

    def computed_edges(self, network: Network) -> int:
        """Edges actually multiplied: rows each layer computed x that layer's nonzeros."""
        nnz = np.array([layer.nnz for layer in network.layers], dtype=np.int64)
        rows = self.computed_rows_per_layer
        return int((rows[: len(nnz)] * nnz).sum()) if rows is not None else 0

    def categories(self) -> np.ndarray:
        """Sorted 1-based ids, the challenge's categories format."""
        return self.alive_ids + 1


ProgressFn = Callable[[int, int, int, float], None]  # (layers done, total, live rows, seconds)


def choose_batch(backend: Backend, network: Network, n_rows: int, batch: int | None) -> int:
    """Rows per batch: the user's choice, else all rows, else what fits the backend."""
    if batch is not None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        return batch
    width = max(max(layer.n_in, layer.n_out) for layer in network.layers)
    fits = backend.max_batch_rows(width)
    return max(1, min(n_rows, fits)) if fits is not None else max(1, n_rows)


#: Layers that must be left after a cut of a run without checks: a cut costs a
#: launch, and queueing a layer costs the host 0.2-0.4 us (1920 layers: 0.4-0.7 ms),
#: so short networks (the 3-layer models) keep their one launch.
CUT_MIN_LAYERS_LEFT = 16


def starts_queued(layers_done: int, n_layers: int) -> bool:
    """Whether a run without checks starts its queued layers after ``layers_done``
    of ``n_layers`` layers: after 1, 2, 4, 8, ... while ``CUT_MIN_LAYERS_LEFT`` are
    left, so the device begins the first layer while the host still queues the
    others (H100, 1024 x 1920 direct: layer 1 at 71-73 against 17-19 % of its floor
    queued whole), in a handful of launches."""
    return (layers_done & (layers_done - 1) == 0
            and n_layers - layers_done >= CUT_MIN_LAYERS_LEFT)


def run_inference(
    network: Network,
    rows: SparseRows,
    backend: Backend,
    *,
    batch: int | None = None,
    want_features: bool = False,
    progress: ProgressFn | None = None,
    progress_every: float = 2.0,
    compress: str = "off",
    plans: dict[tuple[int, int], CheckPlan] | None = None,
) -> InferenceResult:
    """Run every layer of ``network`` over ``rows`` on an already loaded ``backend``.

    As the challenge times it, the clock covers the layers (compression checks
    included) and fetching the survivors; loading a batch's inputs is
    ``input_seconds``. ``plans``: where given, a batch (first row, rows) found there
    replays those checks, and one not found is measured and its plan stored.
    """
    if compress not in COMPRESS_MODES:
        raise SpdnnError(f"unknown compress mode {compress!r}; choose {', '.join(COMPRESS_MODES)}")
    drop = droppable_after(network)
    n_layers = network.n_layers
    batch_rows = choose_batch(backend, network, rows.n_rows, batch)
    live = np.zeros(n_layers, dtype=np.int64)
    computed = np.zeros(n_layers, dtype=np.int64)
    events: list[list[dict]] = []
    layer_seconds = np.zeros(n_layers) if n_layers else None
    alive: list[np.ndarray] = []
    feats: list[np.ndarray] = []
    n_batches = 0
    seconds = input_seconds = 0.0
    t_start = time.perf_counter()
    next_report = t_start + progress_every
    for start in range(0, max(rows.n_rows, 1), batch_rows):
        part = rows.slice(start, min(start + batch_rows, rows.n_rows))
        t_in = time.perf_counter()
        backend.load_features(part, drop[0])
        backend.synchronize()
        t0 = time.perf_counter()
        input_seconds += t0 - t_in
        checks = None
        # a network too short for any checkpoint runs as off does (3-layer models on a GPU)
        if compress == "auto" and n_layers - 1 >= backend.check_min_layers_left:
            key = (part.first_row, part.n_rows)
            checks = BatchChecks(backend, part.n_rows, n_layers,
                                 plans.get(key) if plans is not None else None)
            checks.start(part.n_rows)
        for k in range(n_layers):
            backend.run_layer(k, drop[k + 1])
            if checks is None:
                if starts_queued(k + 1, n_layers):
                    backend.flush()
            elif (n_layers - (k + 1) >= backend.check_min_layers_left
                    and is_checkpoint(k + 1)):
                checks.at_checkpoint(k + 1, network.layers[k].n_out)
            if progress is not None and time.perf_counter() >= next_report:
                progress(k + 1, n_layers, backend.live_count(), time.perf_counter() - t_start)
                next_report = time.perf_counter() + progress_every
        comp = checks.compressor if checks is not None else None
        res = backend.finish(want_features, meanwhile=comp.fold if comp is not None else None)
        alive_rows, batch_features = np.asarray(res.alive_rows, dtype=np.int64), res.features
        if checks is not None and plans is not None:
            plans.setdefault(key, checks.plan())
        if comp is not None:
            alive_rows, batch_features = comp.expand(alive_rows, batch_features)
        if compress == "auto":
            events.append(comp.summary() if comp is not None else [])
        seconds += time.perf_counter() - t0
        n_batches += 1
        live += np.asarray(res.live_per_layer, dtype=np.int64)
        computed += rows_computed(part, res.live_per_layer, drop, comp)
        if res.layer_seconds is not None and layer_seconds is not None:
            layer_seconds += np.asarray(res.layer_seconds)
        else:
            layer_seconds = None
        alive.append(alive_rows + part.first_row)
        if want_features and batch_features is not None:
            feats.append(batch_features)
    ids = np.concatenate(alive) if alive else np.zeros(0, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    features = None
    if want_features:
        width = network.layers[-1].n_out
        features = np.concatenate(feats)[order] if feats else np.zeros((0, width), np.float32)
    if progress is not None:
        progress(n_layers, n_layers, int(len(ids)), time.perf_counter() - t_start)
    return InferenceResult(ids[order], live, seconds, layer_seconds, n_batches, features,
                           input_seconds, computed, events)


def rows_computed(rows: SparseRows, live_after: Sequence[int], drop: list[bool],
                  comp: Compressor | None) -> np.ndarray:
    """Rows that entered each layer of one batch (representatives once merged)."""
    n_layers = len(live_after)
    merged = {e.layer: e.representatives for e in comp.events} if comp is not None else {}
    out = np.zeros(n_layers, dtype=np.int64)
    held = int(np.count_nonzero(np.diff(rows.indptr))) if drop[0] else rows.n_rows
    for k in range(n_layers):
        if k:
            held = int(live_after[k - 1]) if drop[k] else held
            held = min(held, merged[k]) if k in merged else held
        out[k] = held
    return out


def time_inference(network: Network, rows: SparseRows, backend: Backend, repeat: int = 3,
                   batch: int | None = None, compress: str = "off",
                   want_features: bool = False,
                   ) -> tuple[float, list[float], InferenceResult]:
    """(median seconds, every run's seconds, last result) of ``repeat`` timed runs,
    after an untimed warm-up on ``backend.warm_up_rows`` rows (None: all). With
    compression, the warm-up on all rows is run twice, the second measuring its checks
    where the first left the device's first-call costs behind; the timed runs replay
    the checks that a measured run of their batch chose (``check_policy.CheckPlan``)."""
    warm = rows.n_rows if backend.warm_up_rows is None else min(rows.n_rows, backend.warm_up_rows)
    plans: dict[tuple[int, int], CheckPlan] = {}
    warm_ups = 2 if compress == "auto" and warm == rows.n_rows else 1
    for i in range(warm_ups):
        run_inference(network, rows.slice(0, warm), backend, batch=batch, compress=compress,
                      want_features=want_features, plans=plans if i == warm_ups - 1 else None)
    times: list[float] = []
    result = None
    for _ in range(max(1, repeat)):
        result = run_inference(network, rows, backend, batch=batch, compress=compress,
                               want_features=want_features, plans=plans)
        times.append(result.seconds)
    return statistics.median(times), times, result

"""One distributed inference run: load, infer, gather, check, report.

The same function serves one process and any number of MPI ranks: each rank
reads its contiguous range of images and the (replicated) weights, runs the
engine with no communication, and rank 0 gathers the surviving ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spdnn_mpi import comm as mpi
from spdnn_mpi.backends import make_backend, resolve_backend_name
from spdnn_mpi.engine import InferenceResult, run_inference
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.model import ACTIVATIONS, Layer, Network
from spdnn_mpi.readout import classes_of_rows
from spdnn_mpi.report import edges_per_second, machine_info
from spdnn_mpi.util.memory import peak_host_bytes
from spdnn_mpi.util.outputs import check_distinct, check_output
from spdnn_mpi.util.progress import Progress


@dataclass
class RunOptions:
    """What ``spdnn infer`` was asked to do (see its --help for each field)."""

    store: str
    layers: int | None = None
    backend: str = "auto"
    partition: str = "count"  # or "nnz"
    batch: int | None = None
    threads: int | None = None
    oversubscribe_gpus: bool = False
    weights_load: str = "node"  # "node": one reader per node, broadcast; "rank": every rank reads
    compress: str = "auto"  # "auto": merge bit-identical rows (exact); "off": compute every row
    progress: Callable[[int, int, int, float], None] | None = None
    check: bool = False  # read the truth at the start; the report gets it as "_truth"
    out: str | None = None  # output paths rank 0 will write: checked before the run
    json: str | None = None
    emit: Callable[[str], None] | None = None  # rank 0's progress lines of the layout build


def check_options(opts: RunOptions) -> None:
    """Refuse option values that cannot make a run, before anything is read."""
    if opts.layers is not None and opts.layers < 1:
        raise SpdnnError(f"--layers {opts.layers}: must be at least 1")
    if opts.batch is not None and opts.batch < 1:
        raise SpdnnError(f"--batch {opts.batch}: must be at least 1")
    if opts.threads is not None and opts.threads < 1:
        raise SpdnnError(f"--threads {opts.threads}: must be at least 1")


def check_outputs(opts: RunOptions) -> None:
    """The outputs rank 0 writes at the end: writable, distinct, and not the store."""
    outputs = {"--out": opts.out, "--json": opts.json}
    check_distinct(outputs)
    for option, path in outputs.items():
        if path is not None:
            check_output(path, option, inputs={"the store": opts.store})


def agreement_facts(opts: RunOptions, store: Store) -> dict[str, tuple[str, str]]:
    """What every rank of one run must share: {name: (value compared, value shown)}.

    The store is compared by its identity, not its path, so node-local copies
    agree; ``--threads`` may differ (nodes may differ).
    """
    facts = {"store": (store.identity(), f"{opts.store} ({store.describe_identity()})")}
    for name in ("layers", "backend", "partition", "batch", "weights_load", "oversubscribe_gpus",
                 "compress", "check", "out", "json"):
        value = getattr(opts, name)
        option = "--" + name.replace("_", "-")
        shown = f"no {option}" if value in (None, False) else (
            option if value is True else f"{option} {value}")
        facts[option] = (repr(value), shown)
    return facts


def compare_categories(ours: np.ndarray, truth: np.ndarray, show: int = 10) -> dict:
    """Exact comparison of two sorted 1-based id lists, with the first differences."""
    missing = np.setdiff1d(truth, ours)
    extra = np.setdiff1d(ours, truth)
    return {
        "passed": bool(len(missing) == 0 and len(extra) == 0),
        "expected_count": int(len(truth)),
        "got_count": int(len(ours)),
        "missing_first": missing[:show].tolist(),
        "extra_first": extra[:show].tolist(),
        "missing_count": int(len(missing)),
        "extra_count": int(len(extra)),
    }


def merge_events(batches: list[list[dict]]) -> list[dict]:
    """Checks of every batch on every rank, summed per layer (rows, representatives, images)."""
    by_layer: dict[int, dict] = {}
    for events in batches:
        for e in events:
            acc = by_layer.setdefault(e["layer"], {"layer": e["layer"], "rows": 0,
                                                   "representatives": 0, "images": 0,
                                                   "batches": 0})
            for key in ("rows", "representatives", "images"):
                acc[key] += e[key]
            acc["batches"] += 1
    return [by_layer[k] for k in sorted(by_layer)]


def _layer_arrays(layer: Layer) -> list[np.ndarray]:
    meta = np.array([layer.n_in, layer.n_out, layer.values is None, layer.bias_is_scalar,
                     layer.clip is not None, ACTIVATIONS.index(layer.activation)],
                    dtype=np.int64)
    scalars = np.array([layer.uniform_value or 0.0, layer.bias if layer.bias_is_scalar else 0.0,
                        layer.clip or 0.0], dtype=np.float64)
    values = layer.values if layer.values is not None else np.zeros(0, np.float32)
    bias = np.zeros(0, np.float32) if layer.bias_is_scalar else layer.bias
    return [meta, scalars, layer.indptr, layer.indices, values, bias]


def _layer_from_arrays(a: list[np.ndarray]) -> Layer:
    meta, scalars, indptr, indices, values, bias = a
    n_in, n_out, uniform, scalar_bias, has_clip, activation = (int(x) for x in meta)
    return Layer(
        n_in, n_out, indptr, indices,
        None if uniform else values,
        float(scalars[0]) if uniform else None,
        float(scalars[1]) if scalar_bias else bias,
        float(scalars[2]) if has_clip else None,
        ACTIVATIONS[activation],
    )


def load_network(local_comm, store: Store, n_layers: int, mode: str) -> Network:
    """The network on every rank: read by each rank, or once per node and broadcast."""
    if mode == "rank" or local_comm.Get_size() == 1:
        return store.network(n_layers)
    if mode != "node":
        raise SpdnnError(f"unknown --weights-load {mode!r}; choose node or rank")
    net = store.network(n_layers) if local_comm.Get_rank() == 0 else None
    layers = []
    for k in range(n_layers):
        arrays = _layer_arrays(net.layers[k]) if net is not None else None
        layers.append(_layer_from_arrays(mpi.broadcast_arrays(local_comm, arrays)))
    return Network(layers, store.provenance, store.readout)


def distributed_infer(comm, opts: RunOptions) -> dict | None:
    """Run inference across ``comm``; rank 0 returns the report (others None).

    Any rank's failure in a phase stops every rank with that rank's message.
    """
    node, local = mpi.node_info(comm)
    state: dict = {}
    try:
        return _distributed_infer(comm, local, node, opts, state)
    finally:
        if "store" in state:
            state["store"].close()
        local.Free()


def _distributed_infer(comm, local, node, opts: RunOptions, state: dict) -> dict | None:
    rank, size = comm.Get_rank(), comm.Get_size()
    backend_name, why = resolve_backend_name(opts.backend)

    def load() -> None:
        check_options(opts)
        if rank == 0:
            check_outputs(opts)
        store = Store(opts.store)
        state["store"] = store
        n_layers = store.n_layers if opts.layers is None else opts.layers
        if not 1 <= n_layers <= store.n_layers:
            raise SpdnnError(f"{opts.store}: --layers {n_layers}, store has {store.n_layers}")
        n_images = store.n_images
        if store.readout == "argmax" and rank == 0:
            # read now, like the truth: reference predictions and, for the whole
            # network, the labels (they score its outputs only)
            if n_layers == store.n_layers:
                state["labels"] = store.labels()
            if opts.check:
                state["reference"] = store.predictions(n_layers)
                if state["reference"] is None:
                    raise SpdnnError(
                        f"{opts.store}: no reference predictions stored for {n_layers} "
                        f"layers (stored: {store.prediction_layers() or 'none'}); run "
                        "without --check")
        elif opts.check and rank == 0:
            # read now: a store replaced during the run must not change the verdict
            state["truth"] = store.truth(n_layers)
            if state["truth"] is None:
                raise SpdnnError(
                    f"{opts.store}: no truth stored for {n_layers} layers "
                    f"(stored: {store.truth_layers() or 'none'}); run without --check"
                )
        if opts.partition == "nnz":
            weights = store.input_row_nnz() if rank == 0 else None
            bounds = mpi.partition(n_images, size, weights) if rank == 0 else None
        elif opts.partition == "count":
            bounds = mpi.partition(n_images, size)
        else:
            raise SpdnnError(f"unknown --partition {opts.partition!r}; choose count or nnz")
        state.update(n_layers=n_layers, n_images=n_images, bounds=bounds,
                     facts=agreement_facts(opts, store), readout=store.readout)

    mpi.run_phase(comm, load)
    mpi.check_agreement(comm, state["facts"])
    state["bounds"] = comm.bcast(state["bounds"], root=0)

    def setup() -> None:
        t0 = time.perf_counter()
        store: Store = state["store"]
        checked_before = store.validate_seconds
        start, stop = (int(x) for x in state["bounds"][rank : rank + 2])
        rows = store.inputs(start, stop)
        network = load_network(local, store, state["n_layers"], opts.weights_load)
        t1 = time.perf_counter()
        state["validate_seconds"] = store.validate_seconds - checked_before
        options: dict = {}
        if backend_name == "cuda":
            from spdnn_mpi.backends.cuda.backend import import_cupy

            cupy = import_cupy()  # a clear install hint where CuPy is missing

            def uuid_of(dev: int) -> str:
                props = cupy.cuda.runtime.getDeviceProperties(dev)
                return bytes(props.get("uuid", b"")).hex() or f"index-{dev}"

            visible = cupy.cuda.runtime.getDeviceCount()
            options["device"] = mpi.choose_gpu(node, local, visible, uuid_of,
                                               opts.oversubscribe_gpus)
        elif backend_name == "cpu":
            options["threads"] = mpi.cpu_threads_per_rank(node.local_size, opts.threads)
        backend = make_backend(backend_name, **options)
        backend.load_network(network.layers, progress=Progress(
            "layout", state["n_layers"], opts.emit if rank == 0 else None))
        # Untimed warm-up on a few rows: kernel compilation and CUDA graph capture
        # belong to set-up (reported as layout time), not to inference.
        run_inference(network, rows.slice(0, min(rows.n_rows, 64)), backend, batch=opts.batch,
                      compress=opts.compress)
        t2 = time.perf_counter()
        state.update(rows=rows, network=network, backend=backend, start=start, stop=stop,
                     load_seconds=t1 - t0, layout_seconds=t2 - t1)

    mpi.run_phase(comm, setup)

    argmax = state["readout"] == "argmax"

    def infer() -> InferenceResult:
        return run_inference(state["network"], state["rows"], state["backend"],
                             batch=opts.batch, want_features=argmax,
                             progress=opts.progress if rank == 0 else None,
                             compress=opts.compress)

    result: InferenceResult = mpi.run_phase(comm, infer)
    state["store"].close()

    ids = mpi.gather_ids(comm, result.alive_ids)
    classes = None
    if argmax:  # one class per image; ranks hold contiguous ranges, gathered in rank order
        mine = classes_of_rows(state["stop"] - state["start"],
                               result.alive_ids - state["start"], result.features)
        classes = mpi.gather_ids(comm, mine)
    live = mpi.sum_to_root(comm, result.live_per_layer)
    per_rank = comm.gather({
        "rank": rank,
        "host": node.hostname,
        "local_rank": node.local_rank,
        "images": state["stop"] - state["start"],
        "first_image": state["start"],
        "input_nnz": state["rows"].nnz,
        "load_seconds": state["load_seconds"],
        "validate_seconds": state["validate_seconds"],
        "layout_seconds": state["layout_seconds"],
        "inference_seconds": result.seconds,
        "input_seconds": result.input_seconds,
        "alive_at_end": int(len(result.alive_ids)),
        "computed_edges": result.computed_edges(state["network"]),
        "compression": result.compression,
        "batches": result.batches,
        "backend": state["backend"].describe(),
        **peak_host_bytes(),
    }, root=0)
    if rank != 0:
        return None

    network: Network = state["network"]
    n_images = state["n_images"]
    edges = network.edges()
    times = np.array([r["inference_seconds"] for r in per_rank])
    slowest = float(times.max())
    categories = np.sort(ids) + 1
    eps = edges_per_second(n_images, edges, slowest)
    computed = sum(r["computed_edges"] for r in per_rank)
    computed_eps = computed / slowest if slowest > 0 else float("inf")
    return {
        "store": str(opts.store),
        "n_layers": state["n_layers"],
        "neurons": network.n_inputs,
        "n_images": n_images,
        "edges_per_image": edges,
        "backend": backend_name,
        "backend_choice": why,
        "ranks": size,
        "partition": opts.partition,
        "inference_seconds": slowest,
        "edges_per_second": eps,
        "teraedges_per_second": eps / 1e12,
        "compress": opts.compress,
        "computed_edges": computed,
        "computed_edges_per_second": computed_eps,
        "computed_teraedges_per_second": computed_eps / 1e12,
        "compression": merge_events([b for r in per_rank for b in r["compression"]]),
        "input_seconds": max(r["input_seconds"] for r in per_rank),
        "load_seconds": max(r["load_seconds"] for r in per_rank),
        "validate_seconds": max(r["validate_seconds"] for r in per_rank),
        "layout_seconds": max(r["layout_seconds"] for r in per_rank),
        "peak_host_bytes": max(r["peak_host_bytes"] for r in per_rank),
        "peak_children_bytes": max(r["peak_children_bytes"] for r in per_rank),
        "imbalance": float(slowest / times.mean()) if times.mean() > 0 else 1.0,
        "live_rows_per_layer": live.tolist(),
        "layer_seconds": None if result.layer_seconds is None else result.layer_seconds.tolist(),
        "categories_count": int(len(categories)),
        "readout": state["readout"],
        "per_rank": per_rank,
        "machine": machine_info(),
        "_categories": categories,
        "_truth": state.get("truth"),
        "_predictions": classes,
        "_reference": state.get("reference"),
        "_labels": state.get("labels"),
    }

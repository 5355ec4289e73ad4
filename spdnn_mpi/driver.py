"""One distributed inference run (one process or any number of MPI ranks), in steps:

    open_run -> agree -> read_rank_data -> share the weights -> prepare_backend
    -> lay_out -> infer -> gather_report

Each rank runs the engine on its contiguous range of images with no communication.
A step runs on every rank inside ``comm.run_phase``, so a failure on any rank stops
every rank; collectives happen only between steps, so a failed rank can never
leave the others waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spdnn_mpi import comm as mpi
from spdnn_mpi.backends import make_backend, resolve_backend_name
from spdnn_mpi.backends.base import Backend
from spdnn_mpi.engine import InferenceResult, run_inference
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.readout import classes_of_rows
from spdnn_mpi.report import RunReport, merge_events
from spdnn_mpi.util import outputs
from spdnn_mpi.util.memory import peak_host_bytes
from spdnn_mpi.util.progress import Progress, note_if_slow


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
    check: bool = False  # read the truth (or reference predictions) when the run starts
    out: str | None = None  # output paths rank 0 will write: checked before the run
    json: str | None = None
    emit: Callable[[str], None] | None = None  # rank 0's progress lines of the layout build


@dataclass
class RunPlan:
    """What ``open_run`` settles on each rank before anything large is read."""

    store: Store
    n_layers: int
    n_images: int
    readout: str
    bounds: np.ndarray | None  # partition of the images (None off rank 0 with --partition nnz)
    facts: dict[str, tuple[str, str]]  # what every rank must agree on
    truth: np.ndarray | None = None  # rank 0 with --check (alive stores)
    reference: np.ndarray | None = None  # rank 0 with --check (argmax stores)
    labels: np.ndarray | None = None  # rank 0, argmax stores run whole


@dataclass
class RankData:
    """This rank's inputs and (where it reads them) the weights."""

    rows: SparseRows
    network: Network | None
    start: int
    stop: int
    load_seconds: float
    validate_seconds: float
    device_seconds: float = 0.0  # the backend's runtime: CuPy and the GPU driver, or numba


def check_options(opts: RunOptions) -> None:
    """Refuse option values that cannot make a run, before anything is read."""
    for name in ("layers", "batch", "threads"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise SpdnnError(f"--{name} {value}: must be at least 1")
    if opts.partition not in ("count", "nnz"):
        raise SpdnnError(f"unknown --partition {opts.partition!r}; choose count or nnz")
    if opts.weights_load not in ("node", "rank"):
        raise SpdnnError(f"unknown --weights-load {opts.weights_load!r}; choose node or rank")


def check_outputs(opts: RunOptions) -> None:
    """The outputs rank 0 writes at the end: writable, distinct, and not the store."""
    outputs.check_outputs({"--out": opts.out, "--json": opts.json},
                          {"the store": opts.store}, results=True)


def agreement_facts(opts: RunOptions, store: Store) -> dict[str, tuple[str, str]]:
    """What every rank of one run must share: {name: (value compared, value shown)}.
    The store by its identity, so node-local copies agree; ``--threads`` may differ."""
    facts = {"store": (store.identity(), f"{opts.store} ({store.describe_identity()})")}
    for name in ("layers", "backend", "partition", "batch", "weights_load", "oversubscribe_gpus",
                 "compress", "check", "out", "json"):
        value = getattr(opts, name)
        option = "--" + name.replace("_", "-")
        shown = f"no {option}" if value in (None, False) else (
            option if value is True else f"{option} {value}")
        facts[option] = (repr(value), shown)
    return facts


def open_run(opts: RunOptions, rank: int, size: int, opened: list[Store]) -> RunPlan:
    """Step 1, on every rank: check the options, open the store, plan the partition;
    rank 0 also checks the outputs and reads what the verdict is made against (now,
    so a store replaced during the run cannot change it)."""
    check_options(opts)
    if rank == 0:
        check_outputs(opts)
    store = Store(opts.store)
    opened.append(store)
    n_layers = store.n_layers if opts.layers is None else opts.layers
    if not 1 <= n_layers <= store.n_layers:
        raise SpdnnError(f"{opts.store}: --layers {n_layers}, store has {store.n_layers}")
    plan = RunPlan(store, n_layers, store.n_images, store.readout, None,
                   agreement_facts(opts, store))
    if rank == 0:
        if store.readout == "argmax":
            if n_layers == store.n_layers:  # labels score the whole network's outputs only
                plan.labels = store.labels()
            if opts.check:
                plan.reference = _checked_against(store.predictions(n_layers), opts, n_layers,
                                                  "reference predictions", store.prediction_layers)
        elif opts.check:
            plan.truth = _checked_against(store.truth(n_layers), opts, n_layers, "truth",
                                          store.truth_layers)
    if opts.partition == "count":
        plan.bounds = mpi.partition(plan.n_images, size)
    elif rank == 0:
        plan.bounds = mpi.partition(plan.n_images, size, store.input_row_nnz())
    return plan


def _checked_against(found: np.ndarray | None, opts: RunOptions, n_layers: int, what: str,
                     stored: Callable[[], list]) -> np.ndarray:
    """What ``--check`` compares with, or the error naming the layer counts ``stored``."""
    if found is None:
        raise SpdnnError(f"{opts.store}: no {what} stored for {n_layers} layers "
                         f"(stored: {stored() or 'none'}); run without --check")
    return found


def read_rank_data(plan: RunPlan, bounds: np.ndarray, rank: int, reads_weights: bool) -> RankData:
    """Step 2, on every rank: its own images and, where ``reads_weights``, the network."""
    t0 = time.perf_counter()
    checked_before = plan.store.validate_seconds
    start, stop = (int(x) for x in bounds[rank : rank + 2])
    rows = plan.store.inputs(start, stop)
    network = plan.store.network(plan.n_layers) if reads_weights else None
    return RankData(rows, network, start, stop, time.perf_counter() - t0,
                    plan.store.validate_seconds - checked_before)


def device_option(backend_name: str, node: mpi.NodeInfo, opts: RunOptions) -> dict:
    """The backend's placement option on this rank: its GPU index, or its CPU threads."""
    if backend_name == "cuda":
        from spdnn_mpi.backends.cuda.compile import import_cupy

        cupy = import_cupy()  # a clear install hint where CuPy is missing
        visible = cupy.cuda.runtime.getDeviceCount()
        return {"device": mpi.gpu_index(node, visible, opts.oversubscribe_gpus)}
    if backend_name == "cpu":
        return {"threads": mpi.cpu_threads_per_rank(node.local_size, opts.threads)}
    return {}


def gpu_uuid(device: int) -> str:
    """The physical identity of a visible GPU (two ranks with one UUID share a card)."""
    from spdnn_mpi.backends.cuda.compile import import_cupy

    props = import_cupy().cuda.runtime.getDeviceProperties(device)
    return bytes(props.get("uuid", b"")).hex() or f"index-{device}"


def prepare_backend(backend_name: str, options: dict, data: RankData, compile_now: bool,
                    emit: Callable[[str], None] | None = None
                    ) -> tuple[Backend, float, float]:
    """Step 4, on every rank: build the backend; where ``compile_now`` (the first rank
    of each node) also compile its kernels, so the node's other ranks load them from
    the disk cache instead of all compiling at once. (backend, seconds building it:
    its runtime's import and start, seconds compiling)."""
    with note_if_slow(emit, "compiling the kernels (once: later runs load them from "
                            "the cache)"):
        t0 = time.perf_counter()
        backend = make_backend(backend_name, **options)
        t1 = time.perf_counter()
        if compile_now:
            backend.prepare_kernels(data.network.layers)
    return backend, t1 - t0, time.perf_counter() - t1


def lay_out(backend: Backend, plan: RunPlan, data: RankData, opts: RunOptions,
            emit: Callable[[str], None] | None) -> tuple[float, float]:
    """Step 5, on every rank: lay out the network and warm up on a few rows, keeping
    first-call costs out of inference; (layout seconds, warm-up seconds)."""
    t0 = time.perf_counter()
    backend.load_network(data.network.layers, progress=Progress("layout", plan.n_layers, emit))
    t1 = time.perf_counter()
    run_inference(data.network, data.rows.slice(0, min(data.rows.n_rows, 64)), backend,
                  batch=opts.batch, compress=opts.compress)
    return t1 - t0, time.perf_counter() - t1


def distributed_infer(comm, opts: RunOptions) -> RunReport | None:
    """Run inference across ``comm``; rank 0 returns the report (others None)."""
    node, local = mpi.node_info(comm)
    opened: list[Store] = []
    try:
        return _run_steps(comm, node, local, opts, opened)
    finally:
        for store in opened:
            store.close()
        local.Free()


def _run_steps(comm, node: mpi.NodeInfo, local, opts: RunOptions,
               opened: list[Store]) -> RunReport | None:
    rank, size = comm.Get_rank(), comm.Get_size()
    backend_name, why = resolve_backend_name(opts.backend)
    plan: RunPlan = mpi.run_phase(comm, lambda: open_run(opts, rank, size, opened))
    mpi.check_agreement(comm, plan.facts)
    bounds = comm.bcast(plan.bounds, root=0)
    share = opts.weights_load == "node" and local.Get_size() > 1
    reads = not share or local.Get_rank() == 0
    data: RankData = mpi.run_phase(comm, lambda: read_rank_data(plan, bounds, rank, reads))
    if share:
        t0 = time.perf_counter()
        layers = mpi.broadcast_layers(local, data.network.layers if reads else None)
        data.network = Network(layers, plan.store.provenance, plan.store.readout)
        data.load_seconds += time.perf_counter() - t0

    t_device = time.perf_counter()  # CuPy's import and the driver's start-up, for a GPU
    options = mpi.run_phase(comm, lambda: device_option(backend_name, node, opts))
    if "device" in options:
        uuids = local.allgather(mpi.run_phase(comm, lambda: gpu_uuid(options["device"])))
        mpi.run_phase(comm, lambda: mpi.check_gpu_sharing(node, uuids, opts.oversubscribe_gpus))
    data.device_seconds = time.perf_counter() - t_device
    first_on_node = node.local_rank == 0
    backend, built_seconds, prepare_seconds = mpi.run_phase(comm, lambda: prepare_backend(
        backend_name, options, data, first_on_node, opts.emit if rank == 0 else None))
    data.device_seconds += built_seconds
    layout_seconds, warm_up_seconds = mpi.run_phase(comm, lambda: lay_out(
        backend, plan, data, opts, opts.emit if rank == 0 else None))
    layout_seconds += prepare_seconds

    argmax = plan.readout == "argmax"

    def infer() -> tuple[InferenceResult, np.ndarray | None]:
        result = run_inference(data.network, data.rows, backend, batch=opts.batch,
                               want_features=argmax,
                               progress=opts.progress if rank == 0 else None,
                               compress=opts.compress)
        classes = (classes_of_rows(data.stop - data.start, result.alive_ids - data.start,
                                   result.features) if argmax else None)
        return result, classes

    result, classes = mpi.run_phase(comm, infer)
    plan.store.close()
    return gather_report(comm, node, backend_name, why, opts, plan, data, backend, result,
                         classes, layout_seconds, warm_up_seconds)


def gather_report(comm, node: mpi.NodeInfo, backend_name: str, why: str, opts: RunOptions,
                  plan: RunPlan, data: RankData, backend: Backend, result: InferenceResult,
                  classes: np.ndarray | None, layout_seconds: float,
                  warm_up_seconds: float) -> RunReport | None:
    """Last step: every rank's ids (and classes) and facts to rank 0, which builds the report."""
    ids = mpi.gather_ids(comm, result.alive_ids)
    # ranks hold contiguous ranges: classes gathered in rank order are in image order
    predictions = mpi.gather_ids(comm, classes) if classes is not None else None
    live = mpi.sum_to_root(comm, result.live_per_layer)
    described = backend.describe()
    compile_seconds = float(described.get("compile_seconds", 0.0))
    per_rank = comm.gather({
        "rank": comm.Get_rank(),
        "host": node.hostname,
        "local_rank": node.local_rank,
        "images": data.stop - data.start,
        "first_image": data.start,
        "input_nnz": data.rows.nnz,
        "load_seconds": data.load_seconds,
        "device_seconds": data.device_seconds,
        "validate_seconds": data.validate_seconds,
        "layout_seconds": layout_seconds - compile_seconds,
        "compile_seconds": compile_seconds,
        "kernels_compiled": bool(described.get("kernels_compiled", False)),
        "warm_up_seconds": warm_up_seconds,
        "inference_seconds": result.seconds,
        "input_seconds": result.input_seconds,
        "alive_at_end": int(len(result.alive_ids)),
        "computed_edges": result.computed_edges(data.network),
        "compression": result.compression,
        "batches": result.batches,
        "backend": described,
        **peak_host_bytes(),
    }, root=0)
    if comm.Get_rank() != 0:
        return None
    network = data.network
    times = np.array([r["inference_seconds"] for r in per_rank])
    return RunReport(
        store=str(opts.store), n_layers=plan.n_layers, layer_widths=network.widths(),
        n_images=plan.n_images, edges_per_image=network.edges(), backend=backend_name,
        backend_choice=why, ranks=comm.Get_size(), partition=opts.partition,
        compress=opts.compress, readout=plan.readout,
        inference_seconds=float(times.max()),
        imbalance=float(times.max() / times.mean()) if times.mean() > 0 else 1.0,
        computed_edges=sum(r["computed_edges"] for r in per_rank),
        live_rows_per_layer=live.tolist(),
        layer_seconds=None if result.layer_seconds is None else result.layer_seconds.tolist(),
        compression=merge_events([b for r in per_rank for b in r["compression"]]),
        per_rank=per_rank,
        categories=np.sort(ids) + 1, truth=plan.truth, predictions=predictions,
        reference=plan.reference, labels=plan.labels,
    )

"""The challenge part of `spdnn bench`: cases, timing, checks, peers and simulated ranks.

A case is a store (given, or generated once per N into the data folder) and a layer
count, timed in each compression mode and checked against the truth or a peer.
``run`` drives the whole command; ``spdnn_mpi.bench.tables`` prints it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

#: Peers that run the challenge networks; the others run imported models only.
CHALLENGE_PEERS = ("graphblas", "cusparse", "torch")
PEERS = (*CHALLENGE_PEERS, "onnxruntime", "torch-dense")


def log(args: argparse.Namespace, msg: str) -> None:
    """One progress line on stderr, unless --quiet."""
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def emitter(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Where progress lines go: indented on stderr, or nowhere with --quiet."""
    if args.quiet:
        return None
    return lambda line: print(f"  {line}", file=sys.stderr, flush=True)


def requested_configs(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(N, L) of every --config and, with --challenge, the 12 challenge configurations."""
    from spdnn_mpi.model import CHALLENGE_LAYERS, CHALLENGE_NEURONS

    configs = list(args.config)
    if args.challenge:
        configs += [(n, lay) for n in CHALLENGE_NEURONS for lay in CHALLENGE_LAYERS]
    return configs


def generated_cases(args: argparse.Namespace) -> Iterator[tuple[Path, int]]:
    """(store, layers) per requested configuration; each N's store found in the cache
    folder or generated there just before its first case (a run cut short keeps the
    cases done)."""
    from spdnn_mpi.generators import challenge
    from spdnn_mpi.util.paths import cache_dir

    data_dir = args.data_dir or cache_dir()
    by_n: dict[int, list[int]] = {}
    for n, layers in requested_configs(args):
        by_n.setdefault(n, []).append(layers)
    tmax = args.truth_max[0] * args.truth_max[1]
    for n, layer_list in by_n.items():
        truth = sorted({lay for lay in layer_list if n * lay <= tmax})
        path = challenge.cached_generated_store(data_dir, n, max(layer_list), args.images,
                                                args.seed, truth, log=lambda m: log(args, m),
                                                quiet=args.quiet)
        for lay in sorted(set(layer_list)):
            yield path, lay


def run_peer(name: str, network, rows, threads: int | None,
             emit: Callable[[str], None] | None = None) -> tuple[np.ndarray, float]:
    """(alive ids, seconds) of one peer, after an untimed warm-up on a few rows (as
    ``engine.time_inference`` does for ours); the timed run's progress to ``emit``."""
    if name == "graphblas":
        from spdnn_mpi.bench.peers.graphblas import graphblas_infer, graphblas_memory_check
        from spdnn_mpi.util.progress import Progress

        graphblas_memory_check(network, rows)

        def fn(r):
            progress = Progress("peer graphblas", network.n_layers,
                                emit if r is rows else None)
            return graphblas_infer(network, r, threads, progress)
    else:
        from spdnn_mpi.bench.peers import gpu_sparse

        impl = gpu_sparse.cusparse_infer if name == "cusparse" else gpu_sparse.torch_sparse_infer

        def fn(r):
            return impl(network, r)
    fn(rows.slice(0, min(rows.n_rows, 256)))
    return fn(rows)


def check_row(ours: np.ndarray, truth: np.ndarray | None, truth_by: str | None,
              others: dict[str, np.ndarray]) -> dict | None:
    """Full-list check of one mode: against the truth, else the first other result given."""
    from spdnn_mpi.readout import compare_categories

    if truth is not None:
        return {"against": f"truth ({truth_by})", **compare_categories(ours, np.asarray(truth))}
    for name, theirs in others.items():
        return {"against": name, **compare_categories(ours, theirs)}
    return None


def time_mode(args: argparse.Namespace, network, rows, backend, mode: str,
              set_up_seconds: float) -> dict:
    """Median of --repeat timed runs in one compression mode, plus its end-to-end time."""
    import tempfile

    from spdnn_mpi.engine import time_inference
    from spdnn_mpi.formats.tsv.write import write_categories
    from spdnn_mpi.report import edges_per_second, merge_events

    median, times, res = time_inference(network, rows, backend, args.repeat, args.batch,
                                        compress=mode)
    ours = res.categories()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_categories(Path(tmp) / "categories.tsv", ours)
        write_s = time.perf_counter() - t0
    nominal = edges_per_second(rows.n_rows, network.edges(), median)
    computed = res.computed_edges(network) / median if median > 0 else float("inf")
    return {
        "compress": mode, "seconds": median, "seconds_all": times,
        "seconds_min": min(times), "seconds_max": max(times),
        "edges_per_second": nominal, "teraedges_per_second": nominal / 1e12,
        "computed_edges_per_second": computed, "computed_teraedges_per_second": computed / 1e12,
        "alive_at_end": int(len(ours)), "input_seconds": res.input_seconds,
        "end_to_end_seconds": set_up_seconds + res.input_seconds + median + write_s,
        "live_rows_per_layer": res.live_per_layer.tolist(),
        "layer_seconds": None if res.layer_seconds is None else res.layer_seconds.tolist(),
        "computed_rows_per_layer": res.computed_rows_per_layer.tolist(),
        "compression": merge_events(res.compression),
        "_categories": ours,
    }


def simulate_ranks(args: argparse.Namespace, network, rows, backend, mode: str,
                   median: float, ranks: int) -> dict:
    """Each of P count-balanced partitions in turn on this device: the projected P-rank run."""
    from spdnn_mpi.comm import partition
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.report import edges_per_second

    bounds = partition(rows.n_rows, ranks)
    part_times = [run_inference(network, rows.slice(int(bounds[p]), int(bounds[p + 1])),
                                backend, batch=args.batch, compress=mode).seconds
                  for p in range(ranks)]
    slowest = max(part_times)
    return {
        "ranks": ranks, "seconds": part_times,
        "imbalance": slowest / statistics.mean(part_times) if slowest > 0 else 1.0,
        "projected_seconds": slowest,
        "projected_speedup": median / slowest if slowest > 0 else float("inf"),
        "projected_edges_per_second": edges_per_second(rows.n_rows, network.edges(), slowest),
    }


def _peers(args: argparse.Namespace, row: dict, network, rows, backend) -> dict[str, np.ndarray]:
    """Run every asked-for challenge peer into ``row["peers"]``; their 1-based ids by name."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.readout import compare_categories
    from spdnn_mpi.report import edges_per_second

    modes, n, n_layers = row["modes"], row["neurons"], row["layers"]
    peer_cap = args.peer_max[0] * args.peer_max[1] if args.peer_max else None
    base = modes.get("off") or modes["auto"]  # peers compute every live row, like off
    peer_ids: dict[str, np.ndarray] = {}
    if any(p in CHALLENGE_PEERS for p in args.peer):
        backend.release_buffers()  # the peer's memory: 31 GB at 60000 x 65536 on a GPU
    for peer in args.peer:
        if peer not in CHALLENGE_PEERS:
            row["peers"][peer] = {"skipped": "a peer for imported models only"}
            continue
        if peer_cap is not None and n * n_layers > peer_cap:
            row["peers"][peer] = {"skipped": f"N*L above --peer-max {args.peer_max}"}
            continue
        log(args, f"  peer {peer} on {n}x{n_layers} ...")
        try:
            ids, seconds = run_peer(peer, network, rows, args.threads, emitter(args))
        except SpdnnError as exc:
            row["peers"][peer] = {"skipped": str(exc)}
            continue
        peer_ids[f"peer {peer}"] = np.sort(ids) + 1
        agree = all(compare_categories(m["_categories"], peer_ids[f"peer {peer}"])["passed"]
                    for m in modes.values())
        row["peers"][peer] = {
            "seconds": seconds, "speedup": seconds / base["seconds"], "agrees": agree,
            "edges_per_second": edges_per_second(rows.n_rows, network.edges(), seconds)}
    return peer_ids


def bench_case(args: argparse.Namespace, store_path: Path, n_layers: int | None, backend,
               backend_name: str) -> dict:
    """One case: every mode timed and checked, the peers, simulated ranks, layer figures."""
    from spdnn_mpi.bench.anchors import anchors_for
    from spdnn_mpi.bench.floors import add_first_layers, card_for, converged_layers
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.readout import compare_categories
    from spdnn_mpi.util.memory import peak_host_bytes
    from spdnn_mpi.util.progress import Progress

    with Store(store_path) as store:
        n_layers = store.n_layers if n_layers is None else n_layers  # 0 is refused, not "all"
        t0 = time.perf_counter()
        network = store.network(n_layers)
        rows = store.inputs()
        truth = store.truth(n_layers)
        truth_by = store.truth_source(n_layers)
        read_s = time.perf_counter() - t0
    n = network.n_inputs
    t0 = time.perf_counter()
    backend.load_network(network.layers, progress=Progress("layout", n_layers, emitter(args)))
    layout_s = time.perf_counter() - t0
    modes = {m: time_mode(args, network, rows, backend, m, read_s + layout_s)
             for m in (["off", "auto"] if args.compress == "both" else [args.compress])}
    info = backend.describe()
    gpu = backend_name == "cuda"
    compile_s = float(info.get("compile_seconds", 0.0))  # inside the layout's time
    row = {
        "store": str(store_path), "neurons": n, "layers": n_layers, "images": rows.n_rows,
        "backend": backend_name, "read_seconds": read_s, "layout_seconds": layout_s - compile_s,
        "compile_seconds": compile_s, "kernels_compiled": bool(info.get("kernels_compiled")),
        "backend_info": info, "modes": modes, "peers": {},
    }
    if gpu:  # published GPU figures: no comparison for a CPU run (its peer is GraphBLAS)
        row["anchors"] = anchors_for(n, n_layers)
    peer_ids = _peers(args, row, network, rows, backend)
    for name, m in modes.items():
        others = dict(peer_ids)
        if name == "auto" and "off" in modes:  # bit-exact mode: the same list as off, too
            others = {"off": modes["off"]["_categories"], **others}
            m["same_as_off"] = compare_categories(m["_categories"],
                                                  modes["off"]["_categories"])["passed"]
        m["check"] = check_row(m["_categories"], truth, truth_by, others)
        if args.ranks_sim:
            m["ranks_sim_all"] = [simulate_ranks(args, network, rows, backend, name,
                                                 m["seconds"], p) for p in args.ranks_sim]
            m["ranks_sim"] = m["ranks_sim_all"][0]
    for m in modes.values():
        del m["_categories"]
    if gpu:  # the floor is a GPU's; a CPU run has none
        device = info.get("device")
        add_first_layers(row, network, args.first_layers, card_for(device), device,
                         bool(info.get("inputs_as_bits")))
    converged = converged_layers(modes["auto"]) if "auto" in modes else None
    if converged is not None:
        row["converged_layers"] = converged
    row.update(peak_host_bytes())  # of the process so far: the largest case run yet
    return row


def row_failed(row: dict) -> bool:
    """Any mode's check failed, auto differed from off, or a peer disagreed."""
    bad = any(m.get("check") and not m["check"]["passed"] for m in row["modes"].values())
    bad |= any(m.get("same_as_off") is False for m in row["modes"].values())
    return bad or any(p.get("agrees") is False for p in row["peers"].values())


def run(args: argparse.Namespace) -> int:
    """The whole `spdnn bench`: models, stores and configurations; tables; JSON; plots."""
    from spdnn_mpi.backends import make_backend, resolve_backend_name
    from spdnn_mpi.bench import models as bench_models
    from spdnn_mpi.bench import plot as bench_plot
    from spdnn_mpi.bench import tables
    from spdnn_mpi.commands.options import STDOUT, emit_json, json_file, text_stream
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.report import machine_info
    from spdnn_mpi.util.memory import peak_host_bytes
    from spdnn_mpi.util.outputs import check_outputs

    check_outputs({"--json": json_file(args), "--plot": args.plot},
                  {f"the store {s}": s for s in args.stores}, results=True)
    cases: list[tuple[Path, int | None]] = []
    model_paths = bench_models.shipped_model_stores(args) if args.model or args.models else []
    for s in args.stores:
        if bench_models.is_model_store(Path(s)):
            model_paths.append(Path(s))
        else:
            cases += [(Path(s), lay) for lay in (args.layers or [None])]
    bench_plot.check_options(args, cases, requested_configs(args), bool(model_paths))
    if not cases and not requested_configs(args) and not model_paths:
        raise SpdnnError("nothing to benchmark: give STORE paths, --config NxL, --challenge "
                         "or --models")
    name, why = resolve_backend_name(args.backend)
    log(args, f"backend {name} ({why})")
    backend = make_backend(name, **({"threads": args.threads} if name == "cpu" else {}))
    results: list[dict] = []
    models: list[dict] = []

    def save(last: bool = False) -> None:
        """The JSON, to its file after every case, to stdout (--json -) once at the end."""
        if args.json and (last or args.json != STDOUT):
            emit_json(args, {"machine": machine_info(), "backend": name,
                             "argv": sys.argv[1:], "cwd": os.getcwd(),
                             "results": results, "models": models, **peak_host_bytes()})

    for path in model_paths:
        log(args, f"model {path.name} ...")
        models.append(bench_models.bench_model(args, path, backend, name))
        save()
    for path, layers in itertools.chain(cases, generated_cases(args)):
        log(args, f"case {path.name} layers={layers or 'all'} ...")
        results.append(bench_case(args, path, layers, backend, name))
        for mode, m in results[-1]["modes"].items():
            log(args, f"  {mode}: {m['seconds']:.4f} s, {m['teraedges_per_second']:.3f} "
                      f"TE/s nominal, {m['alive_at_end']} alive")
        save()
    if models:
        print(bench_models.table(models, args.peer), file=text_stream(args))
        if args.plot:
            bench_models.plot(models, args.plot)
    if results:
        print(tables.report(results, args.peer), file=text_stream(args))
        if args.plot:
            bench_plot.plot(results, args.plot, args.plot_config)
    if args.json == STDOUT:
        save(last=True)
    failed = any(row_failed(r) for r in results) or bench_models.failed(models)
    return 1 if failed else 0

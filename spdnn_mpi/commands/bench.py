"""Benchmark a backend over stores or generated challenge configurations.

Prints a table (N, L, time, edges/s, live rows at the end, check) and writes
JSON. Peers (GraphBLAS on the CPU; cuSPARSE and torch.sparse on the GPU) run
the same inference on the same data with the same row dropping; their
categories must agree with ours and the table gives our speed over theirs.
Stores of imported models (argmax readout) and the shipped pruned MNIST
models (--model, --models) get their own table: see ``bench_models``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: Peers that run the challenge networks; the others run imported models only.
CHALLENGE_PEERS = ("graphblas", "cusparse", "torch")
PEERS = (*CHALLENGE_PEERS, "onnxruntime", "torch-dense")

EXAMPLES = """\
examples:
  spdnn bench real1024.h5 --backend cpu --peer graphblas --repeat 5
  spdnn bench --config 1024x120 --config 4096x480 --backend cuda --peer cusparse --peer torch
  spdnn bench --challenge --backend cuda --peer cusparse --json challenge.json
  spdnn bench --models --peer onnxruntime --plot models.png
  spdnn bench --config 1024x120 --config 4096x120 --backend cuda --plot bench.png

columns (also printed under the table): TE/s from the median of --repeat timed
runs; off_runs_s, auto_runs_s = fastest-slowest of each mode's runs; <peer>_s = the
peer's time (one run after a warm-up); x<peer> = <peer>_s / our off time, our
speed-up over that peer on the same data (DISAGREE: its categories differ).
memory: the graphblas peer needs about 16 B x images x N of host memory beside
ours (measured: 1.7 GB for the whole bench at 60000 x 1024, 0.7 GB without the
peer); the JSON has the process's peak (peak_host_bytes). A GPU peer runs beside
our buffers: one that runs out of device memory is reported as skipped, with the
library's message, and the benchmark goes on.
"""


def default_data_dir() -> Path:
    """Where generated benchmark stores are cached ($SPDNN_CACHE_DIR or ~/.cache)."""
    from spdnn_mpi.util.paths import cache_dir

    return cache_dir() / "bench"


def parse_config(text: str) -> tuple[int, int]:
    """``1024x120`` -> (1024, 120)."""
    try:
        n, layers = text.lower().split("x")
        return int(n), int(layers)
    except ValueError:
        raise argparse.ArgumentTypeError(f"config {text!r} is not NxL, e.g. 1024x120") from None


def rank_counts(text: str) -> list[int]:
    """``4`` or ``2,4,8`` -> [2, 4, 8] (each at least 1)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected rank counts like 4 or 2,4,8: {text!r}")
    return counts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stores", nargs="*", help="stores to benchmark (all their layers, or --layers)")
    p.add_argument("--config", type=parse_config, action="append", default=[],
                   metavar="NxL", help="generated challenge configuration, e.g. 4096x480 "
                   "(repeatable; stores are generated once into --data-dir)")
    p.add_argument("--challenge", action="store_true",
                   help="all 12 challenge configurations (N 1024..65536 x L 120, 480, 1920)")
    p.add_argument("--layers", type=int, action="append", default=[], metavar="L",
                   help="layer counts to run on each STORE (repeatable; default: all)")
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "reference"],
                   help="backend to measure; auto picks cuda when CuPy sees a GPU, else cpu")
    p.add_argument("--peer", action="append", default=[], choices=PEERS,
                   help="also run this peer on the same data and report our speed over its; "
                        "repeatable: --peer cusparse --peer torch (models: onnxruntime, "
                        "torch-dense and torch, the sparse one)")
    p.add_argument("--model", type=float, action="append", default=[], metavar="SPARSITY",
                   help="a shipped pruned MNIST model by sparsity in percent, e.g. 95 "
                        "(repeatable)")
    p.add_argument("--models", action="store_true", help="every shipped pruned MNIST model")
    p.add_argument("--model-images", type=int, default=None, metavar="COUNT",
                   help="models: time COUNT images (the store's inputs repeated; default: them)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw a PNG (matplotlib, the 'bench' extra): for configurations, "
                        "TE/s of both modes against the published anchors and time and live "
                        "rows per layer of --plot-config; for models, speed-up and accuracy "
                        "against sparsity")
    p.add_argument("--plot-config", type=parse_config, default=None, metavar="NxL",
                   help="the configuration whose layers --plot draws (one that runs; "
                        "default: the largest N x L)")
    p.add_argument("--first-layers", type=int, default=10, metavar="K",
                   help="print and write (JSON first_layers) the off mode's first K layers "
                        "against their H200 floor, where the backend times layers (0: none)")
    p.add_argument("--peer-max", type=parse_config, default=None, metavar="NxL",
                   help="run peers only on cases with N*L at most this (default: all)")
    p.add_argument("--repeat", type=int, default=3, metavar="COUNT",
                   help="timed runs per case (median reported, with min and max)")
    p.add_argument("--ranks-sim", type=rank_counts, default=None, metavar="P[,P...]",
                   help="also run each of P count-balanced partitions in turn and report "
                        "per-partition times, imbalance and projected P-rank speedup "
                        "(several counts: 2,4,8; the table shows the first)")
    p.add_argument("--images", type=int, default=60000, metavar="COUNT",
                   help="images in generated stores")
    p.add_argument("--seed", type=int, default=1, metavar="SEED", help="seed of generated stores")
    p.add_argument("--truth-max", type=parse_config, default="4096x120",
                   metavar="NxL",
                   help="generated stores get reference truth only up to this N*L "
                        "(larger cases are checked against a peer)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="cache for generated stores (default: bench/ under $SPDNN_CACHE_DIR, "
                        "else $XDG_CACHE_HOME/spdnn_mpi, else ~/.cache/spdnn_mpi)")
    p.add_argument("--threads", type=int, default=None, metavar="COUNT",
                   help="CPU threads, for the cpu backend and the graphblas peer "
                        "(default: all usable cores)")
    p.add_argument("--batch", type=int, default=None, metavar="ROWS",
                   help="images per batch (default: as many as fit in memory)")
    p.add_argument("--compress", default="both", choices=["both", "auto", "off"],
                   help="both: time every case without compression (off: every live row "
                        "computed) and with it (auto: each group of bit-identical rows once), "
                        "side by side; or just one of them")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write all results as JSON to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _log(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def _emit(args):
    """Where progress lines go: indented on stderr, or nowhere with --quiet."""
    if args.quiet:
        return None
    return lambda line: print(f"  {line}", file=sys.stderr, flush=True)


def requested_configs(args) -> list[tuple[int, int]]:
    """(N, L) of every --config and, with --challenge, the 12 challenge configurations."""
    from spdnn_mpi.model import CHALLENGE_LAYERS, CHALLENGE_NEURONS

    configs = list(args.config)
    if args.challenge:
        configs += [(n, lay) for n in CHALLENGE_NEURONS for lay in CHALLENGE_LAYERS]
    return configs


def generated_cases(args) -> Iterator[tuple[Path, int]]:
    """(store, layers) per requested configuration; each N's store generated (once)
    just before its first case, so a run cut short keeps the cases done (--json is
    written after every case) instead of spending its time generating them all."""
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.generators.challenge import generate_store

    configs = requested_configs(args)
    data_dir = args.data_dir or default_data_dir()
    by_n: dict[int, list[int]] = {}
    for n, layers in configs:
        by_n.setdefault(n, []).append(layers)
    tmax = args.truth_max[0] * args.truth_max[1]
    for n, layer_list in by_n.items():
        depth = max(layer_list)
        truth = sorted({lay for lay in layer_list if n * lay <= tmax})
        path = data_dir / f"radixnet-n{n}-l{depth}-i{args.images}-s{args.seed}.h5"
        usable = False
        if path.exists():
            with Store(path) as st:
                usable = st.n_layers >= depth and set(truth) <= set(st.truth_layers())
        if not usable:
            _log(args, f"generating {path.name} (truth for {truth or 'none'}) ...")
            t0 = time.perf_counter()
            generate_store(path, n, depth, args.seed, images=args.images,
                           truth_layers=truth, quiet=args.quiet, force=True)
            _log(args, f"  generated in {time.perf_counter() - t0:.1f} s")
        for lay in sorted(set(layer_list)):
            yield path, lay


def run_peer(name: str, network, rows, threads: int | None, emit=None):
    """(alive ids, seconds) of one peer, after an untimed warm-up on a few rows.

    The warm-up keeps library start-up (handles, kernel compilation) out of
    the peer's time, as ``engine.time_inference`` does for ours. Progress
    lines of the timed run go to ``emit`` (GraphBLAS: 13-30 s at 1024 x 120).
    """
    if name == "graphblas":
        from spdnn_mpi.bench.peers.graphblas import graphblas_infer, graphblas_memory_check
        from spdnn_mpi.util.progress import Progress

        graphblas_memory_check(network, rows)

        def fn(r):
            progress = Progress("peer graphblas", network.n_layers,
                                emit if r is rows else None)
            return graphblas_infer(network, r, threads, progress)
    else:
        from spdnn_mpi.bench.peers import gpu_sparse as peers_gpu

        impl = peers_gpu.cusparse_infer if name == "cusparse" else peers_gpu.torch_sparse_infer

        def fn(r):
            return impl(network, r)
    fn(rows.slice(0, min(rows.n_rows, 256)))
    return fn(rows)


def mode_names(choice: str) -> list[str]:
    """--compress both|auto|off -> the modes to time, off first (the direct figure)."""
    return ["off", "auto"] if choice == "both" else [choice]


def check_row(ours: np.ndarray, truth: np.ndarray | None, truth_by: str | None,
              others: dict[str, np.ndarray]) -> dict | None:
    """Full-list check of one mode: against the truth, else the first other result given."""
    from spdnn_mpi.readout import compare_categories

    if truth is not None:
        return {"against": f"truth ({truth_by})", **compare_categories(ours, np.asarray(truth))}
    for name, theirs in others.items():
        return {"against": name, **compare_categories(ours, theirs)}
    return None


def time_mode(args, network, rows, backend, mode: str, set_up_seconds: float) -> dict:
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


def simulate_ranks(args, network, rows, backend, mode: str, median: float, ranks: int) -> dict:
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


def bench_case(args, store_path: Path, n_layers: int | None, backend, backend_name: str) -> dict:
    from spdnn_mpi.bench import plot as bench_plot
    from spdnn_mpi.bench.anchors import anchors_for
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.readout import compare_categories
    from spdnn_mpi.report import edges_per_second
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
    backend.load_network(network.layers, progress=Progress("layout", n_layers, _emit(args)))
    layout_s = time.perf_counter() - t0
    modes = {m: time_mode(args, network, rows, backend, m, read_s + layout_s)
             for m in mode_names(args.compress)}
    edges = network.edges()
    row = {
        "store": str(store_path), "neurons": n, "layers": n_layers, "images": rows.n_rows,
        "backend": backend_name, "read_seconds": read_s, "layout_seconds": layout_s,
        "backend_info": backend.describe(), "anchors": anchors_for(n, n_layers),
        "modes": modes, "peers": {},
    }
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
        _log(args, f"  peer {peer} on {n}x{n_layers} ...")
        try:
            ids, seconds = run_peer(peer, network, rows, args.threads, _emit(args))
        except SpdnnError as exc:
            row["peers"][peer] = {"skipped": str(exc)}
            continue
        peer_ids[f"peer {peer}"] = np.sort(ids) + 1
        agree = all(compare_categories(m["_categories"], peer_ids[f"peer {peer}"])["passed"]
                    for m in modes.values())
        row["peers"][peer] = {"seconds": seconds, "speedup": seconds / base["seconds"],
                              "agrees": agree,
                              "edges_per_second": edges_per_second(rows.n_rows, edges, seconds)}
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
    bench_plot.add_first_layers(row, network, args.first_layers)
    row.update(peak_host_bytes())  # of the process so far: the largest case run yet
    return row


def row_failed(row: dict) -> bool:
    """Any mode's check failed, auto differed from off, or a peer disagreed."""
    bad = any(m.get("check") and not m["check"]["passed"] for m in row["modes"].values())
    bad |= any(m.get("same_as_off") is False for m in row["modes"].values())
    return bad or any(p.get("agrees") is False for p in row["peers"].values())


def _runs(mode: dict) -> str:
    """``0.582-0.611``: the spread of one mode's timed runs, in seconds."""
    return f"{mode['seconds_min']:.3f}-{mode['seconds_max']:.3f}"


def table(rows: list[dict], peers: list[str]) -> str:
    """One line per case: both modes side by side, the anchors and our ratio to each."""
    from spdnn_mpi.report import format_table

    headers = ["N", "L", "off_TE/s", "auto_TE/s", "computed", "auto/off", "A100_2020",
               "off/A100", "SNICIT", "auto/SNICIT", "off_runs_s", "auto_runs_s", "e2e_s",
               "alive", "check"]
    for peer in peers:
        headers += [f"{peer}_s", f"x{peer}"]
    sim = any("ranks_sim" in m for r in rows for m in r["modes"].values())
    if sim:
        headers += ["sim_P", "proj_off", "proj_auto"]
    out = []
    for r in rows:
        off, auto = r["modes"].get("off"), r["modes"].get("auto")
        a100, snicit = r["anchors"]["paper_2020_a100"], r["anchors"]["snicit_a6000"]
        off_t = off["teraedges_per_second"] if off else None
        auto_t = auto["teraedges_per_second"] if auto else None
        checks = [m["check"] for m in r["modes"].values() if m.get("check")]
        checked = any(c["against"] != "off" for c in checks)  # truth or a peer, not auto=off
        line = [r["neurons"], r["layers"], off_t, auto_t,
                auto["computed_teraedges_per_second"] if auto else None,
                auto_t / off_t if off_t and auto_t else None,
                a100, off_t / a100 if off_t and a100 else None,
                snicit, auto_t / snicit if auto_t and snicit else None,
                _runs(off) if off else None, _runs(auto) if auto else None,
                (auto or off)["end_to_end_seconds"],
                (auto or off)["alive_at_end"],
                "FAIL" if row_failed(r) else
                ("pass" if checked else "auto=off" if checks else "-")]
        for peer in peers:
            pr = r["peers"].get(peer, {})
            line += [pr.get("seconds"), pr.get("speedup")]
            if pr and "agrees" in pr and not pr["agrees"]:
                line[-1] = "DISAGREE"
        if sim:
            sims = [r["modes"].get(m, {}).get("ranks_sim") for m in ("off", "auto")]
            first = next(s for s in sims if s)
            line += [first["ranks"]] + [s["projected_speedup"] if s else None for s in sims]
        out.append(line)
    legend = ("TE/s: nominal challenge rate (60000 images x all edges / inference time); "
              "computed: edges actually multiplied / time (auto); off: every live row "
              "computed; auto: each group of bit-identical rows once. A100_2020 and SNICIT: "
              "published TE/s (2020 paper, one A100; SNICIT 2023, one RTX A6000). e2e_s: "
              "store read + layout + inputs + inference + categories file. off_runs_s, "
              "auto_runs_s: fastest-slowest of each mode's --repeat timed runs. x<peer>: the "
              "peer's time over ours (off). check: pass = the categories equal the truth or "
              "a peer's; auto=off = the two modes agree, with no truth or peer to check them.")
    return format_table(headers, out) + "\n" + legend


def run(args: argparse.Namespace) -> int:
    from spdnn_mpi.backends import make_backend, resolve_backend_name
    from spdnn_mpi.bench import models as bench_models
    from spdnn_mpi.bench import plot as bench_plot
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.report import machine_info, write_json
    from spdnn_mpi.util.memory import peak_host_bytes
    from spdnn_mpi.util.outputs import check_output

    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output(path, option, inputs={f"the store {s}": s for s in args.stores})
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
    _log(args, f"backend {name} ({why})")
    options = {"threads": args.threads} if name == "cpu" else {}
    backend = make_backend(name, **options)
    results: list[dict] = []
    models: list[dict] = []

    def save() -> None:
        if args.json:  # after every case, so a long run that is cut short keeps its results
            write_json(args.json, {"machine": machine_info(), "backend": name,
                                   "argv": sys.argv[1:], "cwd": os.getcwd(),
                                   "results": results, "models": models,
                                   **peak_host_bytes()})

    for path in model_paths:
        _log(args, f"model {path.name} ...")
        models.append(bench_models.bench_model(args, path, backend, name))
        save()
    for path, layers in itertools.chain(cases, generated_cases(args)):
        _log(args, f"case {path.name} layers={layers or 'all'} ...")
        results.append(bench_case(args, path, layers, backend, name))
        for mode, m in results[-1]["modes"].items():
            _log(args, f"  {mode}: {m['seconds']:.4f} s, {m['teraedges_per_second']:.3f} "
                       f"TE/s nominal, {m['alive_at_end']} alive")
        save()
    if models:
        print(bench_models.table(models, args.peer))
        if args.plot:
            bench_models.plot(models, args.plot)
    if results:
        print(table(results, args.peer))
        first = bench_plot.first_layers_text(results)
        if first:
            print("\n" + first)
        if args.plot:
            bench_plot.plot(results, args.plot, args.plot_config)
    failed = any(row_failed(r) for r in results) or bench_models.failed(models)
    return 1 if failed else 0

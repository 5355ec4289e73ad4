"""Benchmark a backend over stores or generated challenge configurations.

Prints a table (N, L, time, edges/s, live rows at the end, check) and writes
JSON. Peers (GraphBLAS on the CPU; cuSPARSE and torch.sparse on the GPU) run
the same inference on the same data with the same row dropping; their
categories must agree with ours and the table gives our speed over theirs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PEERS = ("graphblas", "cusparse", "torch")


def default_data_dir() -> Path:
    """Where generated benchmark stores are cached ($SPDNN_CACHE_DIR or ~/.cache)."""
    from spdnn_mpi.generators.challenge import cache_dir

    return cache_dir() / "bench"


def parse_config(text: str) -> tuple[int, int]:
    """``1024x120`` -> (1024, 120)."""
    try:
        n, layers = text.lower().split("x")
        return int(n), int(layers)
    except ValueError:
        raise argparse.ArgumentTypeError(f"config {text!r} is not NxL, e.g. 1024x120") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stores", nargs="*", help="stores to benchmark (all their layers, or --layers)")
    p.add_argument("--config", type=parse_config, action="append", default=[],
                   metavar="NxL", help="generated challenge configuration, e.g. 4096x480 "
                   "(repeatable; stores are generated once into --data-dir)")
    p.add_argument("--challenge", action="store_true",
                   help="all 12 challenge configurations (N 1024..65536 x L 120, 480, 1920)")
    p.add_argument("--layers", type=int, action="append", default=[],
                   help="layer counts to run on each STORE (repeatable; default: all)")
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "reference"],
                   help="backend to measure")
    p.add_argument("--peer", action="append", default=[], choices=PEERS,
                   help="also run this peer on the same data and report our speed over its")
    p.add_argument("--peer-max", type=parse_config, default=None, metavar="NxL",
                   help="run peers only on cases with N*L at most this (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case (median reported)")
    p.add_argument("--ranks-sim", type=int, default=None, metavar="P",
                   help="also run each of P count-balanced partitions in turn and report "
                        "per-partition times, imbalance and projected P-rank speedup")
    p.add_argument("--images", type=int, default=60000, help="images in generated stores")
    p.add_argument("--seed", type=int, default=1, help="seed of generated stores")
    p.add_argument("--truth-max", type=parse_config, default=parse_config("4096x120"),
                   metavar="NxL",
                   help="generated stores get reference truth only up to this N*L "
                        "(larger cases are checked against a peer)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="cache for generated stores (default: $SPDNN_CACHE_DIR/bench)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (cpu backend)")
    p.add_argument("--batch", type=int, default=None, help="images per batch")
    p.add_argument("--json", default=None, metavar="FILE", help="write all results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _log(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def generated_cases(args) -> list[tuple[Path, int]]:
    """(store, layers) per requested configuration; stores generated once per N."""
    from spdnn_mpi.formats.store import Store
    from spdnn_mpi.generators.challenge import generate_store
    from spdnn_mpi.model import CHALLENGE_LAYERS, CHALLENGE_NEURONS

    configs = list(args.config)
    if args.challenge:
        configs += [(n, lay) for n in CHALLENGE_NEURONS for lay in CHALLENGE_LAYERS]
    data_dir = args.data_dir or default_data_dir()
    by_n: dict[int, list[int]] = {}
    for n, layers in configs:
        by_n.setdefault(n, []).append(layers)
    cases = []
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
                           truth_layers=truth, quiet=args.quiet)
            _log(args, f"  generated in {time.perf_counter() - t0:.1f} s")
        cases += [(path, lay) for lay in sorted(set(layer_list))]
    return cases


def run_peer(name: str, network, rows, threads: int | None):
    """(alive ids, seconds) of one peer, after an untimed warm-up on a few rows.

    The warm-up keeps library start-up (handles, kernel compilation) out of
    the peer's time, as ``engine.time_inference`` does for ours.
    """
    if name == "graphblas":
        from spdnn_mpi.peers.graphblas import graphblas_infer

        def fn(r):
            return graphblas_infer(network, r, threads)
    else:
        from spdnn_mpi.peers import gpu as peers_gpu

        impl = peers_gpu.cusparse_infer if name == "cusparse" else peers_gpu.torch_sparse_infer

        def fn(r):
            return impl(network, r)
    fn(rows.slice(0, min(rows.n_rows, 256)))
    return fn(rows)


def bench_case(args, store_path: Path, n_layers: int | None, backend, backend_name: str) -> dict:
    from spdnn_mpi.comm import partition
    from spdnn_mpi.driver import compare_categories
    from spdnn_mpi.engine import run_inference, time_inference
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.store import Store
    from spdnn_mpi.report import edges_per_second

    with Store(store_path) as store:
        n_layers = n_layers or store.n_layers
        t0 = time.perf_counter()
        network = store.network(n_layers)
        rows = store.inputs()
        truth = store.truth(n_layers)
        truth_by = store.truth_source(n_layers)
        read_s = time.perf_counter() - t0
    n = network.n_inputs
    t0 = time.perf_counter()
    backend.load_network(network.layers)
    layout_s = time.perf_counter() - t0
    median, times, res = time_inference(network, rows, backend, args.repeat, args.batch)
    edges = network.edges()
    ours = res.categories()
    row = {
        "store": str(store_path), "neurons": n, "layers": n_layers, "images": rows.n_rows,
        "backend": backend_name, "seconds": median, "seconds_all": times,
        "edges_per_second": edges_per_second(rows.n_rows, edges, median),
        "alive_at_end": int(len(ours)), "read_seconds": read_s, "layout_seconds": layout_s,
        "input_seconds": res.input_seconds,
        "live_rows_per_layer": res.live_per_layer.tolist(),
        "backend_info": backend.describe(),
    }
    row["teraedges_per_second"] = row["edges_per_second"] / 1e12
    if truth is not None:
        cmp = compare_categories(ours, np.asarray(truth))
        row["check"] = {"against": f"truth ({truth_by})", **cmp}
    peer_cap = args.peer_max[0] * args.peer_max[1] if args.peer_max else None
    row["peers"] = {}
    for peer in args.peer:
        if peer_cap is not None and n * n_layers > peer_cap:
            row["peers"][peer] = {"skipped": f"N*L above --peer-max {args.peer_max}"}
            continue
        _log(args, f"  peer {peer} on {n}x{n_layers} ...")
        try:
            ids, seconds = run_peer(peer, network, rows, args.threads)
        except SpdnnError as exc:
            row["peers"][peer] = {"skipped": str(exc)}
            continue
        agree = compare_categories(ours, np.sort(ids) + 1)
        row["peers"][peer] = {"seconds": seconds, "speedup": seconds / median,
                              "agrees": agree["passed"],
                              "edges_per_second": edges_per_second(rows.n_rows, edges, seconds)}
        if "check" not in row:
            row["check"] = {"against": f"peer {peer}", **agree}
    if args.ranks_sim:
        bounds = partition(rows.n_rows, args.ranks_sim)
        part_times = []
        for p in range(args.ranks_sim):
            part = rows.slice(int(bounds[p]), int(bounds[p + 1]))
            part_times.append(run_inference(network, part, backend, batch=args.batch).seconds)
        slowest = max(part_times)
        row["ranks_sim"] = {
            "ranks": args.ranks_sim, "seconds": part_times,
            "imbalance": slowest / statistics.mean(part_times) if slowest > 0 else 1.0,
            "projected_seconds": slowest,
            "projected_speedup": median / slowest if slowest > 0 else float("inf"),
            "projected_edges_per_second": edges_per_second(rows.n_rows, edges, slowest),
        }
    return row


def table(rows: list[dict], peers: list[str]) -> str:
    from spdnn_mpi.report import format_table

    headers = ["N", "L", "backend", "time_s", "TE/s", "alive", "check"]
    for peer in peers:
        headers += [f"{peer}_s", f"x{peer}"]
    if any("ranks_sim" in r for r in rows):
        headers += ["sim_P", "imbalance", "proj_speedup"]
    out = []
    for r in rows:
        check = r.get("check")
        line = [r["neurons"], r["layers"], r["backend"], r["seconds"],
                r["teraedges_per_second"], r["alive_at_end"],
                "-" if check is None else ("pass" if check["passed"] else "FAIL")]
        for peer in peers:
            pr = r["peers"].get(peer, {})
            line += [pr.get("seconds"), pr.get("speedup")]
            if pr and "agrees" in pr and not pr["agrees"]:
                line[-1] = "DISAGREE"
        if "ranks_sim" in r:
            sim = r["ranks_sim"]
            line += [sim["ranks"], sim["imbalance"], sim["projected_speedup"]]
        out.append(line)
    return format_table(headers, out)


def run(args: argparse.Namespace) -> int:
    from spdnn_mpi.backends import make_backend, resolve_backend_name
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.report import machine_info, write_json

    cases: list[tuple[Path, int | None]] = []
    for s in args.stores:
        cases += [(Path(s), lay) for lay in (args.layers or [None])]
    cases += generated_cases(args) if (args.config or args.challenge) else []
    if not cases:
        raise SpdnnError("nothing to benchmark: give STORE paths, --config NxL or --challenge")
    name, why = resolve_backend_name(args.backend)
    _log(args, f"backend {name} ({why})")
    options = {"threads": args.threads} if name == "cpu" else {}
    backend = make_backend(name, **options)
    results = []
    for path, layers in cases:
        _log(args, f"case {path.name} layers={layers or 'all'} ...")
        results.append(bench_case(args, path, layers, backend, name))
        r = results[-1]
        _log(args, f"  {r['seconds']:.4f} s, {r['teraedges_per_second']:.3f} TE/s, "
                   f"{r['alive_at_end']} alive")
        if args.json:  # after every case, so a long run that is cut short keeps its results
            write_json(args.json, {"machine": machine_info(), "backend": name,
                                   "argv": sys.argv[1:], "cwd": os.getcwd(),
                                   "results": results})
    print(table(results, args.peer))
    failed = [r for r in results if r.get("check") and not r["check"]["passed"]]
    failed += [r for r in results if any(p.get("agrees") is False for p in r["peers"].values())]
    return 1 if failed else 0

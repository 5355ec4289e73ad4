"""Time the CPU backend with and without shared sums, alternating, in one process.

Uniform layers whose outputs share input lists add each list once
(``CpuBackend(shared_sums=True)``, the default); this times that against every
output summing on its own, round after round on the same store, and checks
that both give the same survivors (this machine is shared: only same-run
ratios mean anything).

    python tools/cpu_shared_sums.py real1024.h5 --rounds 3
    python tools/cpu_shared_sums.py g1024x1920.h5 --compress auto --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from spdnn_mpi.backends.cpu.backend import CpuBackend
from spdnn_mpi.engine import run_inference
from spdnn_mpi.formats.store.reader import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="challenge store (spdnn prepare / spdnn generate)")
    ap.add_argument("--layers", type=int, default=None, help="layers to run (default: all)")
    ap.add_argument("--compress", choices=("off", "auto"), default="off",
                    help="compression mode of both runs (default: off)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: 3)")
    ap.add_argument("--json", help="write the times here")
    args = ap.parse_args()
    with Store(args.store) as store:
        network = store.network(args.layers)
        rows = store.inputs()
    backends = {}
    for name, shared in (("shared", True), ("plain", False)):
        backends[name] = CpuBackend(shared_sums=shared)
        backends[name].load_network(network.layers)
        run_inference(network, rows.slice(0, min(rows.n_rows, 256)), backends[name])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in backends}
    ids = {}
    for _ in range(max(1, args.rounds)):
        for name, backend in backends.items():
            res = run_inference(network, rows, backend, compress=args.compress)
            times[name].append(res.seconds)
            ids[name] = res.alive_ids
    same = bool(np.array_equal(ids["shared"], ids["plain"]))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{'form':>7} {'median s':>9}  runs")
    for name, t in times.items():
        print(f"{name:>7} {med[name]:9.3f}  {', '.join(f'{x:.3f}' for x in t)}")
    print(f"plain / shared: {med['plain'] / med['shared']:.2f}x; same survivors: {same} "
          f"({len(ids['shared'])})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"store": args.store, "compress": args.compress, "seconds": times,
                       "same_survivors": same}, fh, indent=1)
    if not same:
        raise SystemExit("the two forms gave different survivors")


if __name__ == "__main__":
    main()

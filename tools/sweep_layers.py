"""Per-layer device times of a GPU sweep (its --json): a short dump.

    python tools/sweep_layers.py sweep.json [--first 12]
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", help="the sweep's --json file")
    p.add_argument("--first", type=int, default=12, help="layers shown one by one")
    args = p.parse_args(argv)
    for r in json.load(open(args.json)):
        ls = r.get("layer_seconds")
        if not ls:
            continue
        us = np.asarray(ls) * 1e6
        live = r["live_per_layer"]
        k = args.first
        print(f"{r['net']} {r['n']}x{r['layers']} {r['variant']} {r['compress']}: "
              f"{r['seconds'] * 1e3:.2f} ms, first {k} {us[:k].sum() / 1e3:.2f} ms, "
              f"late mean {us[k:].mean() if len(us) > k else 0:.1f} us")
        print("   us  ", " ".join(f"{v:.0f}" for v in us[:k]))
        print("   live", " ".join(str(v) for v in live[:k]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

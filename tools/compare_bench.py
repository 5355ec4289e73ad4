"""Compare challenge benches of two trees: TE/s before and after, per configuration and mode.

    python tools/compare_bench.py --before base.json --after new.json
    python tools/compare_bench.py --before b1.json b2.json --after a1.json a2.json --json cmp.json

Each file is the ``--json`` of ``spdnn bench --challenge`` (tools/device_run.sh
writes them with ``BASELINE=<older tree>``: bench_baseline*.json, bench_challenge*.json).
With several files a side, the i-th before and the i-th after are taken as one
round (run one after the other in one process tree and call, so on one card):
the table gives each side's median and the range of the per-round ratios, since
separate processes of one tree differ by a few per cent. A check that did not
pass, or files from different devices, are said in the table and make the exit
status 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from spdnn_mpi.bench.challenge import row_failed
from spdnn_mpi.report import format_table

MODES = ("off", "auto")


def load(path: Path) -> dict[str, dict]:
    """One bench file's results by configuration ("NxL"): TE/s by mode, checks, device."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        results = data["results"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"compare_bench: {path}: not a challenge bench JSON ({exc})") from None
    out = {}
    for r in results:
        modes = r["modes"]
        out[f"{r['neurons']}x{r['layers']}"] = {
            "teps": {m: modes[m]["teraedges_per_second"] for m in MODES if m in modes},
            "passed": not row_failed(r),  # as the bench's own table says it
            "device": (r.get("backend_info") or {}).get("device"),
        }
    return out


def compare(before: list[dict], after: list[dict]) -> list[dict]:
    """Rows of the comparison: configurations in both sides' first files, in their order."""
    rounds = min(len(before), len(after))
    rows = []
    for config in [c for c in before[0] if c in after[0]]:
        b = [f[config] for f in before if config in f]
        a = [f[config] for f in after if config in f]
        row = {"config": config,
               "passed": all(x["passed"] for x in b + a),
               "devices": sorted({x["device"] for x in b + a if x["device"]})}
        pairs = [(after[i][config]["teps"], before[i][config]["teps"])
                 for i in range(rounds) if config in after[i] and config in before[i]]
        for mode in MODES:
            bv = [x["teps"][mode] for x in b if mode in x["teps"]]
            av = [x["teps"][mode] for x in a if mode in x["teps"]]
            if not bv or not av:
                continue
            ratios = [x[mode] / y[mode] for x, y in pairs if mode in x and mode in y]
            row[mode] = {"before": statistics.median(bv), "after": statistics.median(av),
                         "ratio": statistics.median(av) / statistics.median(bv),
                         "round_ratios": ratios}
        rows.append(row)
    return rows


def _span(ratios: list[float]) -> str:
    """The per-round ratios as one value or their range."""
    if not ratios:
        return "-"
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.3f}" if len(ratios) == 1 else f"{lo:.3f}-{hi:.3f}"


def table(rows: list[dict]) -> str:
    """The rows as text: medians, their ratio, and the per-round ratios' range."""
    cells = []
    for row in rows:
        check = "pass" if row["passed"] else "FAILED"
        if len(row["devices"]) > 1:
            check += " (devices differ: " + ", ".join(row["devices"]) + ")"
        cells += [[row["config"], mode, f"{row[mode]['before']:.1f}", f"{row[mode]['after']:.1f}",
                   row[mode]["ratio"], _span(row[mode]["round_ratios"]), check]
                  for mode in MODES if mode in row]
    return format_table(["N x L", "mode", "before", "after", "ratio", "rounds", "check"], cells)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", nargs="+", type=Path, required=True, metavar="JSON",
                   help="bench JSON of the older tree (one a round)")
    p.add_argument("--after", nargs="+", type=Path, required=True, metavar="JSON",
                   help="bench JSON of the newer tree (one a round, in the same order)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write the comparison as JSON to FILE")
    args = p.parse_args(argv)
    rows = compare([load(f) for f in args.before], [load(f) for f in args.after])
    if not rows:
        print("compare_bench: no configuration is in both sides' first files", file=sys.stderr)
        return 1
    print(table(rows))
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
        tmp.replace(args.json)
    ok = all(r["passed"] and len(r["devices"]) <= 1 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

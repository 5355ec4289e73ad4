"""Benchmark a backend over stores or generated challenge configurations.

The command line only; the benchmark itself is ``spdnn_mpi.bench``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spdnn_mpi.bench.challenge import PEERS

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
speed-up over that peer on the same data (DISAGREE: its categories differ);
A100_2020 and SNICIT, published GPU figures, on GPU runs only. Under the table:
one line per simulated rank count (--ranks-sim), the first layers against the
floor of the card the run used and against the one-pass floor, where a layer reads
the rows the layer before it took in (GPU runs), and the compressed mode's median time
per converged layer (at most one 32-row tile computed). The models table gives
each time's median and its fastest-slowest runs (runs_ms).
memory: the graphblas peer needs about 16 B x images x N of host memory beside
ours (measured: 1.7 GB for the whole bench at 60000 x 1024, 0.7 GB without the
peer); the JSON has the process's peak (peak_host_bytes). A GPU peer runs beside
our buffers: one that runs out of device memory is reported as skipped, with the
library's message, and the benchmark goes on.
"""


def parse_config(text: str) -> tuple[int, int]:
    """``1024x120`` -> (1024, 120); N and L must be at least 1 (argparse type)."""
    try:
        n, layers = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"config {text!r} is not NxL, e.g. 1024x120") from None
    if n < 1 or layers < 1:
        raise argparse.ArgumentTypeError(f"config {text!r}: N and L must be at least 1 "
                                         "(N neurons x L layers, e.g. 1024x120)")
    return n, layers


def rank_counts(text: str) -> list[int]:
    """``4`` or ``2,4,8`` -> [2, 4, 8] (each at least 1)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected rank counts like 4 or 2,4,8: {text!r}")
    return counts


def _count(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_count(text: str) -> int:
    """An int of at least 1 (argparse type: --repeat, --images, --threads, ...)."""
    return _count(text, 1)


def count_or_zero(text: str) -> int:
    """An int of at least 0 (argparse type: --first-layers, where 0 means none)."""
    return _count(text, 0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_backend, add_json, add_quiet, add_seed

    p.add_argument("stores", nargs="*", help="stores to benchmark (all their layers, or --layers)")
    p.add_argument("--config", type=parse_config, action="append", default=[],
                   metavar="NxL", help="generated challenge configuration, e.g. 4096x480 "
                   "(repeatable; stores are generated once into --data-dir)")
    p.add_argument("--challenge", action="store_true",
                   help="all 12 challenge configurations (N 1024..65536 x L 120, 480, 1920)")
    p.add_argument("--layers", type=int, action="append", default=[], metavar="L",
                   help="layer counts to run on each STORE (repeatable; default: all)")
    add_backend(p, "backend to measure; auto picks cuda when CuPy sees a GPU, else cpu")
    p.add_argument("--peer", action="append", default=[], choices=PEERS,
                   help="also run this peer on the same data and report our speed over its; "
                        "repeatable: --peer cusparse --peer torch (models: onnxruntime, "
                        "torch-dense and torch, the sparse one)")
    p.add_argument("--model", type=float, action="append", default=[], metavar="SPARSITY",
                   help="a shipped pruned MNIST model by sparsity in percent, e.g. 95 "
                        "(repeatable)")
    p.add_argument("--models", action="store_true", help="every shipped pruned MNIST model")
    p.add_argument("--model-images", type=positive_count, default=None, metavar="COUNT",
                   help="models: time COUNT images (the store's inputs repeated; default: them)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw a PNG (matplotlib, the 'bench' extra): for configurations, "
                        "TE/s of both modes against the published anchors and time and live "
                        "rows per layer of --plot-config; for models, speed-up and accuracy "
                        "against sparsity")
    p.add_argument("--plot-config", type=parse_config, default=None, metavar="NxL",
                   help="the configuration whose layers --plot draws (one that runs; "
                        "default: the largest N x L)")
    p.add_argument("--first-layers", type=count_or_zero, default=10, metavar="K",
                   help="GPU runs: print and write (JSON first_layers) the off mode's first K "
                        "layers against the floors of the card the run uses (no floor for a "
                        "card not in spdnn_mpi.bench.floors.CARDS; 0: none)")
    p.add_argument("--peer-max", type=parse_config, default=None, metavar="NxL",
                   help="run peers only on cases with N*L at most this (default: all)")
    p.add_argument("--repeat", type=positive_count, default=3, metavar="COUNT",
                   help="timed runs per case (median reported, with min and max)")
    p.add_argument("--ranks-sim", type=rank_counts, default=None, metavar="P[,P...]",
                   help="also run each of P count-balanced partitions in turn and report "
                        "per-partition times, imbalance and projected P-rank speedup "
                        "(several counts: 2,4,8; one line per case and P under the table)")
    p.add_argument("--images", type=positive_count, default=60000, metavar="COUNT",
                   help="images in generated stores")
    add_seed(p, "seed of generated stores")
    p.add_argument("--truth-max", type=parse_config, default="4096x120",
                   metavar="NxL",
                   help="generated stores get reference truth only up to this N*L "
                        "(larger cases are checked against a peer)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="folder of the cached generated stores and shipped models, shared "
                        "with spdnn demo --cache-dir: a store demo made is used, not made "
                        "again (default: $SPDNN_CACHE_DIR, else $XDG_CACHE_HOME/spdnn_mpi, "
                        "else ~/.cache/spdnn_mpi)")
    p.add_argument("--threads", type=positive_count, default=None, metavar="COUNT",
                   help="CPU threads, for the cpu backend and the graphblas peer "
                        "(default: all usable cores)")
    p.add_argument("--batch", type=positive_count, default=None, metavar="ROWS",
                   help="images per batch (default: as many as fit in memory)")
    p.add_argument("--compress", default="both", choices=["both", "auto", "off"],
                   help="both: time every case without compression (off: every live row "
                        "computed) and with it (auto: each group of bit-identical rows once), "
                        "side by side; or just one of them")
    add_json(p, "all results (after every case, so a run cut short keeps the cases done; "
                "with '-', once at the end)")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark (``spdnn_mpi.bench.challenge.run``); 1 when a check failed."""
    from spdnn_mpi.bench.challenge import run as run_bench

    return run_bench(args)

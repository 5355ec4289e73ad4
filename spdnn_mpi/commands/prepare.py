"""Convert official Graph Challenge TSV files into a store.

Reads a ``neuron{N}`` folder layer by layer (never the whole network), plus
optionally the ``sparse-images-{N}.tsv`` inputs and ``neuron{N}-l{L}-
categories.tsv`` truth files, and writes one store atomically: on any error
nothing is left under the output name. The conversion itself is
``spdnn_mpi.formats.tsv.to_store.prepare_store``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from spdnn_mpi.formats.tsv.to_store import DEFAULT_CLIP

EXAMPLES = """\
examples:
  # the official 1024 network with MNIST-derived inputs and reference truth
  # (works with the weights alone: the official inputs are not needed)
  spdnn prepare --weights ../shared/graphchallenge/neuron1024 --generate-inputs \\
      --truth-layers 120 --out real1024.h5
  # the official inputs and truth, for users who have those files
  spdnn prepare --weights neuron1024 --inputs sparse-images-1024.tsv \\
      --categories neuron1024-l120-categories.tsv --out neuron1024.h5

--categories files are truth for the official inputs only; with --generate-inputs
use --truth-layers.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_images, add_quiet, add_truth
    from spdnn_mpi.model import CHALLENGE_BIAS

    p.add_argument("--weights", required=True, type=Path, metavar="DIR",
                   help="the neuron{N} folder holding n{N}-l{k}.tsv[.gz]")
    p.add_argument("--neurons", type=int, default=None, metavar="N",
                   help="neurons per layer; when not given, read from the folder or file names")
    p.add_argument("--layers", type=int, default=None, metavar="L",
                   help="number of layers; when not given, all consecutive layer files found")
    p.add_argument("--inputs", type=Path, default=None, metavar="FILE",
                   help="sparse-images-{N}.tsv[.gz] input file")
    p.add_argument("--generate-inputs", action="store_true",
                   help="no images file: use MNIST-derived inputs made like `spdnn generate`'s "
                        "(--images of them, 60000 by default)")
    add_truth(p, "compute truth for these layer counts with --truth-backend and store it")
    add_images(p, None, "number of input images; when not given, the largest image id in "
                        "--inputs (60000 with --generate-inputs)")
    p.add_argument("--categories", action="append", default=[], metavar="[L=]FILE",
                   help="official truth file neuron{N}-l{L}-categories.tsv for --inputs (L from "
                        "the name, or given as L=FILE); repeatable")
    per_n = ", ".join(f"{b:g} for N={n}" for n, b in sorted(CHALLENGE_BIAS.items()))
    p.add_argument("--bias", type=float, default=None,
                   help=f"bias of every layer; when not given, the challenge value for N: {per_n} "
                        "(other N: -0.05 more per factor of 4)")
    clip = p.add_mutually_exclusive_group()
    clip.add_argument("--clip", type=float, default=DEFAULT_CLIP, help="upper clip (YMAX)")
    clip.add_argument("--no-clip", dest="clip", action="store_const", const=None,
                      help="no upper clip")
    p.add_argument("--out", required=True, type=Path, metavar="STORE", help="store to write")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    add_quiet(p)


def parse_categories_arg(text: str) -> tuple[int, Path]:
    """``L=FILE`` or a file named ``neuron{N}-l{L}-categories.tsv[.gz]`` -> (L, path)."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv.read import CATEGORIES_RE

    m = re.fullmatch(r"(\d+)=(.+)", text)
    if m:
        return int(m.group(1)), Path(m.group(2))
    path = Path(text)
    named = CATEGORIES_RE.match(path.name)
    if not named:
        raise SpdnnError(
            f"--categories {text}: cannot tell the layer count from the file name "
            "(expected neuron{N}-l{L}-categories.tsv); write it as L=FILE"
        )
    return int(named.group(2)), path


def run(args: argparse.Namespace) -> int:
    categories: dict[int, Path] = {}
    for text in args.categories:
        n_l, path = parse_categories_arg(text)
        if n_l in categories:
            from spdnn_mpi.errors import SpdnnError

            raise SpdnnError(f"two truth files for {n_l} layers: {categories[n_l]} and {path}")
        categories[n_l] = path
    from spdnn_mpi.formats.tsv.to_store import prepare_store

    prepare_store(
        args.weights,
        args.out,
        neurons=args.neurons,
        n_layers=args.layers,
        inputs=args.inputs,
        n_images=args.images,
        categories=categories,
        bias=args.bias,
        clip=args.clip,
        force=args.force,
        progress=not args.quiet,
        generate_inputs=args.generate_inputs,
        truth_layers=args.truth_layers,
        truth_backend=args.truth_backend,
    )
    return 0

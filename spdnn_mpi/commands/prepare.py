"""Convert official Graph Challenge TSV files into a store.

Reads a ``neuron{N}`` folder layer by layer (never the whole network), plus
optionally the ``sparse-images-{N}.tsv`` inputs and ``neuron{N}-l{L}-
categories.tsv`` truth files, and writes one store atomically: on any error
nothing is left under the output name. With ``--tree DIR --out-dir OUT`` it
converts every network found under DIR (``fetch_challenge.sh``'s layout),
one store per N or, with ``--split``, per truth file. The conversion itself is
``spdnn_mpi.formats.tsv.to_store`` (``prepare_store``, ``convert_tree``); the
generated inputs of ``--generate-inputs`` are made here and handed to it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from spdnn_mpi.formats.tsv.to_store import DEFAULT_CLIP

if TYPE_CHECKING:
    from spdnn_mpi.model import SparseRows

EXAMPLES = """\
examples:
  # the official 1024 network with MNIST-derived inputs and reference truth
  # (works with the weights alone: the official inputs are not needed)
  spdnn prepare --weights ../shared/graphchallenge/neuron1024 --generate-inputs \\
      --truth-layers 120 --out real1024.h5
  # the official inputs and truth, for users who have those files
  spdnn prepare --weights neuron1024 --inputs sparse-images-1024.tsv \\
      --categories neuron1024-l120-categories.tsv --out neuron1024.h5
  # every network of a downloaded tree (tools/fetch_challenge.sh 1024 4096)
  spdnn prepare --tree data/graphchallenge --out-dir stores --split

--categories files are truth for the official inputs only; with --generate-inputs
use --truth-layers.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_images, add_quiet, add_truth
    from spdnn_mpi.model import CHALLENGE_BIAS
    from spdnn_mpi.util.workers import default_jobs

    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", type=Path, metavar="DIR|ARCHIVE",
                        help="the neuron{N} folder holding n{N}-l{k}.tsv[.gz], or the official "
                             "archive neuron{N}.tar.gz read as it is, never unpacked (one "
                             "network, into --out)")
    source.add_argument("--tree", type=Path, metavar="DIR",
                        help="an official tree (neuron{N}/ folders or the neuron{N}.tar.gz "
                             "archives as downloaded, sparse-images-{N}.tsv[.gz], "
                             "neuron{N}-l{L}-categories.tsv, searched recursively): every "
                             "network found, with its images and truth, into --out-dir (an "
                             "archive as deep as its deepest truth file)")
    p.add_argument("--neurons", type=int, nargs="+", action="extend", default=None,
                   metavar="N",
                   help="neurons per layer; when not given, read from the folder or file "
                        "names (with --tree: only these N, several allowed; default: all)")
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
    p.add_argument("--out", type=Path, metavar="STORE", help="store to write (with --weights)")
    p.add_argument("--out-dir", type=Path, metavar="DIR",
                   help="with --tree: folder for the stores neuron{N}-l{L}.h5 (made if missing)")
    p.add_argument("--split", action="store_true",
                   help="with --tree: one store per truth file (its first L layers) instead of "
                        "one per N with all layers found")
    p.add_argument("--force", action="store_true", help="replace existing stores")
    p.add_argument("--jobs", type=int, default=None, metavar="J",
                   help="worker processes parsing layer files while this one writes the "
                        "store (1: all in this process, one layer at a time); default: every "
                        f"core this process may run on ({default_jobs()} here)")
    add_quiet(p)


def parse_categories_arg(text: str) -> tuple[int, Path]:
    """``L=FILE`` or a file named ``neuron{N}-l{L}-categories.tsv[.gz]`` -> (L, path)."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv.tree import CATEGORIES_RE

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


#: Options that describe one network's files: refused with --tree, which finds
#: each network's own (dest name, option, value when not given).
_ONE_NETWORK = (("layers", "--layers", None), ("inputs", "--inputs", None),
                ("generate_inputs", "--generate-inputs", False), ("categories", "--categories", []),
                ("truth_layers", "--truth-layers", None), ("images", "--images", None),
                ("bias", "--bias", None), ("clip", "--clip/--no-clip", DEFAULT_CLIP),
                ("out", "--out", None))


def _check_mode(args: argparse.Namespace) -> None:
    """--weights needs --out, --tree needs --out-dir; options of the other mode are refused."""
    from spdnn_mpi.errors import SpdnnError

    if args.tree is None:
        if args.out is None:
            raise SpdnnError("--weights needs --out STORE (the store to write)")
        for option, value in (("--out-dir", args.out_dir), ("--split", args.split)):
            if value:
                raise SpdnnError(f"{option} goes with --tree DIR, not --weights")
        if args.neurons and len(args.neurons) > 1:
            raise SpdnnError(f"--neurons {' '.join(map(str, args.neurons))}: one N with "
                             "--weights (several only with --tree)")
        return
    if args.out_dir is None:
        raise SpdnnError(f"--tree {args.tree} needs --out-dir DIR (the folder for the stores)")
    given = [option for dest, option, unset in _ONE_NETWORK if getattr(args, dest) != unset]
    if given:
        raise SpdnnError(f"{', '.join(given)}: for one network (--weights DIR); --tree takes "
                         "each network's layers, images and truth files as found, with the "
                         "challenge's bias and clip")


def _generated_inputs(n_images: int | None) -> Callable[[int], SparseRows]:
    """The --generate-inputs maker handed to prepare_store: MNIST-derived rows for N."""
    def make(neurons: int) -> SparseRows:
        from spdnn_mpi.generators.digits import digit_images

        return digit_images(neurons, 60000 if n_images is None else n_images)

    return make


def run(args: argparse.Namespace) -> int:
    """Convert one network (--weights) or a whole tree (--tree); exit status 0."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv.to_store import convert_tree, prepare_store
    from spdnn_mpi.util.workers import default_jobs

    _check_mode(args)
    jobs = default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        raise SpdnnError(f"--jobs {jobs}: must be at least 1")
    if args.tree is not None:
        for path in convert_tree(args.tree, args.out_dir, neurons=args.neurons,
                                 split=args.split, force=args.force, progress=not args.quiet,
                                 jobs=jobs):
            print(path)
        return 0
    categories: dict[int, Path] = {}
    for text in args.categories:
        n_l, path = parse_categories_arg(text)
        if n_l in categories:
            raise SpdnnError(f"two truth files for {n_l} layers: {categories[n_l]} and {path}")
        categories[n_l] = path
    prepare_store(
        args.weights,
        args.out,
        neurons=args.neurons[0] if args.neurons else None,
        n_layers=args.layers,
        inputs=args.inputs,
        n_images=args.images,
        categories=categories,
        bias=args.bias,
        clip=args.clip,
        force=args.force,
        progress=not args.quiet,
        make_inputs=_generated_inputs(args.images) if args.generate_inputs else None,
        made_inputs_source="generated from MNIST digits (spdnn_mpi.generators.digits)",
        truth_layers=args.truth_layers,
        truth_backend=args.truth_backend,
        jobs=jobs,
    )
    return 0

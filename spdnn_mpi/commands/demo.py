"""The built-in default case: 1024 neurons x 120 layers, MNIST-derived inputs.

Generated once into the cache folder with its truth, then inferred and checked
(with --model, a shipped pruned MNIST classifier instead).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEMO_NEURONS = 1024
DEMO_LAYERS = 120


EXAMPLES = """\
examples:
  spdnn demo                      # generate once (about 20 s), then infer and check
  spdnn demo --backend cpu --json demo.json
  spdnn demo --images 6000 --quiet
  spdnn demo --model 95           # a shipped pruned MNIST classifier instead

memory (measured): 0.9 GB the first time (generation and reference truth), 0.7 GB
cached.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_backend, add_images, add_json, add_quiet, add_seed

    add_backend(p)
    add_images(p, 60000, "number of input images")
    add_seed(p)
    p.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                   help="folder of the cached generated stores and shipped models, shared "
                        "with spdnn bench --data-dir (default: $SPDNN_CACHE_DIR, else "
                        "$XDG_CACHE_HOME/spdnn_mpi, else ~/.cache/spdnn_mpi)")
    p.add_argument("--regenerate", action="store_true", help="rebuild the cached store")
    p.add_argument("--model", type=float, default=None, metavar="SPARSITY",
                   help="run a shipped pruned MNIST classifier instead, by sparsity in "
                        "percent (90, 95, 98 or 99)")
    add_json(p, "the run report")
    add_quiet(p)


def demo_store(args) -> Path:
    """The demo store from the cache folder (shared with `spdnn bench --config`), generated
    on first use (atomically)."""
    from spdnn_mpi.generators.challenge import cached_generated_store
    from spdnn_mpi.util.paths import cache_dir

    def log(line: str) -> None:
        if not args.quiet:
            print(f"spdnn demo: {line}", file=sys.stderr, flush=True)

    return cached_generated_store(args.cache_dir or cache_dir(), DEMO_NEURONS, DEMO_LAYERS,
                                  args.images, args.seed, [DEMO_LAYERS],
                                  regenerate=args.regenerate, log=log, quiet=args.quiet)


def model_demo_store(args) -> Path:
    """The cached store of the shipped model asked for with --model."""
    from spdnn_mpi.generators import mnist_models as mm
    from spdnn_mpi.util.paths import cache_dir

    entry = mm.find_model(args.model)
    path = mm.model_store(entry, (args.cache_dir or cache_dir()) / "models", args.regenerate)
    if not args.quiet:
        print(f"spdnn demo: {entry['file']} ({100 * entry['sparsity']:.2f}% of the weights "
              f"zero; held-out accuracy recorded at training: "
              f"{100 * entry['accuracy']:.2f}%), store {path}", file=sys.stderr, flush=True)
    return path


def run(args: argparse.Namespace) -> int:
    from spdnn_mpi.cli import main

    if args.model is None:  # the cached store may be deeper (one bench made): its first L
        argv = ["infer", str(demo_store(args)), "--layers", str(DEMO_LAYERS)]
    else:
        argv = ["infer", str(model_demo_store(args))]
    argv += ["--backend", args.backend, "--check"]
    argv += ["--json", args.json] if args.json else []
    argv += ["--quiet"] if args.quiet else []
    return main(argv)

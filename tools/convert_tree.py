#!/usr/bin/env python3
"""Convert a whole official Graph Challenge tree into stores (every N and L found).

Thin wrapper over ``spdnn_mpi.formats.tsv.to_store.convert_tree``; see docs/data.md.

    python tools/convert_tree.py DATA_DIR STORE_DIR [--neurons 1024 4096] [--split]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import spdnn_mpi  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv.to_store import convert_tree

    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("root", type=Path, help="official tree (neuron{N}/, sparse-images-{N}.tsv, ...)")
    p.add_argument("out_dir", type=Path, help="folder for the stores neuron{N}-l{L}.h5")
    p.add_argument("--neurons", type=int, nargs="+", help="only these N (default: all found)")
    p.add_argument(
        "--split",
        action="store_true",
        help="one store per truth file (first L layers) instead of one per N",
    )
    p.add_argument("--force", action="store_true", help="replace existing stores")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    args = p.parse_args(argv)
    try:
        paths = convert_tree(
            args.root,
            args.out_dir,
            neurons=args.neurons,
            split=args.split,
            force=args.force,
            progress=not args.quiet,
        )
    except SpdnnError as exc:
        print(f"convert_tree: error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

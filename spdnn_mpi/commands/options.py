"""Options several subcommands share: one spelling, one metavar, one help text each
(tests/test_help.py checks that they read the same wherever they appear)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from spdnn_mpi.truth import TRUTH_BACKENDS

#: --backend choices; auto picks cuda when CuPy sees a GPU, else cpu
BACKEND_CHOICES = ["auto", "cpu", "cuda", "reference"]
#: --truth-backend choices
TRUTH_BACKEND_CHOICES = list(TRUTH_BACKENDS)


def layer_list(text: str) -> list[int]:
    """``120,480`` -> [120, 480] (argparse type; a bad value is a usage error)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer counts like 120,480: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("no layer counts given")
    return values


def add_backend(p: argparse.ArgumentParser, help_text: str | None = None) -> None:
    p.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                   help=help_text or "compute backend; auto picks cuda when CuPy sees a GPU, "
                                     "else cpu")


def add_images(p: argparse.ArgumentParser, default: int | None, help_text: str) -> None:
    p.add_argument("--images", type=int, default=default, metavar="COUNT", help=help_text)


def add_seed(p: argparse.ArgumentParser, help_text: str = "seed of the generated network "
             "(its row relabellings)") -> None:
    p.add_argument("--seed", type=int, default=1, metavar="SEED", help=help_text)


#: ``--json -``: the JSON goes to standard output
STDOUT = "-"


def add_json(p: argparse.ArgumentParser, what: str = "the report") -> None:
    """``--json FILE``, the one meaning in every subcommand; ``-`` is standard output."""
    p.add_argument("--json", default=None, metavar="FILE",
                   help=f"write {what} as JSON to FILE, replacing it (a results file); "
                        f"'-' writes it to standard output, and the human-readable output "
                        f"then goes to standard error")


def json_file(args: argparse.Namespace) -> str | None:
    """The --json path to check and write, None when not given or standard output."""
    return None if args.json in (None, STDOUT) else args.json


def text_stream(args: argparse.Namespace) -> TextIO:
    """Where the human-readable output goes: standard error while ``--json -`` or
    ``--out -`` holds standard output (so what goes there stays parseable), else
    standard output."""
    held = STDOUT in (getattr(args, "json", None), getattr(args, "out", None))
    return sys.stderr if held else sys.stdout


def emit_json(args: argparse.Namespace, data: dict) -> None:
    """Write ``data`` where --json says: atomically to FILE, or to standard output."""
    from spdnn_mpi.report import json_text, write_json

    if args.json == STDOUT:
        sys.stdout.write(json_text(data))
        sys.stdout.flush()
    elif args.json is not None:
        write_json(args.json, data)


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress output")


def add_truth(p: argparse.ArgumentParser, layers_help: str, default_layers=None) -> None:
    """``--truth-layers L1,L2,...`` and ``--truth-backend``; the old spelling
    ``--layers-truth`` stays accepted, hidden from the help."""
    p.add_argument("--truth-layers", type=layer_list, default=default_layers,
                   metavar="L1,L2,...", help=layers_help)
    p.add_argument("--layers-truth", dest="truth_layers", type=layer_list,
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--truth-backend", default="reference", choices=TRUTH_BACKEND_CHOICES,
                   help="what computes the truth: the plain scipy reference (needs about "
                        "12 B x images x N of memory), the fast CPU backend (batched to fit, "
                        "tested against the reference), or none")

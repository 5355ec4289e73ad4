"""Import a trained MLP (ONNX or safetensors) into a store, zeros dropped.

With --inputs the store gets the images and the reference predictions; --labels
adds the true classes. What cannot be represented is refused, naming the node or
tensor, and no store is written.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

EXAMPLES = """\
examples:
  spdnn import model.onnx --out model.h5 --inputs x_test.npy --labels y_test.npy
  spdnn import mlp.safetensors --out mlp.h5 --layer-order fc1,fc2,fc3 --inputs x.npy
  spdnn infer model.h5 --check    # predictions against the stored reference, and accuracy
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_json

    p.add_argument("model", type=Path, help="ONNX (.onnx, .onnx.gz) or safetensors file")
    p.add_argument("--out", required=True, type=Path, metavar="STORE", help="store to write")
    p.add_argument("--inputs", type=Path, default=None, metavar="FILE",
                   help="input images, a float32 .npy file of shape (images, features)")
    p.add_argument("--labels", type=Path, default=None, metavar="FILE",
                   help="true classes, an integer .npy file with one entry per image "
                        "(needs --inputs)")
    p.add_argument("--layer-order", default=None, metavar="NAME,NAME,...",
                   help="safetensors: the layers' tensor prefixes in order (default: file order)")
    p.add_argument("--activations", default=None, metavar="ACT,ACT,...",
                   help="safetensors: relu or none per layer (default: relu, and none for "
                        "the last layer)")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    add_json(p, "the summary")
    p.add_argument("--quiet", action="store_true",
                   help="print nothing on success (--json is still written)")


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def no_inputs_note(args: argparse.Namespace) -> str:
    """The one line saying a store was written without inputs, and the command that adds
    them."""
    model, out = shlex.quote(str(args.model)), shlex.quote(str(args.out))
    return (f"spdnn import: {args.out} has no inputs (no --inputs given), so spdnn infer has "
            f"nothing to run on; add them with: spdnn import {model} --out {out} --force "
            f"--inputs X.npy [--labels y.npy]")


def run(args: argparse.Namespace) -> int:
    """Import the model; print a one-line summary, and the summary as JSON with --json."""
    from spdnn_mpi.commands.options import emit_json, json_file, text_stream
    from spdnn_mpi.formats.models.importer import import_model
    from spdnn_mpi.util.outputs import check_distinct, check_output

    check_distinct({"--out": args.out, "--json": json_file(args)})
    if json_file(args):
        check_output(json_file(args), "--json", results=True,
                     inputs={"the model": args.model, "the --inputs file": args.inputs,
                             "the --labels file": args.labels})
    summary = import_model(args.model, args.out, inputs=args.inputs, labels=args.labels,
                           layer_order=_names(args.layer_order),
                           activations=_names(args.activations), force=args.force)
    emit_json(args, summary)
    if args.quiet:
        return 0
    line = (f"spdnn import: {args.out}: {summary['layers']} layers, "
            f"{summary['n_inputs']} -> {summary['n_classes']}, {summary['edges']:,} weights "
            f"kept ({100 * summary['sparsity']:.2f}% zeros dropped), "
            f"{summary['images']} images")
    if "accuracy" in summary:
        line += f", reference accuracy {100 * summary['accuracy']:.2f}%"
    print(line, file=text_stream(args))
    if summary["images"] == 0:
        print(no_inputs_note(args), file=sys.stderr)
    return 0

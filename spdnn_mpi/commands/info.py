"""Describe a store: network shape, inputs, truth and provenance.

Reads attributes and small arrays, never the weights, so it is quick on any store.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EXAMPLES = """\
examples:
  spdnn info store.h5
  spdnn info store.h5 --json store.json
  spdnn info store.h5 --json - | python -m json.tool
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_json

    p.add_argument("store", type=Path, help="store file written by prepare, generate or import")
    add_json(p, "the summary")


def describe(path: str | Path) -> dict:
    """``Store.summary()`` plus the size and source of every truth set."""
    from spdnn_mpi.formats.store.reader import Store

    with Store(path) as store:
        info = store.summary()
        info["truth"] = {
            str(n_l): {"survivors": len(store.truth(n_l)), "computed_by": store.truth_source(n_l)}
            for n_l in info["truth_layers"]
        }
        info["predictions"] = {
            str(n_l): {"computed_by": store.predictions_source(n_l)}
            for n_l in info["prediction_layers"]
        }
    return info


def _size(n_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n_bytes < 1000 or unit == "TB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1000
    return ""  # pragma: no cover


def _flatten(prefix: str, value, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict) and value:
        for k in sorted(value):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out.append((prefix, json.dumps(value) if not isinstance(value, str) else value))


def format_text(info: dict) -> str:
    """The human-readable form ``spdnn info`` prints."""
    lines = [
        f"store        {info['path']}",
        f"size         {_size(info['file_bytes'])} (schema {info['schema_version']}, "
        f"created {info['created'] or 'unknown'})",
        f"network      {info['n_layers']} layers, {info['neurons_in']} -> {info['neurons_out']} "
        f"neurons, {info['edges']:,} edges",
        f"readout      {info['readout']}; activations "
        + ", ".join(f"{name} x {count}" for name, count in sorted(info["activations"].items())),
    ]
    if "images" in info:
        density = info["input_nnz"] / max(info["images"] * (info["neurons_in"] or 1), 1)
        kind = "binary" if info["inputs_binary"] else "valued"
        lines.append(
            f"inputs       {info['images']:,} images, {info['input_nnz']:,} nonzeros "
            f"({100 * density:.1f}% dense, {kind})"
        )
    else:
        lines.append("inputs       none")
    if info["truth"]:
        for k, (n_l, t) in enumerate(info["truth"].items()):
            head = "truth" if k == 0 else ""
            lines.append(
                f"{head:<13}{n_l} layers: {t['survivors']:,} surviving images ({t['computed_by']})"
            )
    elif not info["predictions"]:
        lines.append("truth        none")
    for n_l, t in info["predictions"].items():
        lines.append(f"predictions  {n_l} layers: one class per image ({t['computed_by']})")
    if "labels" in info:
        lines.append(f"labels       {info['labels']:,} true classes")
    flat: list[tuple[str, str]] = []
    _flatten("", info.get("provenance") or {}, flat)
    for k, (key, value) in enumerate(flat):
        head = "provenance" if k == 0 else ""
        lines.append(f"{head:<13}{key}: {value}")
    if not flat:
        lines.append("provenance   none recorded")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the summary; with --json also write it as JSON (a results file)."""
    from spdnn_mpi.commands.options import emit_json, json_file, text_stream
    from spdnn_mpi.util.outputs import check_output

    if json_file(args):
        check_output(json_file(args), "--json", inputs={"the store": args.store}, results=True)
    info = describe(args.store)
    emit_json(args, info)
    print(format_text(info), file=text_stream(args))
    return 0

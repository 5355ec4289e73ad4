"""The run report: figure of merit, timings, machine; printed and written as JSON."""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path

from spdnn_mpi.util.atomic import write_text_atomic


def edges_per_second(n_images: int, edges: int, seconds: float) -> float:
    """The challenge's figure of merit: images x sum of nnz(W_l) / inference time."""
    return n_images * edges / seconds if seconds > 0 else float("inf")


def machine_info() -> dict:
    """Host, CPU and Python facts (GPU facts come from the backend's describe())."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy

    return {
        "hostname": socket.gethostname(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def write_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True, default=_plain) + "\n")


def _plain(obj):
    import numpy as np

    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def format_table(headers: list[str], rows: list[list]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 1e5 or (0 < abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.3f}"
    return "-" if value is None else str(value)

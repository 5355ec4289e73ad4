"""The run report: figure of merit, timings, machine; printed and written as JSON."""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spdnn_mpi.util.atomic import write_text_atomic


def edges_per_second(n_images: int, edges: int, seconds: float) -> float:
    """The challenge's figure of merit: images x sum of nnz(W_l) / inference time."""
    return n_images * edges / seconds if seconds > 0 else float("inf")


def process_seconds() -> float:
    """Seconds since this process started (Python's own start-up included, on Linux),
    what a user waits for a command; elsewhere since this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        # the start is in clock ticks since boot; now to the nanosecond on the same clock
        # (/proc/uptime has 10 ms steps), so two readings differ by the time between them
        uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no BOOTTIME
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


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
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def json_text(data: dict) -> str:
    """``data`` as the indented JSON every report is written in (NumPy values plain)."""
    return json.dumps(data, indent=2, sort_keys=True, default=_plain) + "\n"


def write_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_text_atomic(Path(path), json_text(data))


def _plain(obj):
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


def merge_events(batches: list[list[dict]]) -> list[dict]:
    """Compression checks of every batch on every rank, summed per layer (rows,
    representatives, images)."""
    by_layer: dict[int, dict] = {}
    for events in batches:
        for e in events:
            acc = by_layer.setdefault(e["layer"], {"layer": e["layer"], "rows": 0,
                                                   "representatives": 0, "images": 0,
                                                   "batches": 0})
            for key in ("rows", "representatives", "images"):
                acc[key] += e[key]
            acc["batches"] += 1
    return [by_layer[k] for k in sorted(by_layer)]


@dataclass
class RunReport:
    """What one distributed run produced, on rank 0: facts for the JSON report and the
    arrays the verdict is made from (not written to the JSON)."""

    store: str
    n_layers: int
    layer_widths: list[int]  # inputs, then each layer's outputs
    n_images: int
    edges_per_image: int
    backend: str
    backend_choice: str  # why this backend (asked for, or what auto found)
    ranks: int
    partition: str
    compress: str
    readout: str
    inference_seconds: float  # the slowest rank's
    imbalance: float  # slowest over mean rank
    computed_edges: int  # edges actually multiplied, all ranks
    live_rows_per_layer: list[int]
    layer_seconds: list[float] | None  # rank 0's, where its backend times layers
    compression: list[dict]
    per_rank: list[dict]
    categories: np.ndarray  # sorted 1-based ids alive at the end
    truth: np.ndarray | None = None  # read at the start with --check (alive stores)
    predictions: np.ndarray | None = None  # one class per image (argmax stores)
    reference: np.ndarray | None = None  # stored reference predictions (--check)
    labels: np.ndarray | None = None  # stored labels (argmax stores run whole)
    check: dict | None = None  # set by the command once it compared
    accuracy: dict | None = None
    startup_seconds: float = 0.0  # process start to the command's start (set by the command)
    machine: dict = field(default_factory=machine_info)

    @property
    def edges_per_second(self) -> float:
        """The challenge's nominal figure of merit over the slowest rank."""
        return edges_per_second(self.n_images, self.edges_per_image, self.inference_seconds)

    @property
    def computed_edges_per_second(self) -> float:
        s = self.inference_seconds
        return self.computed_edges / s if s > 0 else float("inf")

    def to_json(self) -> dict:
        """The report as written by ``--json`` (and read by the text summary)."""
        out = {
            "store": self.store, "n_layers": self.n_layers, "layer_widths": self.layer_widths,
            "neurons": self.layer_widths[0], "n_images": self.n_images,
            "edges_per_image": self.edges_per_image, "backend": self.backend,
            "backend_choice": self.backend_choice, "ranks": self.ranks,
            "partition": self.partition, "compress": self.compress, "readout": self.readout,
            "inference_seconds": self.inference_seconds,
            "edges_per_second": self.edges_per_second,
            "teraedges_per_second": self.edges_per_second / 1e12,
            "computed_edges": self.computed_edges,
            "computed_edges_per_second": self.computed_edges_per_second,
            "computed_teraedges_per_second": self.computed_edges_per_second / 1e12,
            "compression": self.compression, "imbalance": self.imbalance,
            "live_rows_per_layer": self.live_rows_per_layer, "layer_seconds": self.layer_seconds,
            "categories_count": int(len(self.categories)), "per_rank": self.per_rank,
            "startup_seconds": self.startup_seconds,
            "machine": self.machine,
        }
        for key in ("input_seconds", "load_seconds", "validate_seconds", "device_seconds",
                    "layout_seconds", "compile_seconds", "warm_up_seconds", "peak_host_bytes",
                    "peak_children_bytes"):
            out[key] = max(r[key] for r in self.per_rank)
        out["kernels_compiled"] = any(r["kernels_compiled"] for r in self.per_rank)
        for key in ("check", "accuracy"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

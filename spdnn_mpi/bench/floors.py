"""Per-layer device-time floors on one H200, and the first-layers table of a run.

A layer that computes ``live`` rows of ``n_out`` outputs, each output the sum
of ``degree`` inputs, cannot take less than the larger of two times: moving
its bytes through HBM (features read once and written once as dense float32
tiles, the weights' indices streamed once) and doing its fp32 FMAs. The
bench prints, for the direct (off) mode, how far each of the first layers is
from that floor: in the first ~10 layers tens of thousands of distinct rows
are alive, and compression cannot help there. Pure functions, no GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

#: HBM copy bandwidth of one H200, bytes/s: the 4.3 TB/s that docs/performance.md
#: ("The two numbers") quotes from the device notes (KINDS.md), not the 4.8 TB/s spec.
H200_HBM_BYTES_PER_S = 4.3e12
#: fp32 FMAs/s of one H200: 132 SMs x 128 FMA per clock x 1.98 GHz boost = 33.45e12
#: (the "33.5e12" of the docs, rounded).
H200_FMA_PER_S = 132 * 128 * 1.98e9
#: Bytes per weight index (uint16 column indices of W^T in the CUDA layout).
INDEX_BYTES = 2
#: Bytes per feature value (dense float32 tiles).
FEATURE_BYTES = 4


def layer_floor(n_in: int, n_out: int, degree: float, live: int, *,
                index_bytes: int = INDEX_BYTES, value_bytes: int = 0,
                hbm_bytes_per_s: float = H200_HBM_BYTES_PER_S,
                fma_per_s: float = H200_FMA_PER_S) -> dict:
    """Floor of one layer: bytes, FMAs, both times, the larger one and what binds.

    bytes = 4 * live * (n_in + n_out) + (index_bytes + value_bytes) * degree * n_out;
    FMAs = degree * n_out * live. ``value_bytes`` is 0 for uniform weights (the
    challenge's 1/16 carries no value array), 4 for a float32 value per weight.
    """
    weights = (index_bytes + value_bytes) * degree * n_out
    nbytes = FEATURE_BYTES * live * (n_in + n_out) + weights
    fmas = degree * n_out * live
    hbm_s, fma_s = nbytes / hbm_bytes_per_s, fmas / fma_per_s
    return {"bytes": float(nbytes), "fmas": float(fmas), "hbm_seconds": hbm_s,
            "fma_seconds": fma_s, "seconds": max(hbm_s, fma_s),
            "bound": "hbm" if hbm_s >= fma_s else "fma"}


def network_floors(network, rows_in: Sequence[int]) -> list[dict]:
    """``layer_floor`` of every layer of ``network`` for the rows entering it."""
    out = []
    for layer, live in zip(network.layers, rows_in):
        degree = layer.nnz / layer.n_out if layer.n_out else 0.0
        out.append(layer_floor(layer.n_in, layer.n_out, degree, int(live),
                               value_bytes=0 if layer.values is None else 4))
    return out


def _percent(floor_s: float, measured_s: float | None) -> float | None:
    """floor / measured in per cent (100 = at the floor); None without a measurement."""
    if measured_s is None or measured_s <= 0:
        return None
    return 100.0 * floor_s / measured_s


def first_layers(network, rows_in: Sequence[int], layer_seconds: Sequence[float] | None,
                 k: int = 10) -> dict:
    """Rows for the first ``k`` layers and totals over them and over all layers.

    ``rows_in``: rows entering each layer (the engine's computed rows per
    layer; in the off mode every live row). ``layer_seconds``: measured
    device seconds per layer (None: floors only). Each row: 1-based layer,
    live rows in, measured and floor microseconds, the bound (hbm or fma)
    and the floor as a per cent of the measured time.
    """
    floors = network_floors(network, rows_in)
    measured = list(layer_seconds) if layer_seconds is not None else [None] * len(floors)
    rows = []
    for i, (fl, meas) in enumerate(zip(floors[:k], measured[:k])):
        rows.append({"layer": i + 1, "rows_in": int(rows_in[i]),
                     "measured_us": None if meas is None else 1e6 * meas,
                     "floor_us": 1e6 * fl["seconds"], "bound": fl["bound"],
                     "percent_of_floor": _percent(fl["seconds"], meas)})

    def total(n: int) -> dict:
        floor_s = sum(f["seconds"] for f in floors[:n])
        meas_s = None if layer_seconds is None else float(sum(measured[:n]))
        return {"layers": n, "measured_us": None if meas_s is None else 1e6 * meas_s,
                "floor_us": 1e6 * floor_s, "percent_of_floor": _percent(floor_s, meas_s)}

    return {"k": min(k, len(floors)), "rows": rows, "first": total(min(k, len(floors))),
            "all": total(len(floors)),
            "ceilings": {"hbm_bytes_per_s": H200_HBM_BYTES_PER_S, "fma_per_s": H200_FMA_PER_S}}

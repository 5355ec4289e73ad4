"""Per-layer device-time floors on the card a run used, and the first-layers rows.

A layer cannot take less than the larger of moving its bytes through HBM (features
read and written once, the weights' indices once) and doing its fp32 FMAs, at the
ceilings of the card the backend named; a card not in ``CARDS`` gets no floor
(never another card's). Pure functions, no GPU.

Two floors. The floor reads only the rows live entering a layer. The one-pass floor
reads the rows that entered the layer before: a row's death is known only once all
its outputs are, so a layer that computes each output once, in one pass over its
rows, still writes the rows it ends and the next layer still reads them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """One GPU's ceilings for the floor, and how its reported device name is matched."""

    name: str
    hbm_bytes_per_s: float  # measured device-to-device copy rate, reads + writes
    fma_per_s: float  # SMs x fp32 FMA per clock x boost clock
    pattern: str  # regular expression the whole device name must match (case ignored)

    def matches(self, device: str) -> bool:
        """Whether ``device`` (e.g. "NVIDIA H200") names this card."""
        return re.fullmatch(self.pattern, device.strip(), re.IGNORECASE) is not None

    def ceilings(self) -> dict:
        """The card and its two ceilings, as the JSON reports them."""
        return {"card": self.name, "hbm_bytes_per_s": self.hbm_bytes_per_s,
                "fma_per_s": self.fma_per_s}


#: One H200 (141 GB): HBM 4.3e12 B/s measured device-to-device (spec 4.8e12);
#: 132 SMs x 128 fp32 FMA per clock x 1.98 GHz.
H200 = Card("NVIDIA H200", 4.3e12, 132 * 128 * 1.98e9, r"(NVIDIA )?H200")
#: One H100 80GB HBM3 (SXM; not PCIe or NVL): HBM 3.0e12 B/s measured device-to-device;
#: 132 SMs x 128 FMA per clock x 1.98 GHz.
H100_SXM = Card("NVIDIA H100 80GB HBM3", 3.0e12, 132 * 128 * 1.98e9,
                r"(NVIDIA )?H100 80GB HBM3")
#: Cards with a floor; any other device gets none.
CARDS: tuple[Card, ...] = (H200, H100_SXM)

#: Bytes per weight index (uint16 column indices of W^T in the CUDA layout).
INDEX_BYTES = 2
#: Bytes per feature value (dense float32 tiles).
FEATURE_BYTES = 4
#: Rows of one CUDA tile: a layer that computes at most this many has converged.
CONVERGED_ROWS = 32


def card_for(device: str | None) -> Card | None:
    """The card of ``CARDS`` whose pattern matches ``device``; None for any other name."""
    if not device:
        return None
    return next((card for card in CARDS if card.matches(device)), None)


def layer_floor(n_in: int, n_out: int, degree: float, live: int, card: Card, *,
                index_bytes: int = INDEX_BYTES, value_bytes: int = 0,
                input_bytes: float = FEATURE_BYTES, read_rows: int | None = None) -> dict:
    """Floor of one layer on ``card``: bytes, FMAs, both times, the larger one, what binds
    (``value_bytes``: 0 for uniform weights, 4 for a float32 value per weight;
    ``input_bytes``: per input value read, 1 / 8 where binary inputs are read as bits;
    ``read_rows``: rows whose inputs are read, ``live`` if None)."""
    weights = (index_bytes + value_bytes) * degree * n_out
    read = live if read_rows is None else read_rows
    nbytes = read * input_bytes * n_in + live * FEATURE_BYTES * n_out + weights
    fmas = degree * n_out * live
    hbm_s, fma_s = nbytes / card.hbm_bytes_per_s, fmas / card.fma_per_s
    return {"bytes": float(nbytes), "fmas": float(fmas), "hbm_seconds": hbm_s,
            "fma_seconds": fma_s, "seconds": max(hbm_s, fma_s),
            "bound": "hbm" if hbm_s >= fma_s else "fma"}


def network_floors(network, rows_in: Sequence[int], card: Card,
                   input_bits: bool = False, one_pass: bool = False) -> list[dict]:
    """``layer_floor`` of every layer of ``network`` on ``card`` for the rows entering it
    (``input_bits``: the first layer read its binary inputs as bits; ``one_pass``: each
    layer after the first reads the rows that entered the layer before it)."""
    out = []
    for k, (layer, live) in enumerate(zip(network.layers, rows_in)):
        degree = layer.nnz / layer.n_out if layer.n_out else 0.0
        read = int(rows_in[k - 1]) if one_pass and k else int(live)
        out.append(layer_floor(layer.n_in, layer.n_out, degree, int(live), card,
                               value_bytes=0 if layer.values is None else 4,
                               input_bytes=1 / 8 if input_bits and k == 0 else FEATURE_BYTES,
                               read_rows=read))
    return out


def _percent(floor_s: float | None, measured_s: float | None) -> float | None:
    """floor / measured in per cent (100 = at the floor); None without both."""
    if floor_s is None or measured_s is None or measured_s <= 0:
        return None
    return 100.0 * floor_s / measured_s


def first_layers(network, rows_in: Sequence[int], layer_seconds: Sequence[float] | None,
                 k: int, card: Card | None, input_bits: bool = False) -> dict:
    """Rows for the first ``k`` layers and totals over them and over all layers, each
    against both floors, and (with a card) every layer's floor.

    ``rows_in``: rows entering each layer; ``layer_seconds``: measured device seconds
    per layer (None: floors only); ``card`` None: measured times only; ``input_bits``:
    the first layer read its binary inputs as bits (its floor reads those).
    """
    n = len(rows_in)
    floors = one_pass = [None] * n
    if card:
        floors = network_floors(network, rows_in, card, input_bits)
        one_pass = network_floors(network, rows_in, card, input_bits, one_pass=True)
    measured = list(layer_seconds) if layer_seconds is not None else [None] * n

    def against(floor: list, measured_s: float | None, prefix: str = "") -> dict:
        floor_s = sum(f["seconds"] for f in floor) if card else None
        return {f"{prefix}floor_us": None if floor_s is None else 1e6 * floor_s,
                f"percent_of_{prefix}floor": _percent(floor_s, measured_s)}

    rows = []
    for i in range(min(k, n)):
        meas = measured[i]
        rows.append({"layer": i + 1, "rows_in": int(rows_in[i]),
                     "measured_us": None if meas is None else 1e6 * meas,
                     **against(floors[i:i + 1], meas),
                     **against(one_pass[i:i + 1], meas, "one_pass_"),
                     "bound": floors[i]["bound"] if card else None})

    def total(count: int) -> dict:
        meas_s = None if layer_seconds is None else float(sum(measured[:count]))
        return {"layers": count, "measured_us": None if meas_s is None else 1e6 * meas_s,
                **against(floors[:count], meas_s), **against(one_pass[:count], meas_s,
                                                             "one_pass_")}

    out = {"k": min(k, n), "rows": rows, "first": total(min(k, n)), "all": total(n),
           "ceilings": card.ceilings() if card else None}
    if card:
        out["floor_us_per_layer"] = [1e6 * f["seconds"] for f in floors]
    return out


def add_first_layers(row: dict, network, k: int, card: Card | None,
                     device: str | None, input_bits: bool = False) -> None:
    """The off mode's first ``k`` layers against ``card``'s floors, into ``row`` (if
    timed); ``device``, the name the backend reported, is kept beside it (None: no card
    matched); ``input_bits``: the first layer read its binary inputs as bits."""
    off = row["modes"].get("off")
    if k <= 0 or off is None or off.get("layer_seconds") is None:
        return
    row["first_layers"] = {"mode": "off", "device": device,
                           "card": card.name if card else None, "input_bits": input_bits,
                           **first_layers(network, off["computed_rows_per_layer"],
                                          off["layer_seconds"], k, card, input_bits)}


def converged_layers(mode: dict) -> dict | None:
    """Median per-layer time of the layers of one mode's results that computed at most one
    tile (32 rows), the long tail of a compressed run; None without per-layer times."""
    seconds = mode.get("layer_seconds")
    if seconds is None:
        return None
    picked = [s for rows, s in zip(mode["computed_rows_per_layer"], seconds)
              if rows <= CONVERGED_ROWS]
    first = next((i + 1 for i, rows in enumerate(mode["computed_rows_per_layer"])
                  if rows <= CONVERGED_ROWS), None)
    return {"mode": mode.get("compress"), "rows_at_most": CONVERGED_ROWS,
            "layers": len(picked), "first_layer": first,
            "median_us": 1e6 * statistics.median(picked) if picked else None,
            "min_us": 1e6 * min(picked) if picked else None,
            "max_us": 1e6 * max(picked) if picked else None}

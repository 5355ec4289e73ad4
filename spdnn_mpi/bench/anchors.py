"""Published single-GPU results the benchmark prints beside ours (TeraEdges/s): the 2020
paper's A100 (Hidayetoglu et al., HPEC 2020, Table I; every live row, like ``off``) and
SNICIT (Jiang et al., ICPP 2023, Table 3 on an RTX A6000; rows once converged, like
``auto``).
"""

from __future__ import annotations

#: (N, L) -> TE/s, 2020 paper, one A100.
PAPER_2020_A100: dict[tuple[int, int], float] = {
    (1024, 120): 16.74, (1024, 480): 20.99, (1024, 1920): 20.68,
    (4096, 120): 14.27, (4096, 480): 18.63, (4096, 1920): 19.86,
    (16384, 120): 11.60, (16384, 480): 14.31, (16384, 1920): 15.27,
    (65536, 120): 8.15, (65536, 480): 9.08, (65536, 1920): 9.33,
}

#: (N, L) -> TE/s, SNICIT, one RTX A6000.
SNICIT_A6000: dict[tuple[int, int], float] = {
    (1024, 120): 17.6, (1024, 480): 37.6, (1024, 1920): 52.1,
    (4096, 120): 29.1, (4096, 480): 85.5, (4096, 1920): 169.0,
    (16384, 120): 33.7, (16384, 480): 120.0, (16384, 1920): 337.0,
    (65536, 120): 32.6, (65536, 480): 119.0, (65536, 1920): 350.0,
}


def anchors_for(neurons: int, layers: int) -> dict[str, float | None]:
    """Both anchors of one configuration (None where nothing was published)."""
    key = (neurons, layers)
    return {"paper_2020_a100": PAPER_2020_A100.get(key), "snicit_a6000": SNICIT_A6000.get(key)}

"""Other implementations run on the same data for comparison (GraphBLAS, cuSPARSE, torch)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def timed_runs(run: Callable[[], Any], repeat: int,
               settle: Callable[[], None] | None = None) -> tuple[Any, float, list[float]]:
    """(last output, median seconds, every run's seconds) of ``repeat`` runs of ``run``
    after an untimed warm-up (then ``settle()``, e.g. a device synchronisation)."""
    run()
    if settle is not None:
        settle()
    times, out = [], None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times), times

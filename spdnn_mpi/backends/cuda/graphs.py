"""Captured CUDA graphs of the CUDA backend's layer loop, cached by what they launch:
one launch a piece of the loop instead of one or two a layer. Kernels read their
buffers from the pointer table, so only the gather's arrays' addresses are part of
the key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

#: Graphs kept before the cache starts again (a compressed 1920-layer run: ~70 pieces
#: in four forms each).
MAX_GRAPHS = 4096


class GraphCache:
    """Graphs by key; a capture that fails turns graphs off and keeps the reason."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.note = "on" if on else "off"
        self._graphs: dict[tuple, Any] = {}

    def clear(self) -> None:
        """Forget every graph (a new network)."""
        self._graphs = {}

    def key(self, todo: tuple, held: int, tail: Hashable) -> tuple:
        """What identifies a piece: layers, rows held, and what its gather (and
        copy) depend on (``tail``: grid, sizes, addresses; None without a gather)."""
        return todo, held, tail

    def get(self, key: tuple) -> Any | None:
        """The graph of ``key``, if graphs are on and it was captured."""
        return self._graphs.get(key) if self.on else None

    def capture(self, stream: Any, key: tuple, launch: Callable[[], None]) -> Any | None:
        """Capture what ``launch`` enqueues on ``stream`` as the graph of ``key``;
        None (and graphs off, with the reason in ``note``) if capturing fails."""
        try:
            stream.begin_capture()
            try:
                launch()
            finally:
                graph = stream.end_capture()
        except Exception as exc:  # CuPy without graphs, or a capture rule broken
            self.on = False
            self.note = f"off ({type(exc).__name__}: {exc})"
            return None
        if len(self._graphs) >= MAX_GRAPHS:
            self._graphs.clear()
        self._graphs[key] = graph
        return graph

    def any(self) -> Any | None:
        """One captured graph, or None."""
        return next(iter(self._graphs.values()), None)

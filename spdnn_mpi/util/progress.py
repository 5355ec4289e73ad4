"""Progress lines for long phases: steps done, rate, time spent and time left.

One helper for every long phase (inference, reference truth, the GraphBLAS
peer, generating and converting layers, the CUDA layout build), so they all
print the same way and all fall silent with ``--quiet``. A ``Progress`` is
cheap to call once per layer: it reads the clock and prints at most every
``every`` seconds (and once at the end).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

Emit = Callable[[str], None]  # where one finished line of progress text goes


def stderr_lines(prefix: str) -> Emit:
    """An ``Emit`` printing ``prefix: line`` to stderr, flushed at once."""

    def emit(line: str) -> None:
        print(f"{prefix}: {line}", file=sys.stderr, flush=True)

    return emit


@contextlib.contextmanager
def note_if_slow(emit: Emit | None, text: str, after: float = 2.0) -> Iterator[None]:
    """Emit ``text`` if the block still runs ``after`` seconds in: a one-off wait
    (compiling kernels into an empty cache) is explained, a usual short one stays
    quiet. ``emit`` None: nothing."""
    if emit is None:
        yield
        return
    timer = threading.Timer(after, emit, args=(text,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def format_seconds(seconds: float) -> str:
    """``4.2 s``, ``3 min 05 s``, ``1 h 02 min``: short and readable at any size."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Rate-limited lines like ``truth (reference): layer 40/120, 12.3 layers/s, 3.2 s, ...``.

    ``emit`` None makes every call a no-op (quiet). Time left is the steps
    that remain at the rate since the previous line, and only from the second
    line on: the first step carries one-off costs (compiling kernels, opening
    files) that a rate since the start would spread over every step left (a
    4096-neuron generation once said "about 1 h 02 min left" and finished 63 s
    later), and layers get cheaper as rows die, so the recent rate predicts
    the rest far better than the mean does (reference truth at layer 22 of
    120: 42 s left by the mean, 11 s by the recent rate, 3.4 s in fact).
    """

    def __init__(self, what: str, total: int | None, emit: Emit | None, *, unit: str = "layer",
                 every: float = 2.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.what = what
        self.total = None if total is None else int(total)  # None: not known
        self.emit = emit
        self.unit = unit
        self.every = every
        self.clock = clock
        self.start = clock()
        self._next = self.start + every
        self._last: tuple[float, float] | None = None  # (share done, elapsed) at the last line

    @property
    def enabled(self) -> bool:
        return self.emit is not None

    def __call__(self, done: int, detail: str = "", elapsed: float | None = None, *,
                 fraction: float | None = None) -> None:
        """Report ``done`` of ``total`` steps; prints when due, and always at the end.

        ``fraction`` (0..1), when given, is how much of the work is done, for
        phases whose steps say less (layers of an archive that come in any
        order: the share of the archive read); the time left follows it.
        """
        if self.emit is None:
            return
        now = self.clock()
        if not self._finished(done, fraction) and now < self._next:
            return
        self._next = now + self.every
        elapsed = now - self.start if elapsed is None else elapsed
        share = self._share(done, fraction)
        self.emit(self.line(done, elapsed, detail, self._last, fraction=share))
        self._last = (share, elapsed)

    def _finished(self, done: int, fraction: float | None) -> bool:
        if self.total is None:
            return (fraction or 0.0) >= 1.0
        return done >= self.total

    def _share(self, done: int, fraction: float | None) -> float:
        """The share of the work done: ``fraction`` if given, else steps done of the total."""
        if fraction is not None:
            return min(max(fraction, 0.0), 1.0)
        if self.total is None:
            return 0.0
        return done / self.total if self.total else 1.0

    def line(self, done: int, elapsed: float, detail: str = "",
             previous: tuple[float, float] | None = None, *,
             fraction: float | None = None) -> str:
        """The text of one progress line (no prefix); ``previous``: (share done,
        elapsed) at the line before, for the recent rate behind the time left;
        ``fraction``: the share done now (default: ``done`` of the total)."""
        head = f"{self.what}: " if self.what else ""
        of = "" if self.total is None else f"/{self.total}"
        parts = [f"{head}{self.unit} {done}{of}"]
        if detail:
            parts.append(detail)
        if elapsed > 0 and done > 0:
            parts.append(f"{done / elapsed:.1f} {self.unit}s/s")
        parts.append(format_seconds(elapsed))
        share = self._share(done, fraction)
        if previous is not None and previous[0] < share < 1.0 and elapsed > previous[1]:
            left = (elapsed - previous[1]) * (1.0 - share) / (share - previous[0])
            parts.append(f"about {format_seconds(left)} left")
        return ", ".join(parts)

    def note(self, text: str) -> None:
        """One free line (a phase starting or finishing), unless quiet."""
        if self.emit is not None:
            self.emit(text)

"""Holding Ctrl-C and SIGTERM back while a call that must not be cut runs.

Python runs signal handlers between bytecodes, also inside Python code that
a C library calls back: the store writer hands HDF5 a Python file object, so
a KeyboardInterrupt raised in one of its callbacks unwinds through HDF5,
which cannot take it (a SystemError, then a crash at exit, and the temporary
left behind). :func:`deferred_signals` records a signal that arrives during
such a call and delivers it right after, where the usual cleanup runs.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Run the block with SIGINT and SIGTERM held back; the first one that came is
    handled (as its own handler would) when the block ends. Outside the main
    thread, where no handler can be set, the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, object]] = []
    previous = {}
    for signum in _HELD:
        previous[signum] = signal.signal(signum, lambda s, f: pending.append((s, f)))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signum, frame = pending[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def held_signals(method: F) -> F:
    """``method`` run under ``deferred_signals`` (every call of the store writer, whose
    file object HDF5 calls back)."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        with deferred_signals():
            return method(*args, **kwargs)

    return run  # type: ignore[return-value]

"""Worker processes running one function over a stream of tasks, results handed on in order.

``spdnn prepare`` parses layer files on every core it is given while the
main process writes the store: :class:`WorkerPool` sends each task to an
idle worker, keeps at most ``window`` tasks between being taken from the
stream and being handed on (so memory holds a bounded number of parsed
layers however long the network), and yields the results in the order of
the tasks. A worker's SpdnnError (an InputFormatError naming file and line)
is raised in the main process as it was raised in the worker; a worker that
dies (killed, out of memory) is an error naming its exit status, never a
hang. Workers ignore Ctrl-C and die quietly on SIGTERM: the main process
handles both and stops every worker on the way out (``close``).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import wait

from spdnn_mpi.errors import SpdnnError


def default_jobs() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether workers start by fork here (so a closure can be their function)."""
    return "fork" in mp.get_all_start_methods()


def _context():
    """fork where the platform has it: workers start at once with the main process's
    modules and compiled kernels; elsewhere the platform's default."""
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else None)


def _serve(conn, fn: Callable) -> None:
    """A worker's loop: receive a task, send back (True, result) or (False, error)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # close(): die quietly
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        if task is None:
            return
        try:
            reply = (True, fn(task))
        except Exception as exc:  # handed to the main process, which raises it
            reply = (False, exc)
            try:
                pickle.dumps(exc)
            except Exception:
                reply = (False, RuntimeError("".join(traceback.format_exception(exc))))
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


def _died(proc) -> SpdnnError:
    """The error for a worker that ended in the middle of a task."""
    proc.join(1.0)
    code = proc.exitcode
    how = "still running" if code is None else (
        f"signal {-code}" if code < 0 else f"exit status {code}")
    return SpdnnError(f"a worker process died ({how}; out of memory?); run again, with "
                      "fewer --jobs if memory is short")


class WorkerPool:
    """``jobs`` worker processes applying ``fn`` to tasks; use as a context manager."""

    def __init__(self, fn: Callable, jobs: int) -> None:
        for stream in (sys.stdout, sys.stderr):  # no buffered text copied into the workers
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        ctx = _context()
        self._workers: list[tuple] = []
        gc.freeze()  # forked workers never walk (and so copy) the objects they inherit
        try:
            for _ in range(jobs):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(child, fn), daemon=True,
                                   name="spdnn-worker")
                proc.start()
                child.close()
                self._workers.append((proc, parent))
        except BaseException:
            self.close(graceful=False)
            raise
        finally:
            gc.unfreeze()  # this process collects as before

    def map(self, tasks: Iterable, window: int, *, flat: bool = False) -> Iterator:
        """``fn(task)`` for each task, in task order; at most ``window`` tasks are
        taken from ``tasks`` and not yet handed on at any time. With ``flat``, each
        result is a list whose items are handed on one by one, and between two items
        the workers are given their next tasks: none waits while the caller works."""
        window = max(window, 1)
        tasks = iter(tasks)
        idle = list(self._workers)
        busy: dict = {}  # connection -> (task number, worker)
        results: dict[int, tuple[bool, object]] = {}
        state = {"taken": 0, "handed": 0, "more": True}

        def pump(timeout: float | None) -> None:
            """Collect the replies that are ready, then hand idle workers new tasks."""
            self._receive(busy, idle, results, timeout)
            while state["more"] and idle and state["taken"] - state["handed"] < window:
                try:
                    task = next(tasks)
                except StopIteration:
                    state["more"] = False
                    break
                worker = idle.pop()
                try:
                    worker[1].send(task)
                except OSError:  # it died while idle (killed, out of memory)
                    raise _died(worker[0]) from None
                busy[worker[1]] = (state["taken"], worker)
                state["taken"] += 1

        while True:
            pump(0)
            if state["handed"] in results:
                ok, value = results.pop(state["handed"])
                state["handed"] += 1
                if not ok:
                    raise value
                if not flat:
                    yield value
                    continue
                for item in value:
                    yield item
                    pump(0)
            elif not state["more"] and state["handed"] == state["taken"]:
                return
            else:
                self._receive(busy, idle, results, timeout=None)

    @staticmethod
    def _receive(busy: dict, idle: list, results: dict, timeout: float | None) -> None:
        """Collect the replies that are ready (waiting up to ``timeout`` for one); a
        worker that ended without replying is an error."""
        if not busy:
            return
        sentinels = {worker[0].sentinel: conn for conn, (_, worker) in busy.items()}
        for ready in wait([*busy, *sentinels], timeout):
            conn = sentinels.get(ready, ready)
            if conn not in busy:  # both its pipe and its sentinel were ready
                continue
            number, worker = busy.pop(conn)
            try:
                results[number] = conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                raise _died(worker[0]) from None
            idle.append(worker)

    def close(self, graceful: bool = True) -> None:
        """Stop every worker: asked to finish when ``graceful``, else (or if slow) killed."""
        for proc, conn in self._workers:
            if graceful and proc.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    conn.send(None)
        for proc, conn in self._workers:
            if graceful:
                proc.join(2.0)
            if proc.is_alive():
                proc.terminate()
            proc.join(5.0)
            if proc.is_alive():  # pragma: no cover - SIGTERM is not ignored in workers
                proc.kill()
                proc.join()
            conn.close()
        self._workers = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(graceful=exc_type is None)


class Background:
    """``fn(arg)`` computed in one worker process while this one goes on: the worker
    starts here, ``submit(arg)`` gives it its argument, ``result()`` waits for it
    (raising its error as the pool does). A context manager: leaving it stops the
    worker, also on errors and interrupts."""

    def __init__(self, fn: Callable) -> None:
        self._pool = WorkerPool(fn, 1)
        self._worker = self._pool._workers[0]

    def submit(self, arg) -> None:
        try:
            self._worker[1].send(arg)
        except OSError:  # pragma: no cover - it died at once
            self._pool.close(graceful=False)
            raise _died(self._worker[0]) from None

    def result(self):
        results: dict[int, tuple[bool, object]] = {}
        try:
            self._pool._receive({self._worker[1]: (0, self._worker)}, [], results, None)
        except BaseException:
            self._pool.close(graceful=False)
            raise
        self._pool.close()
        ok, value = results[0]
        if not ok:
            raise value
        return value

    def __enter__(self) -> Background:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._pool.close(graceful=exc_type is None)

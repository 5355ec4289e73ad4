"""When a compression check pays, decided from what the run itself measures.

A check (``Backend.merge_duplicate_rows``) costs a pass over the held rows plus a
fixed part (launches, a copy to the host); it saves, on every later layer, the part
of that layer's time that shrinks with the rows it merged. Neither side is known
ahead: small layers (N = 1024) cost about what a launch costs, so a check over
60000 rows there costs more than every layer after it saves, while at N = 65536
one early check saves seconds. So the engine looks at the live count and the
clock at checkpoints and weighs, with the backend's ``CheckCosts`` as the prior:

- a check runs where the share of the rows it is expected to merge (FIRST_GAIN,
  or what the last check found where that was more) would pay for it: its cost
  under that share of a layer's row-bound time over the layers left, each counted
  by the share of the rows still alive there (rows dying fast leave little to save);
- after a check that found next to nothing, the checks may together cost at most
  ``CHECK_SHARE`` of the run's estimated time beyond what they saved (rows that
  never merge cost ``auto`` little against ``off``);
- the looks themselves, where waiting for the device stalls it, cost at most
  ``LOOK_SHARE`` of the run's estimated time.

A ``CheckPlan`` records the layers a measured run checked after, so later runs of
the same batch replay them without looking (``engine.time_inference``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spdnn_mpi.compression import MIN_GAIN, Compressor

if TYPE_CHECKING:
    from spdnn_mpi.backends.base import Backend

#: The least share of the held rows a check is expected to merge (more where the
#: last check found more): rows keep converging at depth (challenge networks,
#: N = 1024: 41 % of 60000 rows at layer 2, 11 % of 17039 at layer 4 while they
#: still die, 96 % of 2080 at layer 16).
FIRST_GAIN = 0.25
#: Share of the run's estimated time that checks after one that found next to
#: nothing (under MIN_GAIN) may cost beyond what they were estimated to save.
CHECK_SHARE = 0.02
#: Share of the run's estimated time that waiting for live counts may cost. At 1 %
#: the looks of 1024 x 480 ran out at layer 12, before its rows stopped dying, so no
#: check ran there (auto 123.6 against off 123.1 TE/s, H100); at 2 % the look after
#: layer 16 finds them settled, and a check then pays (1024 x 1920: 10
#: representatives of 3120 rows from layer 20 on).
LOOK_SHARE = 0.02

#: Once no check can come (one tile of representatives), queued work is cut only
#: every DONE_CUT_STRIDE layers instead of at every checkpoint: each cut ends a
#: launch of converged layers, which costs about 12 us besides its layers (H100),
#: while the cuts left still let the device start before the host has queued all.
DONE_CUT_STRIDE = 128


@dataclass(frozen=True)
class CheckCosts:
    """A backend's prior for the costs of compression, in seconds (zero: free, so
    every due checkpoint checks; the reference backend's choice).

    ``look``: the device's idle time when the host waits for a live count.
    ``check``: one check's fixed part, beyond a pass over the held rows.
    ``layer``: a layer's time that does not shrink with its rows (the launch,
    reading the weights): merging rows saves none of it.
    """

    look: float = 0.0
    check: float = 0.0
    layer: float = 0.0


@dataclass
class CheckPlan:
    """The layers (counts done) a measured run of one batch checked after."""

    layers: tuple[int, ...]


class CheckPolicy:
    """Check decisions for one batch of ``n_layers`` layers (see the module's text)."""

    def __init__(self, costs: CheckCosts, n_layers: int) -> None:
        self.costs = costs
        self.n_layers = n_layers
        self._start = 0.0
        self._last: tuple[int, float, int] | None = None  # (layers done, clock, live) at a look
        self._layer_seconds = 0.0  # per layer between the last two looks
        self._fall = 0.0  # live rows' fall per layer between the last two looks
        self._check_seconds = 0.0  # spent checking since the last look
        self._looks_spent = 0.0
        self._unpaid = 0.0  # cost of checks beyond what they were estimated to save
        self._gain: float | None = None  # fraction of the held rows the last check merged
        self._per_value: float | None = None  # a check's measured cost per held value
        self._looks = 0
        self._one_time = 0.0  # the backend's one-time seconds at the last look

    def start(self, clock: float, live: int, one_time: float = 0.0) -> None:
        """The batch's layers start at ``clock`` (seconds) on ``live`` rows;
        ``one_time``: the backend's ``one_time_seconds`` then."""
        self._start = clock
        self._last = (0, clock, live)
        self._one_time = one_time

    def _elapsed(self, layers_done: int) -> float:
        """Estimated run time after ``layers_done`` layers (from the last look on)."""
        done, clock, _ = self._last
        return clock - self._start + self._layer_seconds * (layers_done - done)

    def _total(self, layers_done: int) -> float:
        return self._elapsed(layers_done) + self._layer_seconds * (self.n_layers - layers_done)

    def wants_look(self, layers_done: int) -> bool:
        """Whether waiting for the live count now stays within ``LOOK_SHARE``."""
        if self.costs.look == 0.0 or self._last[0] == 0:
            return True  # free, or the first look: nothing is measured yet
        return self._looks_spent + self.costs.look <= LOOK_SHARE * self._total(layers_done)

    def observe(self, layers_done: int, clock: float, live: int, one_time: float = 0.0) -> None:
        """A look after ``layers_done`` layers: the clock (the device done), live rows
        and the backend's ``one_time_seconds`` (graph captures: not the layers' time)."""
        done, before, live_before = self._last
        layers = max(1, layers_done - done)
        stalls = (self._check_seconds + (self.costs.look if done else 0.0)
                  + max(0.0, one_time - self._one_time))  # not the layers' time
        self._one_time = one_time
        self._layer_seconds = max(0.0, clock - before - stalls) / layers
        self._fall = 1.0 - (live / live_before) ** (1.0 / layers) if live_before else 0.0
        self._check_seconds = 0.0
        self._looks_spent += self.costs.look
        self._looks += 1
        self._last = (layers_done, clock, live)

    def _saving_per_layer(self) -> float:
        """Of a layer's time now, the part that shrinks with its rows."""
        return max(0.0, self._layer_seconds - self.costs.layer)

    def _horizon(self, layers_done: int) -> float:
        """Layers left, each counted by the share of today's rows still alive there."""
        left = self.n_layers - layers_done
        keep = 1.0 - max(0.0, self._fall)
        if keep >= 1.0:
            return float(left)
        return keep * (1.0 - keep**left) / (1.0 - keep)

    def _check_estimate(self, values: int) -> float:
        if self._per_value is None:
            return self.costs.check + self._saving_per_layer()  # a pass, like a layer's
        return self.costs.check + self._per_value * values

    def wants_check(self, layers_done: int, width: int) -> bool:
        """After a look: whether to check the rows held now (``width`` values each)."""
        live = self._last[2]
        if self.costs == CheckCosts() or live == 0:
            return live > 0  # free checks always pay
        if self._looks < 3:
            return False  # the first two looks only measure: the rows' fall over one
            # layer says nothing of the fall to come (challenge networks: 60000 ->
            # 59940 rows over layer 2, then 3120 by layer 10), and a check after
            # layer 2 taken for 118 layers of savings lost at N = 1024 and 4096
        cost = self._check_estimate(live * width)
        most = self._saving_per_layer() * self._horizon(layers_done)  # were all rows merged
        expected = FIRST_GAIN if self._gain is None else max(self._gain, FIRST_GAIN)
        if expected * most < cost:
            return False
        if self._gain is not None and self._gain < MIN_GAIN:  # the last found next to nothing
            return self._unpaid + cost <= CHECK_SHARE * self._total(layers_done)
        return True

    def checked(self, layers_done: int, seconds: float, rows: int, kept: int,
                width: int) -> None:
        """A check over ``rows`` rows took ``seconds`` and kept ``kept``."""
        gain = 1.0 - kept / rows if rows else 0.0
        saving = gain * self._saving_per_layer() * self._horizon(layers_done)
        self._unpaid += max(0.0, seconds - saving)
        self._gain = gain
        if rows:
            self._per_value = max(0.0, seconds - self.costs.check) / (rows * width)
        self._check_seconds += seconds
        done, clock, _ = self._last
        self._last = (done, clock, kept)  # merging is no dying


class BatchChecks:
    """Compression of one batch on one backend: at each checkpoint, a check (the
    backend merges) or just a cut of the queued work (once no check can come,
    only every ``DONE_CUT_STRIDE`` layers). Measures and decides with a
    ``CheckPolicy``, or replays a ``CheckPlan``; ``plan()`` is what it did."""

    def __init__(self, backend: Backend, n_rows: int, n_layers: int,
                 plan: CheckPlan | None = None) -> None:
        self.backend = backend
        self.compressor = Compressor(n_rows, backend.tile_rows)
        self.policy = None if plan is not None else CheckPolicy(backend.check_costs, n_layers)
        self._replay = plan
        self._checked: list[int] = []

    def start(self, live: int) -> None:
        """The layers start now, on ``live`` rows (the device idle)."""
        if self.policy is not None:
            self.policy.start(time.perf_counter(), live, self.backend.one_time_seconds())

    def at_checkpoint(self, layers_done: int, width: int) -> None:
        """After ``layers_done`` layers of ``width`` outputs: check, or cut the queue."""
        if self._replay is not None:
            check = layers_done in self._replay.layers
        elif self.compressor.due(layers_done) and self.policy.wants_look(layers_done):
            live = self.backend.live_count()
            self.policy.observe(layers_done, time.perf_counter(), live,
                                self.backend.one_time_seconds())
            check = self.policy.wants_check(layers_done, width)
        else:
            check = False
        if not check:
            if not self.compressor.done or layers_done % DONE_CUT_STRIDE == 0:
                self.backend.flush()
            return
        t0, once = time.perf_counter(), self.backend.one_time_seconds()
        groups = self.backend.merge_duplicate_rows()
        if self.policy is not None:
            seconds = time.perf_counter() - t0 - (self.backend.one_time_seconds() - once)
            self.policy.checked(layers_done, seconds, groups.rows_before,
                                groups.representatives, width)
        self.compressor.record(layers_done, groups)
        self._checked.append(layers_done)

    def plan(self) -> CheckPlan:
        return CheckPlan(tuple(self._checked))

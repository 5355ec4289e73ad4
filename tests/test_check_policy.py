"""When compression checks run: decided from the run's own layer times, the live
rows' fall and the checks' measured cost and yield (``check_policy``).

The policy is driven here by a hand-moved clock with the time shapes seen on the
GPU (N = 1024: layers of tens of microseconds against a check of hundreds; N =
65536: layers of milliseconds), then through the engine on the CPU backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import duplicated_rows, random_network, record_cuts, saturating

from spdnn_mpi.backends import make_backend
from spdnn_mpi.check_policy import (
    CHECK_SHARE,
    DONE_CUT_STRIDE,
    LOOK_SHARE,
    CheckCosts,
    CheckPlan,
    CheckPolicy,
)
from spdnn_mpi.compression import is_checkpoint
from spdnn_mpi.engine import run_inference, time_inference
from spdnn_mpi.reference import reference_infer

CUDA_LIKE = CheckCosts(look=20e-6, check=150e-6, layer=6e-6)
#: live rows of the generated 1024 x 120 challenge network: inputs, then after each layer
LIVE_1024 = [60000, 59940, 55296, 41448, 25572, 14304, 8304, 5248, 3569, 3120, 3012, 2964,
             2892, 2892, 2880, 2868, 2856]


def drive(policy: CheckPolicy, n_layers: int, layer_s, live_after, check_s, kept_after,
          width: int = 1024) -> list[int]:
    """Run ``policy`` over a simulated batch: ``layer_s(k, rows)`` seconds for 0-based
    layer k on ``rows`` rows, ``live_after(k)`` rows alive after it (before merging),
    a check costing ``check_s(rows)`` and keeping ``kept_after(k, rows)``. Returns the
    layers checked after; ``policy.clock`` is left at the run's simulated end."""
    clock, rows, checked = 0.0, live_after(-1), []
    policy.start(clock, rows)
    merged = 1.0  # share of the rows left by merges so far
    for k in range(n_layers):
        clock += layer_s(k, rows)
        rows = max(1, int(live_after(k) * merged))
        done = k + 1
        if not (is_checkpoint(done) and n_layers - done >= 8):
            continue
        if policy.wants_look(done):
            policy.observe(done, clock, rows)
            clock += policy.costs.look  # the device idles until the host relaunches
            if policy.wants_check(done, width):
                seconds = check_s(rows)
                kept = kept_after(done, rows)
                clock += seconds
                policy.checked(done, seconds, rows, kept, width)
                merged *= kept / rows
                rows = kept
                checked.append(done)
    policy.clock = clock
    return checked


@pytest.mark.parametrize("look", [CUDA_LIKE.look, 0.0])
def test_small_layers_never_pay_for_a_check(look):
    """N = 1024 x 120: 25 us layers, 300 us checks; merging saves almost nothing,
    also where looks are free and the policy looks at every checkpoint."""
    policy = CheckPolicy(CheckCosts(look, CUDA_LIKE.check, CUDA_LIKE.layer), 120)
    checked = drive(policy, 120, lambda k, r: 6e-6 + 3e-10 * r,
                    lambda k: LIVE_1024[min(k + 1, len(LIVE_1024) - 1)],
                    lambda r: 150e-6 + 3e-9 * r, lambda k, r: r // 2)
    assert checked == []


def test_heavy_layers_check_at_the_third_checkpoint():
    """N = 65536: milliseconds a layer; the first two looks only measure, the third
    checks and, finding many duplicates, the next ones follow."""
    policy = CheckPolicy(CUDA_LIKE, 1920)
    checked = drive(policy, 1920, lambda k, r: 20e-6 + 2e-7 * r,
                    lambda k: 60000 if k < 1 else 55000,
                    lambda r: 150e-6 + 1e-7 * r, lambda k, r: max(1, int(r * 0.6)))
    assert checked[:3] == [4, 8, 12]


def test_checks_wait_while_rows_die_fast():
    """After a check, the next one weighs its gain over the layers the rows still
    live: while the live count halves every layer, it waits."""
    policy = CheckPolicy(CUDA_LIKE, 1920)
    live = {1: 60000, 2: 50000, 4: 12500, 8: 800, 12: 790, 16: 780}
    policy.start(0.0, 60000)
    clock = 0.0
    for done in (1, 2):
        clock += 0.01
        policy.observe(done, clock, live[done])
        assert not policy.wants_check(done, 4096)  # the first two looks only measure
    clock += 0.02
    policy.observe(4, clock, 50000)
    assert policy.wants_check(4, 4096)
    policy.checked(4, 0.002, 50000, 30000, 4096)  # 40 % merged
    clock += 0.002
    policy._unpaid = 1.0  # the exploring budget spent: only the gain can justify it
    clock += 2e-4
    policy.observe(8, clock, 7500)  # 100 us layers, still dying fast: half a layer
    assert not policy.wants_check(8, 4096)
    clock += 8e-4
    policy.observe(12, clock, 7490)  # now steady
    assert policy.wants_check(12, 4096)


def test_a_check_that_found_nothing_is_not_repeated_outside_the_budget():
    policy = CheckPolicy(CUDA_LIKE, 120)
    policy.start(0.0, 5000)
    policy.observe(1, 1e-3, 5000)
    policy.observe(2, 2e-3, 5000)
    policy.observe(4, 4e-3, 5000)
    assert policy.wants_check(4, 16384)
    policy.checked(4, 4e-3, 5000, 5000, 16384)  # nothing merged, and it cost 4 layers
    policy.observe(8, 12e-3, 5000)
    assert not policy.wants_check(8, 16384)


def test_unproven_checks_stay_within_their_share():
    """Rows that never merge: after the first check, the checks cost at most their
    share of the run."""
    for layer_us in (5, 50, 500, 5000):
        policy = CheckPolicy(CUDA_LIKE, 1920)
        checks: list[float] = []

        def check_s(rows, checks=checks, layer_us=layer_us):
            checks.append(150e-6 + layer_us * 1e-6)
            return checks[-1]

        drive(policy, 1920, lambda k, r, u=layer_us: u * 1e-6, lambda k: 4000, check_s,
              lambda k, r: r)
        # the first check on the prior alone; the rest within the share
        assert sum(checks) <= max(checks[:1] + [CHECK_SHARE * policy.clock])
        assert bool(checks) == (layer_us > 5)  # 5 us layers: all launch, nothing to save


def test_looks_stay_within_their_share_on_short_runs():
    policy = CheckPolicy(CUDA_LIKE, 120)
    policy.start(0.0, 60000)
    assert policy.wants_look(1)
    layer = 10e-6  # 120 layers: 1.2 ms, of which LOOK_SHARE (2 %) is 24 us
    policy.observe(1, layer, 59940)
    assert 2 * CUDA_LIKE.look > LOOK_SHARE * 120 * layer
    assert not policy.wants_look(2)  # a second 20 us look is over the share


def test_one_time_host_work_is_not_taken_for_layer_time():
    """A graph captured between two looks (the device idle meanwhile) does not make
    the layers look slower: 5 us layers stay too small to check after."""
    seen = {}
    for captured in (0.0, 0.05):
        policy = CheckPolicy(CUDA_LIKE, 480)
        policy.start(0.0, 60000, one_time=1.0)
        policy.observe(1, 25e-6, 60000, one_time=1.0)
        policy.observe(2, 25e-6 + CUDA_LIKE.look + 5e-6 + captured, 60000,
                       one_time=1.0 + captured)
        seen[captured] = (policy._layer_seconds, policy.wants_check(2, 1024))
    assert seen[0.0] == pytest.approx(seen[0.05]) and seen[0.05] == (pytest.approx(5e-6), False)


def test_free_checks_always_check():
    policy = CheckPolicy(CheckCosts(), 10)
    policy.start(0.0, 10)
    assert policy.wants_look(1)
    policy.observe(1, 1.0, 10)
    assert policy.wants_check(1, 4)


def test_timed_runs_replay_the_measured_plan(monkeypatch):
    """time_inference: the timed runs check where a measured run of the same batch
    did, without waiting for live counts, and give the same results."""
    rng = np.random.default_rng(5)
    net = saturating(rng, 64, 40)
    rows = duplicated_rows(rng, 300, 3, 64, binary=False)
    backend = make_backend("cpu")
    backend.check_costs = CheckCosts(look=1e-9, check=1e-9, layer=0.0)
    backend.load_network(net.layers)
    looks = []
    live_count = backend.live_count
    monkeypatch.setattr(backend, "live_count", lambda: looks.append(1) or live_count())
    plans: dict = {}
    first = run_inference(net, rows, backend, want_features=True, compress="auto",
                          plans=plans)
    measured = len(looks)
    assert measured and list(plans) == [(0, rows.n_rows)]
    plan = plans[(0, rows.n_rows)]
    assert plan == CheckPlan(tuple(e["layer"] for e in first.compression[0]))
    again = run_inference(net, rows, backend, want_features=True, compress="auto",
                          plans=plans)
    assert len(looks) == measured  # replayed: no look
    assert again.compression == first.compression
    np.testing.assert_array_equal(again.alive_ids, first.alive_ids)
    np.testing.assert_array_equal(again.features.view(np.uint32),
                                  first.features.view(np.uint32))
    _median, _times, timed = time_inference(net, rows, backend, repeat=2, compress="auto")
    np.testing.assert_array_equal(timed.alive_ids, first.alive_ids)


def test_cpu_checks_pay_on_a_network_that_collapses():
    """With the CPU backend's own costs, a batch whose rows collapse is checked and
    computes fewer rows than without compression."""
    rng = np.random.default_rng(6)
    net = random_network(rng, [256] * 41, 0.1, bias="positive")
    rows = duplicated_rows(rng, 200, 8, 256, binary=True)
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    off = run_inference(net, rows, backend, compress="off")
    auto = run_inference(net, rows, backend, compress="auto")
    np.testing.assert_array_equal(off.alive_ids, auto.alive_ids)
    assert auto.compression[0] and auto.computed_edges(net) < off.computed_edges(net)


def test_once_no_check_can_come_work_is_cut_only_every_stride(monkeypatch):
    """After the check that leaves one tile, the queue is cut at multiples of
    DONE_CUT_STRIDE only, not at every checkpoint (each cut ends a launch)."""
    rng = np.random.default_rng(8)
    n_layers = 2 * DONE_CUT_STRIDE + 40
    net = saturating(rng, 64, n_layers)
    rows = duplicated_rows(rng, 300, 3, 64, binary=False)
    backend = make_backend("cpu")
    backend.check_costs = CheckCosts()  # free: every due checkpoint checks
    backend.load_network(net.layers)
    cuts = record_cuts(monkeypatch, backend)
    res = run_inference(net, rows, backend, want_features=True, compress="auto")
    last_check = res.compression[0][-1]
    assert last_check["representatives"] <= backend.tile_rows
    after = [c for c in cuts if c > last_check["layer"]]
    assert after == [DONE_CUT_STRIDE, 2 * DONE_CUT_STRIDE]
    before = [c for c in cuts if c < last_check["layer"]]
    assert before == [c for c in range(1, last_check["layer"])
                      if is_checkpoint(c) and c not in {e["layer"] for e in res.compression[0]}]
    ids, feats = reference_infer(net, rows)
    np.testing.assert_array_equal(res.alive_ids, ids)

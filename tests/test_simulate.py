"""Tests of the discrete-event simulator (fast, no Dask)."""

from __future__ import annotations

import numpy as np
import pytest

from hmdspt.core import costs, strategies
from hmdspt.simulate import Drift, NetworkModel, Stragglers, calibrate, simulate_run

FREE = NetworkModel.free()


def test_equal_shares_421_match_analytic_idle() -> None:
    # Equal shares N/3: the round lasts (N/3)/1, the fastest is busy (N/3)/4 of it.
    res = simulate_run(
        3, speeds=[4.0, 2.0, 1.0], partition="equal", n_rows=7 * 3 * 1000, rounds=4, network=FREE
    )
    s = res.summary()
    assert s["fastest_idle_fraction"] == pytest.approx(1 - 1 / 4, abs=1e-12)
    # ideal = N / 7, wall = N / 3
    assert s["efficiency"] == pytest.approx(3 / 7, abs=1e-12)
    np.testing.assert_allclose(res.idle_fraction(), [0.75, 0.5, 0.0], atol=1e-12)


def test_proportional_shares_zero_idle_with_free_network() -> None:
    res = simulate_run(
        3, speeds=[4.0, 2.0, 1.0], partition="proportional", n_rows=7 * 1000, rounds=4, network=FREE
    )
    s = res.summary()
    assert s["fastest_idle_fraction"] == pytest.approx(0.0, abs=1e-12)
    assert s["efficiency"] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(res.rows[0], [4000, 2000, 1000])


def _comm_round(n: int, merge: str):
    # Compute-free round: what remains is the broadcast and the gather + merge.
    net = NetworkModel(
        latency_s=1e-3, bandwidth_Bps=1e8, task_overhead_s=0.0, per_message_s=0.0, merge_Bps=1e9
    )
    return simulate_run(
        n,
        speeds="equal",
        partition="equal",
        merge=merge,
        n_rows=n,
        rounds=1,
        params_bytes=1e5,
        network=net,
    )


def test_tree_merge_grows_like_log_n_flat_like_n() -> None:
    ns = np.array([8, 64, 512, 4096])
    hop, add = 1e-3 + 1e5 / 1e8, 1e5 / 1e9
    tree = [_comm_round(n, "tree") for n in ns]
    flat = [_comm_round(n, "flat") for n in ns]
    # tree: log2 n levels of one transfer + one add, then one transfer to the driver
    tree_merge = np.array([r.merge_s[0] for r in tree])
    np.testing.assert_allclose(tree_merge, np.log2(ns) * (hop + add) + hop, rtol=1e-9)
    # flat: the driver merges n deltas (n adds) and its link carries n broadcasts, so both
    # the merge and the whole round grow linearly in n
    flat_merge = np.array([r.merge_s[0] for r in flat])
    flat_wall = np.array([r.wall_s[0] for r in flat])
    np.testing.assert_allclose(np.diff(flat_merge) / np.diff(ns), add, rtol=1e-6)
    np.testing.assert_allclose(np.diff(flat_wall) / np.diff(ns), 1e5 / 1e8 + add, rtol=1e-6)
    tree_wall = np.array([r.wall_s[0] for r in tree])
    assert flat_wall[-1] > 50 * tree_wall[-1]


def test_straggler_makes_real_policy_move_rows_away(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"update": 0, "decide": 0}
    real_update = costs.RoundCostModel.observe
    real_decide = strategies.PartitionPolicy.plan

    def update(self, *a, **k):
        calls["update"] += a[0] != costs.MoveCost.KEY  # the workers', not the moves' model
        return real_update(self, *a, **k)

    def decide(self, *a, **k):
        calls["decide"] += 1
        return real_decide(self, *a, **k)

    monkeypatch.setattr(costs.RoundCostModel, "observe", update)
    monkeypatch.setattr(strategies.PartitionPolicy, "plan", decide)
    res = simulate_run(
        4,
        speeds="equal",
        partition="proportional",
        n_rows=40_000,
        rounds=8,
        network=FREE,
        stragglers=Stragglers(events=((0, 2, 100, 4.0),)),
    )
    assert calls["update"] == 4 * 8 and calls["decide"] == 8
    assert res.rows[0, 0] == 10_000
    assert res.rows[-1, 0] < 0.5 * 10_000  # rows moved away from the straggler
    assert res.rows_moved.sum() > 0
    assert isinstance(res.costs, costs.RoundCostModel)
    assert res.costs.speed(0) < 0.5 * res.costs.speed(1)
    # after re-balancing the round is much shorter than with the straggler's full share
    assert res.wall_s[-1] < 0.6 * res.wall_s[2]


def test_determinism_with_seed() -> None:
    kw = dict(
        partition="proportional",
        merge="tree",
        n_rows=64 * 10_000,
        rounds=6,
        drift=Drift(sigma=0.1),
        stragglers=Stragglers(prob=0.05),
        noise=0.05,
    )
    a = simulate_run(64, seed=3, **kw)
    b = simulate_run(64, seed=3, **kw)
    c = simulate_run(64, seed=4, **kw)
    np.testing.assert_array_equal(a.wall_s, b.wall_s)
    np.testing.assert_array_equal(a.rows, b.rows)
    assert not np.array_equal(a.wall_s, c.wall_s)


def test_invariants_with_default_network() -> None:
    res = simulate_run(
        16,
        partition="proportional",
        merge="flat",
        n_rows=16 * 5000,
        rounds=5,
        drift=Drift(),
        noise=0.03,
    )
    assert np.all(res.idle_s >= 0)
    np.testing.assert_allclose(res.rows.sum(axis=1), 16 * 5000)
    # wall >= every worker's busy + comm; efficiency in (0, 1]
    assert np.all(res.wall_s[:, None] >= res.busy_s + res.comm_s - 1e-12)
    assert np.all((res.efficiency > 0) & (res.efficiency <= 1))


def test_common_noise_lengthens_rounds_but_does_not_unbalance_them() -> None:
    kw = dict(partition="proportional", n_rows=7 * 1000, rounds=50, network=FREE)
    res = simulate_run(3, speeds=[4.0, 2.0, 1.0], common_noise=0.2, **kw)
    # every worker is slowed by the same factor in a round: shares stay exact
    assert res.idle_s.max() == pytest.approx(0.0, abs=1e-12)
    assert np.std(np.log(res.wall_s)) > 0.1
    np.testing.assert_allclose(res.busy_s / res.busy_s[:, :1], 1.0, rtol=1e-12)
    own = simulate_run(3, speeds=[4.0, 2.0, 1.0], noise=0.2, **kw)
    assert own.idle_fraction().min() > 0.0
    # drawn only when asked: without it, seeds give the streams they always gave
    a = simulate_run(3, speeds=[4.0, 2.0, 1.0], noise=0.1, seed=5, **kw)
    b = simulate_run(3, speeds=[4.0, 2.0, 1.0], noise=0.1, common_noise=0.0, seed=5, **kw)
    np.testing.assert_array_equal(a.busy_s, b.busy_s)


def test_calibrate_recovers_what_the_simulator_was_given() -> None:
    speeds = np.array([40_000.0, 20_000.0, 10_000.0])
    net = NetworkModel(task_overhead_s=0.03, merge_Bps=5e8)
    p = 4 * 50_000
    truth = simulate_run(
        3,
        speeds=speeds,
        partition="equal",
        n_rows=90_000,
        rounds=400,
        params_bytes=p,
        network=net,
        noise=0.05,
        common_noise=0.1,
        seed=2,
    )
    cal = calibrate(truth.rows, truth.busy_s, truth.comm_s, truth.merge_s, p)
    assert cal.rounds == 400
    np.testing.assert_allclose(cal.speeds, speeds, rtol=0.02)
    assert cal.noise == pytest.approx(0.05, rel=0.1)
    assert cal.common_noise == pytest.approx(0.1, rel=0.15)
    assert cal.network.task_overhead_s == pytest.approx(0.03, rel=1e-6)
    # the simulated merge_s also holds the last delta's transfer: a lower bound of the rate
    assert cal.network.merge_Bps < net.merge_Bps
    assert cal.network.latency_s == net.latency_s


def test_calibrate_without_noise_and_replay_reproduce_the_rounds() -> None:
    rows = np.array([[4000.0, 2000.0, 1000.0], [3000.0, 3000.0, 1000.0]])
    busy = rows / np.array([4000.0, 2000.0, 1000.0])
    comm = np.full_like(rows, 0.02)
    cal = calibrate(rows, busy, comm, np.array([0.001, 0.001]), 1000.0)
    np.testing.assert_allclose(cal.speeds, [4000.0, 2000.0, 1000.0])
    assert cal.noise == pytest.approx(0.0, abs=1e-12)
    assert cal.common_noise == pytest.approx(0.0, abs=1e-12)
    sim = simulate_run(
        3,
        speeds=cal.speeds,
        rounds=2,
        params_bytes=1000.0,
        network=cal.network,
        rows_schedule=rows,
    )
    np.testing.assert_allclose(sim.busy_s, busy)
    np.testing.assert_allclose(sim.comm_s.mean(), 0.02, rtol=1e-9)
    # round 2 gives the second worker 1.5 s of work: the first (0.75 s) and third (1 s) idle
    np.testing.assert_allclose(sim.idle_s[1], [0.75, 0.0, 0.5], atol=0.01)


def test_calibrate_rejects_bad_input() -> None:
    ok = np.ones((2, 3))
    with pytest.raises(ValueError):
        calibrate(ok, np.ones((2, 2)), ok, np.ones(2), 100.0)
    with pytest.raises(ValueError):
        calibrate(ok, ok, ok, np.ones(3), 100.0)
    with pytest.raises(ValueError):
        calibrate(np.zeros((2, 3)), ok, ok, np.ones(2), 100.0)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        simulate_run(3, partition="random")
    with pytest.raises(ValueError):
        simulate_run(3, merge="ring")
    with pytest.raises(ValueError):
        simulate_run(3, speeds=[1.0, 2.0])
    with pytest.raises(ValueError):
        simulate_run(3, common_noise=-0.1)

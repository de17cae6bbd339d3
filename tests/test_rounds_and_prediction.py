"""Rounds sized from measured costs, and the prediction a fit makes of its epochs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits

from hmdspt import BPNNClassifier
from hmdspt.core.rounds import (
    EARLY_LOCAL_STEPS,
    MAX_LOCAL_STEPS,
    SYNC_BUDGET,
    local_step_bound,
    size_rounds,
)
from hmdspt.core.runlog import read_events, summarize


def test_the_module_examples_hold():
    import doctest

    import hmdspt.core.prediction

    assert doctest.testmod(hmdspt.core.prediction).failed == 0


def test_the_most_rounds_whose_overhead_stays_within_the_budget():
    # 4 s of compute, 50 ms of overhead: k <= 4 * 0.05 / (0.05 * 0.95) = 4.2.
    size = size_rounds(4.0, 0.05, 100_000, 200)
    assert (size.rounds_per_epoch, size.bound) == (4, "budget")
    assert size.overhead_fraction == pytest.approx(0.05 / (1.0 + 0.05))
    assert size.overhead_fraction <= SYNC_BUDGET


def test_the_step_bound_wins_over_the_budget_and_one_round_is_the_fewest():
    # 500 steps of the largest share, at most 100 per round: 5 rounds, over budget.
    size = size_rounds(1.0, 0.5, 100_000, 200, max_local_steps=100)
    assert (size.rounds_per_epoch, size.bound) == (5, "steps")
    size = size_rounds(0.01, 0.03, 800, 200)  # digits-sized: overhead dominates
    assert (size.rounds_per_epoch, size.bound) == (1, "epoch")
    assert size.overhead_fraction == pytest.approx(0.03 / 0.04)


def test_the_tight_step_bound_is_the_last_epochs():
    assert [local_step_bound(e, 3) for e in (1, 2, 3, 4)] == [
        EARLY_LOCAL_STEPS,
        EARLY_LOCAL_STEPS,
        MAX_LOCAL_STEPS,
        MAX_LOCAL_STEPS,  # a fit resumed past its last epoch stays tight
    ]
    assert local_step_bound(1, 1, max_local_steps=7, early_local_steps=9) == 7  # partial_fit
    assert local_step_bound(2, 5, max_local_steps=7, early_local_steps=9) == 9
    with pytest.raises(ValueError, match=r"^max_local_steps and early_local_steps must be >= 1"):
        local_step_bound(2, 5, early_local_steps=0)


@example(compute=0.0, overhead=5e-324, share=1, batch=1, budget=0.5, max_steps=1)  # underflow
@settings(max_examples=300, deadline=None)
@given(
    compute=st.floats(0.0, 100.0),
    overhead=st.floats(0.0, 2.0),
    share=st.integers(1, 2_000_000),
    batch=st.integers(1, 1024),
    budget=st.floats(0.01, 0.5),
    max_steps=st.integers(1, 4096),
)
def test_no_round_breaks_the_step_bound_and_the_budget_holds_when_it_can(
    compute, overhead, share, batch, budget, max_steps
):
    size = size_rounds(compute, overhead, share, batch, budget=budget, max_local_steps=max_steps)
    k = size.rounds_per_epoch
    steps = math.ceil(share / batch)
    assert 1 <= k <= steps
    assert math.ceil(steps / k) <= max_steps  # no round holds more steps than the bound
    if size.bound == "budget":
        assert size.overhead_fraction <= budget + 1e-9
        if k < steps:  # one more round would break the budget
            assert overhead / (compute / (k + 1) + overhead) > budget - 1e-9
    else:
        # Over budget only when the bound forced more rounds, or one round already is.
        assert size.overhead_fraction >= budget - 1e-9 or k == math.ceil(steps / max_steps)


def _fit(client, log, **options):
    X, y = load_digits(return_X_y=True)
    return BPNNClassifier(
        (32,),
        max_iter=3,
        random_state=0,
        client=client,
        run_log=log,
        trainer_options=options,
    ).fit(X, y)


def _rounds_by_epoch(events):
    counts: dict[int, int] = {}
    for e in events:
        if e["event"] == "round":
            counts[e["epoch"]] = counts.get(e["epoch"], 0) + 1
    return counts


def test_auto_rounds_follow_the_sizes_the_fit_logs(client, tmp_path):
    # One step per round at most in the last epoch (3): one round per step of the largest
    # share there; epoch 2 has the early bound: one step too when it is 1, the budget's
    # rounds when it is large. An overhead budget no round can meet: one round per epoch.
    for name, options, one_step_epochs in (
        ("last", {"max_local_steps": 1, "early_local_steps": 10_000}, {3}),
        ("every", {"max_local_steps": 1, "early_local_steps": 1}, {2, 3}),
        ("none", {"sync_budget": 1e-9, "max_local_steps": 10_000}, set()),
    ):
        log = tmp_path / f"{name}.jsonl"
        _fit(client, log, **options)
        events = read_events(log)
        sizes = {e["epoch"]: e for e in events if e["event"] == "round_size"}
        assert sorted(sizes) == [2, 3]
        per_epoch = _rounds_by_epoch(events)
        last_partition = [e for e in events if e["event"] == "partition"]
        for epoch, size in sizes.items():
            assert per_epoch[epoch] == size["rounds_per_epoch"], (epoch, size, per_epoch)
            early = options.get("early_local_steps", EARLY_LOCAL_STEPS)
            assert size["step_bound"] == (options["max_local_steps"] if epoch == 3 else early)
            rows = [p for p in last_partition if p["round"] < _first_round(events, epoch)]
            steps = math.ceil(max(rows[-1]["rows"].values()) / 200)
            if epoch in one_step_epochs:
                assert size["rounds_per_epoch"] == steps
            else:
                # Digits' rounds cost more overhead than compute: one round per epoch.
                assert (size["rounds_per_epoch"], size["bound"]) == (1, "epoch"), (name, size)
            assert size["sync_s"] > 0 and np.isfinite(size["overhead_fraction"])


def _first_round(events, epoch):
    return min(e["round"] for e in events if e["event"] == "round" and e["epoch"] == epoch)


def test_an_explicit_rounds_per_epoch_is_kept(client, tmp_path):
    log = tmp_path / "fixed.jsonl"
    X, y = load_digits(return_X_y=True)
    BPNNClassifier(
        (32,), max_iter=3, random_state=0, client=client, run_log=log, rounds_per_epoch=3
    ).fit(X, y)
    events = read_events(log)
    assert not [e for e in events if e["event"] == "round_size"]
    per_epoch = _rounds_by_epoch(events)
    assert per_epoch[2] == per_epoch[3] == 3


# ---------------------------------------------------------------------- the prediction
def test_the_prediction_of_an_epoch_weighs_shares_fixed_costs_and_synchronisation():
    from hmdspt.core.prediction import predict_epoch

    speeds = {"a": 4000.0, "b": 2000.0, "c": 1000.0}
    balanced = {"a": 40_000, "b": 20_000, "c": 10_000}
    free = predict_epoch(balanced, speeds, {}, 0.0, 4)
    assert free.epoch_s == pytest.approx(10.0) == free.balanced_epoch_s
    assert free.efficiency == pytest.approx(1.0)
    assert free.speedup == pytest.approx(7 / 4)  # all speeds over the fastest's
    assert free.equal_shares_ratio == pytest.approx((70_000 / 3 / 1000) / 10.0)
    costly = predict_epoch(balanced, speeds, {"a": 0.1, "b": 0.1, "c": 0.1}, 0.5, 4)
    # Each of 4 rounds adds 0.1 s of fixed cost and 0.5 s of synchronisation.
    assert costly.epoch_s == pytest.approx(10.0 + 4 * 0.6, rel=1e-3)
    assert costly.fastest_alone_epoch_s == free.fastest_alone_epoch_s == 70_000 / 4000
    assert costly.efficiency == pytest.approx(10.0 / costly.epoch_s, rel=1e-3)
    # Shares off balance: the slowest share decides the fit's epoch, not the balanced one.
    off = predict_epoch({"a": 30_000, "b": 20_000, "c": 20_000}, speeds, {}, 0.0, 4)
    assert off.epoch_s == pytest.approx(20.0) and off.balanced_epoch_s == pytest.approx(10.0)
    with pytest.raises(ValueError, match="same workers"):
        predict_epoch({"a": 1}, speeds, {}, 0.0, 1)


def test_a_measured_efficiency_weighs_in_and_stretches_every_epoch_with_rounds():
    from hmdspt.core.prediction import MEASURED_WEIGHT, predict_epoch

    speeds = {"a": 4000.0, "b": 2000.0, "c": 1000.0}
    shares = {"a": 30_000, "b": 20_000, "c": 20_000}
    model = predict_epoch(shares, speeds, {"a": 0.1}, 0.2, 4)
    assert model.model_efficiency == model.efficiency and model.measured_efficiency is None
    for measured in (0.2, model.efficiency, 0.95):
        p = predict_epoch(shares, speeds, {"a": 0.1}, 0.2, 4, measured_efficiency=measured)
        weighed = (1 - MEASURED_WEIGHT) * model.efficiency + MEASURED_WEIGHT * measured
        assert p.efficiency == pytest.approx(weighed)
        assert p.model_efficiency == model.efficiency and p.measured_efficiency == measured
        # The rounds' shortfall stretches every epoch with rounds alike; one process has none.
        stretch = model.efficiency / p.efficiency
        assert p.epoch_s == pytest.approx(stretch * model.epoch_s)
        assert p.balanced_epoch_s == pytest.approx(stretch * model.balanced_epoch_s)
        assert p.equal_shares_epoch_s == pytest.approx(stretch * model.equal_shares_epoch_s)
        assert p.fastest_alone_epoch_s == model.fastest_alone_epoch_s
        assert p.equal_shares_ratio == pytest.approx(model.equal_shares_ratio)
        assert (p.speedup < model.speedup) == (measured < model.efficiency)
    with pytest.raises(ValueError, match="measured_efficiency must be > 0"):
        predict_epoch(shares, speeds, {}, 0.0, 1, measured_efficiency=0.0)


def test_the_prediction_covers_the_last_epochs_own_rounds(client, tmp_path):
    # One step per round in the last epoch (3), the budget's one round in epoch 2: the
    # predicted epoch is the mean of a one-round epoch and one of a round per step.
    log = tmp_path / "last.jsonl"
    _fit(client, log, max_local_steps=1)
    events = read_events(log)
    (prediction,) = [e for e in events if e["event"] == "prediction"]
    sizes = {e["epoch"]: e for e in events if e["event"] == "round_size"}
    assert prediction["rounds_per_epoch"] == sizes[2]["rounds_per_epoch"] == 1
    shares = [
        p for p in events if p["event"] == "partition" and p["round"] < _first_round(events, 2)
    ]
    steps = math.ceil(max(shares[-1]["rows"].values()) / 200)
    assert prediction["last_rounds_per_epoch"] == steps > 1
    assert 0 < prediction["efficiency"] <= 1.5


def test_the_mean_epoch_weighs_each_epoch_by_its_seconds():
    from hmdspt.core.prediction import mean_epoch, predict_epoch

    speeds = {"a": 3000.0, "b": 1000.0}
    counts = {"a": 3000, "b": 1000}
    short, long = (predict_epoch(counts, speeds, {"b": 0.01}, 0.1, k, 1, 0.8) for k in (1, 9))
    mean = mean_epoch([short, short, long])
    assert mean.epoch_s == pytest.approx((2 * short.epoch_s + long.epoch_s) / 3)
    ideal = 4000 / 4000
    assert mean.efficiency == pytest.approx(ideal / mean.epoch_s)
    assert long.efficiency < mean.efficiency < short.efficiency
    assert mean.speedup == pytest.approx(mean.fastest_alone_epoch_s / mean.epoch_s)
    assert mean.rounds_per_epoch == 1 and mean_epoch([long]) is long
    with pytest.raises(ValueError, match="^no epoch to average$"):
        mean_epoch([])


def test_a_cluster_predicted_slower_than_its_fastest_worker_says_so(client, tmp_path):
    # Digits in 40 rounds an epoch on an in-process cluster: a round's synchronisation
    # (about a millisecond) outweighs the compute it splits (about 20 rows a worker)
    # several times over.
    log = tmp_path / "slow.jsonl"
    X, y = load_digits(return_X_y=True)
    clf = BPNNClassifier(
        (16,),
        max_iter=2,
        batch_size=16,
        random_state=0,
        client=client,
        run_log=log,
        rounds_per_epoch=40,
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        clf.fit(X, y)
    events = read_events(log)
    # The prediction first: a miss shows the costs it was made from (it failed once in a
    # serial run of the suite, without a record of why).
    (prediction,) = [e for e in events if e["event"] == "prediction"]
    assert prediction["epoch"] == 2 and prediction["rounds_per_epoch"] == 40, prediction
    assert prediction["speedup"] < 1 and prediction["emulated"] is False, prediction
    # The first epoch's efficiency, as the run log's summary measures it, is weighed in.
    first = [e for e in events if e["event"] != "round" or e["epoch"] < 2]
    assert prediction["measured_efficiency"] == pytest.approx(summarize(first)["efficiency"])
    assert prediction["model_efficiency"] > 0
    assert {k: v for k, v in prediction.items() if k in clf.prediction_} == clf.prediction_
    (message,) = [
        str(m.message)
        for m in w
        if m.category is RuntimeWarning and "predicted to train slower" in str(m.message)
    ]
    assert f"speed-up {prediction['speedup']:.2f}x" in message and "\n" not in message
    assert any(e["event"] == "warning" and e["message"] == message for e in events)


def test_compare_says_why_one_process_won_with_the_fits_own_prediction(tmp_path):
    from hmdspt.compare import RunResult, why_one_process_won
    from hmdspt.core.runlog import RunLogWriter

    log = tmp_path / "hmdspt.jsonl"
    with RunLogWriter(log) as w:
        w.prediction(2, 1, 0.04, 0.9, 0.85, 1.5, 0.7, "worker-0", 0.78, 0.6)
    one = RunResult("bpnn-in-process", 3.0, 3.0, 0.96, [], 8)
    hmdspt = RunResult("hmdspt", 4.5, 4.4, 0.95, [], 8, run_log=str(log))
    lines = why_one_process_won([one, hmdspt], 3, machine_cores=2)
    assert lines[0].startswith("why bpnn-in-process won (3.00 s against 4.50 s): 3 workers")
    assert "this machine's 2 cores" in lines[0]
    assert "speed-up 0.78x over one process on worker-0 alone" in lines[1]
    assert "40 ms of synchronisation in an epoch's one round (predicted)" in lines[1]
    # Workers on machines of their own: synchronisation only; nothing when HMDSPT won.
    assert "cores" not in why_one_process_won([one, hmdspt], 3)[0]
    faster = RunResult("hmdspt", 2.0, 2.0, 0.95, [], 8, run_log=str(log))
    assert why_one_process_won([one, faster], 3, machine_cores=2) == []


def test_compare_shows_sub_second_runs_to_the_hundredth():
    """With one decimal, a small data set's in-process run read "0.0" s in every time
    column, as if it took no time, and ties hid which run was faster."""
    from hmdspt.compare import RunResult, format_table

    curve = [(0.02, 0.9), (0.043, 0.95)]
    fast = RunResult("bpnn-in-process", 0.043, 0.041, 0.95, curve, 3)
    slow = RunResult("hmdspt", 12.34, 11.0, 0.95, [(11.0, 0.95)], 3)
    rows = {line.split()[0]: line.split()[1:4] for line in format_table([fast, slow], 0.94)
            .splitlines()[2:]}  # fmt: skip
    assert rows == {"bpnn-in-process": ["0.04", "0.04", "0.04"], "hmdspt": ["12.3", "11.0", "11.0"]}


def test_compare_column_titles_stand_apart():
    """The titles "fastest idle %" and "efficiency" read as one: two spaces part them all."""
    from hmdspt.compare import RunResult, format_table

    run = RunResult("hmdspt", 1.5, 1.4, 0.95, [(1.4, 0.95)], 3)
    head = format_table([run], 0.94).splitlines()[1]
    titles = [t.strip() for t in head.split("  ") if t.strip()]
    assert titles == [
        "run", "wall s", "train s", "s to target", "fastest idle %", "efficiency",
        "final acc", "epochs", "bytes/round",
    ]  # fmt: skip


def test_the_synchronisation_a_round_pays_reads_in_the_singular_for_one_round():
    from hmdspt.core.prediction import sync_per_round

    assert sync_per_round(0.0094, 3) == "9 ms in each of 3 rounds an epoch"
    assert sync_per_round(0.04, 1, " of synchronisation") == (
        "40 ms of synchronisation in an epoch's one round"
    )

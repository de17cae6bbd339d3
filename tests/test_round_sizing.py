"""Rounds sized from measured costs: the pure choice, and a fit that follows it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits

from hmdspt import BPNNClassifier
from hmdspt.core.rounds import SYNC_BUDGET, size_rounds
from hmdspt.core.runlog import read_events


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
    # One step per round at most: every later epoch has one round per step of the largest
    # share; an overhead budget no round can meet: one round per epoch.
    for options, expect in (
        ({"max_local_steps": 1}, None),
        ({"sync_budget": 1e-9, "max_local_steps": 10_000}, 1),
    ):
        log = tmp_path / f"{len(options)}.jsonl"
        _fit(client, log, **options)
        events = read_events(log)
        sizes = {e["epoch"]: e for e in events if e["event"] == "round_size"}
        assert sorted(sizes) == [2, 3]
        per_epoch = _rounds_by_epoch(events)
        last_partition = [e for e in events if e["event"] == "partition"]
        for epoch, size in sizes.items():
            assert per_epoch[epoch] == size["rounds_per_epoch"], (epoch, size, per_epoch)
            if expect is None:
                rows = [p for p in last_partition if p["round"] < _first_round(events, epoch)]
                largest = max(rows[-1]["rows"].values())
                assert size["rounds_per_epoch"] == math.ceil(largest / 200)
            else:
                assert (size["rounds_per_epoch"], size["bound"]) == (expect, "epoch")
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

"""Tests of hmdspt.core.partition: apportioning, move plans and the rebalancing hysteresis."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmdspt.core.partition import (
    Move,
    RebalancePolicy,
    apply_moves,
    apportion,
    plan_moves,
    predicted_round_time,
    should_rebalance,
)

pytestmark = pytest.mark.heavy(7)  # property tests and fits that re-balance

# Scores spanning four orders of magnitude, as real worker speeds may.
score = st.floats(min_value=1e-2, max_value=1e2, allow_nan=False, allow_infinity=False)
score_lists = st.lists(score, min_size=1, max_size=12)
counts_lists = st.lists(st.integers(0, 10_000), min_size=1, max_size=12)


@st.composite
def apportion_case(draw):
    scores = draw(score_lists)
    min_rows = draw(st.integers(0, 20))
    n_rows = draw(st.integers(min_rows * len(scores), 100_000))
    return n_rows, scores, min_rows


@st.composite
def current_and_target(draw):
    """Two count vectors of equal length and equal sum."""
    current = draw(counts_lists)
    total = sum(current)
    # Random target with the same total: cut [0, total] at sorted points.
    cuts = sorted(
        draw(st.lists(st.integers(0, total), min_size=len(current) - 1, max_size=len(current) - 1))
    )
    bounds = [0, *cuts, total]
    target = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    return current, target


# ---------------------------------------------------------------------------------------
# apportion
# ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(apportion_case())
def test_apportion_conservation_minimum_determinism(case):
    n_rows, scores, min_rows = case
    counts = apportion(n_rows, scores, min_rows)
    assert counts.dtype == np.int64
    assert counts.shape == (len(scores),)
    assert counts.sum() == n_rows
    assert (counts >= min_rows).all()
    np.testing.assert_array_equal(counts, apportion(n_rows, scores, min_rows))
    # Same answer through a mapping, keys and order preserved.
    keys = [f"w{i}" for i in range(len(scores))]
    as_dict = apportion(n_rows, dict(zip(keys, scores)), min_rows)
    assert list(as_dict) == keys
    assert list(as_dict.values()) == counts.tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1_000_000), score_lists)
def test_apportion_within_one_row_of_quota(n_rows, scores):
    counts = apportion(n_rows, scores, min_rows=0)
    total = sum(Fraction(s) for s in scores)
    for n_i, s_i in zip(counts.tolist(), scores):
        quota = n_rows * Fraction(s_i) / total
        assert abs(n_i - quota) < 1


@settings(max_examples=300, deadline=None)
@given(apportion_case())
def test_apportion_with_minimum_is_proportional_among_the_rest(case):
    """No worker above the minimum holds a row too many compared with any other worker.

    Hamilton rounding of ``lam * s_i`` gives, for an unpinned worker i and any worker j,
    ``(n_i - 1) / s_i < lam < (n_j + 1) / s_j`` (pinned j: ``lam * s_j <= min_rows``).
    """
    n_rows, scores, min_rows = case
    counts = apportion(n_rows, scores, min_rows).tolist()
    fr = [Fraction(s) for s in scores]
    for i, n_i in enumerate(counts):
        if n_i <= min_rows:
            continue
        for j, n_j in enumerate(counts):
            assert (n_i - 1) * fr[j] < (n_j + 1) * fr[i]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), score_lists)
def test_apportion_when_minimum_does_not_bind_equals_plain(n_rows, scores):
    # A minimum at or below every quota pins no one, so it changes nothing.
    total = sum(Fraction(s) for s in scores)
    floor = math.floor(min(n_rows * Fraction(s) / total for s in scores))
    plain = apportion(n_rows, scores, min_rows=0)
    np.testing.assert_array_equal(apportion(n_rows, scores, min_rows=floor), plain)


@settings(max_examples=200, deadline=None)
@given(apportion_case())
def test_apportion_faster_worker_never_gets_fewer_rows(case):
    n_rows, scores, min_rows = case
    counts = apportion(n_rows, scores, min_rows)
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] > scores[j]:
                assert counts[i] >= counts[j]


def _apportion_by_fractions(n_rows, scores, min_rows):
    """Largest remainders with a floor in :class:`Fraction` arithmetic, written out: the
    reference whose rows, ties included, the scaled integers of ``apportion`` must give."""
    fr = [Fraction(s) for s in scores]
    bound = [False] * len(fr)
    while True:
        free = [i for i in range(len(fr)) if not bound[i]]
        n_free = n_rows - min_rows * (len(fr) - len(free))
        total = sum((fr[i] for i in free), Fraction(0))
        newly = [i for i in free if n_free * fr[i] < min_rows * total]
        if not newly:
            break
        for i in newly:
            bound[i] = True
    counts = [min_rows] * len(fr)
    remainders = []
    for i in free:
        quota = n_free * fr[i] / total
        counts[i] = math.floor(quota)
        remainders.append((quota - counts[i], i))
    remainders.sort(key=lambda r: (-r[0], r[1]))
    for _, i in remainders[: n_free - sum(counts[i] for i in free)]:
        counts[i] += 1
    return counts


# Few distinct speeds, so that remainders tie often.
tied_score_lists = st.lists(
    st.sampled_from([0.1, 0.5, 1.0, 1.5, 3.0, 1e-2]), min_size=1, max_size=12
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(score_lists, tied_score_lists), st.integers(0, 20), st.data())
def test_apportion_gives_the_rows_exact_rational_arithmetic_gives(scores, min_rows, data):
    n_rows = data.draw(st.integers(min_rows * len(scores), 100_000))
    expected = _apportion_by_fractions(n_rows, scores, min_rows)
    assert list(apportion(n_rows, scores, min_rows=min_rows)) == expected


def test_apportion_examples_and_ties_by_order():
    assert apportion(10, {"a": 4.0, "b": 2.0, "c": 1.0}) == {"a": 6, "b": 3, "c": 1}
    # Exact ties: the leftover rows go to the first workers.
    np.testing.assert_array_equal(apportion(11, [1.0] * 4), [3, 3, 3, 2])
    np.testing.assert_array_equal(apportion(2, [3.0, 3.0, 3.0], min_rows=0), [1, 1, 0])
    assert apportion(2, {"z": 3.0, "a": 3.0, "m": 3.0}, min_rows=0) == {"z": 1, "a": 1, "m": 0}
    # 0.1 + 0.2 + 0.7 is not 1.0 in floats; exact arithmetic still gives the exact quotas.
    np.testing.assert_array_equal(apportion(10, [0.1, 0.2, 0.7]), [1, 2, 7])


def test_apportion_minimum_pins_slow_workers_and_splits_the_rest():
    # Quotas 99.8, 0.1, 0.1: both slow workers are pinned at 5, the fast one takes 90.
    np.testing.assert_array_equal(apportion(100, [998.0, 1.0, 1.0], min_rows=5), [90, 5, 5])
    # Pinning cascades: after pinning the slowest, the next falls below the minimum too.
    np.testing.assert_array_equal(apportion(30, [100.0, 9.0, 1.0], min_rows=10), [10, 10, 10])
    np.testing.assert_array_equal(apportion(40, [100.0, 9.0, 1.0], min_rows=10), [20, 10, 10])
    # Exactly enough rows for the minimum.
    np.testing.assert_array_equal(apportion(6, [5.0, 1.0, 1.0], min_rows=2), [2, 2, 2])
    np.testing.assert_array_equal(apportion(0, [5.0, 1.0], min_rows=0), [0, 0])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_apportion_rejects_bad_scores(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        apportion(10, [1.0, bad])
    with pytest.raises(ValueError, match="finite and > 0"):
        apportion(10, {"a": 1.0, "b": bad})


def test_apportion_rejects_bad_arguments():
    with pytest.raises(ValueError, match="too few rows"):
        apportion(5, [1.0, 2.0, 3.0], min_rows=2)
    with pytest.raises(ValueError, match="at least one worker"):
        apportion(5, [])
    with pytest.raises(ValueError, match="at least one worker"):
        apportion(5, {})
    with pytest.raises(ValueError, match=">= 0"):
        apportion(-1, [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        apportion(5, [1.0], min_rows=-1)
    with pytest.raises(TypeError):
        apportion(5.0, [1.0])
    with pytest.raises(TypeError):
        apportion(5, ["fast"])
    with pytest.raises(ValueError, match="one-dimensional"):
        apportion(5, [[1.0, 2.0]])


# ---------------------------------------------------------------------------------------
# plan_moves / apply_moves
# ---------------------------------------------------------------------------------------


def _check_plan(current, target, moves):
    surplus = sum(max(0, c - t) for c, t in zip(current, target))
    assert sum(m.rows for m in moves) == surplus
    assert all(m.rows > 0 for m in moves)
    senders = {m.source for m in moves}
    receivers = {m.destination for m in moves}
    assert not senders & receivers
    n_send = sum(c > t for c, t in zip(current, target))
    n_recv = sum(t > c for c, t in zip(current, target))
    assert len(moves) <= max(0, n_send + n_recv - 1)
    np.testing.assert_array_equal(apply_moves(current, moves), target)


@settings(max_examples=300, deadline=None)
@given(current_and_target())
def test_plan_moves_conserves_and_is_minimal(case):
    current, target = case
    moves = plan_moves(current, target)
    _check_plan(current, target, moves)
    assert plan_moves(current, target) == moves
    # Also as numpy arrays.
    assert plan_moves(np.asarray(current), np.asarray(target)) == moves


@settings(max_examples=200, deadline=None)
@given(apportion_case(), st.lists(score, min_size=12, max_size=12))
def test_rebalancing_an_apportionment_keeps_constraints(case, new_scores):
    n_rows, scores, min_rows = case
    current = apportion(n_rows, scores, min_rows)
    target = apportion(n_rows, new_scores[: len(scores)], min_rows)
    moves = plan_moves(current, target)
    _check_plan(current.tolist(), target.tolist(), moves)


def _plan_moves_by_scanning(current, target):
    """The plan of ``plan_moves`` written out, scanning every worker at every step: the
    reference its index and heaps must reproduce move for move, ties included."""
    surplus = {i: c - t for i, (c, t) in enumerate(zip(current, target)) if c > t}
    deficit = {i: t - c for i, (c, t) in enumerate(zip(current, target)) if t > c}
    moves = []
    for s in list(surplus):
        for d in deficit:
            if deficit[d] == surplus[s]:
                moves.append(Move(s, d, surplus[s]))
                del surplus[s], deficit[d]
                break
    while surplus:
        s = max(surplus, key=surplus.__getitem__)
        d = max(deficit, key=deficit.__getitem__)
        rows = min(surplus[s], deficit[d])
        moves.append(Move(s, d, rows))
        for side, i in ((surplus, s), (deficit, d)):
            side[i] -= rows
            if side[i] == 0:
                del side[i]
    return moves


@st.composite
def small_counts_and_target(draw):
    """Counts of a few rows each, so that surpluses and deficits tie often."""
    current = draw(st.lists(st.integers(0, 12), min_size=1, max_size=30))
    target = list(current)
    for _ in range(draw(st.integers(0, 40))):
        i = draw(st.integers(0, len(target) - 1))
        j = draw(st.integers(0, len(target) - 1))
        if target[i]:
            target[i] -= 1
            target[j] += 1
    return current, target


@settings(max_examples=300, deadline=None)
@given(st.one_of(current_and_target(), small_counts_and_target()))
def test_plan_moves_gives_the_moves_of_scanning_every_worker(case):
    current, target = case
    assert plan_moves(current, target) == _plan_moves_by_scanning(current, target)


def test_plan_moves_examples():
    assert plan_moves([5, 5], [5, 5]) == []
    assert plan_moves([10, 0, 0], [4, 3, 3]) == [Move(0, 1, 3), Move(0, 2, 3)]
    # Exact match pass: greedy largest-to-largest alone would need 3 moves here.
    moves = plan_moves([7, 5, 0, 0], [0, 0, 5, 7])
    assert moves == [Move(0, 3, 7), Move(1, 2, 5)]


def test_plan_moves_worker_joins_and_leaves():
    current = {"a": 60, "b": 30, "c": 10}
    # "c" leaves (absent from target) and "d" joins (absent from current).
    target = {"a": 50, "b": 25, "d": 25}
    moves = plan_moves(current, target)
    assert sum(m.rows for m in moves) == 10 + 5 + 10
    assert {m.source for m in moves} == {"a", "b", "c"}
    assert {m.destination for m in moves} == {"d"}
    after = apply_moves(current, moves)
    assert after == {"a": 50, "b": 25, "c": 0, "d": 25}


def test_plan_moves_rejects_bad_input():
    with pytest.raises(ValueError, match="same number of rows"):
        plan_moves([5, 5], [5, 6])
    with pytest.raises(ValueError, match="same number of rows"):
        plan_moves({"a": 5}, {"b": 4})
    with pytest.raises(ValueError, match="different lengths"):
        plan_moves([5, 5], [10])
    with pytest.raises(ValueError, match=">= 0"):
        plan_moves([-1, 11], [5, 5])
    with pytest.raises(TypeError, match="both be mappings"):
        plan_moves({"a": 5}, [5])
    with pytest.raises(TypeError):
        plan_moves([5.5, 4.5], [5, 5])


def test_move_and_apply_moves_validate():
    with pytest.raises(ValueError):
        Move("a", "b", 0)
    with pytest.raises(ValueError):
        Move("a", "a", 3)
    with pytest.raises(ValueError, match="holds"):
        apply_moves({"a": 1, "b": 0}, [Move("a", "b", 2)])
    with pytest.raises(ValueError, match="outside"):
        apply_moves([1, 0], [Move(0, 2, 1)])
    with pytest.raises(AttributeError):
        Move("a", "b", 1).rows = 2  # frozen


# ---------------------------------------------------------------------------------------
# hysteresis
# ---------------------------------------------------------------------------------------


def test_predicted_round_time():
    assert predicted_round_time([40, 20, 10], [4.0, 2.0, 1.0]) == 10.0
    assert predicted_round_time([10, 10], [1.0, 2.0]) == 10.0
    assert predicted_round_time([0, 0], [1.0, 2.0]) == 0.0
    # Mapping: a joined worker without rows costs nothing; a departed one with rows never ends.
    assert predicted_round_time({"a": 10}, {"a": 2.0, "b": 1.0}) == 5.0
    assert predicted_round_time({"a": 10, "b": 3}, {"a": 2.0}) == math.inf
    assert predicted_round_time({"a": 10, "b": 0}, {"a": 2.0}) == 5.0
    with pytest.raises(ValueError, match="finite and > 0"):
        predicted_round_time([1, 1], [1.0, 0.0])


# Base speeds within a factor 10 and enough rows that one row of rounding is < 0.1 % of any
# share: the hysteresis margin then only has to absorb the score noise.
base_scores = st.lists(st.floats(1.0, 10.0), min_size=2, max_size=8)


@settings(max_examples=300, deadline=None)
@given(base_scores, st.integers(100_000, 1_000_000), st.data())
def test_small_score_noise_does_not_trigger_rebalancing(scores, n_rows, data):
    current = apportion(n_rows, scores)
    noise = data.draw(st.lists(st.floats(-0.02, 0.02), min_size=len(scores), max_size=len(scores)))
    noisy = [s * (1 + e) for s, e in zip(scores, noise)]
    assert not should_rebalance(current, noisy, threshold=0.05)
    assert RebalancePolicy(threshold=0.05).decide(current, noisy) is None


@settings(max_examples=300, deadline=None)
@given(base_scores, st.integers(100_000, 1_000_000), st.data())
def test_a_worker_twice_as_slow_triggers_rebalancing(scores, n_rows, data):
    current = apportion(n_rows, scores)
    j = data.draw(st.integers(0, len(scores) - 1))
    changed = list(scores)
    changed[j] /= 2
    assert should_rebalance(current, changed, threshold=0.05)
    moves = RebalancePolicy(threshold=0.05).decide(current, changed)
    assert moves
    after = apply_moves(current, moves)
    np.testing.assert_array_equal(after, apportion(n_rows, changed))
    assert all(m.source == j for m in moves)
    # Once rebalanced, the same scores ask for nothing more (no sloshing).
    assert RebalancePolicy(threshold=0.05).decide(after, changed) is None


def test_a_worker_twice_as_fast_triggers_rebalancing():
    current = apportion(100_000, [1.0, 1.0, 1.0, 1.0])
    # Round time drops from 25_000 to 20_000: a 20 % gain.
    assert should_rebalance(current, [2.0, 1.0, 1.0, 1.0])
    # A 2x gain on a worker carrying 1/41 of the load is worth ~2.4 %: not enough.
    current = apportion(100_000, [1.0, 10.0, 10.0, 10.0, 10.0])
    assert not should_rebalance(current, [2.0, 10.0, 10.0, 10.0, 10.0])
    assert should_rebalance(current, [2.0, 10.0, 10.0, 10.0, 10.0], threshold=0.0)


def test_policy_handles_worker_joining_and_leaving():
    policy = RebalancePolicy(threshold=0.05, min_rows=1)
    current = {"a": 500, "b": 500}
    # A joining worker holds nothing yet; even a slow one is forced in to its share.
    moves = policy.decide(current, {"a": 1.0, "b": 1.0, "c": 0.02})
    assert moves is not None
    after = apply_moves(current, moves)
    assert after == apportion(1000, {"a": 1.0, "b": 1.0, "c": 0.02})
    assert {m.destination for m in moves} == {"c"}
    # A leaving worker (no score) must hand over all its rows, whatever the threshold.
    policy = RebalancePolicy(threshold=0.9)
    current = {"a": 400, "b": 300, "c": 300}
    moves = policy.decide(current, {"a": 1.0, "b": 1.0})
    assert moves is not None
    after = apply_moves(current, moves)
    assert after == {"a": 500, "b": 500, "c": 0}
    assert {m.source for m in moves} == {"c"}
    assert should_rebalance(current, {"a": 1.0, "b": 1.0}, threshold=0.9)


def test_hysteresis_rejects_bad_input():
    with pytest.raises(ValueError, match="threshold"):
        should_rebalance([5, 5], [1.0, 1.0], threshold=1.5)
    with pytest.raises(ValueError, match="threshold"):
        RebalancePolicy(threshold=-0.1)
    with pytest.raises(ValueError, match="finite and > 0"):
        should_rebalance([5, 5], [1.0, math.nan])
    with pytest.raises(ValueError, match="too few rows"):
        should_rebalance([1, 1], [1.0, 1.0, 1.0], min_rows=1)
    with pytest.raises(ValueError, match="different lengths"):
        RebalancePolicy().decide([5, 5], [1.0, 1.0, 1.0])

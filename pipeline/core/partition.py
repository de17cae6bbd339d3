"""Proportional partitioning of rows over workers and minimal move plans (pure numpy).

HMDSPT gives each worker a shard whose size follows its measured speed, so that all
workers finish a round at nearly the same time. This module answers three questions,
without touching Dask:

- :func:`apportion` -- how many rows should each worker hold, given its score (rows per
  second)? Largest-remainder (Hamilton) rounding with a per-worker minimum.
- :func:`plan_moves` -- which worker-to-worker transfers turn the current counts into the
  target counts while moving as few rows as possible?
- :func:`should_rebalance` / :class:`RebalancePolicy` -- is a new plan worth it? Scores are
  noisy measurements; without hysteresis every round would shuffle a few rows back and
  forth and pay the transfer for nothing.

Workers are named either by the keys of a mapping (``{"tcp://10.0.0.1:4001": 812.5, ...}``)
or by their position in a sequence. A mapping in gives a mapping out with the same keys in
the same order; a sequence in gives an ``int64`` ndarray (or integer indices in a
:class:`Move`).
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "Move",
    "RebalancePolicy",
    "apply_moves",
    "apportion",
    "fitting_workers",
    "plan_moves",
    "predicted_round_time",
    "rows_rebuilt",
    "should_rebalance",
]

# Scores or row counts per worker: keyed by worker, or by position.
Scores = Mapping[Hashable, float] | Sequence[float] | np.ndarray
Counts = Mapping[Hashable, int] | Sequence[int] | np.ndarray


@dataclass(frozen=True)
class Move:
    """Transfer of ``rows`` rows from worker ``source`` to worker ``destination``.

    Parameters
    ----------
    source : hashable
        The sending worker: a mapping key, or an integer index for sequence inputs.
    destination : hashable
        The receiving worker, named like ``source``.
    rows : int
        Number of rows to transfer, strictly positive.
    """

    source: Hashable
    destination: Hashable
    rows: int

    def __post_init__(self) -> None:
        if not isinstance(self.rows, numbers.Integral) or self.rows <= 0:
            raise ValueError(f"Move.rows must be a positive integer, got {self.rows!r}")
        if self.source == self.destination:
            raise ValueError(f"Move from worker {self.source!r} to itself")


# ---------------------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------------------


def _split(values, what: str) -> tuple[list | None, list]:
    """Split a mapping into (keys, values) or a sequence into (None, values)."""
    if isinstance(values, Mapping):
        return list(values.keys()), list(values.values())
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a mapping or a sequence of numbers, got a string")
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    return None, arr.tolist()


def _check_scores(values: list, what: str = "scores") -> list[float]:
    """Scores as floats; each must be finite and strictly positive."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{what}[{i}] must be a real number, got {v!r}")
        f = float(v)
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"{what} must be finite and > 0, got {f!r} at position {i}")
        out.append(f)
    return out


def _check_count(v, what: str) -> int:
    """A row count: a non-negative integer (integral floats are refused on purpose)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {v!r}")
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v!r}")
    return int(v)


def _check_counts(values: list, what: str) -> list[int]:
    return [_check_count(v, f"{what}[{i}]") for i, v in enumerate(values)]


def _aligned_counts(current: Counts, target: Counts) -> tuple[list | None, list[int], list[int]]:
    """Bring two count collections onto one list of workers.

    For mappings the workers are the union of the keys, ``current``'s order first; a worker
    missing on one side has count 0 there (joining or leaving). Sequences must have equal
    length.
    """
    cur_keys, cur_vals = _split(current, "current")
    tgt_keys, tgt_vals = _split(target, "target")
    if (cur_keys is None) != (tgt_keys is None):
        raise TypeError("current and target must both be mappings or both be sequences")
    cur_vals = _check_counts(cur_vals, "current")
    tgt_vals = _check_counts(tgt_vals, "target")
    if cur_keys is None:
        if len(cur_vals) != len(tgt_vals):
            raise ValueError(
                f"current and target have different lengths ({len(cur_vals)} and "
                f"{len(tgt_vals)}); use mappings to express joining or leaving workers"
            )
        return None, cur_vals, tgt_vals
    cur = dict(zip(cur_keys, cur_vals))
    tgt = dict(zip(tgt_keys, tgt_vals))
    keys = list(cur_keys) + [k for k in tgt_keys if k not in cur]
    return keys, [cur.get(k, 0) for k in keys], [tgt.get(k, 0) for k in keys]


# ---------------------------------------------------------------------------------------
# apportioning
# ---------------------------------------------------------------------------------------


def _apportion_list(n_rows: int, scores: list[float], min_rows: int) -> list[int]:
    """Largest-remainder apportionment with a floor, in exact integer arithmetic.

    Floats are exact binary fractions, so scaled by one power of two they are exact integers
    with the same ratios: a float rounding error can never cost a worker a row, and
    remainders that are mathematically tied are tied here too, so the tie-break by position
    is the only thing that decides them. (Integers rather than :class:`~fractions.Fraction`:
    the simulator apportions thousands of workers every round.)
    """
    n_workers = len(scores)
    fractions = [Fraction(s) for s in scores]
    scale = max(f.denominator for f in fractions)  # a power of two: every denominator divides it
    weight = [f.numerator * (scale // f.denominator) for f in fractions]
    bound = [False] * n_workers
    # Water-filling: find lambda with sum_i max(min_rows, lambda * s_i) == n_rows. Workers
    # whose proportional quota falls below the minimum are pinned at it; that lowers the
    # quota of the others, which may pin more. Lambda only decreases, so this terminates in
    # at most n_workers passes, and the result does not depend on the order of pinning.
    while True:
        free = [i for i in range(n_workers) if not bound[i]]
        n_free = n_rows - min_rows * (n_workers - len(free))
        total = sum(weight[i] for i in free)
        newly = [i for i in free if n_free * weight[i] < min_rows * total]
        if not newly:
            break
        for i in newly:
            bound[i] = True
    # n_rows >= min_rows * n_workers guarantees a free worker remains (the pinned quotas sum
    # to less than their minimums, so the free ones must hold the excess).
    assert free, "apportion: no unpinned worker left"

    counts = [min_rows] * n_workers
    remainders = []
    for i in free:
        # The quota n_free * w_i / total, as its floor and its remainder over ``total``.
        fl, remainder = divmod(n_free * weight[i], total)
        # fl >= min_rows because the quota >= min_rows for an unpinned worker and min_rows
        # is an integer; so Hamilton rounding never breaks the minimum.
        counts[i] = fl
        remainders.append((remainder, i))
    leftover = n_free - sum(counts[i] for i in free)
    # Largest remainder first; equal remainders go to the earlier worker.
    remainders.sort(key=lambda r: (-r[0], r[1]))
    for _, i in remainders[:leftover]:
        counts[i] += 1
    return counts


def apportion(
    n_rows: int,
    scores: Mapping[Hashable, float] | Sequence[float] | np.ndarray,
    min_rows: int = 1,
) -> dict[Hashable, int] | np.ndarray:
    """Split ``n_rows`` rows over workers in proportion to their scores.

    Rows are apportioned by the largest-remainder (Hamilton) method: every worker gets the
    integer part of its quota ``n_rows * s_i / sum(s)``, and the rows left over go one each
    to the workers with the largest fractional parts. Equal fractional parts go to the
    worker that comes first (mapping order or position), so the result is deterministic.

    With a per-worker minimum, a worker whose quota is below ``min_rows`` gets exactly
    ``min_rows`` and the remaining rows are apportioned among the other workers in
    proportion to their scores (repeated until no further worker falls below the minimum,
    i.e. "water-filling"). Formally, there is a ``lam > 0`` such that every worker at the
    minimum has ``lam * s_i <= min_rows`` and every other worker holds ``floor`` or
    ``ceil`` of ``lam * s_i``; when the minimum does not bind, ``lam = n_rows / sum(s)``
    and ``|n_i - n_rows * s_i / sum(s)| < 1``.

    Parameters
    ----------
    n_rows : int
        Total number of rows to distribute, ``>= 0``.
    scores : mapping of worker to float, or sequence of float
        Speed score of each worker (e.g. rows per second). Every score must be finite and
        strictly positive; a worker that should get no rows must be left out.
    min_rows : int, default=1
        Minimum number of rows per worker, ``>= 0``. Keeping it at least 1 keeps every
        worker in the round, so its speed keeps being measured.

    Returns
    -------
    counts : dict or ndarray of int64
        Rows per worker, summing to ``n_rows``. A dict with the keys of ``scores`` in the
        same order if ``scores`` is a mapping, else an ``int64`` array of ``len(scores)``.

    Raises
    ------
    ValueError
        If there are no workers, a score is not finite or not positive, ``n_rows`` or
        ``min_rows`` is negative, or ``n_rows < min_rows * n_workers`` (too few rows to give
        every worker its minimum).
    TypeError
        If ``n_rows``, ``min_rows`` or a score is not a number of the right kind.

    Examples
    --------
    >>> apportion(10, {"a": 4.0, "b": 2.0, "c": 1.0})
    {'a': 6, 'b': 3, 'c': 1}
    >>> apportion(10, [1.0, 1.0, 1.0])
    array([4, 3, 3])
    >>> apportion(100, [1000.0, 1.0], min_rows=5)
    array([95,  5])
    """
    n_rows = _check_count(n_rows, "n_rows")
    min_rows = _check_count(min_rows, "min_rows")
    keys, values = _split(scores, "scores")
    values = _check_scores(values)
    if not values:
        raise ValueError("apportion needs at least one worker (scores is empty)")
    if n_rows < min_rows * len(values):
        raise ValueError(
            f"too few rows: n_rows={n_rows} cannot give each of {len(values)} workers "
            f"min_rows={min_rows} (needs at least {min_rows * len(values)})"
        )
    counts = _apportion_list(n_rows, values, min_rows)
    if keys is None:
        return np.asarray(counts, dtype=np.int64)
    return dict(zip(keys, counts))


def fitting_workers(
    n_rows: int, scores: Mapping[Hashable, float], min_rows: int = 1
) -> dict[Hashable, float]:
    """The fastest workers that can each hold ``min_rows`` of ``n_rows`` rows.

    All of them when there are rows enough (``n_rows >= min_rows * len(scores)``), else
    the ``n_rows // min_rows`` with the highest scores (equal scores: the earlier
    worker); the others are to hold no rows. The result can be passed to
    :func:`apportion` with the same ``min_rows``.

    Parameters
    ----------
    n_rows : int
        Rows to share, ``>= 0``.
    scores : mapping of worker to float
        Speed score of each worker, finite and > 0.
    min_rows : int, default=1
        Fewest rows a worker that holds any must hold.

    Returns
    -------
    scores : dict
        The chosen workers' scores, in the order of ``scores``.

    Raises
    ------
    ValueError
        No worker at all, or too few rows to give even one worker ``min_rows``.

    Examples
    --------
    >>> fitting_workers(2, {"a": 1.0, "b": 3.0, "c": 2.0})
    {'b': 3.0, 'c': 2.0}
    """
    n_rows = _check_count(n_rows, "n_rows")
    min_rows = _check_count(min_rows, "min_rows")
    if not isinstance(scores, Mapping):
        raise TypeError(f"scores must be a mapping of worker to score, got {type(scores)}")
    values = dict(zip(scores, _check_scores(list(scores.values()))))
    if not values:
        raise ValueError("fitting_workers needs at least one worker (scores is empty)")
    if not min_rows or n_rows >= min_rows * len(values):
        return values
    room = n_rows // min_rows
    if room == 0:
        raise ValueError(
            f"too few rows: n_rows={n_rows} cannot give even one worker min_rows={min_rows}"
        )
    order = list(values)
    fastest = set(sorted(range(len(order)), key=lambda i: (-values[order[i]], i))[:room])
    return {w: values[w] for i, w in enumerate(order) if i in fastest}


# ---------------------------------------------------------------------------------------
# move plans
# ---------------------------------------------------------------------------------------


def plan_moves(
    current: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    target: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
) -> list[Move]:
    """Worker-to-worker transfers that turn ``current`` row counts into ``target``.

    Only workers with a surplus (``current > target``) send and only workers with a
    deficit receive, each exactly its surplus or deficit. No row is therefore moved twice,
    and the total moved is ``sum(max(0, current_i - target_i))``, the least possible.

    The number of moves is kept small, not minimal (finding the minimum is a partition
    problem, NP-hard in general): first every surplus that exactly equals some deficit is
    paired off in one move (e.g. a leaving worker whose rows all go to one joining worker),
    then the largest remaining surplus repeatedly sends to the largest remaining deficit.
    Each greedy step zeroes at least one side, so there are at most
    ``n_senders + n_receivers - 1`` moves. Ties are broken by worker order, so the plan
    is deterministic.

    Parameters
    ----------
    current : mapping of worker to int, or sequence of int
        Rows each worker holds now.
    target : mapping of worker to int, or sequence of int
        Rows each worker should hold. For mappings a worker present only in ``target`` has
        ``current`` 0 (it joins), one present only in ``current`` has ``target`` 0 (it
        leaves). Sequences must have the same length.

    Returns
    -------
    moves : list of Move
        Transfers in the order they were planned. Sources and destinations are mapping
        keys, or integer positions for sequences. Empty if ``current == target``.

    Raises
    ------
    ValueError
        If ``sum(current) != sum(target)``, a count is negative, or sequences differ in
        length.
    TypeError
        If one argument is a mapping and the other a sequence, or a count is not an integer.

    Examples
    --------
    >>> plan_moves({"a": 5, "b": 5}, {"a": 7, "b": 2, "c": 1})
    [Move(source='b', destination='a', rows=2), Move(source='b', destination='c', rows=1)]
    """
    keys, cur, tgt = _aligned_counts(current, target)
    if sum(cur) != sum(tgt):
        raise ValueError(
            f"current and target must hold the same number of rows, got "
            f"sum(current)={sum(cur)} and sum(target)={sum(tgt)}"
        )
    surplus = {i: c - t for i, (c, t) in enumerate(zip(cur, tgt)) if c > t}
    deficit = {i: t - c for i, (c, t) in enumerate(zip(cur, tgt)) if t > c}
    moves: list[tuple[int, int, int]] = []

    # Pass 1: exact matches, one move settles two workers; each surplus takes the first
    # worker (in worker order) still without a match whose deficit equals it.
    by_deficit: dict[int, list[int]] = {}
    for d in reversed(list(deficit)):
        by_deficit.setdefault(deficit[d], []).append(d)  # the earliest worker last
    for s in list(surplus):
        matches = by_deficit.get(surplus[s])
        if matches:
            d = matches.pop()
            moves.append((s, d, surplus[s]))
            del surplus[s], deficit[d]

    # Pass 2: largest surplus to largest deficit, ties to the earlier worker. Heaps of
    # (-rows, worker) whose stale entries (rows since sent or received) are skipped: a plan
    # for thousands of workers would otherwise scan them all at every move.
    surplus_heap = [(-rows, i) for i, rows in surplus.items()]
    deficit_heap = [(-rows, i) for i, rows in deficit.items()]
    heapq.heapify(surplus_heap)
    heapq.heapify(deficit_heap)
    while surplus:
        s = _largest(surplus_heap, surplus)
        d = _largest(deficit_heap, deficit)
        rows = min(surplus[s], deficit[d])
        moves.append((s, d, rows))
        for side, heap, i in ((surplus, surplus_heap, s), (deficit, deficit_heap, d)):
            side[i] -= rows
            if side[i] == 0:
                del side[i]
            else:
                heapq.heappush(heap, (-side[i], i))

    def name(i: int) -> Hashable:
        return i if keys is None else keys[i]

    return [Move(name(s), name(d), rows) for s, d, rows in moves]


def _largest(heap: list[tuple[int, int]], rows: Mapping[int, int]) -> int:
    """The worker with the most ``rows`` (the earliest of equals), from a heap that may hold
    stale entries; a worker's rows only fall, so a stale entry is one whose rows differ."""
    while True:
        negative_rows, i = heap[0]
        if rows.get(i) == -negative_rows:
            return i
        heapq.heappop(heap)


def apply_moves(
    current: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    moves: Sequence[Move],
) -> dict[Hashable, int] | np.ndarray:
    """Row counts after carrying out ``moves`` on ``current``.

    Parameters
    ----------
    current : mapping of worker to int, or sequence of int
        Rows each worker holds now.
    moves : sequence of Move
        Transfers, e.g. from :func:`plan_moves`.

    Returns
    -------
    counts : dict or ndarray of int64
        For a mapping, a new dict: ``current``'s keys first, then any destination that was
        not in it; workers left with 0 rows are kept (the caller decides whether a worker
        with no rows is gone). For a sequence, an ``int64`` array.

    Raises
    ------
    ValueError
        If a move sends more rows than its source holds at that point, or names a worker
        outside a sequence's range.
    """
    keys, values = _split(current, "current")
    values = _check_counts(values, "current")
    counts: dict = dict(zip(keys, values)) if keys is not None else dict(enumerate(values))
    for m in moves:
        if keys is None:
            for w in (m.source, m.destination):
                if w not in counts:
                    raise ValueError(f"move names worker {w!r}, outside 0..{len(values) - 1}")
        have = counts.get(m.source, 0)
        if m.rows > have:
            raise ValueError(f"move {m} sends {m.rows} rows but {m.source!r} holds {have}")
        counts[m.source] = have - m.rows
        counts[m.destination] = counts.get(m.destination, 0) + m.rows
    if keys is None:
        return np.asarray([counts[i] for i in range(len(values))], dtype=np.int64)
    return counts


def rows_rebuilt(
    current: Mapping[Hashable, int] | Sequence[int] | np.ndarray, moves: Sequence[Move]
) -> int:
    """Rows of the shards that carrying out ``moves`` rebuilds: every sender's and every
    receiver's rows after the moves.

    A re-balance concatenates each receiver's old rows with the ones it gets, so its time
    follows the size of those shards more than the rows moved: on the testbed, when senders
    still copied their kept rows, a move of 13,057 rows between shards of 215k, 499k and 886k
    rows took 0.98 s, as long as staging all 1.6M rows (0.96 s). A staging rebuilds every row
    it stages. A sender keeps its rows in place (views), yet its rows are counted too: priced
    by the receivers' rows alone, re-balances followed the testbed's swinging speeds more
    often and the fits were no shorter (docs/design.md, "Re-balancing that pays").

    Parameters
    ----------
    current : mapping of worker to int, or sequence of int
        Rows each worker holds before the moves.
    moves : sequence of Move
        The moves, e.g. from :func:`plan_moves`.

    Returns
    -------
    rows : int
        The rows the touched workers hold after the moves (0 for no move of any row).

    Examples
    --------
    >>> rows_rebuilt({"a": 600, "b": 300, "c": 100}, [Move("c", "a", 50)])
    700
    """
    moving = [m for m in moves if m.rows]
    after = apply_moves(current, moving)
    touched = {w for m in moving for w in (m.source, m.destination)}
    return int(sum(int(after[w]) for w in touched))


# ---------------------------------------------------------------------------------------
# hysteresis
# ---------------------------------------------------------------------------------------


def _aligned_counts_scores(
    counts: Counts, scores: Scores
) -> tuple[list | None, list[int], list[float | None]]:
    """Counts and scores on one list of workers; a worker without a score gets None."""
    c_keys, c_vals = _split(counts, "counts")
    s_keys, s_vals = _split(scores, "scores")
    if (c_keys is None) != (s_keys is None):
        raise TypeError("counts and scores must both be mappings or both be sequences")
    c_vals = _check_counts(c_vals, "counts")
    s_vals = _check_scores(s_vals)
    if c_keys is None:
        if len(c_vals) != len(s_vals):
            raise ValueError(
                f"counts and scores have different lengths ({len(c_vals)} and {len(s_vals)})"
            )
        return None, c_vals, list(s_vals)
    c = dict(zip(c_keys, c_vals))
    s = dict(zip(s_keys, s_vals))
    keys = list(c_keys) + [k for k in s_keys if k not in c]
    return keys, [c.get(k, 0) for k in keys], [s.get(k) for k in keys]


def predicted_round_time(
    counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    scores: Mapping[Hashable, float] | Sequence[float] | np.ndarray,
) -> float:
    """Predicted compute time of a synchronous round: ``max_i counts_i / scores_i``.

    The round ends when its slowest worker ends, so with ``scores`` in rows per second
    this is the round's wall time up to communication and the constant factor of epochs
    per round (which cancels in the relative comparisons of :func:`should_rebalance`).

    Parameters
    ----------
    counts : mapping of worker to int, or sequence of int
        Rows per worker.
    scores : mapping of worker to float, or sequence of float
        Speed per worker, finite and > 0. For mappings a worker with a score but no count
        holds 0 rows; a worker holding rows without a score (e.g. it has left) makes the
        time infinite, since its rows would never be processed.

    Returns
    -------
    time : float
        ``max_i counts_i / scores_i``; 0.0 if no worker holds rows.
    """
    _, c, s = _aligned_counts_scores(counts, scores)
    t = 0.0
    for ci, si in zip(c, s):
        if ci == 0:
            continue
        if si is None:
            return math.inf
        t = max(t, ci / si)
    return t


def _check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"threshold must be a real number, got {threshold!r}")
    threshold = float(threshold)
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold must be in [0, 1), got {threshold!r}")
    return threshold


def _needs_rebalance(
    current: Counts, target: Counts, scores: Scores, threshold: float, min_rows: int
) -> bool:
    """Core of :func:`should_rebalance` once the target is known."""
    keys, c, s = _aligned_counts_scores(current, scores)
    # Forced: a worker without a score holds rows (it left), or a scored worker holds fewer
    # than the minimum (it joined). These are correctness, not speed, so no hysteresis.
    for ci, si in zip(c, s):
        if (si is None and ci > 0) or (si is not None and ci < min_rows):
            return True
    t_now = predicted_round_time(current, scores)
    if t_now == 0.0:
        return False
    t_new = predicted_round_time(target, scores)
    return (t_now - t_new) > threshold * t_now


def should_rebalance(
    current_counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    scores: Mapping[Hashable, float] | Sequence[float] | np.ndarray,
    threshold: float = 0.05,
    min_rows: int = 1,
) -> bool:
    """Whether re-partitioning by the new ``scores`` is worth moving rows (hysteresis).

    The target is ``apportion(sum(current_counts), scores, min_rows)``. Rebalancing is
    advised only if it shortens the predicted round time by more than ``threshold``,
    relative to the current layout::

        (T(current) - T(target)) / T(current) > threshold,  T = predicted_round_time

    Scores are measurements and fluctuate from round to round. Without this dead band,
    every fluctuation would produce a slightly different target, a few rows would move
    each round, and the next fluctuation would move them back. With it, rows only move when
    the gain is real: with ``threshold=0.05``, score noise of about +/-2 % (which can make
    the current layout look at most ~4 % slower than ideal) never triggers a move, whereas
    a worker that becomes twice as slow (the round time nearly doubles) always does.

    Two cases rebalance regardless of the threshold, because they are about correctness
    rather than speed: a worker that holds rows but has no score (it left the cluster),
    and a scored worker holding fewer than ``min_rows`` rows (typically one that just
    joined with none). Only mappings can express these; for sequences the second case
    applies.

    Parameters
    ----------
    current_counts : mapping of worker to int, or sequence of int
        Rows each worker holds now.
    scores : mapping of worker to float, or sequence of float
        Current speed estimate per worker, finite and > 0. The workers in ``scores`` are
        the ones that should hold rows after a rebalance.
    threshold : float, default=0.05
        Minimum relative improvement of the predicted round time, in ``[0, 1)``. 0 means
        rebalance on any strict improvement.
    min_rows : int, default=1
        Per-worker minimum passed to :func:`apportion`.

    Returns
    -------
    rebalance : bool
        True if the rows should be moved to the new target.

    Raises
    ------
    ValueError
        On invalid scores or counts, a threshold outside ``[0, 1)``, or too few rows for
        ``min_rows`` per worker.
    """
    threshold = _check_threshold(threshold)
    _, values = _split(current_counts, "current_counts")
    total = sum(_check_counts(values, "current_counts"))
    target = apportion(total, scores, min_rows)
    return _needs_rebalance(current_counts, target, scores, threshold, min_rows)


@dataclass(frozen=True)
class RebalancePolicy:
    """Between-round decision: apportion by score, apply hysteresis, plan the moves.

    Parameters
    ----------
    threshold : float, default=0.05
        Minimum relative improvement of the predicted round time that justifies moving
        rows; see :func:`should_rebalance`.
    min_rows : int, default=1
        Minimum rows per worker; see :func:`apportion`.

    Examples
    --------
    >>> policy = RebalancePolicy(threshold=0.05)
    >>> policy.decide({"a": 50, "b": 50}, {"a": 1.0, "b": 1.01}) is None
    True
    >>> policy.decide({"a": 50, "b": 50}, {"a": 1.0, "b": 3.0})
    [Move(source='a', destination='b', rows=25)]
    """

    threshold: float = 0.05
    min_rows: int = 1

    def __post_init__(self) -> None:
        _check_threshold(self.threshold)
        _check_count(self.min_rows, "min_rows")

    def target(
        self,
        current: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
        scores: Mapping[Hashable, float] | Sequence[float] | np.ndarray,
    ) -> dict[Hashable, int] | np.ndarray:
        """Proportional target for the rows in ``current`` (ignores hysteresis)."""
        _, values = _split(current, "current")
        return apportion(sum(_check_counts(values, "current")), scores, self.min_rows)

    def decide(
        self,
        current: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
        scores: Mapping[Hashable, float] | Sequence[float] | np.ndarray,
    ) -> list[Move] | None:
        """Moves to carry out before the next round, or None to keep the layout.

        Parameters
        ----------
        current : mapping of worker to int, or sequence of int
            Rows each worker holds now (workers that left included, if they hold rows).
        scores : mapping of worker to float, or sequence of float
            Speed estimate of every worker that should hold rows.

        Returns
        -------
        moves : list of Move or None
            None if the predicted gain is within the threshold (and nothing forces a move);
            otherwise the plan of :func:`plan_moves` from ``current`` to the target.
        """
        target = self.target(current, scores)
        if not _needs_rebalance(current, target, scores, self.threshold, self.min_rows):
            return None
        return plan_moves(current, target)

"""A cost model of each worker's round, and the row shares that make rounds finish together.

A worker's busy time in a round is modelled as ``fixed_s + rows / speed``: a cost it pays
whatever its share (task start, deserialising ``w_t``, optimizer set-up) plus a cost per
row. Its communication (sending ``w_t``, fetching its delta) is a separate per-round term.
Dividing rows by busy time instead, as a plain speed estimate does, makes a small share look
slow (its busy time is mostly the fixed cost), so it is given fewer rows and looks slower
still; here the speed is the slope of busy time against rows, which does not depend on how
many rows the worker was given.

:class:`RoundCostModel` fits ``fixed_s`` and ``1 / speed`` per worker by exponentially
weighted least squares over measurement windows, with their uncertainty; rounds shorter
than ``min_window_s`` are added up until the window is long enough, so that a window spans
several periods of the OS's CPU scheduler (a round shorter than one period can run a
throttled worker at full speed in one burst). :func:`balanced_shares` solves for the shares
with equal predicted finish times, fixed costs and communication included.

:class:`MoveCost` predicts what a re-balance costs, from the stagings and re-balances
measured and the rows of the shards it rebuilds, so that rows move only when the predicted
saving over the rest of the fit exceeds it (:meth:`hmdspt.core.strategies.PartitionPolicy.plan`).

Everything here is numpy and arithmetic: no Dask. See ``docs/design.md``, "Round cost
model".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hmdspt.core.partition import apportion

__all__ = ["MAX_SPEED_OVER_NAIVE", "MoveCost", "RoundCostModel", "WorkerCost", "balanced_shares"]

# The most speed a fit may credit a worker with beyond its plain rows / busy seconds.
MAX_SPEED_OVER_NAIVE = 4.0
# Busy seconds below which a window tells nothing (below any timer's resolution).
MIN_BUSY_S = 1e-7
# Rows per round must differ this much between windows before a fixed cost is fitted.
MIN_SIZE_SPREAD = 1.05


def balanced_shares(
    n_rows: int,
    speeds: Mapping[Hashable, float],
    fixed_s: Mapping[Hashable, float],
    min_rows: int = 1,
) -> tuple[dict[Hashable, int], float]:
    """Rows per worker such that every worker's predicted round ends at the same time.

    Worker ``i`` is predicted to take ``fixed_s[i] + n_i / speeds[i]``; the shares solve
    ``fixed_s[i] + n_i / speeds[i] = T`` for all ``i`` with ``sum(n_i) == n_rows``, so
    ``T = (n_rows + sum(speeds * fixed_s)) / sum(speeds)``. A worker whose fixed cost alone
    is about ``T`` or more cannot shorten the round: it is held at ``min_rows`` (water-
    filling: its rows are taken out and ``T`` solved again for the others).

    Parameters
    ----------
    n_rows : int
        Rows to share, ``>= min_rows * len(speeds)``.
    speeds : mapping of worker to float
        Rows per second of each worker's per-row cost, finite and > 0.
    fixed_s : mapping of worker to float
        Seconds each worker spends per round whatever its share (fixed cost plus its
        communication), finite and >= 0; a worker missing here has none.
    min_rows : int, default=1
        Rows every worker keeps, so that it stays in the round and keeps being measured.

    Returns
    -------
    counts : dict
        Rows per worker, in the order of ``speeds``, summing to ``n_rows``. Workers not at
        the minimum hold ``floor`` or ``ceil`` of their real-valued share.
    finish_s : float
        The predicted finish time ``T`` of the workers above the minimum.

    Examples
    --------
    >>> counts, t = balanced_shares(1000, {"a": 1000.0, "b": 1000.0}, {"a": 0.0, "b": 0.1})
    >>> counts, round(t, 3)
    ({'a': 550, 'b': 450}, 0.55)
    """
    workers = list(speeds)
    if not workers:
        raise ValueError("balanced_shares needs at least one worker (speeds is empty)")
    v = {w: float(speeds[w]) for w in workers}
    f = {w: float(fixed_s.get(w, 0.0)) for w in workers}
    for w in workers:
        if not (math.isfinite(v[w]) and v[w] > 0):
            raise ValueError(f"speed of {w!r} must be a positive finite number, got {v[w]!r}")
        if not (math.isfinite(f[w]) and f[w] >= 0):
            raise ValueError(f"fixed cost of {w!r} must be a finite number >= 0, got {f[w]!r}")
    if n_rows < min_rows * len(workers):
        raise ValueError(
            f"too few rows: n_rows={n_rows} cannot give each of {len(workers)} workers "
            f"min_rows={min_rows}"
        )
    pinned: set[Hashable] = set()
    while True:
        free = [w for w in workers if w not in pinned]
        n_free = n_rows - min_rows * len(pinned)
        finish = (n_free + sum(v[w] * f[w] for w in free)) / sum(v[w] for w in free)
        # Pinning lowers the rows left for the others, so T only falls: a pass per worker.
        quota = {w: v[w] * (finish - f[w]) for w in free}
        newly = [w for w in free if not quota[w] >= max(min_rows, 1e-12)]
        if len(newly) == len(free):  # no rows above the minimum to share: one takes them
            newly.remove(max(free, key=quota.__getitem__))
        if not newly:
            break
        pinned.update(newly)
    counts = dict.fromkeys(workers, min_rows)
    if len(free) == 1:
        counts[free[0]] = n_free
    else:
        counts.update(apportion(n_free, quota, min_rows=min_rows))
    return counts, finish


@dataclass
class WorkerCost:
    """One worker's weighted fit of ``busy = rounds * fixed + rows / speed``.

    Attributes
    ----------
    xtx : ndarray of shape (2, 2)
        Weighted ``sum x x^T`` over windows, ``x = (rounds, rows)`` (the information).
    xty : ndarray of shape (2,)
        Weighted ``sum x * busy``.
    rel_var : float
        Exponentially weighted squared relative residual of the windows after their fit.
    n_eff : float
        Weighted number of windows (each window counts 1, then fades).
    window : list of float
        The window being filled: rounds, rows, busy seconds, wall seconds of its rounds.
    comm_s : float
        Exponentially weighted communication seconds per round (nan before any).
    n_windows : int
        Windows fitted so far.
    round_sizes : list of float
        Fewest and most rows per round among the fitted windows (probes aside).
    shifted : list of tuple
        Consecutive recent windows far off the fit on the same side (a candidate change
        of speed, see :class:`RoundCostModel`).
    least_busy_s : float
        The shortest busy time of any one round observed: no cost paid in every round can
        be longer (inf before a round).
    provisional : bool
        The fit holds only a stand-in speed (the first rounds' rows over busy seconds, for
        a fit that was not probed), which the first window of rounds replaces.
    """

    xtx: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))
    xty: np.ndarray = field(default_factory=lambda: np.zeros(2))
    rel_var: float = 0.0
    n_eff: float = 0.0
    window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    comm_s: float = math.nan
    n_windows: int = 0
    round_sizes: list[float] = field(default_factory=lambda: [math.inf, 0.0])
    shifted: list[tuple[float, float, float, int]] = field(default_factory=list)
    least_busy_s: float = math.inf
    provisional: bool = False


class RoundCostModel:
    """Per-worker round cost ``fixed_s + rows / speed`` (+ communication), fitted online.

    Each worker's observations are windows of consecutive rounds (``k`` rounds, ``r`` rows
    in all, ``b`` busy seconds in all); a window closes once its busy time reaches
    ``min_window_s``. A closed window is a point of the regression ``b = k * fixed + r * c``
    (``c = 1 / speed``), weighted by ``1 / b**2`` so that every window's relative error
    counts alike, and all statistics fade by half every ``halflife`` windows so that a
    worker that changes speed is followed. A probe's timing of ``rows`` in ``busy_s`` without
    round overheads is the point ``(0, rows, busy_s)``.

    Windows of a single share size cannot separate the fixed cost from the per-row cost; a
    weak prior that the fixed cost is ``prior_fixed_s`` settles that direction until share
    sizes differ (they do: ramp rounds, re-balances, an epoch's last round).

    A worker that changes speed (a neighbour's job, a straggler) is followed at once:
    ``shift_windows`` windows in a row whose busy time is ``shift_factor`` times the fit's
    prediction or more (or as much less), on the same side, restart its fit from them.

    Parameters
    ----------
    min_window_s : float, default=0.3
        Busy seconds a window must reach: three periods of the Linux CFS default (100 ms).
    halflife : float, default=4.0
        Windows after which a window's weight has halved.
    prior_fixed_s : float, default=0.0
        Fixed cost assumed before the data separate it.
    prior_weight : float, default=0.001
        Weight of that prior, in windows.
    shift_factor : float, default=1.5
        A window this many times slower or faster than predicted is a candidate change.
    shift_windows : int, default=2
        Candidates in a row, on the same side, that restart the fit.

    Examples
    --------
    >>> m = RoundCostModel(min_window_s=0.0)
    >>> for rows in (1000, 4000, 2000):  # fixed 0.02 s, 10,000 rows/s
    ...     m.observe("a", rows, 0.02 + rows / 10_000)
    >>> round(m.speed("a"), -2), round(m.fixed_s("a"), 3)  # a weak prior pulls on 3 windows
    (10000.0, 0.02)
    """

    def __init__(
        self,
        min_window_s: float = 0.3,
        halflife: float = 4.0,
        prior_fixed_s: float = 0.0,
        prior_weight: float = 0.001,
        shift_factor: float = 1.5,
        shift_windows: int = 2,
    ) -> None:
        for name, value, low in (
            ("min_window_s", min_window_s, 0.0),
            ("prior_fixed_s", prior_fixed_s, 0.0),
        ):
            if not (math.isfinite(value) and value >= low):
                raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
        if not (math.isfinite(halflife) and halflife > 0):
            raise ValueError(f"halflife must be a positive number, got {halflife!r}")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise ValueError(f"prior_weight must be a positive number, got {prior_weight!r}")
        if not (math.isfinite(shift_factor) and shift_factor > 1) or shift_windows < 1:
            raise ValueError(
                f"shift_factor must be > 1 and shift_windows >= 1, got {shift_factor!r}, "
                f"{shift_windows!r}"
            )
        self.shift_factor = float(shift_factor)
        self.shift_windows = int(shift_windows)
        self.min_window_s = float(min_window_s)
        self.halflife = float(halflife)
        self.prior_fixed_s = float(prior_fixed_s)
        self.prior_weight = float(prior_weight)
        self.decay = 0.5 ** (1.0 / self.halflife)
        self.workers: dict[Hashable, WorkerCost] = {}

    # ----------------------------------------------------------------- updates
    def add_worker(self, worker: Hashable) -> None:
        """Start ``worker`` with no measurement (a no-op if it is known)."""
        self.workers.setdefault(worker, WorkerCost())

    def remove_worker(self, worker: Hashable) -> None:
        """Forget ``worker`` (lost or retired); unknown workers are ignored."""
        self.workers.pop(worker, None)

    def observe_probe(
        self, worker: Hashable, rows: float, busy_s: float, *, provisional: bool = False
    ) -> None:
        """Fold in a probe: ``rows`` computed in ``busy_s`` with no per-round cost.

        ``provisional``: a stand-in until rounds measure the worker (the first rounds'
        speed of a fit that was not probed: a round of a few milliseconds, its start-up
        included, read 2x off the speed the later rounds measured on digits). The first
        window of rounds then replaces it instead of being held back as a change of speed.
        """
        if rows > 0 and busy_s > 0 and math.isfinite(rows) and math.isfinite(busy_s):
            cost = self._cost(worker)
            self._fit(cost, 0.0, float(rows), float(busy_s))
            cost.provisional = provisional and cost.n_windows == 1

    def observe(
        self,
        worker: Hashable,
        rows: float,
        busy_s: float,
        comm_s: float | None = None,
        wall_s: float | None = None,
    ) -> None:
        """Fold in one round: ``rows`` computed in ``busy_s``, ``comm_s`` communicating,
        in a round that lasted ``wall_s``.

        A window closes once its busy time reaches ``min_window_s``, several periods of the
        OS's scheduler. The first window after a provisional seed also closes once the wall
        time of its rounds does: by busy time alone, a fast worker busy a few milliseconds a
        round (digits) never closed one in a whole fit and kept its seed to the end.

        A round with no busy time or non-finite numbers carries nothing and is ignored; a
        round with no rows still measures the fixed cost.
        """
        cost = self._cost(worker)
        if comm_s is not None and math.isfinite(comm_s) and comm_s >= 0:
            cost.comm_s = (
                comm_s
                if math.isnan(cost.comm_s)
                else cost.comm_s + (1 - self.decay) * (comm_s - cost.comm_s)
            )
        if not (busy_s > 0 and rows >= 0 and math.isfinite(busy_s) and math.isfinite(rows)):
            return
        cost.least_busy_s = min(cost.least_busy_s, float(busy_s))
        window = cost.window
        window[0] += 1.0
        window[1] += float(rows)
        window[2] += float(busy_s)
        if wall_s is not None and math.isfinite(wall_s):
            window[3] += max(float(wall_s), float(busy_s))
        # By wall time only to replace a provisional seed: a later such window could hold
        # short rounds a quota-throttled worker ran in one burst (docs/design.md).
        by_wall = cost.provisional and window[3] >= self.min_window_s
        if window[2] >= self.min_window_s or by_wall:
            self._close(worker, cost)

    def _close(self, worker: Hashable, cost: WorkerCost) -> None:
        """Fit ``worker``'s window. A window far off the fit is held back until the next
        says whether the worker changed speed (then its fit restarts from the newest
        window, the first one wholly at the new pace) or not (then it was an outlier, a
        hiccup of the machine, and is dropped: in a fit of the slope one outlier at a
        share size would read as a change of slope)."""
        window, cost.window = cost.window[:3], [0.0, 0.0, 0.0, 0.0]
        if cost.provisional:  # the stand-in speed gives way to the first measurement
            fresh = WorkerCost(comm_s=cost.comm_s, least_busy_s=cost.least_busy_s)
            self.workers[worker] = fresh
            self._fit(fresh, *window)
            return
        side = self._side(cost, *window)
        if not side or (cost.shifted and cost.shifted[-1][3] != side):
            cost.shifted = []
        if not side:
            self._fit(cost, *window)
            return
        cost.shifted.append((*window, side))
        if len(cost.shifted) >= self.shift_windows:
            fresh = WorkerCost(comm_s=cost.comm_s)
            self.workers[worker] = fresh
            # The first window held may span the change: half old pace, half new, it
            # would read as a fixed cost (0.06 s a round in the simulator's straggler).
            self._fit(fresh, *cost.shifted[-1][:3])

    def _side(self, cost: WorkerCost, rounds: float, rows: float, busy: float) -> int:
        """+1 (-1) if ``busy`` is ``shift_factor`` times the fit's prediction or more (or
        as much less), else 0: also before any measurement, and at a share size the fit
        cannot predict yet."""
        if not (cost.xtx[1, 1] > 0 and busy >= MIN_BUSY_S):
            return 0
        sizes = cost.round_sizes
        if rounds > 0 and math.isfinite(sizes[0]) and not sizes[1] > MIN_SIZE_SPREAD * sizes[0]:
            # Before the fixed cost is separable, busy time is predicted in proportion to
            # rows; within a factor tol of the sizes seen, that is off by at most tol
            # whatever the fixed cost, which stays under shift_factor.
            size, tol = rows / rounds, math.sqrt(self.shift_factor)
            if not sizes[0] / tol <= size <= sizes[1] * tol:
                return 0
        # The best prediction, not the shares' bounded credit (_solve's cap on the speed).
        fixed, per_row, _ = self._estimate(cost)
        if not (sizes[1] > MIN_SIZE_SPREAD * sizes[0] and fixed >= 0 and per_row > 0):
            fixed = self.prior_fixed_s
            per_row = (cost.xty[1] - fixed * cost.xtx[0, 1]) / cost.xtx[1, 1]
        predicted = rounds * fixed + rows * per_row
        ratio = busy / predicted if predicted > 0 else 1.0
        return 1 if ratio > self.shift_factor else -1 if ratio < 1 / self.shift_factor else 0

    def _cost(self, worker: Hashable) -> WorkerCost:
        self.add_worker(worker)
        return self.workers[worker]

    def _fit(self, cost: WorkerCost, rounds: float, rows: float, busy: float) -> None:
        if busy < MIN_BUSY_S:  # no clock measures this: nothing to learn
            return
        x = np.array([rounds, rows])
        w = 1.0 / (busy * busy)
        # Directional forgetting: what the model knew is faded only along the new window's
        # direction, where the window brings news. Plain fading would also fade what
        # earlier share sizes said about the slope, and at a steady share the fixed cost
        # and the slope would drift back into one another (rows / busy again).
        sx = cost.xtx @ x
        q = float(x @ sx)
        if q > 0:
            forget = (1.0 - self.decay) / q
            cost.xty = cost.xty - forget * sx * float(x @ cost.xty)
            cost.xtx = cost.xtx - forget * np.outer(sx, sx)
        cost.xtx = cost.xtx + w * np.outer(x, x)
        cost.xty = cost.xty + w * busy * x
        cost.n_eff = self.decay * cost.n_eff + 1.0
        cost.n_windows += 1
        if rounds > 0:
            sizes = cost.round_sizes
            sizes[0], sizes[1] = min(sizes[0], rows / rounds), max(sizes[1], rows / rounds)
        if cost.xtx[1, 1] > 0:
            fixed, per_row = self._estimate(cost)[:2]
            residual = (busy - rounds * fixed - rows * per_row) / busy
            cost.rel_var = self.decay * cost.rel_var + residual * residual

    # ----------------------------------------------------------------- queries
    def is_measured(self, worker: Hashable) -> bool:
        """Whether ``worker`` has a fitted window (or probe) in which it computed rows."""
        return self.workers[worker].xtx[1, 1] > 0

    def _estimate(self, cost: WorkerCost) -> tuple[float, float, np.ndarray | None]:
        """Unconstrained ``(fixed_s, per_row_s, inverse normal matrix)``, prior included."""
        # The prior: prior_weight windows' worth of "fixed cost = prior_fixed_s", scaled
        # like the data's round term so that it is weak against any window of its own.
        scale = cost.xtx[0, 0] / max(cost.n_eff, 1e-12) if cost.xtx[0, 0] > 0 else 1.0
        lam = self.prior_weight * scale
        a = cost.xtx + np.diag([lam, 0.0])
        b = cost.xty + np.array([lam * self.prior_fixed_s, 0.0])
        try:
            inverse = np.linalg.inv(a)
        except np.linalg.LinAlgError:
            return self.prior_fixed_s, cost.xty[1] / cost.xtx[1, 1], None
        fixed, per_row = inverse @ b
        return float(fixed), float(per_row), inverse

    def _solve(self, cost: WorkerCost) -> tuple[float, float, float]:
        """``(fixed_s, per_row_s, standard deviation of per_row_s)`` of a measured worker,
        with ``fixed_s >= 0`` and ``per_row_s > 0``; the deviation is inf until three
        windows can say."""
        if not cost.xtx[1, 1] > 0:
            raise ValueError("worker has no measurement of rows yet")
        fixed, per_row, inverse = self._estimate(cost)
        naive = cost.xty[1] / cost.xtx[1, 1]  # the slope through the origin: rows / busy
        sd = math.inf
        if inverse is not None and cost.n_windows >= 3 and cost.n_eff > 2.0:
            # Residuals after their own fit understate the noise: the usual dof factor.
            var = cost.rel_var / (cost.n_eff - 2.0) * inverse[1, 1]
            sd = math.sqrt(var) if var >= 0 else math.inf
        sizes = cost.round_sizes
        if not sizes[1] > MIN_SIZE_SPREAD * sizes[0]:
            # Windows of one share size (a probe aside) cannot separate the fixed cost: one
            # fitted now would be noise or a window spanning a change of speed, and a large
            # one would starve the worker. The prior's fixed cost stands until they differ.
            fixed = self.prior_fixed_s
            per_row = (cost.xty[1] - fixed * cost.xtx[0, 1]) / cost.xtx[1, 1]
            if not per_row > 0:
                fixed, per_row = 0.0, naive
        elif not fixed >= 0:
            fixed, per_row = 0.0, naive
        elif not (per_row >= naive / MAX_SPEED_OVER_NAIVE or per_row > 2.0 * sd):
            # A busy time that hardly grows with rows, within its noise: credit at most
            # this much more speed than rows / busy; the bigger share it then gets
            # measures the slope.
            per_row = naive / MAX_SPEED_OVER_NAIVE
            if cost.xtx[0, 0] > 0:
                fixed = max((cost.xty[0] - per_row * cost.xtx[0, 1]) / cost.xtx[0, 0], 0.0)
        if fixed > cost.least_busy_s:
            # A cost paid in every round cannot outlast the shortest round. A throttled
            # worker (a CPU quota) that waits out its period in most rounds but not in all
            # would otherwise read the wait as a fixed cost, and a share cut for it would
            # only lengthen that reading: the positive feedback that starves a worker.
            fixed = cost.least_busy_s
            per_row = max(
                (cost.xty[1] - fixed * cost.xtx[0, 1]) / cost.xtx[1, 1],
                naive / MAX_SPEED_OVER_NAIVE,
            )
        return float(fixed), float(per_row), float(sd)

    def speed(self, worker: Hashable) -> float:
        """Rows per second of ``worker``'s per-row cost (the slope, not rows / busy)."""
        return 1.0 / self._solve(self.workers[worker])[1]

    def fixed_s(self, worker: Hashable) -> float:
        """Seconds of ``worker``'s round that do not depend on its share."""
        return self._solve(self.workers[worker])[0]

    def comm_s(self, worker: Hashable) -> float:
        """Communication seconds per round of ``worker`` (0 before any was observed)."""
        c = self.workers[worker].comm_s
        return 0.0 if math.isnan(c) else c

    def speed_rel_std(self, worker: Hashable) -> float:
        """Relative standard deviation of :meth:`speed`, from the fit's residuals (inf
        until three windows of at least two share sizes can say)."""
        _, per_row, sd = self._solve(self.workers[worker])
        return sd / per_row

    def shares(self, n_rows: int, min_rows: int = 1) -> tuple[dict[Hashable, int], float]:
        """:func:`balanced_shares` of ``n_rows`` over the measured workers."""
        measured = [w for w in self.workers if self.is_measured(w)]
        if not measured:
            raise ValueError("no worker has been measured yet")
        solved = {w: self._solve(self.workers[w]) for w in measured}
        speeds = {w: 1.0 / s[1] for w, s in solved.items()}
        fixed = {w: s[0] + self.comm_s(w) for w, s in solved.items()}
        return balanced_shares(n_rows, speeds, fixed, min_rows=min_rows)

    def epoch_costs(
        self, workers: list[Hashable], rounds_per_epoch: int, fallback: Mapping[Hashable, float]
    ) -> tuple[dict[Hashable, float], dict[Hashable, float]]:
        """Speeds and fixed seconds per epoch of ``workers``, as partition policies take them.

        An epoch of ``rounds_per_epoch`` rounds costs a worker ``rounds_per_epoch * fixed_s
        + rows / speed`` of busy time. Communication is left out: the driver measures it as
        arrival minus busy time, which includes the order in which the driver takes the
        workers' deltas in, and fewer rows would not shorten that (in the README's example
        the first round's communication moved 4,720 rows to the worker measured quickest
        to answer, whose busy time then came to 1.39 s against the others' 0.80-1.01 s). A
        worker not measured yet gets its ``fallback`` speed and no fixed cost.
        """
        speeds, fixed = {}, {}
        for w in workers:
            if w in self.workers and self.is_measured(w):
                f, per_row, _ = self._solve(self.workers[w])
                speeds[w] = 1.0 / per_row
                fixed[w] = rounds_per_epoch * f
            else:
                speeds[w], fixed[w] = float(fallback[w]), 0.0
        return speeds, fixed

    def __repr__(self) -> str:
        return f"RoundCostModel(min_window_s={self.min_window_s:g}, workers={len(self.workers)})"


class MoveCost:
    """Seconds that re-balancing costs, ``fixed_s + rows / rate``, fitted from what was measured.

    ``rows`` are the rows of the shards an operation builds: every row of a staging, and for
    a re-balance every sender's and receiver's rows after it
    (:func:`hmdspt.core.partition.rows_rebuilt`), not just the rows moved. Every staging and
    re-balance is one observation (rows built, seconds it took); the fit is
    :class:`RoundCostModel`'s, with a window per observation. Before any observation a move
    is predicted to cost nothing.

    Examples
    --------
    >>> cost = MoveCost()
    >>> cost.observe(100_000, 0.1)  # a staging: 1e6 rows/s, fixed cost not yet separable
    >>> round(cost.seconds(60_000), 3)  # a move that rebuilds shards of 60,000 rows
    0.06
    >>> cost.observe(5_000, 0.055)  # a re-balance of small shards: 50 ms of fixed cost show
    >>> round(cost.seconds(10_000), 3)
    0.057
    """

    KEY = "moves"

    def __init__(self) -> None:
        # Every move is its own window, and none is held back as a change of pace.
        self.model = RoundCostModel(min_window_s=0.0, shift_factor=1e12)
        # (fixed_s, rows/s) of the fit, or () before it is measured, solved once per
        # observation: a plan prices thousands of candidate moves between two observations.
        self._line: tuple[float, float] | tuple[()] | None = None

    def observe(self, rows: float, seconds: float) -> None:
        """Fold in one staging or re-balance: shards of ``rows`` rows built in ``seconds``."""
        if rows > 0:
            self.model.observe(self.KEY, rows, seconds)
            self._line = None

    def seconds(self, rows: float) -> float:
        """Predicted seconds of a re-balance that rebuilds shards of ``rows`` rows (0
        before any observation)."""
        if rows <= 0:
            return 0.0
        if self._line is None:
            measured = self.KEY in self.model.workers and self.model.is_measured(self.KEY)
            self._line = (
                (self.model.fixed_s(self.KEY), self.model.speed(self.KEY)) if measured else ()
            )
        if not self._line:
            return 0.0
        fixed_s, speed = self._line
        return fixed_s + rows / speed

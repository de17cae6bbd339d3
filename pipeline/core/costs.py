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

Everything here is numpy and arithmetic: no Dask. The trainer does not use it yet (it
partitions by :class:`hmdspt.core.speed.OnlineScorer`); see ``docs/design.md``, "Round cost
model".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hmdspt.core.partition import apportion

__all__ = ["MAX_SPEED_OVER_NAIVE", "RoundCostModel", "WorkerCost", "balanced_shares"]

# The most speed a fit may credit a worker with beyond its plain rows / busy seconds.
MAX_SPEED_OVER_NAIVE = 4.0
# Busy seconds below which a window tells nothing (below any timer's resolution).
MIN_BUSY_S = 1e-7


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
        The window being filled: rounds, rows, busy seconds.
    comm_s : float
        Exponentially weighted communication seconds per round (nan before any).
    n_windows : int
        Windows fitted so far.
    """

    xtx: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))
    xty: np.ndarray = field(default_factory=lambda: np.zeros(2))
    rel_var: float = 0.0
    n_eff: float = 0.0
    window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    comm_s: float = math.nan
    n_windows: int = 0


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

    def observe_probe(self, worker: Hashable, rows: float, busy_s: float) -> None:
        """Fold in a probe: ``rows`` computed in ``busy_s`` with no per-round cost."""
        if rows > 0 and busy_s > 0 and math.isfinite(rows) and math.isfinite(busy_s):
            self._fit(self._cost(worker), 0.0, float(rows), float(busy_s))

    def observe(
        self, worker: Hashable, rows: float, busy_s: float, comm_s: float | None = None
    ) -> None:
        """Fold in one round: ``rows`` computed in ``busy_s``, ``comm_s`` communicating.

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
        window = cost.window
        window[0] += 1.0
        window[1] += float(rows)
        window[2] += float(busy_s)
        if window[2] >= self.min_window_s:
            self._fit(cost, *window)
            cost.window = [0.0, 0.0, 0.0]

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
        if not fixed >= 0:
            fixed, per_row = 0.0, naive
        elif not (per_row >= naive / MAX_SPEED_OVER_NAIVE or per_row > 2.0 * sd):
            # A busy time that hardly grows with rows, within its noise: credit at most
            # this much more speed than rows / busy; the bigger share it then gets
            # measures the slope.
            per_row = naive / MAX_SPEED_OVER_NAIVE
            if cost.xtx[0, 0] > 0:
                fixed = max((cost.xty[0] - per_row * cost.xtx[0, 1]) / cost.xtx[0, 0], 0.0)
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

    def __repr__(self) -> str:
        return f"RoundCostModel(min_window_s={self.min_window_s:g}, workers={len(self.workers)})"

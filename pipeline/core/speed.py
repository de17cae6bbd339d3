"""Speeds of workers: how many samples per second each really trains (no Dask).

:class:`OnlineScorer` is an exponentially weighted estimate of each worker's speed, updated
after every round from the rows it processed and the seconds it was busy;
:func:`chunk_speed` is the statistic the initial probe makes of a worker's timed chunks, and
:class:`ProbeResult` holds what the probe measured. The probe itself runs on the
Dask workers: :func:`hmdspt.parallel.scoring.score_workers` and
:func:`hmdspt.parallel.scoring.probe_workers`.

Scores are measured, never read from configuration: on an emulated cluster the scorer
does not know the slowdowns, on a real one nobody does.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "PROBE_ESTIMATORS",
    "OnlineScorer",
    "ProbeResult",
    "WorkerEstimate",
    "chunk_speed",
    "probe_pays",
]


@dataclass
class WorkerEstimate:
    """State of one worker's speed estimate.

    Attributes
    ----------
    prior : float
        Relative speed hint used until the first measurement (e.g. its thread count).
    mean : float
        Exponentially weighted mean speed, samples per second (nan before measurements).
    var : float
        Exponentially weighted variance of the speed (nan before measurements).
    n_updates : int
        Number of measurements so far.
    shifted : list of float
        Consecutive recent measurements far off the estimate on the same side (a
        candidate change of speed, see :class:`OnlineScorer`).
    """

    prior: float = 1.0
    mean: float = math.nan
    var: float = math.nan
    n_updates: int = 0
    shifted: list[float] = field(default_factory=list)


class OnlineScorer:
    """Exponentially weighted speed of every worker, in samples per second.

    After a round, ``update(worker, rows, busy_s)`` folds the round's speed
    ``x = rows / busy_s`` into the worker's estimate::

        d = x - mean
        mean += a * d
        var = (1 - a) * (var + a * d**2)

    with ``a = 1 - 0.5 ** (1 / halflife)``, so a measurement's weight halves every
    ``halflife`` rounds. The first measurement (normally the probe's, see
    :func:`hmdspt.parallel.scoring.score_workers`) replaces the prior outright and starts
    the variance at ``(first_rel_std * x) ** 2``: one measurement says little about its own
    spread. Then consistent measurements shrink the variance by ``(1 - a)`` a round and
    surprising ones widen it.

    Parameters
    ----------
    halflife : float, default=2.0
        Rounds after which a measurement's weight has halved. Short enough to follow a
        worker that turns into a straggler within a few rounds, long enough to smooth the
        noise of a shared machine.
    first_rel_std : float, default=0.25
        Relative standard deviation assumed after the first measurement.
    shift_factor : float, default=1.5
        A measurement this many times above or below the estimate is a candidate change
        of speed.
    shift_rounds : int, default=2
        Candidates in a row, on the same side, that restart the estimate from them (a
        worker turned straggler is scored as one after two rounds, not after many).

    Attributes
    ----------
    estimates : dict
        :class:`WorkerEstimate` per worker.

    Examples
    --------
    >>> s = OnlineScorer(halflife=1.0)
    >>> s.add_worker("a", prior=2)
    >>> s.add_worker("b", prior=1)
    >>> s.scores()  # priors only: relative units
    {'a': 2.0, 'b': 1.0}
    >>> s.update("a", rows=1000, busy_s=1.0)
    >>> s.scores()  # b is scaled from a's measured speed per prior unit
    {'a': 1000.0, 'b': 500.0}
    >>> s.update("a", rows=2000, busy_s=1.0)
    >>> s.score("a")
    1500.0
    """

    def __init__(
        self,
        halflife: float = 2.0,
        first_rel_std: float = 0.25,
        shift_factor: float = 1.5,
        shift_rounds: int = 2,
    ) -> None:
        if not (math.isfinite(halflife) and halflife > 0):
            raise ValueError(f"halflife must be a positive number, got {halflife!r}")
        if not (math.isfinite(first_rel_std) and first_rel_std >= 0):
            raise ValueError(f"first_rel_std must be >= 0, got {first_rel_std!r}")
        self.halflife = float(halflife)
        self.first_rel_std = float(first_rel_std)
        self.alpha = 1.0 - 0.5 ** (1.0 / self.halflife)
        if not shift_factor > 1 or shift_rounds < 1:
            raise ValueError("shift_factor must be > 1 and shift_rounds >= 1")
        self.shift_factor = float(shift_factor)
        self.shift_rounds = int(shift_rounds)
        self.estimates: dict[Hashable, WorkerEstimate] = {}

    # ----------------------------------------------------------------- workers
    def add_worker(
        self,
        worker: Hashable,
        prior: float | None = None,
        *,
        nthreads: int | None = None,
        memory_limit: float | None = None,
    ) -> None:
        """Register a worker with a static prior, used only until it is measured.

        Parameters
        ----------
        worker : hashable
            Worker key (address or name).
        prior : float, optional
            Relative speed hint. Defaults to ``nthreads`` if given, else 1.
        nthreads : int, optional
            Worker threads: more threads, proportionally more speed, as a first guess.
        memory_limit : float, optional
            Accepted for symmetry with the worker's static information but ignored: memory
            bounds how many rows a worker can hold, not how fast it trains them.

        Notes
        -----
        Re-adding a known worker resets it (a worker that rejoined may be another machine).
        """
        del memory_limit  # see Notes: not a speed hint
        if prior is None:
            prior = float(nthreads) if nthreads is not None else 1.0
        prior = float(prior)
        if not (math.isfinite(prior) and prior > 0):
            raise ValueError(f"prior must be a positive finite number, got {prior!r}")
        self.estimates[worker] = WorkerEstimate(prior=prior)

    def remove_worker(self, worker: Hashable) -> None:
        """Forget a worker (lost or retired); unknown workers are ignored."""
        self.estimates.pop(worker, None)

    @property
    def workers(self) -> list[Hashable]:
        """Known workers, in the order they were added."""
        return list(self.estimates)

    # ----------------------------------------------------------------- updates
    def update(self, worker: Hashable, rows: float, busy_s: float) -> None:
        """Fold one round's measurement into ``worker``'s estimate.

        Parameters
        ----------
        worker : hashable
            Worker key; added with the default prior if unknown.
        rows : float
            Rows the worker processed in the round.
        busy_s : float
            Seconds it spent computing them.

        Notes
        -----
        A round without rows or without busy time carries no information about speed
        (e.g. a worker that held no rows) and is ignored.
        """
        if rows <= 0 or busy_s <= 0 or not (math.isfinite(rows) and math.isfinite(busy_s)):
            if worker not in self.estimates:
                self.add_worker(worker)
            return
        self.update_speed(worker, rows / busy_s)

    def update_speed(self, worker: Hashable, speed: float) -> None:
        """Fold a measured speed (samples per second) into ``worker``'s estimate.

        Use it for measurements that come as speeds, e.g. the output of
        :func:`hmdspt.parallel.scoring.score_workers`; :meth:`update` is the same from rows
        and seconds.
        """
        speed = float(speed)
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a positive finite number, got {speed!r}")
        est = self.estimates.get(worker)
        if est is None:
            self.add_worker(worker)
            est = self.estimates[worker]
        if est.n_updates == 0:
            est.mean = speed
            est.var = (self.first_rel_std * speed) ** 2
        else:
            # A change of speed (a neighbour's job, a straggler): measurements that sit
            # shift_factor off the estimate on the same side for shift_rounds rounds in a
            # row restart it from them, instead of the average taking many rounds to
            # follow. One noisy round does not.
            ratio = speed / est.mean
            side = 1 if ratio > self.shift_factor else -1 if ratio < 1 / self.shift_factor else 0
            if side and (not est.shifted or (est.shifted[-1] > est.mean) == (side > 0)):
                est.shifted.append(speed)
            else:
                est.shifted.clear()
            if len(est.shifted) >= self.shift_rounds:
                est.mean = sum(est.shifted) / len(est.shifted)
                est.var = (self.first_rel_std * est.mean) ** 2
                est.shifted.clear()
            else:
                a = self.alpha
                d = speed - est.mean
                est.mean += a * d
                est.var = (1.0 - a) * (est.var + a * d * d)
        est.n_updates += 1

    # ----------------------------------------------------------------- queries
    def _speed_per_prior(self) -> float | None:
        measured = [e for e in self.estimates.values() if e.n_updates]
        if not measured:
            return None
        return sum(e.mean for e in measured) / sum(e.prior for e in measured)

    def score(self, worker: Hashable) -> float:
        """Estimated samples per second of ``worker``.

        A worker not yet measured gets its prior times the measured workers' speed per
        prior unit, so that it is comparable with them; if nobody is measured yet, scores
        are the priors themselves (relative units).
        """
        est = self.estimates[worker]
        if est.n_updates:
            return est.mean
        per_prior = self._speed_per_prior()
        return est.prior if per_prior is None else est.prior * per_prior

    def scores(self) -> dict[Hashable, float]:
        """:meth:`score` of every known worker."""
        per_prior = self._speed_per_prior()
        out = {}
        for worker, est in self.estimates.items():
            if est.n_updates:
                out[worker] = est.mean
            else:
                out[worker] = est.prior if per_prior is None else est.prior * per_prior
        return out

    def std(self, worker: Hashable) -> float:
        """Exponentially weighted standard deviation of ``worker``'s speed (inf unmeasured)."""
        est = self.estimates[worker]
        return math.sqrt(est.var) if est.n_updates else math.inf

    def rel_std(self, worker: Hashable) -> float:
        """:meth:`std` relative to the score: the uncertainty to compare across workers."""
        est = self.estimates[worker]
        return math.sqrt(est.var) / est.mean if est.n_updates else math.inf

    def is_measured(self, worker: Hashable) -> bool:
        """Whether ``worker`` has at least one measurement (else its score is a prior)."""
        return self.estimates[worker].n_updates > 0

    def __repr__(self) -> str:
        return f"OnlineScorer(halflife={self.halflife:g}, workers={len(self.estimates)})"


@dataclass
class ProbeResult:
    """What :func:`hmdspt.parallel.scoring.probe_workers` measured.

    Attributes
    ----------
    speeds : dict of str to float
        Samples per second by worker address (the scores).
    details : dict of str to dict
        :func:`hmdspt.parallel.worker.probe_task`'s result by worker address: ``rows``,
        ``steps``, ``busy_s``, ``speed`` and, for the adaptive probe, ``chunks``,
        ``dropped``, ``rel_se``, ``stop``, ``mean_speed``, ``trimmed_speed`` and
        ``median_speed``.
    wall_s : float
        Driver seconds the whole probe took (submission, probing and gathering).
    max_rows : int or None
        Row budget each worker had (from ``n_rows_total``), None without one.
    lost : list of str
        Workers that left the cluster during the probe (in neither ``speeds`` nor
        ``details``).
    """

    speeds: dict[str, float]
    details: dict[str, dict[str, Any]]
    wall_s: float
    max_rows: int | None = None
    lost: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows processed by all probes together."""
        return sum(int(d["rows"]) for d in self.details.values())

    def epoch_fraction(self, n_rows_total: int) -> float:
        """Rows of all probes as a fraction of one epoch of ``n_rows_total`` rows.

        On a balanced cluster an epoch takes ``n_rows_total / sum(speeds)`` seconds while
        the probes, running side by side for about the same time, process
        ``wall * sum(speeds)`` rows: the row fraction is also (about) the time fraction.
        """
        return self.rows / n_rows_total

    def summary(self) -> str:
        """One line for logs: duration, rows, why each worker stopped, who left."""
        busy = max((d["busy_s"] for d in self.details.values()), default=0.0)
        stops = sorted({str(d.get("stop", "seconds")) for d in self.details.values()})
        left = f"; {', '.join(self.lost)} left during it" if self.lost else ""
        return (
            f"probe of {len(self.details)} workers took {self.wall_s:.2f} s "
            f"(longest busy {busy:.2f} s, {self.rows:,} rows, stopped by {'/'.join(stops)}"
            f"{left})"
        )


# ---------------------------------------------------------------------------- probe statistic
# How the probe (hmdspt.parallel.worker.probe_task) makes one speed of a worker's timed chunks.
# Normal-theory constants of the median's standard error from the median absolute
# deviation: sigma ~ 1.4826 MAD, se(median) ~ sqrt(pi / 2) sigma / sqrt(n).
_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)
PROBE_ESTIMATORS = ("trimmed", "median")


# A hiccup is rare. Slow chunks that are more than this fraction of all chunks are how
# the worker runs (a CPU quota's throttling pauses land in every few chunks) and are kept.
HICCUP_MAX_FRACTION = 0.05


def chunk_speed(
    rows: Sequence[float],
    walls: Sequence[float],
    estimator: str = "trimmed",
    hiccup_factor: float = 3.0,
) -> tuple[float, float, int]:
    """Speed of a worker from its timed chunks, its relative standard error, chunks dropped.

    Parameters
    ----------
    rows : sequence of float
        Rows of each chunk.
    walls : sequence of float
        Wall seconds of each chunk (emulation sleeps included).
    estimator : {"trimmed", "median"}, default="trimmed"
        ``"trimmed"``: drop the hiccups, chunks whose seconds per row exceed
        ``hiccup_factor`` times the median, as long as they are at most
        ``HICCUP_MAX_FRACTION`` (5 %) of the chunks; then total rows over total seconds of
        the rest. The relative standard error is that of the mean seconds per row of the
        kept chunks.
        ``"median"``: the median of the chunk speeds; its relative standard error is
        ``sqrt(pi / 2) * 1.4826 * MAD / sqrt(n) / median`` (the median of normal draws, the
        spread taken from the median absolute deviation); nothing is dropped.
    hiccup_factor : float, default=3.0
        ``"trimmed"`` only: how many times slower than the median a chunk must be to count
        as a hiccup rather than as contention.

    Returns
    -------
    speed : float
        Samples per second.
    rel_se : float
        Relative standard error of ``speed``; ``inf`` with fewer than two chunks.
    dropped : int
        Chunks dropped as hiccups.

    Notes
    -----
    Trimmed by default, not the median: a round achieves its rows over its seconds, and
    contention from neighbours is part of that time average, where the median ignores the
    slower chunks and rates a worker too fast. A hiccup (a foreign process, a garbage
    collection) stretches a chunk several-fold and is dropped while such chunks are rare.
    Where they are not, they are the worker's speed: a worker under a CPU quota runs its
    chunks at full speed until the quota is spent and then waits out the scheduling
    period inside one of them (on the testbed at 100 ms, 4 of 11 chunks of a 0.25-core
    worker), and dropping those rated it as fast as a whole core. The measurements
    behind this are in docs/design.md, "Round loop".

    Examples
    --------
    >>> walls = [1.0] * 18 + [1.5, 10.0]  # contention, then a hiccup: 1 chunk in 20
    >>> chunk_speed([100] * 20, walls)[::2]  # 1,900 rows in 19.5 s; the 10 s chunk dropped
    (97.43589743589743, 1)
    >>> walls = [1.0, 1.0, 1.0, 4.0] * 5  # every fourth chunk waits out a quota: kept
    >>> chunk_speed([100] * 20, walls)[::2]
    (57.142857142857146, 0)
    >>> chunk_speed([100] * 20, walls, "median")[::2]
    (100.0, 0)
    """
    r = np.asarray(rows, dtype=np.float64)
    w = np.asarray(walls, dtype=np.float64)
    if estimator == "median":
        x = r / w
        median = float(np.median(x))
        if x.size < 2 or median <= 0.0:
            return median, math.inf, 0
        mad = float(np.median(np.abs(x - median)))
        rel_se = _MEDIAN_SE_FACTOR * _MAD_TO_SIGMA * mad / math.sqrt(x.size) / median
        return median, rel_se, 0
    if estimator != "trimmed":
        raise ValueError(f"estimator must be one of {PROBE_ESTIMATORS}, got {estimator!r}")
    t = w / r  # seconds per row of each chunk
    keep = t <= hiccup_factor * np.median(t)
    if t.size - keep.sum() > HICCUP_MAX_FRACTION * t.size:
        keep[:] = True  # too many to be hiccups
    speed = float(r[keep].sum() / w[keep].sum())
    n = int(keep.sum())
    if n < 2:
        return speed, math.inf, int(t.size - n)
    tk = t[keep]
    return speed, float(tk.std(ddof=1) / math.sqrt(n) / tk.mean()), int(t.size - n)


def probe_pays(n_rows: int, n_workers: int, rows_per_s: float, probe_min_s: float) -> bool:
    """Whether probing the workers before round one can pay for itself.

    Only when one epoch of a worker's equal share, at ``rows_per_s``, takes longer than the
    probe's least busy time. A shorter epoch's first round measures every worker on real
    rows in less time than the probe would take, and the first re-balance follows it.

    Parameters
    ----------
    n_rows : int
        Rows of the training set.
    n_workers : int
        Workers that will share them.
    rows_per_s : float
        A worker's speed, or an estimate of it (the driver's, before anything is measured).
    probe_min_s : float
        Least busy seconds of the probe on every worker.

    Returns
    -------
    bool
    """
    if not (rows_per_s > 0 and n_workers >= 1):
        raise ValueError(
            f"need rows_per_s > 0 and n_workers >= 1, got {rows_per_s!r}, {n_workers!r}"
        )
    return n_rows / n_workers / rows_per_s > probe_min_s

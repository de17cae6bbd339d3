"""Scores of workers: how many samples per second each really trains.

Two parts:

- :class:`OnlineScorer`, pure Python: an exponentially weighted estimate of each worker's
  speed, updated after every round from the rows it processed and the seconds it was busy.
  Importing it does not import Dask (``hmdspt.core.speed`` belongs to the core layer).
- :func:`score_workers` / :func:`probe_workers`: the initial probe, run on the Dask
  workers; ``distributed`` is imported inside them.

Scores are measured, never read from configuration: on an emulated cluster the scorer
does not know the slowdowns, on a real one nobody does.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OnlineScorer", "ProbeResult", "WorkerEstimate", "probe_workers", "score_workers"]

logger = logging.getLogger(__name__)


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
    :func:`score_workers`) replaces the prior outright and starts the variance at
    ``(first_rel_std * x) ** 2``: one measurement says little about its own spread. Then
    consistent measurements shrink the variance by ``(1 - a)`` a round and surprising ones
    widen it.

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
        :func:`score_workers`; :meth:`update` is the same from rows and seconds.
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
    """What :func:`probe_workers` measured.

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
    """

    speeds: dict[str, float]
    details: dict[str, dict[str, Any]]
    wall_s: float
    max_rows: int | None = None

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
        """One line for logs: duration, rows, why each worker stopped."""
        busy = max((d["busy_s"] for d in self.details.values()), default=0.0)
        stops = sorted({str(d.get("stop", "seconds")) for d in self.details.values()})
        return (
            f"probe of {len(self.details)} workers took {self.wall_s:.2f} s "
            f"(longest busy {busy:.2f} s, {self.rows:,} rows, stopped by {'/'.join(stops)})"
        )


def probe_workers(
    client: Any,
    layer_sizes: Sequence[int],
    seconds: float | None = None,
    batch_size: int = 256,
    *,
    min_seconds: float = 0.1,
    max_seconds: float = 2.0,
    rel_tol: float = 0.05,
    n_rows_total: int | None = None,
    max_fraction: float = 0.05,
    estimator: str = "trimmed",
    X: Any = None,
    Y: Any = None,
    seed: int = 0,
    hidden_activation: str = "relu",
    out_activation: str = "softmax",
    workers: Iterable[str] | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Probe every worker at once with real training steps; speeds and probe details.

    Submits :func:`hmdspt.parallel.worker.probe_task` to every worker simultaneously, pinned
    (``workers=[address], allow_other_workers=False``): run together, the workers share the
    machine(s) as they will in training, so the scores include that contention.

    Parameters
    ----------
    client : distributed.Client
        Client of the cluster.
    layer_sizes : sequence of int
        The model's units per layer, input first: the probe trains this very shape.
    seconds : float, optional
        A fixed probe: busy seconds each worker spends probing, speed ``rows / busy_s``
        (the original behaviour). None (default): the adaptive probe below.
    batch_size : int, default=256
        Mini-batch size of training.
    min_seconds : float, default=0.1
        Adaptive probe: least busy seconds of every worker.
    max_seconds : float, default=2.0
        Adaptive probe: most busy seconds of any worker.
    rel_tol : float, default=0.05
        Adaptive probe: a worker stops once the relative standard error of its speed is
        below this (and ``min_seconds`` and eight chunks are done).
    n_rows_total : int, optional
        Rows of the training set. Given, the probes together process at most
        ``max_fraction`` of one epoch: each worker gets ``max_fraction * n_rows_total /
        n_workers`` rows, but always at least the minimum (``min_seconds`` and eight chunks)
        needed for a measurement.
    max_fraction : float, default=0.05
        Fraction of an epoch's rows the probes may use together (with ``n_rows_total``).
    estimator : {"trimmed", "median"}, default="trimmed"
        Adaptive probe: how a worker's timed chunks make one speed (see Notes and
        :func:`hmdspt.parallel.worker.chunk_speed`).
    X, Y : array-like, optional
        Sample rows of the real data and their encoded targets (broadcast once to every
        worker); synthetic rows of the same shape if None.
    seed : int, default=0
        Seed of the probe's model, row order and synthetic rows.
    hidden_activation, out_activation : str
        As in :class:`hmdspt.core.nn.MLP`.
    workers : iterable of str, optional
        Addresses to probe; all current workers by default.
    timeout : float, optional
        Seconds to wait for the results; default ``60 + 5 * (seconds or max_seconds)``.

    Returns
    -------
    result : ProbeResult
        Speeds, per-worker details and the probe's wall time.

    Notes
    -----
    **Why adaptive.** A fixed probe costs the same whatever the job: 2 s at ~600k
    samples/s is a dozen epochs of a 100k-row data set. The adaptive probe stops each
    worker as soon as its speed is known to ``rel_tol``, which on a steady worker takes
    a few tenths of a second, and spends longer only where the measurement is noisy.

    **Why trimmed, not the median.** Each worker's chunks (16 mini-batches each, under the
    emulation throttle as in training) are timed one by one. In a short probe one chunk
    stretched by a scheduling hiccup (a foreign process, a garbage collection) would shift
    the plain time average by its full length, so the estimate must be robust. The median
    of the chunk speeds is, but it is biased where contention is regular rather than rare:
    on the emulated 4:2:1 cluster the fastest worker's chunks run at one speed and 1.2-2x
    slower while a neighbour's duty cycle overlaps them, and the median, ignoring that
    slower minority, scored it 5-20 % faster than the time average a round achieves. The
    default therefore drops only hiccups, chunks more than 3x slower than the median chunk
    (a 99th-percentile chunk measured 1.4-2.3x), and takes rows over seconds of the rest.
    The precision that stops the probe is that estimate's relative standard error.
    Hiccups that recur are real costs: the online scorer sees them in the
    ``rows / busy_s`` of every training round. ``estimator="median"`` is kept for
    comparison.

    **Why equal row budgets.** Speeds are unknown before the probe, so the row budget of
    ``n_rows_total`` is split equally; this bounds the total rows. A worker ``r`` times
    slower than the mean then needs ``r`` times longer for its rows, so in wall time the
    probe may cost up to ``max(mean speed / speed)`` times ``max_fraction`` of a balanced
    epoch. For a small data set the minimum measurement dominates anyway: a probe cannot
    be cheaper than a few tenths of a second and a task round trip. A worker stopped by
    its row budget is only as precise as that minimum made it (its ``rel_se`` says how
    precise); the online scores of the first rounds refine it.
    """
    from distributed import wait

    from hmdspt.parallel.shards import scheduler_workers
    from hmdspt.parallel.worker import probe_task

    addresses = list(workers) if workers is not None else sorted(scheduler_workers(client))
    if not addresses:
        raise ValueError("the cluster has no workers to score")
    max_rows = None
    if n_rows_total is not None:
        if seconds is not None:
            raise ValueError(
                "seconds fixes the probe's duration; n_rows_total bounds the adaptive probe "
                "(seconds=None) only"
            )
        if not (n_rows_total >= 1 and 0 < max_fraction <= 1):
            raise ValueError(
                f"need n_rows_total >= 1 and 0 < max_fraction <= 1, got "
                f"n_rows_total={n_rows_total!r}, max_fraction={max_fraction!r}"
            )
        max_rows = max(1, int(max_fraction * n_rows_total / len(addresses)))
    if timeout is None:
        timeout = 60.0 + 5.0 * (seconds if seconds is not None else max_seconds)
    start = time.perf_counter()
    data = {}
    if X is not None:
        # Once to every worker, not once per task in the task's payload.
        data["X"] = client.scatter(X, workers=addresses, broadcast=True, hash=False)
        if Y is not None:
            data["Y"] = client.scatter(Y, workers=addresses, broadcast=True, hash=False)
    options = {}
    if seconds is None:
        options = dict(
            min_seconds=min_seconds,
            max_seconds=max_seconds,
            rel_tol=rel_tol,
            max_rows=max_rows,
            estimator=estimator,
        )
    futures = [
        client.submit(
            probe_task,
            tuple(layer_sizes),
            seconds,
            batch_size,
            seed,
            hidden_activation=hidden_activation,
            out_activation=out_activation,
            workers=[address],
            allow_other_workers=False,
            pure=False,
            **options,
            **data,
        )
        for address in addresses
    ]
    try:
        wait(futures, timeout=timeout)
        results = client.gather(futures)
    except BaseException:
        client.cancel(futures)
        raise
    details = dict(zip(addresses, results))
    return ProbeResult(
        speeds={address: float(r["speed"]) for address, r in details.items()},
        details=details,
        wall_s=time.perf_counter() - start,
        max_rows=max_rows,
    )


def score_workers(
    client: Any,
    layer_sizes: Sequence[int],
    seconds: float | None = None,
    batch_size: int = 256,
    **options: Any,
) -> dict[str, float]:
    """Probe every worker at once with real training steps; samples per second of each.

    :func:`probe_workers` without the details. The probe's duration is logged (logger
    ``hmdspt.core.speed``, level INFO).

    Parameters
    ----------
    client, layer_sizes, seconds, batch_size
        As in :func:`probe_workers`.
    **options
        The keyword-only parameters of :func:`probe_workers` (the adaptive probe's
        bounds, sample rows, activations, workers, timeout).

    Returns
    -------
    scores : dict of str to float
        Samples per second by worker address.

    Notes
    -----
    One probe task per worker, i.e. the speed of one worker thread, as a round trains one
    model replica per worker. Fold the result into an :class:`OnlineScorer` with
    :meth:`OnlineScorer.update_speed` as each worker's first measurement.
    """
    result = probe_workers(client, layer_sizes, seconds, batch_size, **options)
    logger.info(result.summary())
    return result.speeds

"""Scores of workers: how many samples per second each really trains.

Two parts:

- :class:`OnlineScorer`, pure Python: an exponentially weighted estimate of each worker's
  speed, updated after every round from the rows it processed and the seconds it was busy.
  Importing it does not import Dask (``pipeline.scoring`` belongs to the core layer).
- :func:`score_workers`: the initial probe, run on the Dask workers; ``distributed`` is
  imported inside it.

Scores are measured, never read from configuration: on an emulated cluster the scorer
does not know the slowdowns, on a real one nobody does.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OnlineScorer", "WorkerEstimate", "score_workers"]


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
    """

    prior: float = 1.0
    mean: float = math.nan
    var: float = math.nan
    n_updates: int = 0


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

    def __init__(self, halflife: float = 2.0, first_rel_std: float = 0.25) -> None:
        if not (math.isfinite(halflife) and halflife > 0):
            raise ValueError(f"halflife must be a positive number, got {halflife!r}")
        if not (math.isfinite(first_rel_std) and first_rel_std >= 0):
            raise ValueError(f"first_rel_std must be >= 0, got {first_rel_std!r}")
        self.halflife = float(halflife)
        self.first_rel_std = float(first_rel_std)
        self.alpha = 1.0 - 0.5 ** (1.0 / self.halflife)
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


def score_workers(
    client: Any,
    layer_sizes: Sequence[int],
    seconds: float = 2.0,
    batch_size: int = 256,
    *,
    X: Any = None,
    Y: Any = None,
    seed: int = 0,
    hidden_activation: str = "relu",
    out_activation: str = "softmax",
    workers: Iterable[str] | None = None,
    timeout: float | None = None,
) -> dict[str, float]:
    """Probe every worker at once with real training steps; samples per second of each.

    Submits :func:`pipeline.worker_tasks.probe_task` to every worker simultaneously, pinned
    (``workers=[address], allow_other_workers=False``): run together, the workers share the
    machine(s) as they will in training, so the scores include that contention.

    Parameters
    ----------
    client : distributed.Client
        Client of the cluster.
    layer_sizes : sequence of int
        The model's units per layer, input first: the probe trains this very shape.
    seconds : float, default=2.0
        Busy seconds each worker spends probing (the call takes about this long plus a
        task round trip). Longer is less noisy; a few seconds give a few percent.
    batch_size : int, default=256
        Mini-batch size of training.
    X, Y : array-like, optional
        Sample rows of the real data and their encoded targets (broadcast once to every
        worker); synthetic rows of the same shape if None.
    seed : int, default=0
        Seed of the probe's model and synthetic rows.
    hidden_activation, out_activation : str
        As in :class:`pipeline.nn.MLP`.
    workers : iterable of str, optional
        Addresses to probe; all current workers by default.
    timeout : float, optional
        Seconds to wait for the results; default ``60 + 5 * seconds``.

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
    from distributed import wait

    from pipeline.worker_tasks import probe_task

    addresses = list(workers) if workers is not None else list(client.scheduler_info()["workers"])
    if not addresses:
        raise ValueError("the cluster has no workers to score")
    if timeout is None:
        timeout = 60.0 + 5.0 * seconds
    data = {}
    if X is not None:
        # Once to every worker, not once per task in the task's payload.
        data["X"] = client.scatter(X, workers=addresses, broadcast=True, hash=False)
        if Y is not None:
            data["Y"] = client.scatter(Y, workers=addresses, broadcast=True, hash=False)
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
    return {address: float(r["speed"]) for address, r in zip(addresses, results)}

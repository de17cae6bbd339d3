"""The initial probe of worker speeds, run on the Dask workers.

:func:`probe_workers` submits :func:`hmdspt.parallel.worker.probe_task` to every worker at
once and collects a :class:`hmdspt.core.speed.ProbeResult`; :func:`score_workers` returns
just the speeds. The online estimate that refines them round after round is
:class:`hmdspt.core.speed.OnlineScorer`, which needs no Dask.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from distributed import Client

from hmdspt.core.callers import user_stacklevel
from hmdspt.core.speed import ProbeResult
from hmdspt.parallel.client import (
    WorkerLostError,
    _gone_workers,
    blas_limit_for_own_workers,
    scheduler_workers,
    wait_some,
)
from hmdspt.parallel.cluster import connected
from hmdspt.parallel.membership import active_membership
from hmdspt.parallel.worker import check_probe_settings, probe_task

__all__ = ["PROBE_MIN_S", "probe_workers", "score_workers"]

#: The adaptive probe's least busy seconds on every worker.
PROBE_MIN_S = 0.1

#: Without a fit's membership to wake it, how often a probe's wait asks the scheduler
#: whether a probed worker has left (its pinned task would never end).
LOSS_POLL_S = 0.5

logger = logging.getLogger(__name__)


def probe_workers(
    client: Any,
    layer_sizes: Sequence[int],
    seconds: float | None = None,
    batch_size: int = 256,
    *,
    min_seconds: float = PROBE_MIN_S,
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
        :func:`hmdspt.core.speed.chunk_speed`).
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
        Speeds, per-worker details and the probe's wall time. A worker that leaves the
        cluster during the probe is left out of them and named in ``result.lost``.

    Raises
    ------
    TimeoutError
        Naming the workers whose probe had not finished at ``timeout``.

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
    is, but where contention is regular rather than rare it ignores the slower chunks and
    rates a worker too fast (docs/design.md, "Round loop"). The default therefore drops
    only hiccups, chunks more than 3x slower than the median chunk, and takes rows over
    seconds of the rest.
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
    # Here, once: else every worker fails its task and logs the traceback first.
    check_probe_settings(
        layer_sizes,
        seconds,
        batch_size,
        hidden_activation,
        out_activation,
        min_seconds=min_seconds,
        max_seconds=max_seconds,
        rel_tol=rel_tol,
        estimator=estimator,
    )
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
    by_worker = dict(zip(addresses, futures))
    try:
        lost = _wait_for_probes(client, by_worker, timeout)
        details = dict(zip(by_worker, client.gather(list(by_worker.values()))))
    except BaseException:
        client.cancel(futures)
        raise
    return ProbeResult(
        speeds={address: float(r["speed"]) for address, r in details.items()},
        details=details,
        wall_s=time.perf_counter() - start,
        max_rows=max_rows,
        lost=sorted(lost),
    )


def _wait_for_probes(client: Client, by_worker: dict[str, Any], timeout: float) -> set[str]:
    """Wait for every worker's probe; a worker that leaves meanwhile is dropped from
    ``by_worker`` (its pinned task would never end) and returned.

    While a fit's membership is open the wait wakes when a worker leaves; otherwise it
    asks the scheduler every :data:`LOSS_POLL_S` seconds.

    Raises
    ------
    TimeoutError
        Naming the workers still probing at ``timeout``.
    WorkerLostError
        When every probed worker has left.
    """
    deadline = time.monotonic() + timeout
    poll_s = None if active_membership(client) is not None else LOSS_POLL_S
    lost: set[str] = set()
    while True:
        left = deadline - time.monotonic()
        _, pending = wait_some(
            by_worker.values(), max(0.0, left if poll_s is None else min(left, poll_s)),
            watch=by_worker,
        )  # fmt: skip
        if not pending:
            return lost
        gone = _gone_workers(client, by_worker) & {a for a, f in by_worker.items() if f in pending}
        for address in gone:
            client.cancel(by_worker.pop(address))
        lost |= gone
        if not by_worker:
            raise WorkerLostError(
                f"every worker left the cluster during the speed probe ({', '.join(sorted(lost))})"
            )
        if not gone and time.monotonic() >= deadline:
            raise TimeoutError(_late_probe_message(client, by_worker, timeout))


def _late_probe_message(client: Client, by_worker: dict[str, Any], timeout: float) -> str:
    """One line naming the workers whose probe had not finished at ``timeout``."""
    names = {a: info.get("name", a) for a, info in scheduler_workers(client).items()}
    late = [f"{names.get(a, a)} ({a})" for a, f in by_worker.items() if not f.done()]
    return (
        f"the speed probe waited {timeout:.3g} s and {', '.join(late)} had not finished it; "
        f"a worker that slow or stuck cannot train (check it, or leave it out)"
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
    ``hmdspt.parallel.scoring``, level INFO). Workers that are threads of this process
    are probed with the BLAS limit a fit gives them
    (:func:`hmdspt.parallel.client.blas_limit_for_own_workers`), so that their speeds are
    those they train at.

    Parameters
    ----------
    client : Client, cluster, str, path or None
        The cluster, as the estimators' ``client`` names it: a ``distributed.Client``, a
        cluster object, a scheduler address or a scheduler file (a client opened here is
        closed on return); None: the current client (inside ``with Client(...)``).
    layer_sizes, seconds, batch_size
        As in :func:`probe_workers`.
    **options
        The keyword-only parameters of :func:`probe_workers` (the adaptive probe's
        bounds, sample rows, activations, workers, timeout).

    Returns
    -------
    scores : dict of str to float
        Samples per second by worker address, of the workers that stayed through the probe
        (a ``RuntimeWarning`` names any that left during it).

    Notes
    -----
    One probe task per worker, i.e. the speed of one worker thread, as a round trains one
    model replica per worker. Fold the result into an :class:`OnlineScorer` with
    :meth:`OnlineScorer.update_speed` as each worker's first measurement.
    """
    if client is None:  # Dask's convention: the current client; not a new idle cluster
        try:
            client = Client.current()
        except ValueError:
            raise ValueError(
                "score_workers: no current Dask client; pass a Client, a cluster, a "
                "scheduler address or a scheduler file"
            ) from None
    with connected(client) as client, blas_limit_for_own_workers(client):
        if options.get("workers") is not None:
            # A worker never in the cluster would be reported as one that left it.
            known = scheduler_workers(client)
            unknown = [a for a in options["workers"] if a not in known]
            if unknown:
                raise ValueError(
                    f"score_workers: not workers of this cluster: {', '.join(map(str, unknown))}"
                    f" (its workers: {', '.join(sorted(known)) or 'none'})"
                )
        result = probe_workers(client, layer_sizes, seconds, batch_size, **options)
    logger.info(result.summary())
    if result.lost:  # the dict alone would leave them out without a word
        warnings.warn(
            f"no speed for {len(result.lost)} worker(s) that left the cluster during the "
            f"probe: {', '.join(result.lost)}",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
    return result.speeds

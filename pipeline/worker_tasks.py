"""Code that runs on a Dask worker: the speed-emulation throttle and the speed probe.

This module is imported by the workers, so task functions defined here are pickled by
reference (a module path), never by value; defining them in ``__main__`` would ship their
code with every task.

Emulated heterogeneity (see DESIGN.md, "Heterogeneity on one machine")
----------------------------------------------------------------------
A worker emulating a machine ``k`` times slower than the fastest runs a duty cycle: after
each compute chunk that used ``t`` seconds of its thread's CPU time it sleeps ``(k - 1) t``.
Thread CPU time, not wall time: on a shared machine contention stretches a chunk's wall
time, and sleeping in proportion to it would slow the already slowed workers a second time
(4:2:1 measured as ~5.7:2.2:1 that way, ~4.25:1.9:1 with CPU time).

The slowdown ``k`` of a worker lives in this module's ``_SLOWDOWNS`` dict, keyed by worker
address (several in-process workers may share one interpreter). :class:`SlowdownPlugin`
writes it when it is set up on a worker, :func:`set_slowdown` changes it on a running
worker, and compute code applies it by wrapping each chunk in :func:`throttled`. Code that
measures speed (the scorer) never reads it: it only sees rows and seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from distributed import WorkerPlugin, get_worker

from pipeline.nn import MLP, AdamOptimizer

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, Worker

__all__ = [
    "SLOWDOWN_PLUGIN_NAME",
    "SlowdownPlugin",
    "ThrottleRecord",
    "current_slowdown",
    "get_slowdowns",
    "probe_task",
    "set_slowdown",
    "throttled",
]

SLOWDOWN_PLUGIN_NAME = "hmdspt-slowdown"

# worker address -> slowdown factor k >= 1 of the workers living in this process.
_SLOWDOWNS: dict[str, float] = {}


def _check_slowdown(k: float) -> float:
    try:
        k = float(k)
    except (TypeError, ValueError):
        raise ValueError(f"slowdown must be a number >= 1, got {k!r}") from None
    if not (math.isfinite(k) and k >= 1.0):
        raise ValueError(f"slowdown must be a finite number >= 1, got {k!r}")
    return k


class SlowdownPlugin(WorkerPlugin):
    """Worker plugin that makes a worker emulate a slower machine.

    Parameters
    ----------
    slowdown : float, default=1.0
        Factor ``k >= 1``: the worker sleeps ``(k - 1)`` times the thread CPU time of every
        compute chunk run under :func:`throttled`, so it computes ``1/k`` as fast.
    blas_threads : int or None, default=1
        BLAS/OpenMP threads allowed in the worker's process, set with
        ``threadpoolctl.threadpool_limits`` at setup. Several workers on few cores with
        multi-threaded BLAS oversubscribe the machine (5-20x slower, DESIGN.md).
        ``distributed.nanny.pre-spawn-environ`` already exports ``OMP_NUM_THREADS=1`` etc.
        to worker processes by default; this also covers a changed config. ``None`` leaves
        the process alone. Note that the limit is process-wide: for in-process workers it
        also limits the client's process.

    Notes
    -----
    Give each worker its own instance (``plugins={SlowdownPlugin(k)}`` in the worker's
    options, as :func:`pipeline.cluster.local_cluster` does), or register one instance with
    ``Client.register_plugin`` to slow down every worker alike.
    """

    name = SLOWDOWN_PLUGIN_NAME
    idempotent = False

    def __init__(self, slowdown: float = 1.0, blas_threads: int | None = 1) -> None:
        self.slowdown = _check_slowdown(slowdown)
        self.blas_threads = blas_threads

    def setup(self, worker: Worker) -> None:
        if self.blas_threads is not None:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=int(self.blas_threads))
        _SLOWDOWNS[worker.address] = self.slowdown

    def teardown(self, worker: Worker) -> None:
        _SLOWDOWNS.pop(worker.address, None)


def current_slowdown() -> float:
    """Slowdown ``k`` of the worker running the calling task (1.0 outside a worker)."""
    try:
        address = get_worker().address
    except ValueError:  # not inside a worker task: nothing to emulate
        return 1.0
    return _SLOWDOWNS.get(address, 1.0)


@dataclass
class ThrottleRecord:
    """What :func:`throttled` did for one chunk (filled in when the block exits).

    Attributes
    ----------
    cpu_s : float
        Thread CPU seconds the chunk used.
    sleep_s : float
        Seconds slept afterwards, ``(k - 1) * cpu_s``.
    """

    cpu_s: float = 0.0
    sleep_s: float = 0.0


@contextmanager
def throttled(slowdown: float | None = None) -> Iterator[ThrottleRecord]:
    """Run a compute chunk, then sleep ``(k - 1)`` times its thread CPU time.

    Parameters
    ----------
    slowdown : float, optional
        Factor ``k`` to apply; by default the running worker's (see
        :class:`SlowdownPlugin`), read when the chunk ends so that :func:`set_slowdown`
        takes effect at the next chunk.

    Yields
    ------
    record : ThrottleRecord
        Filled in with the chunk's CPU and sleep seconds after the block. For logging and
        tests only: code that measures speed must time rows against wall seconds.

    Notes
    -----
    Keep chunks well above the sleep granularity (tens of milliseconds of compute): the
    sleep is then accurate, and the duty cycle fine-grained enough that concurrent workers
    see each other as steady load. A chunk that raises is not followed by a sleep.
    """
    record = ThrottleRecord()
    start = time.thread_time()
    yield record
    record.cpu_s = time.thread_time() - start
    k = current_slowdown() if slowdown is None else _check_slowdown(slowdown)
    if k > 1.0 and record.cpu_s > 0.0:
        record.sleep_s = (k - 1.0) * record.cpu_s
        time.sleep(record.sleep_s)


# ------------------------------------------------------------------ client-side helpers
def _set_slowdown_here(k: float, dask_worker: Worker) -> float:
    _SLOWDOWNS[dask_worker.address] = k
    return k


def _get_slowdown_here(dask_worker: Worker) -> float:
    return _SLOWDOWNS.get(dask_worker.address, 1.0)


def set_slowdown(client: Client, worker_address: str, slowdown: float) -> None:
    """Change the emulated slowdown of one running worker (e.g. to make a straggler).

    Parameters
    ----------
    client : distributed.Client
        Client of the cluster.
    worker_address : str
        Address of the worker to change; the others keep theirs.
    slowdown : float
        New factor ``k >= 1``; applies from the worker's next compute chunk.

    Notes
    -----
    Runs on the worker's event loop (``Client.run``), so it takes effect even while a
    task is computing. A worker that restarts gets its plugin's original factor back.
    """
    k = _check_slowdown(slowdown)
    client.run(_set_slowdown_here, k, workers=[worker_address])


def get_slowdowns(client: Client) -> dict[str, float]:
    """Emulated slowdown of every worker, by address (for tests and reports, not scoring)."""
    return client.run(_get_slowdown_here)


# ------------------------------------------------------------------------------- probe
def _synthetic_targets(rng: np.random.RandomState, n: int, n_out: int, out_activation: str):
    if out_activation == "softmax":
        Y = np.zeros((n, n_out), dtype=np.float32)
        Y[np.arange(n), rng.randint(n_out, size=n)] = 1.0
        return Y
    if out_activation == "logistic":
        return (rng.uniform(size=(n, n_out)) < 0.5).astype(np.float32)
    return rng.standard_normal((n, n_out)).astype(np.float32)


def probe_task(
    layer_sizes: Sequence[int],
    seconds: float = 2.0,
    batch_size: int = 256,
    seed: int = 0,
    X: np.ndarray | None = None,
    Y: np.ndarray | None = None,
    n_rows: int = 4096,
    hidden_activation: str = "relu",
    out_activation: str = "softmax",
    chunk_seconds: float = 0.05,
    warmup_steps: int = 2,
) -> dict[str, float | int]:
    """Measure this worker's training speed with real Adam steps of the real model shape.

    Runs ``MLP.loss_and_grad`` + ``AdamOptimizer.update`` on mini-batches, in chunks of about
    ``chunk_seconds`` of CPU each under :func:`throttled`, until about ``seconds`` of wall
    time have been spent computing. Submit it to every worker at once (see
    :func:`pipeline.scoring.score_workers`): run concurrently, the workers contend for the
    machine as they will in training.

    Parameters
    ----------
    layer_sizes : sequence of int
        Units per layer of the model to be trained, input first.
    seconds : float, default=2.0
        Budget of measured busy (wall) seconds; the last chunk may overrun it by one chunk.
    batch_size : int, default=256
        Rows per mini-batch, as in training.
    seed : int, default=0
        Seed of the initial weights and of synthetic rows.
    X : ndarray of shape (n, layer_sizes[0]), optional
        Sample rows of the real data; synthetic standard normal rows if None.
    Y : ndarray of shape (n, layer_sizes[-1]), optional
        Encoded targets of ``X`` (one-hot for softmax); synthetic if None.
    n_rows : int, default=4096
        Synthetic rows to cycle through when ``X`` is None.
    hidden_activation, out_activation : str
        As in :class:`pipeline.nn.MLP`.
    chunk_seconds : float, default=0.05
        Thread CPU seconds per throttled chunk.
    warmup_steps : int, default=2
        Unmeasured steps first (buffer allocation, caches).

    Returns
    -------
    result : dict
        ``rows`` (int, rows processed in measured steps), ``steps`` (int), ``busy_s``
        (float, wall seconds of the measured compute including the emulation's sleeps) and
        ``speed`` (float, ``rows / busy_s`` in samples per second).
    """
    if seconds <= 0 or batch_size < 1:
        raise ValueError("seconds must be > 0 and batch_size >= 1")
    rng = np.random.RandomState(seed)
    model = MLP(layer_sizes, hidden_activation=hidden_activation, out_activation=out_activation)
    model.initialize(rng)
    opt = AdamOptimizer(model.n_params, dtype=model.dtype)
    n_in, n_out = model.layer_sizes[0], model.layer_sizes[-1]
    if X is None:
        X = rng.standard_normal((max(int(n_rows), batch_size), n_in)).astype(np.float32)
    X = np.ascontiguousarray(X, dtype=model.dtype)
    if X.ndim != 2 or X.shape[1] != n_in or X.shape[0] < 1:
        raise ValueError(f"X must have shape (n >= 1, {n_in}), got {X.shape}")
    if Y is None:
        Y = _synthetic_targets(rng, X.shape[0], n_out, out_activation)
    Y = np.ascontiguousarray(Y, dtype=model.dtype)
    if Y.shape != (X.shape[0], n_out):
        raise ValueError(f"Y must have shape ({X.shape[0]}, {n_out}), got {Y.shape}")
    # Whole batches only (a short last batch would be a different, cheaper step); tiny
    # samples are tiled up to one batch.
    if X.shape[0] < batch_size:
        reps = -(-batch_size // X.shape[0])
        X, Y = np.tile(X, (reps, 1))[:batch_size], np.tile(Y, (reps, 1))[:batch_size]
    starts = np.arange(0, X.shape[0] - batch_size + 1, batch_size)
    batches = [(X[s : s + batch_size], Y[s : s + batch_size]) for s in starts]

    def step(i: int) -> None:
        xb, yb = batches[i % len(batches)]
        model.loss_and_grad(xb, yb)
        opt.update(model.params, model.grad)

    for i in range(warmup_steps):
        step(i)

    steps = 0
    busy_start = time.perf_counter()
    busy = 0.0
    while busy < seconds:
        with throttled():
            chunk_start = time.thread_time()
            # At least one step per chunk; then until the chunk holds enough CPU time.
            while True:
                step(steps)
                steps += 1
                if time.thread_time() - chunk_start >= chunk_seconds:
                    break
        busy = time.perf_counter() - busy_start
    rows = steps * batch_size
    return {"rows": rows, "steps": steps, "busy_s": busy, "speed": rows / busy}

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
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed import WorkerPlugin, get_worker

from pipeline.merge import ErrorFeedback, compress
from pipeline.nn import MLP, AdamOptimizer, BatchBuffers, make_optimizer, minibatch_pass

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


# ----------------------------------------------------------------------------------
# The training round (one task per worker per round)
# ----------------------------------------------------------------------------------
# Per-run state kept in the worker process between rounds: the model object (its work
# buffers), the local optimizer (its moments), the error-feedback residual and the RNG.
# Keyed by run id; dropped by ``drop_run_state`` when the fit ends.
_RUN_STATE: dict[str, dict[str, Any]] = {}


@dataclass(frozen=True)
class RoundSpec:
    """What a worker needs to know for one round (small; pickled per task).

    Attributes
    ----------
    run_id : str
        Key of the per-run state on the worker.
    layer_sizes, hidden_activation, out_activation, alpha, dtype
        The model (see :class:`pipeline.nn.MLP`).
    optimizer : dict
        Keyword arguments of :func:`pipeline.nn.make_optimizer` (with ``solver``).
    batch_size : int
        Local mini-batch size.
    mode : {"delta", "gradient"}
        ``"delta"``: local mini-batch steps, return ``w_i - w_t`` (hmdspt, local).
        ``"gradient"``: one gradient over the round's rows, return it (bsp).
    new_epoch : bool
        First round of an epoch: every row of the shard becomes due again.
    rounds_left : int
        Rounds left in the epoch including this one; the worker processes
        ``ceil(due / rounds_left)`` of its due rows, so every row is processed exactly
        once per epoch even when rows move between rounds.
    learning_rate : float
        Current step size of the driver's schedule (SGD schedules).
    compression : str
        ``"none"``, ``"float16"`` or ``"topk"`` (with error feedback).
    topk : float
        Fraction kept by ``"topk"``.
    seed : int
        Seeds the worker's row order (with the worker address and round).
    chunk_batches : int
        Mini-batches per throttled compute chunk.
    return_row_ids : bool
        Also return the source ids of the rows processed (audits and tests).
    """

    run_id: str
    layer_sizes: tuple[int, ...]
    hidden_activation: str
    out_activation: str
    alpha: float
    dtype: str
    optimizer: dict
    batch_size: int
    mode: str
    new_epoch: bool
    rounds_left: int
    learning_rate: float
    compression: str = "none"
    topk: float = 0.1
    seed: int = 0
    round: int = 0
    chunk_batches: int = 16
    return_row_ids: bool = False


def _state_for(spec: RoundSpec) -> dict[str, Any]:
    state = _RUN_STATE.get(spec.run_id)
    if state is None:
        # bsp workers return data gradients only: the driver adds the L2 term once.
        alpha = 0.0 if spec.mode == "gradient" else spec.alpha
        model = MLP(
            spec.layer_sizes,
            spec.hidden_activation,
            spec.out_activation,
            alpha,
            np.dtype(spec.dtype),
        )
        optimizer = make_optimizer(n_params=model.n_params, dtype=model.dtype, **spec.optimizer)
        state = {
            "model": model,
            "optimizer": optimizer,
            "feedback": ErrorFeedback(spec.compression, k=spec.topk)
            if spec.compression != "none"
            else None,
            "buffers": BatchBuffers(
                spec.batch_size, spec.layer_sizes[0], spec.layer_sizes[-1], model.dtype
            ),
        }
        _RUN_STATE[spec.run_id] = state
    return state


def drop_run_state(run_id: str) -> bool:
    """Forget a run's state on this worker (call through ``client.run``)."""
    return _RUN_STATE.pop(run_id, None) is not None


def round_task(shard, params: np.ndarray, spec: RoundSpec) -> dict[str, Any]:
    """One worker's part of one synchronous round.

    Parameters
    ----------
    shard : pipeline.staging.Shard
        The worker's rows (held in its memory between rounds); ``shard.y`` holds the
        encoded targets. Its ``done`` mask records the rows already processed this epoch
        and travels with the rows when they move.
    params : ndarray
        The global parameters ``w_t`` (broadcast once per round).
    spec : RoundSpec
        The round's settings.

    Returns
    -------
    result : dict
        ``payload`` (compressed delta or gradient), ``rows``, ``steps``, ``loss_sum``,
        ``busy_s`` (compute wall seconds including emulation), ``due_left`` and
        ``bytes_out``.
    """
    start = time.perf_counter()
    state = _state_for(spec)
    model, optimizer = state["model"], state["optimizer"]
    if spec.new_epoch:
        shard.done[:] = False
    due = np.flatnonzero(~shard.done)
    quota = -(-len(due) // max(spec.rounds_left, 1))
    # Deterministic per shard and round, different across workers (first row id).
    first_row = int(shard.row_ids[0]) if len(shard) else 0
    rng = np.random.default_rng([spec.seed, spec.round, first_row])
    rows = rng.permutation(due)[:quota] if quota else due[:0]
    shard.done[rows] = True
    model.set_params(params)
    if hasattr(optimizer, "lr_schedule"):
        optimizer.learning_rate = spec.learning_rate

    loss_sum, steps = 0.0, 0
    if spec.mode == "gradient":
        if quota:
            with throttled():
                # n_total=1: the sum of the rows' data gradients; the driver divides.
                loss_sum = model.loss_and_grad(shard.X[rows], shard.y[rows], n_total=1)
            steps = 1
        payload = compress(model.grad.copy(), "none")
    else:
        chunk = spec.batch_size * spec.chunk_batches
        for lo in range(0, quota, chunk):
            with throttled():
                part_loss, part_steps = minibatch_pass(
                    model,
                    optimizer,
                    shard.X,
                    shard.y,
                    rows[lo : lo + chunk],
                    spec.batch_size,
                    state["buffers"],
                )
            loss_sum += part_loss
            steps += part_steps
        delta = model.params  # reuse the buffer: w_i - w_t in place
        delta -= params
        feedback = state["feedback"]
        payload = feedback.compress(delta) if feedback is not None else compress(delta.copy())
    result = {
        "payload": payload,
        "rows": int(quota),
        "steps": int(steps),
        "loss_sum": float(loss_sum),
        "busy_s": time.perf_counter() - start,
        "due_left": int(len(due) - quota),
        "bytes_out": int(payload.nbytes),
    }
    if spec.return_row_ids:
        result["row_ids"] = shard.row_ids[rows]
    return result

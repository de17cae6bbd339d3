"""Code that runs on a Dask worker: the emulation throttle, the probe, the round, speed memory.

This module is imported by the workers, so task functions defined here are pickled by
reference (a module path), never by value; defining them in ``__main__`` would ship their
code with every task.

Emulated heterogeneity (see docs/design.md, "Heterogeneity on one machine")
----------------------------------------------------------------------
A worker emulating a machine ``k`` times slower than the fastest runs a duty cycle: after
each compute chunk that used ``t`` seconds of its thread's CPU time it sleeps ``(k - 1) t``.
Thread CPU time, not wall time: on a shared machine contention stretches a chunk's wall
time, and sleeping in proportion to it would slow the already slowed workers a second time
(docs/design.md, "Heterogeneity on one machine").

The slowdown ``k`` of a worker lives on its :class:`HMDSPTWorkerPlugin` (in-process
workers sharing one interpreter each have their own), set up with the worker and gone with
it; :func:`set_slowdown` changes it on a running worker, and compute code applies it by
wrapping each chunk in :func:`throttled`. Code that measures speed (the scorer) never reads
it: it only sees rows and seconds. The same plugin holds the runs' state between rounds and
the speeds the worker remembers (see :class:`HMDSPTWorkerPlugin`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed import WorkerPlugin, get_worker
from distributed.core import Status
from distributed.protocol import to_serialize
from distributed.utils import sync
from distributed.worker import WORKER_ANY_RUNNING
from distributed.worker_state_machine import FreeKeysEvent

from hmdspt.core.callers import PACKAGE_DIR
from hmdspt.core.merge import ErrorFeedback, compress
from hmdspt.core.nn import (
    HIDDEN_ACTIVATIONS,
    MLP,
    OUTPUT_ACTIVATIONS,
    AdamOptimizer,
    BatchBuffers,
    make_optimizer,
    minibatch_pass,
    split_weights,
)
from hmdspt.core.process import HUGE_PAGES, ProcessSetting
from hmdspt.core.rounds import round_share
from hmdspt.core.speed import PROBE_ESTIMATORS, chunk_speed

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, Worker

__all__ = [
    "MAX_SLOWDOWN",
    "ROUND_OP",
    "WORKER_PLUGIN_NAME",
    "HMDSPTWorkerPlugin",
    "ThrottleRecord",
    "WorkerNotRunning",
    "current_slowdown",
    "get_slowdowns",
    "drop_run_state",
    "drop_runs",
    "forget_speeds",
    "orphan_keys",
    "parse_run_key",
    "probe_task",
    "remembered_speed",
    "run_ids_held",
    "run_round",
    "run_key",
    "model_speed_key",
    "speed_key",
    "set_slowdown",
    "throttled",
    "unremembered_busy_s",
]


#: The most an emulated worker is slowed down. It sleeps ``k - 1`` times each chunk's
#: compute: at 1000x the embedded default still fitted (an epoch in 8.5 s); at 100,000x the
#: slow worker's probe outlasted its timeout, and at 1e308x the sleep overflowed.
MAX_SLOWDOWN = 1000.0


def _check_slowdown(k: float) -> float:
    try:
        k = float(k)
    except (TypeError, ValueError):
        raise ValueError(
            f"slowdown must be a number from 1 to {MAX_SLOWDOWN:g}, got {k!r}"
        ) from None
    if not (math.isfinite(k) and 1.0 <= k <= MAX_SLOWDOWN):
        raise ValueError(f"slowdown must be a number from 1 to {MAX_SLOWDOWN:g}, got {k!r}")
    return k


def _slowdown_of(worker: Worker) -> float:
    plugin = worker.plugins.get(WORKER_PLUGIN_NAME)
    return 1.0 if plugin is None else plugin.slowdown


def current_slowdown() -> float:
    """Slowdown ``k`` of the worker running the calling task (1.0 outside a worker)."""
    try:
        worker = get_worker()
    except ValueError:  # not inside a worker task: nothing to emulate
        return 1.0
    return _slowdown_of(worker)


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
def throttled(slowdown: float | Callable[[], float] | None = None) -> Iterator[ThrottleRecord]:
    """Run a compute chunk, then sleep ``(k - 1)`` times its thread CPU time.

    Parameters
    ----------
    slowdown : float or callable, optional
        Factor ``k`` to apply, or a function returning it; by default the running task's
        worker's (see :class:`HMDSPTWorkerPlugin`). Read when the chunk ends, so that
        :func:`set_slowdown` takes effect at the next chunk.

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
    if slowdown is None:
        k = current_slowdown()
    else:
        k = _check_slowdown(slowdown() if callable(slowdown) else slowdown)
    if k > 1.0 and record.cpu_s > 0.0:
        record.sleep_s = (k - 1.0) * record.cpu_s
        time.sleep(record.sleep_s)


# ------------------------------------------------------------------ client-side helpers
def _set_slowdown_here(k: float, dask_worker: Worker) -> float:
    # A worker started without the plugin gets one (BLAS left alone).
    _worker_plugin(dask_worker, create=True).slowdown = k
    return k


def _get_slowdown_here(dask_worker: Worker) -> float:
    return _slowdown_of(dask_worker)


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
    task is computing. A worker that restarts gets the factor its plugin was given for it
    back (1 if none).
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


# Least thread-CPU seconds of a throttled compute chunk: each sleep pays a wake-up latency,
# which chunks of a few milliseconds would add to the slow workers' 1/k.
CHUNK_CPU_S = 0.05


# Least thread-CPU seconds of a chunk of the adaptive probe when a row budget shrinks its
# chunks (see :func:`probe_task`).
MIN_PROBE_CHUNK_CPU_S = 0.004


def batches_per_chunk(cpu_s: float, batches: int, target_s: float = CHUNK_CPU_S) -> int:
    """Batches a chunk needs for ``target_s`` of CPU, from one that took ``cpu_s``."""
    if cpu_s <= 0 or batches < 1:
        return max(batches, 1)
    return max(1, int(np.ceil(target_s * batches / cpu_s)))


def check_probe_settings(
    layer_sizes: Sequence[int],
    seconds: float | None,
    batch_size: int,
    hidden_activation: str,
    out_activation: str,
    *,
    chunk_batches: int = 16,
    min_seconds: float = 0.1,
    max_seconds: float = 2.0,
    rel_tol: float = 0.05,
    min_chunks: int = 8,
    max_rows: int | None = None,
    estimator: str = "trimmed",
    hiccup_factor: float = 3.0,
) -> None:
    """Raise ValueError, one line, for a setting :func:`probe_task` cannot run with.

    Called by the probe's caller before it submits anything (else each worker failed the
    task, and logged its traceback, for the caller to raise the first) and by the task.
    Numbers must be finite: a probe of ``nan`` seconds had a deadline nothing reached.
    """
    sizes = list(layer_sizes) if isinstance(layer_sizes, Sequence) else None
    if (
        sizes is None
        or isinstance(layer_sizes, str)
        or len(sizes) < 2
        or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in sizes)
    ):
        raise ValueError(
            "layer_sizes must be a sequence of at least two whole numbers >= 1 (input, "
            f"hidden..., output), got {layer_sizes!r}"
        )
    if hidden_activation not in HIDDEN_ACTIVATIONS or out_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(
            f"hidden_activation must be one of {HIDDEN_ACTIVATIONS} and out_activation one of "
            f"{OUTPUT_ACTIVATIONS}, got {hidden_activation!r}, {out_activation!r}"
        )
    if not all(_whole(n) and n >= 1 for n in (batch_size, chunk_batches)):
        raise ValueError(
            f"batch_size and chunk_batches must be whole numbers >= 1, got {batch_size!r}, "
            f"{chunk_batches!r}"
        )
    if seconds is not None:
        if not (_real(seconds) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        return
    if not (
        _real(min_seconds)
        and _real(max_seconds)
        and math.isfinite(max_seconds)
        and 0 <= min_seconds <= max_seconds
        and max_seconds > 0
    ):
        raise ValueError(
            f"need 0 <= min_seconds <= max_seconds, max_seconds finite and > 0, got "
            f"min_seconds={min_seconds!r}, max_seconds={max_seconds!r}"
        )
    if not (_real(rel_tol) and rel_tol >= 0) or min_chunks < 2:
        raise ValueError(f"rel_tol must be a number >= 0 and min_chunks >= 2, got {rel_tol!r}")
    if max_rows is not None and not (_whole(max_rows) and max_rows >= 1):
        raise ValueError(f"max_rows must be a whole number >= 1, got {max_rows!r}")
    if estimator not in PROBE_ESTIMATORS or not (_real(hiccup_factor) and hiccup_factor > 1):
        raise ValueError(
            f"estimator must be one of {PROBE_ESTIMATORS} and hiccup_factor > 1, got "
            f"{estimator!r}, {hiccup_factor!r}"
        )


def _whole(n: Any) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


def probe_task(
    layer_sizes: Sequence[int],
    seconds: float | None = None,
    batch_size: int = 256,
    seed: int = 0,
    X: np.ndarray | None = None,
    Y: np.ndarray | None = None,
    n_rows: int = 4096,
    hidden_activation: str = "relu",
    out_activation: str = "softmax",
    chunk_batches: int = 16,
    warmup_steps: int = 8,
    *,
    min_seconds: float = 0.1,
    max_seconds: float = 2.0,
    rel_tol: float = 0.05,
    min_chunks: int = 8,
    max_rows: int | None = None,
    estimator: str = "trimmed",
    hiccup_factor: float = 3.0,
) -> dict[str, Any]:
    """Measure this worker's training speed with real Adam steps of the real model shape.

    Trains the model shape with :func:`hmdspt.core.nn.minibatch_pass` (the round's own loop,
    row gather included) in chunks of ``chunk_batches`` mini-batches, each under
    :func:`throttled` as in a training round, and times every chunk in wall seconds. Submit
    it to every worker at once (see :func:`hmdspt.parallel.scoring.score_workers`): run
    concurrently, the workers contend for the machine as they will in training.

    Two modes:

    - **adaptive** (``seconds=None``, the default): after every chunk, stop when at least
      ``min_seconds`` and ``min_chunks`` are done and the relative standard error of the
      speed estimated from the chunks (:func:`~hmdspt.core.speed.chunk_speed`) is below
      ``rel_tol``, or when ``max_rows`` rows are done (never before that minimum), or at
      ``max_seconds`` whatever the precision. A steady worker stops after about
      ``min_seconds``; a noisy one probes longer, up to ``max_seconds``. The speed is robust
      to hiccups: by default the time average of the chunks without the hiccups, optionally
      their median.
    - **fixed** (``seconds`` given, the original probe): chunks until ``seconds`` of busy
      wall time have passed; the speed is ``rows / busy_s``.

    Parameters
    ----------
    layer_sizes : sequence of int
        Units per layer of the model to be trained, input first.
    seconds : float, optional
        Fixed busy (wall) seconds to probe; the last chunk may overrun it. None: adaptive.
    batch_size : int, default=256
        Rows per mini-batch, as in training.
    seed : int, default=0
        Seed of the initial weights, the row order and synthetic rows.
    X : ndarray of shape (n, layer_sizes[0]), optional
        Sample rows of the real data; synthetic standard normal rows if None.
    Y : ndarray of shape (n, layer_sizes[-1]), optional
        Encoded targets of ``X`` (one-hot for softmax); synthetic if None.
    n_rows : int, default=4096
        Synthetic rows to cycle through when ``X`` is None.
    hidden_activation, out_activation : str
        As in :class:`hmdspt.core.nn.MLP`.
    chunk_batches : int, default=16
        Mini-batches per throttled chunk: the training round's default
        (:class:`RoundSpec`), so that the emulated duty cycle, and the contention it
        causes, is the one training will see.
    warmup_steps : int, default=8
        Unmeasured steps first (buffer allocation, caches).
    min_seconds : float, default=0.1
        Adaptive mode: least busy seconds, so that every worker is measured while the
        others run too (a worker probing alone would see no contention).
    max_seconds : float, default=2.0
        Adaptive mode: most busy seconds (the last chunk may overrun it).
    rel_tol : float, default=0.05
        Adaptive mode: target relative standard error of the median speed (0: run to
        ``max_seconds`` or ``max_rows``).
    min_chunks : int, default=8
        Adaptive mode: least chunks before the spread of their speeds is trusted.
    max_rows : int, optional
        Adaptive mode: most rows to process once the minimum is met; the last chunk is cut
        to whole mini-batches so that it overruns by less than one mini-batch. Chunks
        shrink below ``chunk_batches`` so that ``min_chunks`` of them fit the budget, down
        to ``MIN_PROBE_CHUNK_CPU_S`` of compute each.
    estimator : {"trimmed", "median"}, default="trimmed"
        Adaptive mode: how the chunks make one speed; see :func:`~hmdspt.core.speed.chunk_speed`.
    hiccup_factor : float, default=3.0
        Adaptive mode, ``"trimmed"``: a chunk that many times slower than the median chunk
        is a hiccup and left out.

    Returns
    -------
    result : dict
        ``rows`` (int, rows processed in measured steps), ``steps`` (int), ``busy_s``
        (float, wall seconds of the measured compute including the emulation's sleeps) and
        ``speed`` (float, samples per second). Adaptive mode adds ``chunks`` (int),
        ``dropped`` (chunks left out as hiccups), ``rel_se`` (of ``speed``), ``stop`` (why
        it stopped: ``"rel_tol"``, ``"max_rows"`` or ``"max_seconds"``) and, for
        comparison, ``mean_speed`` (``rows / busy_s``, hiccups included),
        ``trimmed_speed`` and ``median_speed`` (both estimators).

    Notes
    -----
    Why robust in adaptive mode: a probe of a few tenths of a second holds few chunks, and
    one chunk stretched by a scheduling hiccup (a foreign process, a garbage collection,
    the worker's own heartbeat) would move the plain average by its full length. Hiccups
    are real costs, but spread over a training round's seconds rather than concentrated in
    a probe, and the online scorer measures them from ``rows / busy_s`` of every round.
    The fixed mode keeps its original ``rows / busy_s`` (a long probe averages them out).
    """
    adaptive = seconds is None
    check_probe_settings(
        layer_sizes,
        seconds,
        batch_size,
        hidden_activation,
        out_activation,
        chunk_batches=chunk_batches,
        min_seconds=min_seconds,
        max_seconds=max_seconds,
        rel_tol=rel_tol,
        min_chunks=min_chunks,
        max_rows=max_rows,
        estimator=estimator,
        hiccup_factor=hiccup_factor,
    )

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
    # Weighted targets (one more column) train as the rounds will train them.
    if Y.ndim != 2 or Y.shape[0] != X.shape[0] or Y.shape[1] not in (n_out, n_out + 1):
        raise ValueError(
            f"Y must have shape ({X.shape[0]}, {n_out}) (or {n_out + 1} columns with sample "
            f"weights), got {Y.shape}"
        )
    # Arrays that arrive through Dask's comms can be misaligned, where the row gather is
    # slower than on staged shards, which are aligned (``hmdspt.core.shard.Shard``).
    X = X if X.flags.aligned else X.copy()
    Y = Y if Y.flags.aligned else Y.copy()

    # The row order cycles through the sample in a shuffled order, a whole number of
    # chunks long: every chunk is ``chunk_batches`` full batches (a short last batch would
    # be a different, cheaper step) however few sample rows there are.
    n_sample = X.shape[0]
    buffers = BatchBuffers(batch_size, n_in, Y.shape[1], model.dtype)
    warm = rng.permutation(n_sample)[np.arange(batch_size * max(warmup_steps, 1)) % n_sample]
    cpu_start = time.thread_time()
    minibatch_pass(model, opt, X, Y, warm, batch_size, buffers)
    if not adaptive:
        # Fixed mode measures the emulated speeds as training runs them: chunks of at
        # least CHUNK_CPU_S of compute (see there). Adaptive mode keeps short chunks so it
        # can stop early; its throttled workers then read a little slow (up to ~15 %),
        # which the online scorer corrects from the first training round on.
        chunk_batches = max(
            chunk_batches,
            batches_per_chunk(time.thread_time() - cpu_start, max(warmup_steps, 1)),
        )
    elif max_rows is not None:
        # A row budget that cannot hold ``min_chunks`` chunks would be overridden by the
        # minimum, so the chunks shrink to fit it, but not below MIN_PROBE_CHUNK_CPU_S of compute:
        # shorter chunks measure the emulation's sleep latency rather than the worker.
        warm_cpu_per_batch = (time.thread_time() - cpu_start) / max(warmup_steps, 1)
        fit_budget = max_rows // (min_chunks * batch_size)
        floor = math.ceil(MIN_PROBE_CHUNK_CPU_S / max(warm_cpu_per_batch, 1e-9))
        chunk_batches = max(1, min(chunk_batches, max(fit_budget, floor)))
    chunk_rows = batch_size * chunk_batches
    order = rng.permutation(n_sample)[np.arange(chunk_rows * -(-n_sample // chunk_rows)) % n_sample]

    chunk_rows_done: list[int] = []  # rows and wall seconds of every measured chunk
    chunk_walls: list[float] = []
    rows = steps = 0
    pos = 0
    stop = "seconds"
    next_check = min_chunks  # precision is checked at geometrically spaced chunk counts
    busy_start = time.perf_counter()
    while True:
        take = chunk_rows
        if adaptive and max_rows is not None and rows + take > max_rows:
            # Cut the chunk to the rows left, but only once the minimum is met: before it,
            # the minimum wins over the row budget.
            if time.perf_counter() - busy_start >= min_seconds and len(chunk_walls) >= min_chunks:
                take = batch_size * max(1, -(-(max_rows - rows) // batch_size))
        idx = order[pos : pos + take]
        pos = (pos + take) % len(order)
        chunk_start = time.perf_counter()
        with throttled():
            _, n_steps = minibatch_pass(model, opt, X, Y, idx, batch_size, buffers)
        now = time.perf_counter()
        steps += n_steps
        rows += len(idx)
        busy = now - busy_start
        if not adaptive:
            if busy >= seconds:
                break
            continue
        chunk_rows_done.append(len(idx))
        chunk_walls.append(now - chunk_start)
        n_chunks = len(chunk_walls)
        if busy >= max_seconds:
            stop = "max_seconds"
            break
        if busy < min_seconds or n_chunks < min_chunks:
            continue
        if max_rows is not None and rows >= max_rows:
            stop = "max_rows"
            break
        if n_chunks >= next_check:
            # The estimate is O(n): checking at chunk counts 5 % apart keeps the bookkeeping
            # linear in the chunks even for tiny models with sub-millisecond chunks.
            next_check = max(n_chunks + 1, math.ceil(n_chunks * 1.05))
            _, rel_se, _ = chunk_speed(chunk_rows_done, chunk_walls, estimator, hiccup_factor)
            if rel_se < rel_tol:
                stop = "rel_tol"
                break

    busy = time.perf_counter() - busy_start
    result: dict[str, Any] = {"rows": rows, "steps": steps, "busy_s": busy, "speed": rows / busy}
    if adaptive:
        estimates = {
            name: chunk_speed(chunk_rows_done, chunk_walls, name, hiccup_factor)
            for name in PROBE_ESTIMATORS
        }
        speed, rel_se, dropped = estimates[estimator]
        result.update(
            speed=speed,
            chunks=len(chunk_walls),
            dropped=dropped,
            rel_se=rel_se,
            stop=stop,
            mean_speed=rows / busy,
            trimmed_speed=estimates["trimmed"][0],
            median_speed=estimates["median"][0],
        )
    return result


# ----------------------------------------------------------------------------------
# Speed memory: what a worker measured in its latest fit of a model shape
# ----------------------------------------------------------------------------------
# A probe costs a few tenths of a second before a fit's first round, whatever the fit
# (its floor is a task round trip plus enough timed chunks on the slowest worker). A
# worker that trained the same model shape minutes ago has measured its speed already,
# over whole rounds of real rows, so repeated fits on one cluster (a grid search, a
# comparison, a refit) reuse that measurement instead of probing again; the online
# scores of the new fit correct it from its first round, as they correct a probe.
# Held by the worker's HMDSPTWorkerPlugin (its ``speeds``, keyed by speed_key()), so it
# lives and dies with the worker.

# Least busy seconds of regular rounds a fit must have spent on a worker before its speed
# is remembered: more compute than the probe it replaces times (docs/design.md, "Round loop").
MIN_REMEMBERED_BUSY_S = 0.3


def speed_key(
    layer_sizes: Sequence[int],
    batch_size: int,
    dtype: Any,
    hidden_activation: str,
    out_activation: str,
) -> tuple:
    """What a remembered speed belongs to: the model shape and the mini-batch size."""
    return (
        tuple(int(n) for n in layer_sizes),
        int(batch_size),
        np.dtype(dtype).name,
        str(hidden_activation),
        str(out_activation),
    )


def model_speed_key(model: MLP, batch_size: int) -> tuple:
    """:func:`speed_key` of ``model`` trained in mini-batches of ``batch_size`` rows."""
    return speed_key(
        model.layer_sizes, batch_size, model.dtype, model.hidden_activation, model.out_activation
    )


def _remember_speed(plugin: HMDSPTWorkerPlugin, spec: RoundSpec, rows: int, busy_s: float) -> None:
    """Add a round's rows and busy seconds to this worker's record of the model shape.

    A new fit starts its own total, except after fits too short to be remembered: their
    totals, if their last round is younger than ``spec.speed_memory_s``, carry on into it,
    so that a run of short fits (a grid search's) is remembered once they add up to
    ``MIN_REMEMBERED_BUSY_S`` and later fits skip the probe.
    """
    key = speed_key(
        spec.layer_sizes, spec.batch_size, spec.dtype, spec.hidden_activation, spec.out_activation
    )
    entry = plugin.speeds.setdefault(key, {})
    now = time.time()
    if entry.get("run_id") != spec.run_id:  # a new fit
        carried = (
            entry.get("busy_s", 0.0) < MIN_REMEMBERED_BUSY_S
            and now - entry.get("updated", -math.inf) <= spec.speed_memory_s
        )
        if not carried:
            entry.update(rows=0, busy_s=0.0, fits=0)
        entry.update(run_id=spec.run_id, fits=entry.get("fits", 0) + 1)
    entry["rows"] += rows
    entry["busy_s"] += busy_s
    entry["updated"] = now
    if entry["busy_s"] >= MIN_REMEMBERED_BUSY_S:
        entry["remembered"] = {
            "speed": entry["rows"] / entry["busy_s"],
            "busy_s": entry["busy_s"],
            "run_id": spec.run_id,
            "fits": entry["fits"],
            "time": now,
        }


def _speed_entry(key: tuple, dask_worker: Worker) -> dict | None:
    """This worker's record of the model shape ``key`` (None: none, or no plugin)."""
    plugin = _worker_plugin(dask_worker)
    return None if plugin is None else plugin.speeds.get(tuple(key))


def remembered_speed(key: tuple, max_age_s: float, dask_worker: Worker) -> dict | None:
    """This worker's remembered speed for ``key`` (call through ``client.run``).

    Parameters
    ----------
    key : tuple
        From :func:`speed_key`.
    max_age_s : float
        Older memories (seconds since the remembering fit's last round) are not returned.
    dask_worker : distributed.Worker
        Supplied by ``client.run``.

    Returns
    -------
    memory : dict or None
        ``speed`` (rows per busy second), ``busy_s`` (what it was measured over), ``run_id``
        of the fit that completed it, ``fits`` (how many fits it adds up: more than one
        when short fits carried their totals on) and ``age_s``; None when there is none
        young enough.
    """
    entry = _speed_entry(key, dask_worker)
    memory = None if entry is None else entry.get("remembered")
    if memory is None:
        return None
    age_s = time.time() - memory["time"]
    if age_s > max_age_s:
        return None
    return {**{k: v for k, v in memory.items() if k != "time"}, "age_s": age_s}


def unremembered_busy_s(key: tuple, dask_worker: Worker) -> float:
    """Busy seconds this worker holds for ``key`` that made no memory yet (call through
    ``client.run``): what fits too short to be remembered added up so far (0: none)."""
    entry = _speed_entry(key, dask_worker)
    busy_s = 0.0 if entry is None else float(entry.get("busy_s", 0.0))
    return busy_s if busy_s < MIN_REMEMBERED_BUSY_S else 0.0


def forget_speeds(dask_worker: Worker) -> int:
    """Forget every speed this worker remembers (call through ``client.run``)."""
    plugin = _worker_plugin(dask_worker)
    if plugin is None:
        return 0
    n = len(plugin.speeds)
    plugin.speeds.clear()
    return n


# ----------------------------------------------------------------------------------
# The training round (one call per worker per round, w_t with it)
# ----------------------------------------------------------------------------------
# Per-run state kept on a worker between rounds: the model object (its work buffers), the
# local optimizer (its moments), the error-feedback residual and the chunk size. It lives
# on the worker's HMDSPTWorkerPlugin, keyed by run id, and goes when the run ends: at the
# trainer's clean-up (drop_run_state), or when the scheduler sees the run's driver
# disconnect (hmdspt.parallel.lifecycle.RunOwnersPlugin calls drop_runs), so a driver that
# dies leaves nothing behind. Data of a run (its shards) is scattered under keys named by
# run_key, so that the worker can drop a run's keys too, including those of a scatter
# interrupted before the scheduler learnt of them, which nothing else would free.
WORKER_PLUGIN_NAME = "hmdspt"
RUN_KEY_PREFIX = "hmdspt/"
#: The worker's comm handler a fit's rounds are sent to (HMDSPTWorkerPlugin.round_handler).
ROUND_OP = "hmdspt_round"


class WorkerNotRunning(RuntimeError):
    """A worker refused a round: it is in the cluster but not running (paused for memory,
    retiring, closing), so it takes no new work, as it would take no task."""

    def __init__(self, address: str, status: str) -> None:
        super().__init__(address, status)
        self.address, self.status = address, status

    def __str__(self) -> str:
        return f"worker {self.address} is {self.status}, not running"


# Task states in which a task still needs its inputs in memory.
_NEEDS_INPUTS = frozenset(
    {"waiting", "ready", "constrained", "executing", "long-running", "fetch", "flight"}
)


def run_key(run_id: str, owner: str, name: str) -> str:
    """A new, unique Dask key for data of run ``run_id`` owned by client ``owner``.

    ``"hmdspt/<run_id>/<owner>/<name>-<uuid>"``; :func:`parse_run_key` reads it back.
    """
    for part in (run_id, owner):
        if not part or "/" in part:
            raise ValueError(f"run ids and client ids in keys must be non-empty, no '/': {part!r}")
    return f"{RUN_KEY_PREFIX}{run_id}/{owner}/{name}-{uuid.uuid4().hex}"


def parse_run_key(key: object) -> tuple[str, str] | None:
    """``(run_id, owner)`` of a key made by :func:`run_key`; None for any other key."""
    if not isinstance(key, str) or not key.startswith(RUN_KEY_PREFIX):
        return None
    parts = key[len(RUN_KEY_PREFIX) :].split("/")
    return (parts[0], parts[1]) if len(parts) == 3 else None


@dataclass
class _Run:
    owner: str | None  # client id of the driver, once a key of the run told it
    state: dict[str, Any] | None = None
    quiet: bool = False  # its rounds asked for a quiet worker (RoundSpec.quiet_workers)


#: The worker's periodic callbacks a quiet run changes, and the period each runs at
#: meanwhile (None: stopped). The statistical profiler samples every thread's stack every
#: 10 ms and the tick measures the event loop every 20 ms: with both, the testbed's fits of
#: the embedded default took about a tenth longer (docs/design.md, "Quiet workers").
QUIET_CALLBACKS: dict[str, float | None] = {"profile": None, "profile-cycle": None, "tick": 1000.0}


@dataclass
class _Handover:
    """What a plugin removed from a running worker leaves to its same-named successor."""

    slowdown: float
    runs: dict[str, _Run]
    ended: dict[str, None]
    speeds: dict[tuple, dict[str, Any]]


# Attribute of the worker under which a removed plugin leaves its _Handover.
_HANDOVER_ATTR = "_hmdspt_handover"


def _limit_blas(threads: int) -> Callable[[], Any]:
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads).restore_original_limits


_BLAS_LIMIT = ProcessSetting(_limit_blas)


class _OwnDataErrors(logging.Filter):
    """Drops a worker's "Compute Failed" record of a task of this package's that found bad
    rows (a :class:`~hmdspt.core.shard.DataError`: a NaN weight, a NaN in an ``eval_set``):
    the fit raises that error in one line naming the row, and each worker's record with
    its traceback came first (in-process workers print it on the user's terminal). Any
    other task's failure is logged as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Compute Failed") or len(record.args or ()) < 5:
            return True
        exception, traceback = str(record.args[3]), str(record.args[4])
        return not (exception.startswith("DataError(") and PACKAGE_DIR in traceback)


_OWN_DATA_ERRORS = _OwnDataErrors()


class HMDSPTWorkerPlugin(WorkerPlugin):
    """The one HMDSPT plugin of a worker: its emulation, its runs' state, its speeds.

    It holds

    - the emulated slowdown ``k`` of the worker (``slowdown``, applied by :func:`throttled`,
      changed by :func:`set_slowdown`), the BLAS thread limit and numpy's huge page
      advice, set at setup;
    - the per-run state of HMDSPT fits, by run id (``runs``). A run is held from the first
      of its keys to land on the worker (which names its owner, see :func:`run_key`) or its
      first round, until it ends (:meth:`end_runs`: at the fit's clean-up, or when
      its driver's client disconnects, see :mod:`hmdspt.parallel.lifecycle`). Ending a run
      drops its state and frees its keys in the worker's memory; a key of an ended run that
      lands later (the tail of an interrupted broadcast) is freed as it lands, for the last
      ``max_ended`` ended runs (``ended``). Freeing goes through the worker's state machine,
      so the worker tells the scheduler, which forgets the key if it knew it;
    - the speeds the worker remembers from its fits (``speeds``, by :func:`speed_key`),
      which outlive a run but not the worker;
    - the periods of the worker's profiler and tick while a quiet run is held
      (:data:`QUIET_CALLBACKS`): the first round of a run that asks for it
      (``RoundSpec.quiet_workers``) quiets them, and the end of the last such run, or
      the plugin's teardown, gives them back as they were.

    Everything goes with the worker (:meth:`teardown`).

    Parameters
    ----------
    slowdowns : float, mapping of worker name to float, or None, default=None
        Emulated slowdown ``k >= 1``: one for every worker, or by worker name (a worker
        whose name is missing runs at ``k = 1``). The worker sleeps ``(k - 1)`` times the
        thread CPU time of every compute chunk run under :func:`throttled`, so it computes
        ``1/k`` as fast. None (what a fit registers) sets no slowdown: the worker keeps the
        one it has (see Notes), else 1.
    blas_threads : int or None, default=None
        BLAS/OpenMP threads allowed in the worker's process, set with
        ``threadpoolctl.threadpool_limits`` at setup: several workers on few cores with
        multi-threaded BLAS oversubscribe the machine (docs/design.md, "Heterogeneity on
        one machine"). ``distributed.nanny.pre-spawn-environ`` already exports
        ``OMP_NUM_THREADS=1`` etc. to worker processes by default; this also covers a
        changed config. None leaves the process alone. The limit is process-wide: for
        in-process workers it also limits the client's process, until the last of them
        closes and the process gets its own limits back.
    numpy_huge_pages : bool or None, default=False
        Whether numpy asks the kernel for transparent huge pages for the arrays of 4 MiB
        and more it allocates in the worker's process, from setup to teardown
        (:func:`hmdspt.core.process.numpy_huge_page_switch`; numpy's own default is True
        on Linux 4.6 and later). False, because a worker's large arrays are the shards it
        receives and those a re-balance builds, each in freshly mapped memory, and where
        the kernel compacts memory to find huge pages for them (its THP ``defrag`` setting
        ``madvise``) the receiving worker stalled: staging took 1.4-2.4 times as long with
        the advice (docs/design.md, "Round loop"). None leaves the process alone.
        Process-wide, as ``blas_threads`` is.

    Notes
    -----
    Register ONE instance on the scheduler (``Client.register_plugin``, as
    :func:`hmdspt.parallel.cluster.local_cluster` does before its first worker starts),
    with the slowdowns by worker name. Why:

    - the scheduler keeps it and gives a copy to every worker that joins or restarts,
      which picks its own slowdown from the mapping at setup, before it runs a task;
    - every fit registers one too (``HMDSPTWorkerPlugin()``, idempotently,
      :func:`hmdspt.parallel.lifecycle.open_run`) so that any cluster has it. Idempotent
      means the scheduler skips it when it knows the name already: then nothing reaches
      the workers, and no fit can replace the plugin under another run.

    When the scheduler does not know it (a plugin given in the workers' options, as
    ``Worker(plugins=...)``), a registration reaches every worker, and ``Worker.plugin_add``
    removes a same-named plugin before setting up the new one. A plugin removed from a
    running worker therefore hands its runs, ended ids, speeds and slowdown to its
    successor, which keeps that slowdown unless it was given one for the worker; state
    nothing takes over by the next turn of the worker's event loop (the plugin was
    unregistered) is dropped.
    """

    name = WORKER_PLUGIN_NAME
    idempotent = True
    max_ended = 1024  # ended run ids remembered, to free keys that land after the end

    def __init__(
        self,
        slowdowns: float | Mapping[Any, float] | None = None,
        blas_threads: int | None = None,
        numpy_huge_pages: bool | None = False,
    ) -> None:
        if isinstance(slowdowns, Mapping):
            slowdowns = {name: _check_slowdown(k) for name, k in slowdowns.items()}
        elif slowdowns is not None:
            slowdowns = _check_slowdown(slowdowns)
        if blas_threads is not None and (
            isinstance(blas_threads, bool) or not isinstance(blas_threads, int) or blas_threads < 1
        ):
            raise ValueError(f"blas_threads must be an int >= 1 or None, got {blas_threads!r}")
        if numpy_huge_pages is not None and not isinstance(numpy_huge_pages, bool):
            raise ValueError(
                f"numpy_huge_pages must be True, False or None, got {numpy_huge_pages!r}"
            )
        self.slowdowns = slowdowns
        self.blas_threads = blas_threads
        self.numpy_huge_pages = numpy_huge_pages
        self.holds_blas_limit = False
        self.holds_huge_pages = False
        self.worker: Worker | None = None
        self.slowdown = 1.0
        self.runs: dict[str, _Run] = {}
        self.ended: dict[str, None] = {}  # insertion-ordered: the oldest go first
        self.speeds: dict[tuple, dict[str, Any]] = {}  # speed_key -> the latest fit's record
        # While quiet: name -> (period, running) of each callback QUIET_CALLBACKS changed.
        self.loud: dict[str, tuple[float, bool]] | None = None
        # Rounds run in worker threads, the rest on the worker's event loop.
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        # Only the configuration travels: a lock does not pickle, and state is per worker.
        return {
            "slowdowns": self.slowdowns,
            "blas_threads": self.blas_threads,
            "numpy_huge_pages": self.numpy_huge_pages,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _given_slowdown(self, worker: Worker) -> float | None:
        if not isinstance(self.slowdowns, dict):
            return self.slowdowns
        for name in (worker.name, str(worker.name)):
            if name in self.slowdowns:
                return self.slowdowns[name]
        return None

    def setup(self, worker: Worker) -> None:
        self.worker = worker
        handover = worker.__dict__.pop(_HANDOVER_ATTR, None)
        if handover is not None:
            self.slowdown = handover.slowdown
            self.runs, self.ended, self.speeds = handover.runs, handover.ended, handover.speeds
        given = self._given_slowdown(worker)
        if given is not None:
            self.slowdown = given
        if self.blas_threads is not None and not self.holds_blas_limit:
            _BLAS_LIMIT.hold(self.blas_threads)
            self.holds_blas_limit = True
        if self.numpy_huge_pages is not None and not self.holds_huge_pages:
            HUGE_PAGES.hold(self.numpy_huge_pages)
            self.holds_huge_pages = True
        worker.handlers[ROUND_OP] = self.round_handler
        # Once a process (a filter is kept once however often it is added).
        logging.getLogger("distributed.worker").addFilter(_OWN_DATA_ERRORS)

    def teardown(self, worker: Worker) -> None:
        if worker.handlers.get(ROUND_OP) == self.round_handler:
            del worker.handlers[ROUND_OP]
        self._set_quiet(False)  # a successor quiets again at its run's next round
        if self.holds_blas_limit:
            _BLAS_LIMIT.release()
            self.holds_blas_limit = False
        if self.holds_huge_pages:
            HUGE_PAGES.release()
            self.holds_huge_pages = False
        with self.lock:
            handover = _Handover(self.slowdown, self.runs, self.ended, self.speeds)
            self.runs, self.ended, self.speeds = {}, {}, {}
        if worker.status not in WORKER_ANY_RUNNING:
            return  # the worker is closing: its memory goes with it
        # Removed from a running worker: a same-named plugin is set up next, in the same turn
        # of the event loop (Worker.plugin_add), and takes the state over.
        setattr(worker, _HANDOVER_ATTR, handover)
        worker.loop.add_callback(_drop_handover, worker, handover)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "memory":
            return
        parsed = parse_run_key(key)
        if parsed is None:
            return
        run_id, owner = parsed
        with self.lock:
            if run_id not in self.ended:
                self.runs.setdefault(run_id, _Run(owner)).owner = owner
                return
        # Not from inside a transition: the state machine is mid-step.
        self.worker.loop.add_callback(self._free, [key])

    def state_for(self, spec: RoundSpec) -> dict[str, Any]:
        """The run's state, made at its first round; a throwaway one for an ended run."""
        with self.lock:
            run = (
                None if spec.run_id in self.ended else self.runs.setdefault(spec.run_id, _Run(None))
            )
            if run is not None and run.state is not None:
                return run.state
        state = _new_run_state(spec)
        if run is not None:
            run.state = state
        return state

    async def round_handler(self, shard_key: str, params: np.ndarray, spec: RoundSpec) -> dict:
        """Run a round sent straight from the driver (comm op :data:`ROUND_OP`).

        The driver calls it on every worker at once, with the key of the worker's shard and
        the round's ``w_t`` itself; the reply carries the round's result
        (:func:`run_round`). Not a task: a task goes from the driver to the scheduler to
        the worker and its result back through the scheduler, and those hops cost a round
        more than its compute when rounds are short (docs/design.md, "Round loop"). The
        round runs in the worker's task thread pool, beside any task it runs.

        A worker that is not running (paused for memory, retiring, closing) refuses with
        :class:`WorkerNotRunning`, as it would refuse new tasks and data.
        """
        worker = self.worker
        if worker.status != Status.running:
            raise WorkerNotRunning(worker.address, worker.status.name)
        try:
            shard = worker.data[shard_key]
        except KeyError as exc:
            raise KeyError(f"worker {worker.address} does not hold {exc.args[0]!r}") from None
        result = await asyncio.get_running_loop().run_in_executor(
            worker.executors["default"], run_round, self, shard, params, spec
        )
        return {"status": "OK", "result": to_serialize(result)}

    def held(self) -> list[str]:
        with self.lock:
            return sorted(self.runs)

    def end_runs(self, run_ids: Sequence[str] = (), owner: str | None = None) -> list[str]:
        """End the runs ``run_ids`` and those of client ``owner``; the run ids it held.

        Call on the worker's event loop (``client.run`` does).
        """
        with self.lock:
            ending = set(run_ids) | {
                r for r, run in self.runs.items() if owner and run.owner == owner
            }
            held = sorted(r for r in ending if self.runs.pop(r, None) is not None)
            for run_id in ending:
                self.ended.pop(run_id, None)
                self.ended[run_id] = None
            while len(self.ended) > self.max_ended:
                del self.ended[next(iter(self.ended))]
        self._sync_quiet()
        self._free([k for k in list(self.worker.state.tasks) if _run_of(k) in ending])
        return held

    def hold_quiet(self, run_id: str) -> None:
        """Mark run ``run_id`` quiet and quiet the worker (from any thread)."""
        with self.lock:
            run = None if run_id in self.ended else self.runs.setdefault(run_id, _Run(None))
            if run is None:
                return
            run.quiet = True
        self._sync_quiet()

    def _sync_quiet(self) -> None:
        """Quiet the worker while it holds a quiet run, else give the callbacks back; read
        when it runs on the worker's event loop, so a late call cannot undo a newer run."""
        if self.worker is None:
            return
        if not _on_event_loop():
            self.worker.loop.add_callback(self._sync_quiet)
            return
        with self.lock:
            quiet = any(run.quiet for run in self.runs.values())
        self._set_quiet(quiet)

    def _set_quiet(self, quiet: bool) -> None:
        """Give :data:`QUIET_CALLBACKS` their quiet periods, or back their own."""
        if self.worker is None:
            return
        if not _on_event_loop():  # a periodic callback starts on the loop it runs on
            self.worker.loop.add_callback(self._set_quiet, quiet)
            return
        callbacks = self.worker.periodic_callbacks
        if quiet and self.loud is None:
            self.loud = {}
            for name, period in QUIET_CALLBACKS.items():
                callback = callbacks.get(name)
                if callback is None:
                    continue
                running = callback.is_running()
                self.loud[name] = (callback.callback_time, running)
                callback.stop()
                if period is not None and running:
                    callback.callback_time = period
                    callback.start()
        elif not quiet and self.loud is not None:
            loud, self.loud = self.loud, None
            for name, (period, running) in loud.items():
                callback = callbacks.get(name)
                if callback is None:
                    continue
                callback.stop()
                callback.callback_time = period
                # A closing worker has stopped its callbacks for good.
                if running and self.worker.status in WORKER_ANY_RUNNING:
                    callback.start()

    def _free(self, keys: list) -> None:
        """Release ``keys`` held in memory that no waiting or running task still needs."""
        tasks = self.worker.state.tasks
        free = []
        for key in keys:
            ts = tasks.get(key)
            if ts is not None and ts.state == "memory":
                if not any(d.state in _NEEDS_INPUTS for d in ts.dependents):
                    free.append(key)
        if free:
            self.worker.handle_stimulus(
                FreeKeysEvent(keys=free, stimulus_id=f"hmdspt-run-ended-{time.time()}")
            )


def _run_of(key: object) -> str | None:
    parsed = parse_run_key(key)
    return None if parsed is None else parsed[0]


def _drop_handover(worker: Worker, handover: _Handover) -> None:
    """Drop what a removed plugin left if no successor took it (it was unregistered)."""
    if worker.__dict__.get(_HANDOVER_ATTR) is handover:
        del worker.__dict__[_HANDOVER_ATTR]


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _worker_plugin(worker: Worker, create: bool = False) -> HMDSPTWorkerPlugin | None:
    """The worker's :class:`HMDSPTWorkerPlugin`; with ``create``, one is added if it has
    none (rounds or ``set_slowdown`` used without a fit, which registers it)."""
    plugin = worker.plugins.get(WORKER_PLUGIN_NAME)
    if plugin is None and create:
        plugin = HMDSPTWorkerPlugin()
        if _on_event_loop():  # ``client.run``: set up in place, as plugin_add does
            worker.plugins[WORKER_PLUGIN_NAME] = plugin
            plugin.setup(worker)
        else:  # a task's thread: plugins are iterated on the event loop, add it there
            sync(worker.loop, worker.plugin_add, plugin=plugin, name=WORKER_PLUGIN_NAME)
        plugin = worker.plugins[WORKER_PLUGIN_NAME]
    return plugin


def run_ids_held(dask_worker: Worker) -> list[str]:
    """Ids of the HMDSPT runs whose state or data this worker holds (``client.run``)."""
    plugin = _worker_plugin(dask_worker)
    return [] if plugin is None else plugin.held()


def orphan_keys(dask_worker: Worker) -> list[str]:
    """Keys of HMDSPT runs in this worker's memory whose run it no longer holds (ended,
    or its driver gone): what a leak would leave behind (``client.run``)."""
    held = set(run_ids_held(dask_worker))
    for _ in range(10):  # the worker's event loop may change its data meanwhile
        try:
            keys = list(dask_worker.data.keys())
            break
        except RuntimeError:
            continue
    else:
        keys = []
    return sorted(k for k in keys if (run := _run_of(k)) is not None and run not in held)


def drop_runs(run_ids: Sequence[str], owner: str | None, dask_worker: Worker) -> list[str]:
    """End the runs ``run_ids`` and those of client ``owner`` on this worker: drop their
    state and free their keys (``client.run`` or the scheduler's broadcast)."""
    plugin = _worker_plugin(dask_worker)
    return [] if plugin is None else plugin.end_runs(run_ids, owner)


@dataclass(frozen=True)
class RoundSpec:
    """What a worker needs to know for one round (small; pickled per task).

    Attributes
    ----------
    run_id : str
        Key of the per-run state on the worker.
    layer_sizes, hidden_activation, out_activation, alpha, dtype
        The model (see :class:`hmdspt.core.nn.MLP`); ``alpha`` is the L2 penalty the
        workers apply (the sync strategy's ``worker_alpha``: 0 for bsp, whose driver adds
        it once).
    optimizer : dict
        Keyword arguments of :func:`hmdspt.core.nn.make_optimizer` (with ``solver``).
    batch_size : int
        Local mini-batch size.
    mode : {"delta", "gradient"}
        The sync strategy's ``worker_mode``, a key of :data:`ROUND_WORK`: ``"delta"``,
        local mini-batch steps, return ``w_i - w_t`` (hmdspt, local); ``"gradient"``, one
        gradient over the round's rows, return it (bsp).
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
    remember_speed : bool
        Add the round's rows and busy seconds to the worker's remembered speed (a regular
        round with proportional shares; see :func:`remembered_speed`).
    speed_memory_s : float
        How long the totals of fits too short to be remembered carry on into the next fit
        of the same shape (the fit's ``reuse_speeds_s``; 0: each fit on its own).
    quiet_workers : bool
        Quiet the worker's profiler and tick while the run is held
        (:data:`QUIET_CALLBACKS`; the fit's ``quiet_workers``).
    pending_rows : int
        The worker's rows still on their way (a second staging wave): they count in the
        round's share of the due rows, which is drawn from the rows that have landed.
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
    remember_speed: bool = False
    speed_memory_s: float = 0.0
    quiet_workers: bool = False
    pending_rows: int = 0


def _new_run_state(spec: RoundSpec) -> dict[str, Any]:
    model = MLP(
        spec.layer_sizes,
        spec.hidden_activation,
        spec.out_activation,
        spec.alpha,
        np.dtype(spec.dtype),
    )
    optimizer = make_optimizer(n_params=model.n_params, dtype=model.dtype, **spec.optimizer)
    return {
        "model": model,
        "optimizer": optimizer,
        "feedback": ErrorFeedback(spec.compression, k=spec.topk)
        if spec.compression != "none"
        else None,
        "buffers": BatchBuffers(
            spec.batch_size, spec.layer_sizes[0], spec.layer_sizes[-1], model.dtype
        ),
    }


def drop_run_state(run_id: str, dask_worker: Worker) -> bool:
    """End a run on this worker: forget its state, free its keys (``client.run``).

    Returns whether the worker held the run.
    """
    return bool(drop_runs([run_id], None, dask_worker))


def _local_steps(
    state: dict[str, Any],
    shard,
    rows: np.ndarray,
    params: np.ndarray,
    spec: RoundSpec,
    slowdown: Callable[[], float],
) -> tuple[Any, float, int]:
    """``mode="delta"``: local mini-batch steps over ``rows``; the payload is
    ``w_i - w_t``, compressed (with error feedback when the run has it)."""
    model, optimizer = state["model"], state["optimizer"]
    loss_sum, steps = 0.0, 0
    if not state["buffers"].fits(spec.batch_size, shard.X.shape[1], shard.y.shape[1], model.dtype):
        # Weighted targets are one column wider than the model's outputs.
        state["buffers"] = BatchBuffers(
            spec.batch_size, shard.X.shape[1], shard.y.shape[1], model.dtype
        )
    # Chunk size from the last chunk's CPU time, kept per run on the worker.
    n_batches = state.get("chunk_batches", spec.chunk_batches)
    lo = 0
    while lo < len(rows):
        chunk = spec.batch_size * n_batches
        with throttled(slowdown) as record:
            part_loss, part_steps = minibatch_pass(
                model,
                optimizer,
                shard.X,
                shard.y,
                rows[lo : lo + chunk],
                spec.batch_size,
                state["buffers"],
            )
        if part_steps == n_batches:  # a full chunk: a fair measure of its cost
            n_batches = batches_per_chunk(record.cpu_s, part_steps)
        lo += chunk
        loss_sum += part_loss
        steps += part_steps
    state["chunk_batches"] = n_batches
    delta = model.params  # reuse the buffer: w_i - w_t in place
    delta -= params
    feedback = state["feedback"]
    payload = feedback.compress(delta) if feedback is not None else compress(delta.copy())
    return payload, loss_sum, steps


def _data_gradient(
    state: dict[str, Any],
    shard,
    rows: np.ndarray,
    params: np.ndarray,
    spec: RoundSpec,
    slowdown: Callable[[], float],
) -> tuple[Any, float, int]:
    """``mode="gradient"``: the sum of the data gradients of ``rows`` (one step), sent
    uncompressed; the driver divides by the rows of all workers."""
    model = state["model"]
    loss_sum, steps = 0.0, 0
    if len(rows):
        with throttled(slowdown):
            # n_total=1: the sum of the rows' data gradients; the driver divides.
            loss_sum = model.loss_and_grad(shard.X[rows], shard.y[rows], n_total=1)
        steps = 1
    return compress(model.grad.copy(), "none"), loss_sum, steps


#: A round's work by ``RoundSpec.mode`` (:data:`hmdspt.core.strategies.WORKER_MODES`):
#: ``work(state, shard, rows, params, spec, slowdown) -> (payload, loss_sum, steps)``.
ROUND_WORK = {"delta": _local_steps, "gradient": _data_gradient}


def round_task(shard, params: np.ndarray, spec: RoundSpec) -> dict[str, Any]:
    """One worker's part of one synchronous round, as a Dask task (:func:`run_round` on
    the running task's worker); a fit sends its rounds straight to the workers instead
    (:meth:`HMDSPTWorkerPlugin.round_handler`)."""
    return run_round(_worker_plugin(get_worker(), create=True), shard, params, spec)


def run_round(
    plugin: HMDSPTWorkerPlugin, shard, params: np.ndarray, spec: RoundSpec
) -> dict[str, Any]:
    """One worker's part of one synchronous round.

    Parameters
    ----------
    plugin : HMDSPTWorkerPlugin
        The worker's plugin: the run's state, the emulated slowdown, the speed memory.
    shard : hmdspt.core.shard.Shard
        The worker's rows (held in its memory between rounds); ``shard.y`` holds the
        encoded targets. Its ``done`` mask records the rows already processed this epoch
        and travels with the rows when they move.
    params : ndarray
        The global parameters ``w_t`` (sent with the round's call).
    spec : RoundSpec
        The round's settings.

    Returns
    -------
    result : dict
        ``payload`` (compressed delta or gradient), ``rows``, ``weight`` (the rows'
        sum of sample weights; ``rows`` when unweighted), ``steps``, ``loss_sum``,
        ``busy_s`` (compute wall seconds including emulation), ``due_left`` and
        ``bytes_out``.
    """
    if spec.quiet_workers:  # every round passes here, as a call or as a task
        plugin.hold_quiet(spec.run_id)
    start = time.perf_counter()
    state = plugin.state_for(spec)
    model, optimizer = state["model"], state["optimizer"]
    if spec.new_epoch:
        shard.done[:] = False
    due = np.flatnonzero(~shard.done)
    quota = min(round_share(len(due), spec.pending_rows, spec.rounds_left), len(due))
    # Deterministic per shard and round, different across workers (first row id).
    first_row = int(shard.row_ids[0]) if len(shard) else 0
    rng = np.random.default_rng([spec.seed, spec.round, first_row])
    # Drawn without replacement in O(quota), not by shuffling every due row: at 800,000
    # rows a shard's shuffle took 5 ms of an 85 ms round.
    rows = due[rng.choice(len(due), size=quota, replace=False)] if quota else due[:0]
    shard.done[rows] = True
    model.set_params(params)
    if hasattr(optimizer, "lr_schedule"):
        optimizer.learning_rate = spec.learning_rate

    payload, loss_sum, steps = ROUND_WORK[spec.mode](
        state, shard, rows, params, spec, lambda: plugin.slowdown
    )
    _, weights = split_weights(shard.y, spec.layer_sizes[-1])
    weight = float(quota) if weights is None else float(weights[rows].sum())
    busy_s = time.perf_counter() - start
    if spec.remember_speed and quota:
        _remember_speed(plugin, spec, int(quota), busy_s)
    result = {
        "payload": payload,
        "rows": int(quota),
        "weight": weight,
        "steps": int(steps),
        "loss_sum": float(loss_sum),
        "busy_s": busy_s,
        "due_left": int(len(due) - quota + spec.pending_rows),
        "bytes_out": int(payload.nbytes),
    }
    if spec.return_row_ids:
        result["row_ids"] = shard.row_ids[rows]
    return result

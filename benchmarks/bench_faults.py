"""Fault injection: what a fit does when a worker, the scheduler or the driver fails mid-fit.

``python -m benchmarks.bench_faults [--fits 20] [--reference 3] [--targeted 1] [--seed 0]``

Every fit runs on a fresh emulated cluster (``local_cluster(speeds=(2, 1, 1))``;
heterogeneity is EMULATED on one machine). Random faults, each at a random round (both
seeded):

- ``kill``: a random worker is SIGKILLed (its nanny restarts it, so it also re-joins);
- ``slow``: a random worker's emulated slowdown is multiplied by 4 (``set_slowdown``);
- ``join``: ``cluster.scale(n + 1)`` adds an (unthrottled) worker.

Targeted faults, ``--targeted`` times each variant (default once):

- ``kill-staging``: a worker is SIGKILLed while the rows are first staged, either the one
  that received the first shard (as the second is sent) or the one about to receive the
  second (the benchmark wraps the ``scatter_to`` that ``hmdspt.parallel.shards.stage`` calls,
  in the driver, to time it);
- ``kill-last-round``: a worker is SIGKILLed during an epoch's last round (the round whose
  ``RoundSpec.rounds_left`` is 1), about half its last round's busy time after the round is
  specified; in epoch 2 and in the fit's last epoch;
- ``kill-scheduler``: the scheduler, here a process of its own, is SIGKILLed mid-fit;
- ``kill-driver``: the driver, a subprocess fitting against the cluster's scheduler
  address, is SIGKILLed mid-fit;
- ``sigint-driver``: the subprocess driver gets one SIGINT mid-fit.

The trainer records which rows each worker processed (``record_row_ids=True``). For every
fit the benchmark reports: completed, or the error's first line; rows never processed in a
complete epoch; rows processed more than once in an epoch no re-staging disturbed; in
disturbed epochs (``Trainer._disturbed_epochs``, or marked by an ``epoch`` run-log event)
the duplicates measured and those the trainer counted (its ``epoch`` events'
``duplicates``; "n/a" when it logs none); the run log's ``run_end`` status; and what is
left on the workers afterwards (run states, keys), asked by a fresh client and polled for
a bounded time. Undisturbed fits with the same data and seed give the reference accuracy.

What each fit must do to meet its expectation (``EXPECTED``):

- undisturbed and worker faults: complete; every row processed exactly once in every epoch
  (a disturbed epoch may process some twice if the trainer counts exactly those);
  ``run_end`` "completed"; no run state or key left;
- ``kill-scheduler``: fail within ``SCHEDULER_ERROR_S`` of the kill with an error whose
  first line names the scheduler; ``run_end`` "failed" (nothing can be asked of the workers
  once their scheduler is gone);
- ``kill-driver``: no run state or key left on the workers ``DRIVER_GONE_S`` after;
- ``sigint-driver``: the driver exits within ``DRIVER_GONE_S``; ``run_end`` "stopped"; no
  run state or key left.

Every wait is bounded: a fit still running after ``--timeout`` counts as hung (stacks on
stderr), and every process a fit started is killed when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("kill", "slow", "join")
TARGETED = ("kill-staging", "kill-last-round", "kill-scheduler", "kill-driver", "sigint-driver")
WORKER_FAULTS = ("none", *FAULTS, "kill-staging", "kill-last-round")
DRIVER_FAULTS = ("kill-driver", "sigint-driver")
SPEEDS = (2, 1, 1)
SCHEDULER_ERROR_S = 60.0  # kill-scheduler: the fit must fail this soon after the kill
DRIVER_GONE_S = 30.0  # after a driver's death or SIGINT: exit, and workers clean, by then
LEFTOVER_WAIT_S = 10.0  # after an in-process fit ended: workers clean by then
EXPECTED = {
    **dict.fromkeys(WORKER_FAULTS, "completes, rows once per epoch, nothing left"),
    "kill-scheduler": f"clear error naming the scheduler within {SCHEDULER_ERROR_S:g} s",
    "kill-driver": f"nothing left on the workers {DRIVER_GONE_S:g} s after",
    "sigint-driver": f"exits within {DRIVER_GONE_S:g} s, run_end stopped, nothing left",
}


@dataclass
class FitPlan:
    """One fit to run: its fault, where it strikes, and (for kills) which worker."""

    fault: str
    at: int | str | None  # a round number, or a named moment ("epoch 2", "shard 1 staged")
    victim: int = 0  # index of the worker among the sorted names


@dataclass
class FitResult:
    """What one fit measured."""

    fault: str
    at: int | str | None
    completed: bool = False
    error: str | None = None  # first line of the error, or how the driver ended
    hung: bool = False
    accuracy: float = float("nan")
    seconds: float = 0.0
    fault_applied: bool = False
    seconds_to_end: float | None = None  # from the fault to the fit's end (error or exit)
    disturbed_epochs: list[int] = field(default_factory=list)
    rows_never: int | None = None  # rows never processed in a complete epoch, summed
    dup_undisturbed: int | None = None  # extra processings in undisturbed epochs
    dup_disturbed: int | None = None  # extra processings in disturbed epochs, measured
    dup_counted: int | None = None  # the same, as the trainer's epoch events count them
    dup_mismatch: list[int] = field(default_factory=list)  # epochs the two disagree on
    run_end: str | None = None
    run_states_left: int | None = None
    keys_left: int | None = None
    orphan_keys: int | None = None
    leftover_note: str = ""
    fault_note: str = ""  # how the fault met its moment, when that can vary
    processes_killed: int = 0
    unmet: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.completed:
            return "completed"
        return self.error or ("hung" if self.hung else "failed")


def make_data(n_rows: int, seed: int) -> tuple[np.ndarray, ...]:
    """A 3-class problem split 80/20 into train and test, float32 features."""
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n_rows, n_features=20, n_informative=12, n_classes=3, random_state=seed
    )
    X = X.astype(np.float32)
    cut = int(0.8 * n_rows)
    return X[:cut], y[:cut], X[cut:], y[cut:]


def first_line(text: str, width: int = 90) -> str:
    """The first non-empty line of ``text``, cut to ``width`` characters."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def _events(log: Path) -> list[dict]:
    from hmdspt.core.runlog import read_events

    return read_events(log) if log.exists() else []


def _rounds_logged(log: Path) -> int:
    return sum(e["event"] == "round" for e in _events(log))


def _run_end(events: list[dict]) -> str | None:
    ends = [e for e in events if e["event"] == "run_end"]
    return ends[-1].get("status") if ends else None


def _counted_duplicates(events: list[dict]) -> dict[int, int]:
    """Epoch -> duplicates, from the trainer's ``epoch`` events (empty when it logs none)."""
    return {
        int(e["epoch"]): int(e["duplicates"])
        for e in events
        if e["event"] == "epoch" and e.get("duplicates") is not None and "epoch" in e
    }


def _marked_epochs(events: list[dict]) -> set[int]:
    """Epochs the trainer's ``epoch`` events mark as disturbed (or give duplicates for)."""
    return {
        int(e["epoch"])
        for e in events
        if e["event"] == "epoch" and "epoch" in e and (e.get("duplicates") or e.get("disturbed"))
    }


def count_rows(
    rows_seen: dict[int, np.ndarray],
    disturbed: set[int],
    completed: bool,
    counted: dict[int, int] | None = None,
) -> dict[str, Any]:
    """Rows never processed and processed twice, over the complete epochs of a fit.

    Parameters
    ----------
    rows_seen : dict of int to ndarray
        Epoch -> how many times each row was processed in it.
    disturbed : set of int
        Epochs in which rows were re-staged (some may be processed twice there).
    completed : bool
        Whether the fit completed; if not, its last epoch is partial and not counted.
    counted : dict of int to int, optional
        Epoch -> duplicates the trainer counted (its ``epoch`` events); None or empty
        when it counts none.

    Returns
    -------
    counts : dict
        ``rows_never``, ``dup_undisturbed``, ``dup_disturbed`` (extra processings:
        ``sum(max(seen - 1, 0))``), ``dup_counted`` (None without ``counted``) and
        ``dup_mismatch`` (disturbed epochs whose counted duplicates differ from the
        measured ones).
    """
    last = max(rows_seen, default=0)
    complete = [e for e in sorted(rows_seen) if completed or e < last]
    extra = {e: int(np.maximum(rows_seen[e] - 1, 0).sum()) for e in complete}
    dup_disturbed = sum(extra[e] for e in complete if e in disturbed)
    mismatch = []
    if counted:
        mismatch = [e for e in complete if e in disturbed and counted.get(e, 0) != extra[e]]
    elif dup_disturbed:
        mismatch = [e for e in complete if e in disturbed and extra[e]]
    return {
        "rows_never": int(sum((rows_seen[e] == 0).sum() for e in complete)),
        "dup_undisturbed": sum(extra[e] for e in complete if e not in disturbed),
        "dup_disturbed": dup_disturbed,
        "dup_counted": sum(counted.get(e, 0) for e in complete) if counted else None,
        "dup_mismatch": mismatch,
    }


def judge(r: FitResult) -> list[str]:
    """What ``r`` did not do of what its fault's expectation asks (empty: met)."""
    unmet = []
    if r.fault != "none" and not r.fault_applied:
        unmet.append("fault not applied")
    if r.hung:
        unmet.append("hung")
    left = [
        f"{n} {what} left"
        for n, what in ((r.run_states_left, "run states"), (r.keys_left, "keys"))
        if n
    ]
    if r.fault in WORKER_FAULTS:
        if not r.completed and not r.hung:
            unmet.append("did not complete")
        if r.rows_never:
            unmet.append(f"{r.rows_never} rows never processed in an epoch")
        if r.dup_undisturbed:
            unmet.append(f"{r.dup_undisturbed} duplicates in undisturbed epochs")
        if r.dup_mismatch:
            what = "not counted" if r.dup_counted is None else "miscounted"
            unmet.append(f"duplicates {what} by the trainer in epoch(s) {r.dup_mismatch}")
        if r.run_end != "completed":
            unmet.append(f"run_end {r.run_end or 'missing'}")
        unmet += left
    elif r.fault == "kill-scheduler":
        if r.completed:
            unmet.append("completed without its scheduler")
        elif r.seconds_to_end is None or r.seconds_to_end > SCHEDULER_ERROR_S:
            unmet.append(f"no error within {SCHEDULER_ERROR_S:g} s of the kill")
        elif "scheduler" not in (r.error or "").lower():
            unmet.append("error does not name the scheduler")
        if r.run_end != "failed":
            unmet.append(f"run_end {r.run_end or 'missing'}")
    elif r.fault in DRIVER_FAULTS:
        if r.fault == "sigint-driver":
            if r.seconds_to_end is None or r.seconds_to_end > DRIVER_GONE_S:
                unmet.append(f"driver still running {DRIVER_GONE_S:g} s after SIGINT")
            if r.run_end != "stopped":
                unmet.append(f"run_end {r.run_end or 'missing'}")
            if r.rows_never:
                unmet.append(f"{r.rows_never} rows never processed in an epoch")
            if r.dup_undisturbed:
                unmet.append(f"{r.dup_undisturbed} duplicates in undisturbed epochs")
        if r.keys_left is None and r.run_states_left is None:
            unmet.append("workers could not be asked what is left")
        unmet += left
    return unmet


# ----------------------------------------------------------------- what is left behind
def _leftovers_here(dask_worker) -> dict[str, Any]:
    """On a worker: the run states it holds and its keys (``orphan_keys`` if the library
    has it, else every key in its data: the scheduler decides which are orphans)."""
    from hmdspt.parallel import worker

    if hasattr(worker, "run_ids_held"):
        run_ids = [str(r) for r in worker.run_ids_held(dask_worker)]
    else:
        run_ids = [str(r) for a, r in worker._RUN_STATE if a == dask_worker.address]
    out: dict[str, Any] = {"run_ids": run_ids, "keys": [str(k) for k in dask_worker.data]}
    if hasattr(worker, "orphan_keys"):
        out["orphans"] = [str(k) for k in worker.orphan_keys(dask_worker)]
    return out


def _scheduler_keys(dask_scheduler) -> list[str]:
    return [str(k) for k in dask_scheduler.tasks]


def leftovers(address: str, wait_s: float) -> tuple[int | None, int | None, int | None, str]:
    """Run states, keys and orphaned keys on the workers of the scheduler at ``address``.

    Asked by a fresh client, again every half second for up to ``wait_s`` until nothing is
    left (releases travel asynchronously). Orphaned keys are those no client can free: from
    ``hmdspt.parallel.worker.orphan_keys`` when it exists, else the keys in a worker's data
    that the scheduler does not know.

    Returns
    -------
    run_states, keys, orphans, note
        Counts summed over the workers (None when nobody could be asked), and a note on
        how (or why not) they were read.
    """
    from distributed import Client

    deadline = time.monotonic() + wait_s
    counts: tuple[int | None, int | None, int | None] = (None, None, None)
    note = ""
    try:
        with Client(address, timeout=10, set_as_default=False) as client:
            while True:
                per_worker = client.run(_leftovers_here, on_error="return")
                answers = {a: v for a, v in per_worker.items() if isinstance(v, dict)}
                known = set(client.run_on_scheduler(_scheduler_keys))
                if answers:
                    run_ids = sorted({r for v in answers.values() for r in v["run_ids"]})
                    keys = [k for v in answers.values() for k in v["keys"]]
                    if all("orphans" in v for v in answers.values()):
                        orphans = [k for v in answers.values() for k in v["orphans"]]
                        how = "orphan_keys"
                    else:
                        orphans = [k for k in keys if k not in known]
                        how = "keys the scheduler does not know"
                    run_states = sum(len(v["run_ids"]) for v in answers.values())
                    counts = (run_states, len(keys), len(orphans))
                    note = f"{len(answers)}/{len(per_worker)} workers answered (orphans: {how})"
                    if run_states or keys:
                        note += f"; run ids {run_ids[:3]}, keys {sorted(keys)[:3]}"
                    if not (run_states or keys):
                        return (*counts, note)
                else:
                    counts, note = (None, None, None), f"none of {len(per_worker)} workers answered"
                if time.monotonic() >= deadline:
                    return (*counts, note)
                time.sleep(0.5)
    except Exception as exc:  # the cluster is unreachable: say so, do not guess
        return (*counts, note or f"workers not asked: {first_line(repr(exc), 60)}")


# ------------------------------------------------------------------- processes, bounds
def _children() -> dict[int, Any]:
    import psutil

    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def kill_new_children(before: set[int]) -> int:
    """SIGKILL the processes started since ``before`` was taken (the resource tracker of
    multiprocessing is left alone: it is shared); how many were still alive."""
    import psutil

    killed = 0
    for pid, proc in _children().items():
        if pid in before:
            continue
        try:
            if "resource_tracker" in " ".join(proc.cmdline()):
                continue
            proc.kill()
            proc.wait(5)
            killed += 1
        except psutil.Error:
            pass
    return killed


def _bounded(fn: Callable[[], Any], seconds: float) -> bool:
    """Run ``fn`` in a daemon thread for at most ``seconds``; whether it returned."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def _close_quietly(closeable: Any, seconds: float = 20.0) -> None:
    def close() -> None:
        with contextlib.suppress(Exception):
            closeable.close(timeout=seconds)

    _bounded(close, seconds + 5)


# ----------------------------------------------------------------------------- clusters
def _cluster_with_scheduler_process():
    """Like ``local_cluster(SPEEDS)``, but with the scheduler in a process of its own (so
    that it can be SIGKILLed without killing the driver); its pid."""
    from distributed import Nanny, SpecCluster
    from distributed.deploy.subprocess import SubprocessScheduler
    from distributed.worker_memory import parse_memory_limit

    from hmdspt.parallel.worker import HMDSPTWorkerPlugin

    memory = parse_memory_limit("auto", 1, len(SPEEDS), logger=logging.getLogger(__name__))
    workers = {
        f"worker-{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "memory_limit": memory,
                "silence_logs": logging.WARNING,
                "plugins": [HMDSPTWorkerPlugin(max(SPEEDS) / s, blas_threads=1)],
            },
        }
        for i, s in enumerate(SPEEDS)
    }
    scheduler = {
        "cls": SubprocessScheduler,
        "options": {"scheduler_kwargs": {"host": "127.0.0.1", "port": 0, "dashboard": False}},
    }
    # The scheduler's log goes to a pipe nobody reads: keep it short.
    saved = os.environ.get("DASK_LOGGING__DISTRIBUTED")
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "warning"
    try:
        cluster = SpecCluster(
            workers=workers, scheduler=scheduler, silence_logs=logging.WARNING, name="faults"
        )
    finally:
        if saved is None:
            os.environ.pop("DASK_LOGGING__DISTRIBUTED", None)
        else:
            os.environ["DASK_LOGGING__DISTRIBUTED"] = saved
    try:
        cluster.wait_for_workers(len(SPEEDS), timeout=60)
    except BaseException:
        _close_quietly(cluster)
        raise
    return cluster, cluster.scheduler.process.pid


def _worker_pid(cluster, name: str) -> int:
    return cluster.workers[name].process.process.pid


def _address_of(cluster, name: str) -> str:
    return cluster.workers[name].worker_address


def _name_of(cluster, address: str) -> str | None:
    return next((n for n, w in cluster.workers.items() if w.worker_address == address), None)


def _gone_from_scheduler(client, address: str, seconds: float) -> None:
    from hmdspt.parallel.client import scheduler_workers

    deadline = time.monotonic() + seconds
    while address in scheduler_workers(client) and time.monotonic() < deadline:
        time.sleep(0.05)


# -------------------------------------------------------------------------- one fit
def _make_trainer(client, n_features: int, log: Path, rounds_per_epoch: int, trainer_cls=None):
    """The benchmark's trainer (every fit alike) and its model."""
    from hmdspt.core.nn import MLP
    from hmdspt.parallel.trainer import Trainer, TrainerConfig

    model = MLP((n_features, 64, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(
        rounds_per_epoch=rounds_per_epoch,
        record_row_ids=True,
        run_log=str(log),
        probe_seconds=0.3,
        seed=0,
    )
    optimizer = dict(solver="adam", learning_rate_init=0.003)
    return (trainer_cls or Trainer)(client, model, optimizer, 128, config), model


def _hooked_trainer_class(on_spec: Callable[[Any, Any], None]):
    """A Trainer that calls ``on_spec(trainer, spec)`` for each round's spec (to time a
    fault to a round of the epoch: ``spec.rounds_left == 1`` is an epoch's last)."""
    from hmdspt.parallel.trainer import Trainer

    class HookedTrainer(Trainer):
        def _spec(self, *args, **kwargs):
            spec = super()._spec(*args, **kwargs)
            on_spec(self, spec)
            return spec

    return HookedTrainer


@contextlib.contextmanager
def _staging_hook(on_scatter: Callable[[int, str], None]):
    """Call ``on_scatter(i, worker)`` before the i-th shard (from 1) of a first staging is
    scattered to ``worker``; only within ``hmdspt.parallel.shards.stage``."""
    from hmdspt.parallel import shards

    real_stage, real_scatter = shards.stage, shards.scatter_to
    state = {"staging": False, "calls": 0}

    def stage(*args, **kwargs):
        state["staging"] = True
        try:
            return real_stage(*args, **kwargs)
        finally:
            state["staging"] = False

    def scatter_to(client, data, worker, *args, **kwargs):
        if state["staging"]:
            state["calls"] += 1
            on_scatter(state["calls"], worker)
        return real_scatter(client, data, worker, *args, **kwargs)

    shards.stage, shards.scatter_to = stage, scatter_to
    try:
        yield
    finally:
        shards.stage, shards.scatter_to = real_stage, real_scatter


def run_fit(
    data: tuple[np.ndarray, ...],
    plan: FitPlan,
    epochs: int,
    rounds_per_epoch: int,
    workdir: Path,
    timeout: float = 120.0,
) -> FitResult:
    """One fit in this process on a fresh cluster, with ``plan``'s fault.

    A fit still running after ``timeout`` seconds counts as hung: the stacks of every
    thread go to stderr and the client is closed, which ends the fit with an error.
    """
    from distributed import Client

    from hmdspt.parallel.cluster import local_cluster
    from hmdspt.parallel.worker import set_slowdown

    fault = plan.fault
    X, y, X_test, y_test = data
    Y = np.eye(3, dtype=np.float32)[y]
    log = workdir / f"{fault}-{time.monotonic_ns()}.jsonl"
    result = FitResult(fault, plan.at)
    before = set(_children())
    start = time.perf_counter()
    fault_time: list[float] = []
    scheduler_pid = None
    cluster = client = trainer = model = None
    try:
        if fault == "kill-scheduler":
            cluster, scheduler_pid = _cluster_with_scheduler_process()
        else:
            cluster = local_cluster(speeds=SPEEDS)
        client = Client(cluster, timeout=30)
        names = sorted(cluster.workers)
        victim = names[plan.victim % len(names)]

        def applied() -> None:
            fault_time.append(time.monotonic())
            result.fault_applied = True

        def kill(name: str) -> None:
            os.kill(_worker_pid(cluster, name), signal.SIGKILL)
            applied()

        def inject() -> None:
            if fault == "kill":
                kill(victim)
            elif fault == "slow":
                k = cluster.emulation.slowdowns[victim]
                set_slowdown(client, _address_of(cluster, victim), 4.0 * k)
                applied()
            elif fault == "join":
                cluster.scale(len(SPEEDS) + 1)
                applied()
            elif fault == "kill-scheduler":
                os.kill(scheduler_pid, signal.SIGKILL)
                applied()

        def kill_mid_round(name: str, delay_s: float) -> None:
            """SIGKILL ``name`` ``delay_s`` after its round was specified: about the middle of
            the round (a round is a call straight to the worker, so the driver does not see
            it running; the run log's ``worker_lost`` round says where the kill landed)."""
            time.sleep(delay_s)
            result.fault_note = f"{delay_s * 1e3:.0f} ms into its round"
            kill(name)

        armed = threading.Event()

        def on_spec(trainer_, spec) -> None:
            # kill-last-round: the target epoch's last round, once.
            target = int(str(plan.at).split()[-1])
            if armed.is_set() or spec.rounds_left != 1:
                return
            if getattr(trainer_, "_epoch", None) == target:
                armed.set()
                # Half the victim's last busy time: the calls, w_t with them, go out as soon
                # as the round is specified.
                last = trainer_.history[-1].workers.get(victim, {}) if trainer_.history else {}
                delay_s = max(0.5 * last.get("busy_s", 0.0), 0.001)
                threading.Thread(target=kill_mid_round, args=(victim, delay_s), daemon=True).start()

        staged_first: list[str] = []

        def on_scatter(i: int, worker: str) -> None:
            # kill-staging: as the second shard is sent, the worker of the first dies
            # ("shard 1 staged") or the worker about to receive it ("shard 2 sending").
            staged_first.append(worker)
            if result.fault_applied or i != 2:
                return
            target = staged_first[0] if plan.at == "shard 1 staged" else worker
            name = _name_of(cluster, target)
            if name is not None:
                kill(name)
                if plan.at != "shard 1 staged":
                    _gone_from_scheduler(client, target, 5.0)

        trainer_cls = _hooked_trainer_class(on_spec) if fault == "kill-last-round" else None
        trainer, model = _make_trainer(client, X.shape[1], log, rounds_per_epoch, trainer_cls)
        outcome: dict[str, Any] = {}

        def fit() -> None:
            hook = _staging_hook(on_scatter) if fault == "kill-staging" else None
            try:
                with hook or contextlib.nullcontext():
                    trainer.fit(X, Y, max_epochs=epochs)
                outcome["completed"] = True
            except Exception as exc:  # counted, and shown, as a failed fit
                outcome["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                outcome["ended"] = time.monotonic()

        runner = threading.Thread(target=fit, daemon=True)
        runner.start()
        deadline = time.monotonic() + timeout
        while runner.is_alive() and time.monotonic() < deadline:
            if fault in ("kill", "slow", "join", "kill-scheduler") and not fault_time:
                if _rounds_logged(log) >= plan.at:
                    inject()
            runner.join(0.05)
        if runner.is_alive():
            result.hung = True
            result.error = f"hung: still running after {timeout:g} s (stacks on stderr)"
            print(f"--- {fault} at {plan.at}: {result.error}", file=sys.stderr)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            _close_quietly(client, 10)
            runner.join(20)
        result.completed = bool(outcome.get("completed"))
        if outcome.get("error") and not result.hung:
            result.error = first_line(outcome["error"])
        if fault_time and "ended" in outcome:
            result.seconds_to_end = outcome["ended"] - fault_time[-1]
        result.seconds = time.perf_counter() - start
        if not runner.is_alive() and fault != "kill-scheduler":
            gc.collect()  # what the driver no longer references must not count as left
            r = leftovers(cluster.scheduler_address, LEFTOVER_WAIT_S)
            result.run_states_left, result.keys_left, result.orphan_keys, note = r
            result.leftover_note = note
        elif fault == "kill-scheduler":
            result.leftover_note = "workers not asked: their scheduler is gone"
    except Exception as exc:  # the benchmark's own set-up failed: shown as the outcome
        result.error = first_line(f"benchmark: {type(exc).__name__}: {exc}")
    finally:
        if client is not None:
            _close_quietly(client, 10)
        if cluster is not None:
            _close_quietly(cluster, 20)
        result.processes_killed = kill_new_children(before)
    events = _events(log)
    result.run_end = _run_end(events)
    if trainer is not None and trainer.rows_seen and not result.hung:
        disturbed = set(getattr(trainer, "_disturbed_epochs", ())) | _marked_epochs(events)
        result.disturbed_epochs = sorted(disturbed)
        counts = count_rows(
            trainer.rows_seen, disturbed, result.completed, _counted_duplicates(events)
        )
        for name, value in counts.items():
            setattr(result, name, value)
    if result.completed:
        result.accuracy = float((model.forward(X_test).argmax(1) == y_test).mean())
    result.unmet = judge(result)
    return result


def run_driver_fit(
    plan: FitPlan,
    args: argparse.Namespace,
    workdir: Path,
) -> FitResult:
    """One fit whose driver is a subprocess against a fresh cluster here; ``plan.fault``
    (SIGKILL or SIGINT) goes to that subprocess once ``plan.at`` rounds were logged."""
    from hmdspt.parallel.cluster import local_cluster

    result = FitResult(plan.fault, plan.at)
    stamp = time.monotonic_ns()
    log = workdir / f"{plan.fault}-{stamp}.jsonl"
    rows_file = workdir / f"{plan.fault}-{stamp}.npz"
    stderr_path = workdir / f"{plan.fault}-{stamp}.stderr"
    before = set(_children())
    start = time.perf_counter()
    proc = cluster = None
    try:
        cluster = local_cluster(speeds=SPEEDS)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        command = [
            sys.executable,
            "-m",
            "benchmarks.bench_faults",
            "--driver-for",
            cluster.scheduler_address,
            "--driver-log",
            str(log),
            "--driver-rows-file",
            str(rows_file),
            "--rows",
            str(args.rows),
            "--epochs",
            str(args.epochs),
            "--rounds-per-epoch",
            str(args.rounds_per_epoch),
            "--seed",
            str(args.seed),
        ]
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + args.timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if _rounds_logged(log) >= plan.at:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            result.error = f"driver ended before the fault (exit {proc.returncode})"
        elif time.monotonic() >= deadline:
            result.hung = True
            result.error = f"hung: round {plan.at} not reached in {args.timeout:g} s"
        else:
            sig = signal.SIGKILL if plan.fault == "kill-driver" else signal.SIGINT
            os.kill(proc.pid, sig)
            fault_time = time.monotonic()
            result.fault_applied = True
            try:
                proc.wait(DRIVER_GONE_S if sig == signal.SIGINT else 10.0)
                result.seconds_to_end = time.monotonic() - fault_time
                if proc.returncode == -signal.SIGKILL:
                    result.error = "driver SIGKILLed"
                else:  # the last line of a traceback names the exception
                    lines = stderr_path.read_text(errors="replace").strip().splitlines()
                    last = first_line(lines[-1], 60) if lines else ""
                    code = proc.returncode
                    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
                    result.error = f"driver ended ({how})" + (f": {last}" if last else "")
            except subprocess.TimeoutExpired:
                result.error = f"driver still running {DRIVER_GONE_S:g} s after SIGINT"
        result.seconds = time.perf_counter() - start
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        r = leftovers(cluster.scheduler_address, DRIVER_GONE_S)
        result.run_states_left, result.keys_left, result.orphan_keys, result.leftover_note = r
    except Exception as exc:  # the benchmark's own set-up failed: shown as the outcome
        result.error = first_line(f"benchmark: {type(exc).__name__}: {exc}")
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if cluster is not None:
            _close_quietly(cluster, 20)
        result.processes_killed = kill_new_children(before)
    events = _events(log)
    result.run_end = _run_end(events)
    if rows_file.exists():
        with np.load(rows_file) as saved:
            rows_seen = {
                int(k.split("_")[1]): saved[k] for k in saved.files if k.startswith("epoch_")
            }
            disturbed = {int(e) for e in saved["disturbed"]} | _marked_epochs(events)
            completed = bool(saved["completed"])
        result.disturbed_epochs = sorted(disturbed)
        if rows_seen:
            counts = count_rows(rows_seen, disturbed, completed, _counted_duplicates(events))
            for name, value in counts.items():
                setattr(result, name, value)
    result.unmet = judge(result)
    return result


def driver_main(args: argparse.Namespace) -> int:
    """The subprocess driver: one fit against the scheduler at ``args.driver_for``; what
    each epoch processed goes to ``args.driver_rows_file`` however the fit ends (but a
    SIGKILL)."""
    from distributed import Client

    X, y, _, _ = make_data(args.rows, args.seed)
    Y = np.eye(3, dtype=np.float32)[y]
    log = Path(args.driver_log)
    with Client(args.driver_for, timeout=30) as client:
        trainer, _ = _make_trainer(client, X.shape[1], log, args.rounds_per_epoch)
        completed = False
        try:
            trainer.fit(X, Y, max_epochs=args.epochs)
            completed = True
        finally:
            out = Path(args.driver_rows_file)
            tmp = out.with_suffix(".tmp.npz")
            np.savez(
                tmp,
                completed=completed,
                disturbed=np.array(sorted(getattr(trainer, "_disturbed_epochs", ())), int),
                **{f"epoch_{e}": seen for e, seen in trainer.rows_seen.items()},
            )
            os.replace(tmp, out)
    return 0


# ------------------------------------------------------------------------------ report
def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value).replace("|", "\\|")


def table(results: list[FitResult]) -> list[str]:
    """The summary as markdown table lines, one row per fit."""
    lines = [
        "| # | fault | at | outcome | s after fault | never processed | dup undisturbed "
        "| dup disturbed (measured / trainer) | run_end | run states left | keys left "
        "(orphaned) | s | expectation |",
        "|---:|---|---|---|---:|---:|---:|---|---|---:|---|---:|---|",
    ]
    for i, r in enumerate(results, 1):
        keys = "n/a" if r.keys_left is None else f"{r.keys_left} ({_cell(r.orphan_keys)})"
        dup = f"{_cell(r.dup_disturbed)} / {_cell(r.dup_counted)}"
        met = "met" if not r.unmet else "NOT MET: " + "; ".join(r.unmet)
        cells = [
            str(i),
            r.fault,
            _cell(r.at) + (f" ({r.fault_note})" if r.fault_note else ""),
            first_line(r.outcome, 70),
            "n/a" if r.seconds_to_end is None else f"{r.seconds_to_end:.1f}",
            _cell(r.rows_never),
            _cell(r.dup_undisturbed),
            dup,
            _cell(r.run_end),
            _cell(r.run_states_left),
            keys,
            f"{r.seconds:.1f}",
            met,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def verdict(results: list[FitResult]) -> str:
    """The final line: did every fit meet its expectation, and which did not."""
    faulted = [r for r in results if r.fault != "none"]
    failed = [(i, r) for i, r in enumerate(results, 1) if r.unmet]
    if not failed:
        return (
            f"expectations: every fit met its expectation ({len(faulted)} faulted, "
            f"{len(results) - len(faulted)} undisturbed)"
        )
    names = "; ".join(f"fit {i} {r.fault} at {r.at} ({', '.join(r.unmet)})" for i, r in failed)
    return (
        f"expectations: {len(failed)} of {len(results)} fits did not meet their expectation "
        f"({len(faulted)} faulted, {len(results) - len(faulted)} undisturbed): {names}"
    )


def make_plan(args: argparse.Namespace) -> list[FitPlan]:
    """Undisturbed fits, the random faults, then ``args.targeted`` of each targeted one."""
    rng = np.random.default_rng(args.seed)
    total_rounds = args.epochs * args.rounds_per_epoch
    drawn = [
        (str(rng.choice(FAULTS)), int(rng.integers(2, max(3, total_rounds - 2))))
        for _ in range(args.fits)
    ]
    # Victims drawn after the faults, one per fit in order (the plans of earlier runs).
    victims = [int(rng.integers(len(SPEEDS))) for _ in range(args.reference + args.fits)]
    plan = [FitPlan("none", None) for _ in range(args.reference)]
    plan += [FitPlan(f, at, v) for (f, at), v in zip(drawn, victims[args.reference :])]
    # A generator of its own: adding targeted fits leaves the random ones as they were.
    trng = np.random.default_rng([args.seed, 1])
    mid = max(3, total_rounds // 2)
    variants = {
        "kill-staging": [("shard 1 staged", 0), ("shard 2 sending", 0)],
        "kill-last-round": [(f"epoch {min(2, args.epochs)}", None), (f"epoch {args.epochs}", None)],
        "kill-scheduler": [(mid, 0)],
        "kill-driver": [(mid, 0)],
        "sigint-driver": [(mid, 0)],
    }
    for _ in range(args.targeted):
        for fault in TARGETED:
            if args.only and fault not in args.only:
                continue
            for at, victim in variants[fault]:
                v = int(trng.integers(len(SPEEDS))) if victim is None else victim
                plan.append(FitPlan(fault, at, v))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=20, help="random faulted fits (default: 20)")
    parser.add_argument("--reference", type=int, default=3, help="undisturbed fits (default 3)")
    parser.add_argument(
        "--targeted",
        type=int,
        default=1,
        help="runs of each targeted fault's variants (default 1; 0: none)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=TARGETED,
        help="run only these targeted faults (default: all)",
    )
    parser.add_argument("--rows", type=int, default=40000, help="rows of the data set")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds before a fit counts as hung (default: 120)",
    )
    parser.add_argument("--rounds-per-epoch", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the faults and their rounds")
    # The subprocess driver of the driver faults (not for use by hand).
    parser.add_argument("--driver-for", help=argparse.SUPPRESS)
    parser.add_argument("--driver-log", help=argparse.SUPPRESS)
    parser.add_argument("--driver-rows-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver_for:
        return driver_main(args)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Worker and scheduler processes unpickle this module's functions: let them import it.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)

    from benchmarks._common import header

    plan = make_plan(args)
    n_faulted = sum(p.fault != "none" for p in plan)
    header(f"fault injection: {n_faulted} faulted + {args.reference} undisturbed fits")
    print(f"cluster: local_cluster(speeds={SPEEDS}) (EMULATED heterogeneity), fresh per fit")
    print(
        "kill-scheduler: the same workers with the scheduler in a process of its own; "
        "kill-driver, sigint-driver: the driver is a subprocess on the scheduler's address"
    )
    data = make_data(args.rows, args.seed)
    results: list[FitResult] = []
    with TemporaryDirectory() as tmp:
        for i, p in enumerate(plan, 1):
            if p.fault in DRIVER_FAULTS:
                r = run_driver_fit(p, args, Path(tmp))
            else:
                r = run_fit(data, p, args.epochs, args.rounds_per_epoch, Path(tmp), args.timeout)
            results.append(r)
            killed = r.processes_killed
            extra = f"  killed {killed} leftover processes" if killed else ""
            print(
                f"fit {i:2d}/{len(plan)}: {p.fault:<15} at {_cell(p.at):>15}  "
                f"{first_line(r.outcome, 60)}  acc {r.accuracy:.4f}  "
                f"never {_cell(r.rows_never)}  dup {_cell(r.dup_undisturbed)}  "
                f"disturbed epochs {r.disturbed_epochs} dup {_cell(r.dup_disturbed)}/"
                f"{_cell(r.dup_counted)}  run_end {_cell(r.run_end)}  "
                f"left {_cell(r.run_states_left)} runs {_cell(r.keys_left)} keys  "
                f"{r.seconds:.1f} s  {'met' if not r.unmet else 'NOT MET'}{extra}"
                + (f"  [{r.leftover_note}]" if r.run_states_left or r.keys_left else ""),
                flush=True,
            )
    ref = [r.accuracy for r in results if r.fault == "none" and r.completed]
    faulted = [r for r in results if r.fault != "none"]
    print()
    print(
        f"fits completed:   {sum(r.completed for r in faulted)}/{len(faulted)} faulted, "
        f"{len(ref)}/{args.reference} undisturbed"
    )
    for fault in (*FAULTS, *TARGETED):
        of_kind = [r for r in faulted if r.fault == fault]
        if of_kind:
            met = sum(not r.unmet for r in of_kind)
            print(
                f"  {fault:<15} {sum(r.completed for r in of_kind)}/{len(of_kind)} completed, "
                f"{met}/{len(of_kind)} met: {EXPECTED[fault]}"
            )
    done = [r for r in faulted if r.completed]
    if ref and done:
        ref_mean = float(np.mean(ref))
        diffs = np.array([r.accuracy - ref_mean for r in done])
        print(
            f"accuracy:         undisturbed {ref_mean:.4f} (spread {np.ptp(ref):.4f} over "
            f"{len(ref)} fits); faulted {np.mean([r.accuracy for r in done]):.4f}, "
            f"difference to undisturbed min {diffs.min():+.4f} max {diffs.max():+.4f}"
        )
    print()
    print(
        "at: the round after which the fault struck, or its moment; s after fault: to the "
        "fit's end (its error or completion, or the driver's exit); "
        "never processed: rows never processed in a complete epoch; dup: extra processings "
        "of rows (undisturbed epochs; disturbed ones as measured / as the trainer's epoch "
        "events count them); left: run states and keys on the workers afterwards, asked "
        f"from a fresh client for up to {LEFTOVER_WAIT_S:g} s ({DRIVER_GONE_S:g} s after "
        "a driver fault)"
    )
    print()
    for line in table(results):
        print(line)
    print()
    print(verdict(results))
    return 0 if not any(r.unmet for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

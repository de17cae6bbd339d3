"""One synchronous round of a fit: send ``w_t`` with each worker's round call, combine.

:class:`RoundRunner` is the trainer's round (:meth:`hmdspt.parallel.trainer.Trainer._round`):
it calls each staged worker's round handler with ``w_t``
(:meth:`hmdspt.parallel.worker.HMDSPTWorkerPlugin.round_handler`, which runs
:func:`hmdspt.parallel.worker.run_round`) straight from the driver, waits on the fit's
:class:`~hmdspt.parallel.membership.Membership` for the results or a worker's departure,
and has the sync strategy combine what came back.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hmdspt.core import merge
from hmdspt.core.callers import user_stacklevel
from hmdspt.parallel.client import call_each, scheduler_workers
from hmdspt.parallel.worker import ROUND_OP, RoundSpec, WorkerNotRunning

__all__ = ["RoundRecord", "RoundRunner", "TrainingError"]


class TrainingError(RuntimeError):
    """The fit cannot go on (a worker failed or left, no workers)."""


@dataclass
class RoundRecord:
    """What one round measured (also written to the run log)."""

    round: int
    epoch: int
    wall_s: float
    merge_s: float
    loss_sum: float
    rows: int
    workers: dict[str, dict[str, float]] = field(default_factory=dict)
    val_score: float | None = None
    # Training seconds (Trainer.training_seconds) when the round's parameters were merged.
    training_s: float | None = None


class RoundRunner:
    """The round of ``trainer`` (it holds the fit's state; this holds none)."""

    # A worker whose round call failed may have died before the scheduler noticed: wait
    # this long for its removal before calling the failure its own.
    LOSS_NOTICE_S = 5.0

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer

    def spec(self, new_epoch: bool, rounds_left: int) -> RoundSpec:
        t = self.trainer
        cfg = t.config
        lr_scale = t.sync_strategy.local_lr_scale(cfg, t.driver_optimizer)
        optimizer = dict(t.optimizer_kwargs)
        optimizer["learning_rate_init"] *= lr_scale
        return RoundSpec(
            run_id=t.run_id,
            layer_sizes=t.model.layer_sizes,
            hidden_activation=t.model.hidden_activation,
            out_activation=t.model.out_activation,
            alpha=t.sync_strategy.worker_alpha(t.model.alpha),
            dtype=t.model.dtype.name,
            optimizer=optimizer,
            batch_size=t.batch_size,
            mode=t.sync_strategy.worker_mode,
            new_epoch=new_epoch,
            rounds_left=rounds_left,
            learning_rate=t.driver_optimizer.learning_rate * lr_scale,
            compression=cfg.compression,
            topk=cfg.topk,
            seed=cfg.seed,
            round=t.round_index,
            return_row_ids=cfg.record_row_ids,
            # Speeds are remembered from what a later proportional fit will repeat: every
            # worker busy for the whole of a regular round (see worker_tasks). Not from
            # equal shares (the fast workers finish early, and on a shared machine the
            # others then run with less contention than in a proportional round), nor
            # from ramp rounds (fixed per-round costs weigh more in them), nor from bsp's
            # gradients (a different cost per row), nor from catch-up rounds (only some
            # workers have rows due).
            remember_speed=(
                t.partition_policy.uses_speeds
                and t.sync_strategy.remembers_speed
                and rounds_left <= t._rounds_per_epoch
                and not t._catching_up
            ),
            speed_memory_s=cfg.reuse_speeds_s,
            quiet_workers=cfg.quiet_workers,
        )

    def run(
        self,
        epoch: int,
        new_epoch: bool,
        rounds_left: int,
        evaluate: Callable[[np.ndarray], float] | None = None,
        epoch_end: bool = False,
    ) -> RoundRecord:
        """One round (see :meth:`hmdspt.parallel.trainer.Trainer._round`)."""
        t = self.trainer
        t.round_index += 1
        t._sync_membership()
        t.waves.settle(rounds_left)
        spec = t._spec(new_epoch, rounds_left)  # through the trainer: subclasses hook it
        start = time.perf_counter()
        results, arrived, lost = self._call_workers(spec, start)
        if not results:
            t._recover(lost)  # raises when nobody is left; else the round is retried
            return t._round(epoch, new_epoch, rounds_left, evaluate, epoch_end)
        t.scores.flush()  # the last round's score, computed while this one trained
        merge_start = time.perf_counter()
        t._apply(results)
        merge_s = time.perf_counter() - merge_start
        wall = time.perf_counter() - start
        record = RoundRecord(
            t.round_index,
            epoch,
            wall,
            merge_s,
            sum(r["loss_sum"] for r in results.values()),
            sum(r["rows"] for r in results.values()),
        )
        loss = record.loss_sum / max(record.rows, 1)
        finite = bool(np.isfinite(t.model.params).all())
        if not (finite and math.isfinite(loss)):
            raise TrainingError(
                f"training diverged in round {t.round_index}: the loss is {loss:.3g} "
                f"({'finite' if finite else 'non-finite'} parameters); lower "
                "learning_rate_init"
            )
        # Lost workers' rows re-staged after this round (below) are added to these.
        t._due_rows = sum(r["due_left"] for r in results.values())
        dense_bytes = t.model.params.nbytes
        for addr, res in results.items():
            busy = res["busy_s"]
            comm = max(arrived[addr] - busy, 0.0)  # driver-side: send w_t + return payload
            idle = max(wall - busy - comm, 0.0)
            record.workers[t._names[addr]] = {
                "rows": res["rows"],
                "steps": res["steps"],
                "busy_s": busy,
                "comm_s": comm,
                "idle_s": idle,
                "bytes_in": dense_bytes,
                "bytes_out": res["bytes_out"],
            }
            if res["rows"]:
                t.scorer.update(addr, res["rows"], busy)
            t.costs.observe(addr, res["rows"], busy, comm, wall)
        if t.config.record_row_ids:
            seen = t.rows_seen.setdefault(epoch, np.zeros(t.n_rows, dtype=np.int64))
            for res in results.values():
                np.add.at(seen, res["row_ids"], 1)
                t.weights_seen.append((res["row_ids"], res["weight"]))
        t.waves.count_trained(results)
        t.history.append(record)
        fields = dict(
            round=record.round,
            epoch=epoch,
            wall_s=wall,
            merge_s=merge_s,
            loss=loss,
            workers=record.workers,
            timestamp=time.time(),  # the round's end, also when its score comes later
        )
        # With a worker lost, catch-up rounds end the epoch (see fit). An epoch's last
        # round is scored before the epoch ends; the others while the next round trains.
        t.scores.score_round(
            record,
            fields,
            evaluate,
            force=epoch_end and not lost,
            overlap=not (epoch_end or lost),
        )
        if lost:
            t._recover(lost)
        return record

    def _call_workers(
        self, spec: RoundSpec, start: float
    ) -> tuple[dict[str, dict], dict[str, float], set[str]]:
        """Call every staged worker's round with ``w_t``; its results, arrivals, lost workers.

        ``w_t`` goes with the call, one transfer per worker and one round trip in all (a
        separate scatter first cost a second round trip, and on a CPU-quota testbed each
        round trip to a throttled worker can wait out its quota). A call whose worker dies
        ends with the broken connection, and one to a worker that hangs is waited on with
        the membership and cancelled when the worker leaves: both workers are lost, the
        round completes without their deltas. A worker that is in the cluster but not
        running (paused for memory, retiring) refuses (:class:`WorkerNotRunning`); it is
        asked again about once a second, recovered as soon as it leaves, and fails the fit,
        named with its status, once it has refused for ``broadcast_timeout_s``.
        """
        t = self.trainer
        deadline = time.monotonic() + t.config.broadcast_timeout_s
        results: dict[str, dict] = {}
        arrived: dict[str, float] = {}
        lost: set[str] = set()
        to_call = sorted(t.staged.futures)
        while to_call:
            refused = self._call_once(to_call, spec, start, results, arrived, lost)
            to_call = sorted(set(refused) - lost)
            if not to_call:
                break
            # Wakes as soon as one leaves; one that stays may run again, so it is asked again.
            wait_s = min(1.0, max(deadline - time.monotonic(), 0.0))
            gone = t.membership.wait_gone(set(to_call), wait_s)
            lost |= gone
            to_call = [a for a in to_call if a not in gone]
            if to_call and not gone and time.monotonic() >= deadline:
                info = scheduler_workers(t.client)
                states = "; ".join(
                    f"{t._names.get(a, a)} (status "
                    f"{info.get(a, {}).get('status', refused[a].status)})"
                    for a in to_call
                )
                raise TrainingError(
                    f"worker {states} refused round {t.round_index} for "
                    f"{t.config.broadcast_timeout_s:g} s; it is still in the cluster but "
                    "takes no work (paused for memory, or retiring without leaving)"
                )
        return results, arrived, lost

    def _call_once(
        self,
        to_call: list[str],
        spec: RoundSpec,
        start: float,
        results: dict[str, dict],
        arrived: dict[str, float],
        lost: set[str],
    ) -> dict[str, WorkerNotRunning]:
        """One call to each worker of ``to_call``, all at once, waited on until each has
        answered or left; adds to ``results``, ``arrived`` and ``lost``, returns the
        refusals."""
        t = self.trainer
        refused: dict[str, WorkerNotRunning] = {}
        calls = call_each(
            t.client,
            ROUND_OP,
            {
                addr: {
                    "shard_key": t.staged.futures[addr].key,
                    "params": t.model.params,
                    # Rows on their way count in the worker's share of the due rows.
                    "spec": replace(spec, pending_rows=pending)
                    if (pending := t.waves.pending_rows(addr))
                    else spec,
                }
                for addr in to_call
            },
        )
        futures = {future: addr for addr, future in calls.items()}
        pending = set(futures)
        warn_at = time.perf_counter() + t.config.stall_warning_s  # None once warned
        try:
            while pending:
                # Until a call returns or a worker leaves: a call to a hung worker never
                # does, one to a worker busy with another task not until that task ends.
                timeout = None if warn_at is None else max(warn_at - time.perf_counter(), 0.0)
                done, gone = t.membership.wait_any(pending, {futures[f] for f in pending}, timeout)
                if warn_at is not None and not (done or gone) and time.perf_counter() >= warn_at:
                    self._warn_stalled(sorted(futures[f] for f in pending), start)
                    warn_at = None
                pending -= done
                for future in done:
                    addr = futures[future]
                    try:
                        results[addr] = future.result()
                        arrived[addr] = time.perf_counter() - start
                    except WorkerNotRunning as exc:
                        refused[addr] = exc
                    except Exception as exc:
                        # A client that is not connected hears of no departure: no wait.
                        connected = t.client.status == "running"
                        if not (connected and t.membership.wait_gone({addr}, self.LOSS_NOTICE_S)):
                            raise TrainingError(
                                f"worker {t._names.get(addr, addr)} failed in round "
                                f"{t.round_index}: {exc!r}"
                            ) from exc
                        lost.add(addr)  # the round completes without it
                lost |= gone
                pending = {f for f in pending if futures[f] not in gone}
        finally:
            for future in pending:  # calls to workers that left, or an interrupted wait
                future.cancel()
        return refused

    def _warn_stalled(self, waited_on: list[str], start: float) -> None:
        """Say which workers a round has waited on for ``stall_warning_s`` (warned and in
        the run log), once a round; the round goes on waiting for them."""
        t = self.trainer
        names = ", ".join(t._names.get(addr, addr) for addr in waited_on)
        message = (
            f"round {t.round_index} has waited {time.perf_counter() - start:.2g} s on worker(s) "
            f"{names}, which took it and have not answered: busy with another task (a Dask "
            "worker runs one task a thread) or stalled; the fit waits for them"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())
        if t.log is not None:
            t.log.write("warning", round=t.round_index, message=message)

    def apply(self, results: dict[str, dict]) -> None:
        """Combine the workers' payloads into the global parameters (the strategy)."""
        t = self.trainer
        order = sorted(results)
        t.sync_strategy.combine(
            t.model,
            [merge.decompress(results[a]["payload"]) for a in order],
            # Shares of the sample weight (the rows, unweighted): an unbiased merge.
            [results[a]["weight"] for a in order],
            [results[a]["steps"] for a in order],
            optimizer=t.driver_optimizer,
            momentum=t.momentum,
            config=t.config,
        )

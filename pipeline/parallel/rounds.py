"""One synchronous round of a fit: broadcast ``w_t``, run the workers' rounds, combine.

:class:`RoundRunner` is the trainer's round (:meth:`hmdspt.parallel.trainer.Trainer._round`):
it sends ``w_t`` once to every staged worker, calls each worker's round handler
(:meth:`hmdspt.parallel.worker.HMDSPTWorkerPlugin.round_handler`, which runs
:func:`hmdspt.parallel.worker.run_round`) straight from the driver, waits on the fit's
:class:`~hmdspt.parallel.membership.Membership` for the results or a worker's departure,
and has the sync strategy combine what came back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hmdspt.core import merge
from hmdspt.parallel.client import call_each, scatter_each, scheduler_workers
from hmdspt.parallel.worker import ROUND_OP, RoundSpec, run_key

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
        return RoundSpec(
            run_id=t.run_id,
            layer_sizes=t.model.layer_sizes,
            hidden_activation=t.model.hidden_activation,
            out_activation=t.model.out_activation,
            alpha=t.sync_strategy.worker_alpha(t.model.alpha),
            dtype=t.model.dtype.name,
            optimizer=t.optimizer_kwargs,
            batch_size=t.batch_size,
            mode=t.sync_strategy.worker_mode,
            new_epoch=new_epoch,
            rounds_left=rounds_left,
            learning_rate=t.driver_optimizer.learning_rate,
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
        )

    def broadcast(self) -> dict[str, Any]:
        """Send ``w_t`` once to every staged worker; a future per worker.

        Scattered directly to each worker rather than with ``broadcast=True``: Dask's
        broadcast replication keeps retrying a killed worker's stale address every 30 s,
        while a direct transfer to a dead worker fails within the connect timeout.

        A direct scatter also waits, for as long as its timeout, while its worker is
        not *running*: one that is retiring (``--lifetime`` reached, or retired by the
        cluster) or paused, or that has already left. Each scatter is therefore one short
        attempt, all workers' at once (:func:`hmdspt.parallel.client.scatter_each`: one
        round trip instead of one per worker); workers that did not take
        ``w_t`` are asked about (the membership), those that left are recovered (their
        rows re-staged onto the others, which keep the ``w_t`` they got) and the broadcast
        goes on. A worker that stays in the cluster without running fails the fit after
        ``broadcast_timeout_s``, named with its status.

        Each worker's ``w_t`` goes under a key naming the run and this client
        (:func:`hmdspt.parallel.worker.run_key`): a scatter cut short (Ctrl-C, a driver
        that dies) can leave it on a worker with the scheduler never told, and the
        workers free such keys when the run ends.
        """
        t = self.trainer
        deadline = time.monotonic() + t.config.broadcast_timeout_s
        sent: dict[str, Any] = {}
        errors: dict[str, Exception] = {}
        # A key of its own for each worker: one key on several workers is a replicated key,
        # and with no task waiting on it the scheduler's active memory manager drops
        # replicas before the round's call reads them.
        keys = {a: run_key(t.run_id, t.client.id, f"w_t-{t.round_index}") for a in t.staged.futures}
        while True:
            # One attempt per worker, all at once; the deadline is this loop's, for all.
            attempt = scatter_each(
                t.client,
                {a: {keys[a]: t.model.params} for a in sorted(set(t.staged.futures) - set(sent))},
            )
            for addr, got in attempt.items():
                if isinstance(got, Exception):  # not running, left, or died unnoticed
                    errors[addr] = got
                else:
                    sent[addr] = got[keys[addr]]
            missing = set(t.staged.futures) - set(sent)
            if not missing:
                return {addr: sent[addr] for addr in sorted(t.staged.futures)}
            # Wakes as soon as one leaves; one that stays (paused, retiring) is tried again
            # after a second, as it may run again.
            gone = t.membership.wait_gone(missing, min(1.0, max(deadline - time.monotonic(), 0)))
            if gone:
                t._recover(gone)  # raises when nobody is left
                stale = [f for a, f in sent.items() if a not in t.staged.futures]
                if stale:
                    t.client.cancel(stale)
                sent = {a: f for a, f in sent.items() if a in t.staged.futures}
            elif time.monotonic() >= deadline:
                t.client.cancel(list(sent.values()))
                info = scheduler_workers(t.client)
                states = "; ".join(
                    f"{t._names.get(a, a)} (status {info.get(a, {}).get('status', 'gone')}, "
                    f"last error {errors.get(a)!r})"
                    for a in sorted(missing)
                )
                raise TrainingError(
                    f"could not send the model to worker {states} for "
                    f"{t.config.broadcast_timeout_s:g} s in round {t.round_index}; "
                    "it is still in the cluster but takes no data (paused for memory, "
                    "retiring without leaving, or unreachable)"
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
        spec = t._spec(new_epoch, rounds_left)  # through the trainer: subclasses hook it
        start = time.perf_counter()
        # w_t goes to each worker once per round, through Dask (the broadcast's handling of
        # paused, retiring and lost workers); the round itself goes straight to each worker.
        params_futures = t._broadcast()
        calls = call_each(
            t.client,
            ROUND_OP,
            {
                addr: {"shard_key": shard.key, "params_key": params_futures[addr].key, "spec": spec}
                for addr, shard in t.staged.futures.items()
            },
        )
        futures = {future: addr for addr, future in calls.items()}
        results: dict[str, dict] = {}
        arrived: dict[str, float] = {}
        lost: set[str] = set()
        pending = set(futures)
        try:
            while pending:
                # Until a call returns or a worker leaves: a call to a hung worker never does.
                done, gone = t.membership.wait_any(pending, {futures[f] for f in pending})
                pending -= done
                for future in done:
                    addr = futures[future]
                    try:
                        results[addr] = future.result()
                        arrived[addr] = time.perf_counter() - start
                    except Exception as exc:
                        if not t.membership.wait_gone({addr}, self.LOSS_NOTICE_S):
                            raise TrainingError(
                                f"worker {t._names.get(addr, addr)} failed in round "
                                f"{t.round_index}: {exc!r}"
                            ) from exc
                        lost.add(addr)  # the round completes without it; its delta is dropped
                lost |= gone
                pending = {f for f in pending if futures[f] not in gone}
        finally:
            for future in pending:  # calls to workers that left, or an interrupted wait
                future.cancel()
        if not results:
            t._recover(lost)  # raises when nobody is left; else the round is retried
            return t._round(epoch, new_epoch, rounds_left, evaluate, epoch_end)
        t._flush_score()  # the last round's score, computed while this one trained
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
            t.client.cancel(list(params_futures.values()))
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
            t.costs.observe(addr, res["rows"], busy, comm)
        if t.config.record_row_ids:
            seen = t.rows_seen.setdefault(epoch, np.zeros(t.n_rows, dtype=np.int64))
            for res in results.values():
                np.add.at(seen, res["row_ids"], 1)
                t.weights_seen.append((res["row_ids"], res["weight"]))
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
        t._score_round(
            record,
            fields,
            evaluate,
            force=epoch_end and not lost,
            overlap=not (epoch_end or lost),
        )
        t.client.cancel(list(params_futures.values()))
        if lost:
            t._recover(lost)
        return record

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

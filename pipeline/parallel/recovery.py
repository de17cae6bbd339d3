"""Who trains: lost workers' rows re-staged on the survivors, joining workers taken in.

:class:`Recovery` acts on what the fit's :class:`~hmdspt.parallel.membership.Membership`
sees: before every round (:meth:`Recovery.sync`) and whenever a round, a broadcast or a
re-balance finds a worker gone (:meth:`Recovery.recover`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hmdspt.core import partition
from hmdspt.parallel.client import WorkerLostError, scheduler_workers
from hmdspt.parallel.rebalance import drop_workers, held_row_ids
from hmdspt.parallel.rounds import TrainingError
from hmdspt.parallel.scoring import score_workers

__all__ = ["Recovery"]


class Recovery:
    """Membership changes of ``trainer``'s fit (it holds the fit's state; this holds none)."""

    # A staging wait raises as soon as it sees a worker leave; this bounds the wait for
    # the removal of one whose connection broke before the scheduler noticed.
    LOSS_NOTICE_S = 5.0

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer

    def _members(self) -> set[str]:
        t = self.trainer
        return t.active | set(t.staged.futures)

    def sync(self, grace_s: float = 0.0) -> None:
        """Before a round: re-stage the rows of lost workers, bring in new ones.

        ``grace_s``: how long to wait for a member to leave (0: only those already gone).
        """
        t = self.trainer
        gone = t.membership.gone(self._members())
        if not gone and grace_s:
            gone = t.membership.wait_gone(self._members(), grace_s)
        if gone:
            t._recover(gone)
        joined = t.membership.joined(t.active)
        if joined:
            self.join(joined)

    def recover(self, lost: set[str]) -> None:
        """Drop lost workers; re-stage their rows from the source onto the survivors."""
        t = self.trainer
        # The rows still on their way are not missing: join them first.
        lost = set(lost) | t.waves.take()
        for addr in sorted(lost):
            t._log(
                "worker_lost",
                worker=t._names.get(addr, addr),
                round=t.round_index,
                reason="left the cluster",
            )
            t.active.discard(addr)
            if addr in t.scorer.workers:
                t.scorer.remove_worker(addr)
            t.costs.remove_worker(addr)
        t.staged = drop_workers(t.staged, lost)
        survivors = sorted(t.active - t.membership.gone(t.active))
        if not survivors:
            raise TrainingError(
                f"every worker was lost (last: {', '.join(t._names.get(a, a) for a in lost)}"
                f") in round {t.round_index}; nothing is left to train on"
            )
        start = time.perf_counter()
        try:
            missing = self.restage_missing(survivors)
        except WorkerLostError:
            # Another worker left while rows were counted or re-staged; ``staged`` is
            # still whole (add_rows releases nothing until it succeeds): start again.
            more = t.membership.wait_gone(self._members(), self.LOSS_NOTICE_S)
            if not more:
                raise
            t._recover(more)
            return
        t._log_partition(t.round_index, [], time.perf_counter() - start, restaged=int(len(missing)))

    def restage_missing(self, survivors: list[str]) -> np.ndarray:
        """Give the rows no worker holds to ``survivors``, by score; the ids re-staged."""
        t = self.trainer
        held = held_row_ids(t.staged)
        have = np.concatenate(list(held.values())) if held else np.empty(0, np.int64)
        missing = np.setdiff1d(np.arange(t.n_rows), have, assume_unique=True)
        if len(missing):
            shares = partition.apportion(
                len(missing), {a: t.scorer.score(a) for a in survivors}, min_rows=0
            )
            order = np.random.default_rng([t.config.seed, t.round_index]).permutation(missing)
            bounds = np.cumsum([0, *shares.values()])
            assignment = {
                a: np.sort(order[lo:hi]) for a, lo, hi in zip(shares, bounds[:-1], bounds[1:])
            }
            t.staged = t._source.add_rows(
                t.client, t.staged, assignment, dtype=t.model.dtype, key_name=t._shard_key
            )
            t._disturbed_epochs.add(t._epoch)
            t._restaged_rows[t._epoch] += len(missing)
            t._due_rows += len(missing)  # they arrive not done (add_rows)
        return missing

    def join(self, joined: set[str]) -> None:
        """Probe workers that joined, give them a score; rows follow at the next re-balance."""
        t = self.trainer
        info = scheduler_workers(t.client)
        # One whose registration is still under way is taken in at the next round.
        joined = {a for a in joined if a in info}
        if not joined:
            return
        t._register({a: info[a] for a in joined})
        speeds = score_workers(
            t.client,
            t.model.layer_sizes,
            seconds=t.config.probe_seconds,
            batch_size=t.batch_size,
            hidden_activation=t.model.hidden_activation,
            out_activation=t.model.out_activation,
            seed=t.config.seed,
            workers=sorted(joined),
        )
        for addr in sorted(joined):
            t._log(
                "worker_joined",
                worker=t._names[addr],
                round=t.round_index,
                address=addr,
                nthreads=info[addr].get("nthreads"),
                memory=info[addr].get("memory_limit"),
            )
            if addr in speeds:
                t.scorer.update_speed(addr, speeds[addr])
                t.costs.observe_probe(addr, speeds[addr], 1.0)
                t.placement.log_score(addr, speeds[addr], "probe")
        t._maybe_rebalance(force=True)

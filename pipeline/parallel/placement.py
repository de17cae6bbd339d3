"""Where a fit's rows live: the first shares, the speeds they follow, re-balancing.

:class:`Placement` gives the rows out before round one by the partition policy (the
workers' speeds measured first, or remembered, or restored with a checkpoint, when the
policy's shares follow them), moves rows between rounds when the policy's plan says so,
and writes the placement to the run log.
"""

from __future__ import annotations

import math
import time
from typing import Any

from hmdspt.core.nn import training_speed
from hmdspt.core.partition import rows_rebuilt
from hmdspt.core.speed import probe_pays
from hmdspt.parallel.rebalance import rebalance
from hmdspt.parallel.scoring import PROBE_MIN_S, score_workers
from hmdspt.parallel.worker import model_speed_key, remembered_speed

__all__ = ["Placement"]


class Placement:
    """Row placement of ``trainer``'s fit (it holds the fit's state; this holds none)."""

    # A move can fail on a broken connection before the scheduler removed its worker:
    # wait this long for the removal before calling the failure the move's own.
    LOSS_NOTICE_S = 5.0

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer

    def initial_counts(self, n_rows: int, workers: dict[str, dict]) -> dict[str, int]:
        """Rows per worker before round one, by the partition policy (the workers' speeds
        measured first when the policy's shares follow them)."""
        t = self.trainer
        if t.partition_policy.uses_speeds:
            self.measure_speeds(n_rows, sorted(workers))
        return t.partition_policy.shares(n_rows, t.scorer.scores())

    def measure_speeds(self, n_rows: int, addresses: list[str]) -> None:
        """Every worker's speed, from the state resumed, the workers' speed memory or a
        probe (the first of these that has them all), into the scorer and the log.

        The adaptive probe is skipped when it cannot pay (:func:`hmdspt.core.speed.probe_pays`
        at the driver's speed) and the policy re-balances: the rows then start on equal
        shares, the first round's timings score the workers and the first re-balance
        follows them; ``trainer.unprobed`` says why, for the log.
        """
        t = self.trainer
        t.unprobed = None
        if t._resumed and all(t.scorer.estimates[a].n_updates for a in addresses):
            # Every worker's speed came back with the checkpoint: no probe needed.
            for addr in addresses:  # measured online before the restart
                t.costs.observe_probe(addr, t.scorer.score(addr), 1.0)
                self.log_score(addr, t.scorer.score(addr), "online", restored=True)
            return
        remembered = self.remembered_speeds(addresses)
        if remembered is not None:
            for addr, memory in remembered.items():
                t.scorer.update_speed(addr, memory["speed"])
                t.costs.observe_probe(addr, memory["speed"], 1.0)
                self.log_score(
                    addr,
                    memory["speed"],
                    "remembered",
                    round_=0,
                    age_s=memory["age_s"],
                    from_run_id=memory["run_id"],
                    fits=memory.get("fits", 1),  # a worker of an older version: one fit
                )
            return
        # Skipped only by a policy that re-balances (the first re-balance brings the shares
        # the probe would have set) and not when a fixed probe is asked for.
        if t.partition_policy.rebalances and t.config.probe_seconds is None:
            model = t.model
            driver_speed = training_speed(
                model.layer_sizes,
                t.batch_size,
                hidden_activation=model.hidden_activation,
                out_activation=model.out_activation,
                dtype=model.dtype,
            )
            if not probe_pays(n_rows, len(addresses), driver_speed, PROBE_MIN_S):
                t.unprobed = {
                    "epoch_share_s": n_rows / len(addresses) / driver_speed,
                    "probe_min_s": PROBE_MIN_S,
                }
                return
        probe = score_workers(
            t.client,
            t.model.layer_sizes,
            seconds=t.config.probe_seconds,
            n_rows_total=None if t.config.probe_seconds is not None else n_rows,
            batch_size=t.batch_size,
            hidden_activation=t.model.hidden_activation,
            out_activation=t.model.out_activation,
            seed=t.config.seed,
        )
        for addr, speed in probe.items():
            t.scorer.update_speed(addr, speed)
            t.costs.observe_probe(addr, speed, 1.0)
            self.log_score(addr, speed, "probe", round_=0)

    def remembered_speeds(self, addresses: list[str]) -> dict[str, dict] | None:
        """Every worker's remembered speed for this model shape, or None (then probe)."""
        t = self.trainer
        if not t.config.reuse_speeds_s:
            return None
        key = model_speed_key(t.model, t.batch_size)
        try:
            memories = t.client.run(
                remembered_speed, key, t.config.reuse_speeds_s, workers=addresses
            )
        except (OSError, TimeoutError, KeyError, ValueError):
            return None  # a worker left while asked: the probe will find out who is there
        if set(memories) != set(addresses) or any(m is None for m in memories.values()):
            # One unmeasured worker means probing all: probed alone, without the others'
            # contention, it would look faster than it trains.
            return None
        return memories

    def maybe_rebalance(self, force: bool = False, epochs_left: float | None = None) -> None:
        """Move rows when the partition policy's plan says so
        (:meth:`hmdspt.core.strategies.PartitionPolicy.plan`; ``force``: also a policy that
        does not re-balance, which must take in a worker that joined).

        The plan weighs the round cost model's speeds and fixed costs; with
        ``epochs_left``, rows move only when the saving over those epochs exceeds what
        moving them is predicted to cost (:class:`hmdspt.core.costs.MoveCost`).
        """
        t = self.trainer
        members = sorted(t.active)
        current = {a: t.staged.counts.get(a, 0) for a in members}
        if t.unprobed is not None:
            self._seed_costs_from_first_rounds(members)
        speeds, fixed = t.costs.epoch_costs(
            members, t._rounds_per_epoch, {a: t.scorer.score(a) for a in members}
        )
        moves = t.partition_policy.plan(
            current,
            speeds,
            t.n_rows,
            force=force,
            fixed_s=fixed,
            epochs_left=epochs_left,
            move_cost=t.move_cost.seconds,
        )
        if not moves:
            if t.unprobed is not None and not t.speeds_logged:
                # Not probed: the log gets the speeds once the rounds have measured them,
                # whether or not they move rows.
                if all(t.scorer.is_measured(a) for a in members):
                    self._log_online_scores(members, speeds, fixed)
            return
        start = time.perf_counter()
        try:
            t.staged = rebalance(t.client, t.staged, moves)
        except Exception:
            # A worker died under the moves: the old shards are untouched until a
            # re-balance succeeds, so re-stage the lost rows and re-plan next round.
            everyone = t.active | set(t.staged.futures)
            if not t.membership.wait_gone(everyone, self.LOSS_NOTICE_S):
                raise
            t._sync_membership()
            return
        seconds = time.perf_counter() - start
        t.move_cost.observe(rows_rebuilt(current, moves), seconds)
        self._log_online_scores(members, speeds, fixed)
        self.log_partition(t.round_index, moves, seconds)

    def _seed_costs_from_first_rounds(self, members: list[str]) -> None:
        """A fit that skipped the probe: the first rounds' speeds stand in for it in the
        cost model, as a probe's would (:meth:`measure_speeds`), until the first window
        of rounds replaces them (provisional).

        Until a worker's rounds fill a cost window (``cost_window_s`` of busy or wall
        time) the plans would otherwise take the online scorer's speed of every round: on digits
        (rounds of milliseconds) those swung 2x from round to round and an unprobed fit
        re-balanced after almost every epoch, each move costing more than its rounds.
        """
        t = self.trainer
        for addr in members:
            if t.scorer.is_measured(addr) and not (
                addr in t.costs.workers and t.costs.is_measured(addr)
            ):
                t.costs.observe_probe(addr, t.scorer.score(addr), 1.0, provisional=True)

    def _log_online_scores(self, members: list[str], speeds: dict, fixed: dict) -> None:
        """Write the speeds a plan used, with their fixed costs, to the run log."""
        for addr in members:
            self.log_score(
                addr,
                speeds[addr],
                "online",
                uncertainty=self._uncertainty(addr),
                fixed_s=fixed[addr],
            )

    def _uncertainty(self, addr: str) -> float | None:
        """Relative standard deviation of ``addr``'s speed, None while unknown."""
        costs = self.trainer.costs
        if addr not in costs.workers or not costs.is_measured(addr):
            return None
        rel = costs.speed_rel_std(addr)
        return rel if math.isfinite(rel) else None

    def log_score(
        self, addr: str, score: float, source: str, round_: int | None = None, **extra: Any
    ) -> None:
        """Write a worker's speed to the run log (``round_``: the current round if None)."""
        t = self.trainer
        t.speeds_logged = True
        t._log(
            "score",
            round=t.round_index if round_ is None else round_,
            worker=t._names[addr],
            score=score,
            source=source,
            **extra,
        )

    def log_partition(self, round_: int, moves: list, seconds: float, **extra: Any) -> None:
        """Write the placement (rows per worker, the moves) to the run log."""
        t = self.trainer
        t._log(
            "partition",
            round=round_,
            # Members without rows too (fewer rows than workers: PartitionPolicy.shares).
            rows={
                t._names[a]: int(t.staged.counts.get(a, 0))
                for a in [*t.staged.counts, *sorted(t.active - set(t.staged.counts))]
            },
            moves=[
                (
                    t._names.get(m.source, m.source),
                    t._names.get(m.destination, m.destination),
                    int(m.rows),
                )
                for m in moves
            ],
            rows_moved=int(sum(m.rows for m in moves)),
            seconds=seconds,
            **extra,
        )

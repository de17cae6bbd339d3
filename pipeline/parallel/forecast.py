"""What the rest of a fit will cost: rounds sized from measured costs, and the prediction.

:class:`Forecast` reads the costs the rounds of an epoch measured (the round cost model's
speeds and fixed seconds, the synchronisation beyond each round's longest busy time) and
from them sizes the next epoch's rounds (:func:`hmdspt.core.rounds.size_rounds`, issue 17,
point 3) and predicts the rest of the fit against equal shares and the fastest worker alone
(:func:`hmdspt.core.prediction.predict_epoch`, issue 17, point 7), logged and, when the
cluster is predicted slower than that worker alone, warned about in one line.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hmdspt.core.callers import user_stacklevel
from hmdspt.core.prediction import counted, mean_epoch, predict_epoch, sync_per_round
from hmdspt.core.rounds import local_step_bound, size_rounds
from hmdspt.core.runlog import RunTotals

__all__ = ["Forecast"]


class Forecast:
    """Round sizing and prediction of ``trainer``'s fit (it holds the fit's state; this
    holds none)."""

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer

    def measured_costs(self, epoch: int) -> tuple[dict, dict, dict, float] | None:
        """Rows, speeds and fixed seconds per round of the workers holding rows, and the
        synchronisation per round: the median over ``epoch``'s rounds of the round's wall
        time beyond its longest busy time (sending ``w_t``, tasks, gathering, the merge).
        None while a worker holding rows has no speed or ``epoch`` has no rounds."""
        t = self.trainer
        last = [r for r in t.history if r.epoch == epoch and r.workers]
        counts = {a: n for a, n in t.staged.counts.items() if n}
        speeds = {a: t._speed(a) for a in counts}
        if not last or not counts or min(speeds.values()) <= 0:
            return None
        sync_s = float(
            np.median([r.wall_s - max(w["busy_s"] for w in r.workers.values()) for r in last])
        )
        measured = [a for a in counts if a in t.costs.workers and t.costs.is_measured(a)]
        fixed = {a: t.costs.fixed_s(a) if a in measured else 0.0 for a in counts}
        return counts, speeds, fixed, max(sync_s, 0.0)

    def rounds_per_epoch(self, epoch: int, current: int, last_epoch: int) -> int:
        """Rounds of ``epoch`` from the costs measured in the epoch before
        (:meth:`round_size`), logged; ``current`` stands while a worker holding rows has no
        speed yet."""
        t = self.trainer
        measured = self.measured_costs(epoch - 1)
        if measured is None:
            return current
        size, step_bound, compute_s = self.round_size(epoch, last_epoch, measured)
        _, _, fixed, sync_s = measured
        t._log(
            "round_size",
            epoch=epoch,
            rounds_per_epoch=size.rounds_per_epoch,
            compute_s=compute_s,
            sync_s=sync_s,
            fixed_s=max(fixed.values()),
            overhead_fraction=size.overhead_fraction,
            bound=size.bound,
            step_bound=step_bound,
        )
        return size.rounds_per_epoch

    def round_size(self, epoch: int, last_epoch: int, measured: tuple) -> tuple:
        """:func:`size_rounds` of ``epoch`` from ``measured`` (:meth:`measured_costs`): the
        overhead is the synchronisation per round plus the largest fixed per-round cost, the
        compute the longest share's rows over its worker's speed, the step bound the last
        epoch's or an earlier one's (:func:`local_step_bound`). Returns the size, the step
        bound and the compute."""
        t = self.trainer
        counts, speeds, fixed, sync_s = measured
        compute_s = max(n / speeds[a] for a, n in counts.items())
        step_bound = local_step_bound(
            epoch,
            last_epoch,
            max_local_steps=t.config.max_local_steps,
            early_local_steps=t.config.early_local_steps,
        )
        size = size_rounds(
            compute_s,
            sync_s + max(fixed.values()),
            max(counts.values()),
            t.batch_size,
            budget=t.config.sync_budget,
            max_local_steps=step_bound,
        )
        return size, step_bound, compute_s

    def measured_efficiency(self, epoch: int) -> float | None:
        """Parallel efficiency of the fit's rounds before ``epoch``, as its run log's
        summary computes it (docs/design.md, "Definitions"); None without timed rounds."""
        t = self.trainer
        totals = RunTotals()
        for r in t.history:
            if r.epoch < epoch and r.workers:
                totals.add({"event": "round", "wall_s": r.wall_s, "workers": r.workers})
        return totals.summary(None)["efficiency"] or None

    def predict(self, epoch: int, rounds_per_epoch: int, last_epoch: int) -> None:
        """Predict the mean epoch of ``epoch`` to ``last_epoch`` from the costs measured in
        ``epoch - 1`` (:func:`predict_epoch`, :func:`mean_epoch`: the last epoch's rounds
        sized with its own step bound), log it, and warn in one line when one process on
        the fastest worker would be faster."""
        t = self.trainer
        measured = self.measured_costs(epoch - 1)
        if measured is None:
            return
        counts, speeds, fixed, sync_s = measured
        last_rounds = rounds_per_epoch
        if epoch < last_epoch and t.sync_strategy.sizes_rounds(t.config):
            last_rounds = self.round_size(last_epoch, last_epoch, measured)[0].rounds_per_epoch
        efficiency = self.measured_efficiency(epoch)
        early, last = (
            predict_epoch(
                counts,
                speeds,
                fixed,
                sync_s,
                k,
                t.config.min_rows,
                measured_efficiency=efficiency,
            )
            for k in (rounds_per_epoch, last_rounds)
        )
        p = mean_epoch([early] * max(last_epoch - epoch, 0) + [last])
        fastest = t._names.get(p.fastest, str(p.fastest))
        t.prediction = dict(
            epoch=epoch,
            rounds_per_epoch=rounds_per_epoch,
            last_rounds_per_epoch=last_rounds,
            sync_s=sync_s,
            epoch_s=p.epoch_s,
            balanced_epoch_s=p.balanced_epoch_s,
            equal_shares_epoch_s=p.equal_shares_epoch_s,
            fastest_alone_epoch_s=p.fastest_alone_epoch_s,
            fastest=fastest,
            speedup=p.speedup,
            efficiency=p.efficiency,
            model_efficiency=p.model_efficiency,
            measured_efficiency=p.measured_efficiency,
            # Speeds slowed in our code on one machine: labelled wherever they are shown.
            emulated=t.config.emulation is not None,
        )
        t._log("prediction", **t.prediction)
        if p.speedup < 1:
            emulated = " (heterogeneity emulated)" if t.prediction["emulated"] else ""
            message = (
                f"this cluster{emulated} is predicted to train slower than one process on its "
                f"fastest worker {fastest} alone: {p.epoch_s:.3g} s an epoch on "
                f"{counted(len(counts), 'worker')} against {p.fastest_alone_epoch_s:.3g} s "
                f"(speed-up {p.speedup:.2f}x; "
                f"{sync_per_round(sync_s, rounds_per_epoch, ' of synchronisation')})"
            )
            warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())
            if t.log is not None:
                t.log.write("warning", round=t.round_index, message=message)

"""What an epoch on these workers is predicted to cost, against equal shares and against
one process on the fastest worker alone (pure).

From the measured costs (each worker's speed and fixed seconds per round, the
synchronisation per round) the trainer predicts, after the fit's first epoch, whether the
cluster is worth using (docs/design.md, "An honest answer").
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from hmdspt.core.costs import balanced_shares

__all__ = ["EpochPrediction", "predict_epoch"]


@dataclass(frozen=True)
class EpochPrediction:
    """A predicted epoch.

    Attributes
    ----------
    rounds_per_epoch : int
        Rounds the epoch is split into.
    epoch_s : float
        Wall seconds of the epoch with the fit's shares: the longest share's compute and
        fixed costs, plus the synchronisation of each round.
    balanced_epoch_s : float
        The same with balanced shares (equal finish times).
    equal_shares_epoch_s : float
        The same on the same workers with equal shares.
    fastest_alone_epoch_s : float
        One process on the fastest worker, training every row, with no rounds.
    fastest : hashable
        That worker.
    efficiency : float
        Parallel efficiency of the epoch: the ideal time (rows over the summed speeds) over
        ``epoch_s``.
    """

    rounds_per_epoch: int
    epoch_s: float
    balanced_epoch_s: float
    equal_shares_epoch_s: float
    fastest_alone_epoch_s: float
    fastest: Hashable
    efficiency: float

    @property
    def speedup(self) -> float:
        """How many times faster than one process on the fastest worker (< 1: slower)."""
        return self.fastest_alone_epoch_s / self.epoch_s

    @property
    def equal_shares_ratio(self) -> float:
        """Equal shares' epoch over the balanced one's."""
        return self.equal_shares_epoch_s / self.epoch_s


def predict_epoch(
    counts: Mapping[Hashable, int],
    speeds: Mapping[Hashable, float],
    fixed_s: Mapping[Hashable, float],
    sync_s: float,
    rounds_per_epoch: int,
    min_rows: int = 1,
) -> EpochPrediction:
    """Predict one epoch of the rows of ``counts`` in ``rounds_per_epoch`` rounds.

    Worker ``i`` takes ``rounds * fixed_s[i] + n_i / speeds[i]`` of an epoch; every round
    adds ``sync_s`` (sending the model, the tasks, gathering, the merge). One process alone
    takes ``sum(counts) / max(speeds)``: the same per-row speed, without rounds.

    Parameters
    ----------
    counts : mapping of worker to int
        The fit's rows per worker.
    speeds : mapping of worker to float
        Rows per second of each worker of ``counts``, > 0.
    fixed_s : mapping of worker to float
        Each worker's fixed seconds per round (missing: 0).
    sync_s : float
        Synchronisation seconds per round, >= 0.
    rounds_per_epoch : int
        Rounds of the epoch, >= 1.
    min_rows : int, default=1
        Fewest rows a worker holds (in the balanced shares).

    Returns
    -------
    EpochPrediction

    Examples
    --------
    >>> speeds = {"a": 4000.0, "b": 2000.0, "c": 1000.0}
    >>> p = predict_epoch({"a": 3000, "b": 3000, "c": 1000}, speeds, {}, 0.0, 1)
    >>> p.epoch_s, p.balanced_epoch_s, round(p.fastest_alone_epoch_s, 3), p.fastest
    (1.5, 1.0, 1.75, 'a')
    >>> round(p.equal_shares_epoch_s, 3), round(p.efficiency, 3)
    (2.333, 0.667)
    """
    if not speeds or min(speeds.values()) <= 0:
        raise ValueError(f"speeds must be a non-empty mapping of positive numbers, got {speeds}")
    if rounds_per_epoch < 1 or sync_s < 0:
        raise ValueError(
            f"need rounds_per_epoch >= 1 and sync_s >= 0, got {rounds_per_epoch}, {sync_s}"
        )
    if set(counts) != set(speeds):
        raise ValueError("counts and speeds must name the same workers")
    k = rounds_per_epoch
    n_rows = sum(counts.values())
    per_epoch_fixed = {w: k * fixed_s.get(w, 0.0) for w in speeds}
    balanced, _ = balanced_shares(n_rows, speeds, per_epoch_fixed, min_rows=min_rows)

    def epoch(shares: Mapping[Hashable, float]) -> float:
        return max(per_epoch_fixed[w] + n / speeds[w] for w, n in shares.items()) + k * sync_s

    epoch_s = epoch(counts)
    fastest = max(speeds, key=speeds.get)
    ideal = n_rows / sum(speeds.values())
    return EpochPrediction(
        rounds_per_epoch=k,
        epoch_s=epoch_s,
        balanced_epoch_s=epoch(balanced),
        equal_shares_epoch_s=epoch({w: n_rows / len(speeds) for w in speeds}),
        fastest_alone_epoch_s=n_rows / speeds[fastest],
        fastest=fastest,
        efficiency=ideal / epoch_s if epoch_s > 0 else 1.0,
    )

"""What an epoch on these workers is predicted to cost, against equal shares and against
one process on the fastest worker alone (pure).

From the measured costs (each worker's speed and fixed seconds per round, the
synchronisation per round) the trainer predicts, after the fit's first epoch, whether the
cluster is worth using (docs/design.md, "An honest answer").
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from hmdspt.core.costs import balanced_shares

__all__ = [
    "MEASURED_WEIGHT",
    "EpochPrediction",
    "counted",
    "mean_epoch",
    "predict_epoch",
    "sync_per_round",
]

# How much the efficiency an epoch measured counts against the cost model's. The model
# misses per-round jitter and the quota bursts of a throttled worker (it over-predicted on
# the testbed); the measured epoch still holds the rounds before the first re-balance (it
# under-predicted). Chosen on 67 run logs (docs/design.md, "An honest answer").
MEASURED_WEIGHT = 0.5


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
    model_efficiency : float
        The cost model's efficiency, before the measured one is weighed in (equal to
        ``efficiency`` when none was given).
    measured_efficiency : float or None
        The efficiency the fit measured so far, if given.
    """

    rounds_per_epoch: int
    epoch_s: float
    balanced_epoch_s: float
    equal_shares_epoch_s: float
    fastest_alone_epoch_s: float
    fastest: Hashable
    efficiency: float
    model_efficiency: float
    measured_efficiency: float | None = None

    @property
    def speedup(self) -> float:
        """How many times faster than one process on the fastest worker (< 1: slower)."""
        return self.fastest_alone_epoch_s / self.epoch_s

    @property
    def equal_shares_ratio(self) -> float:
        """Equal shares' epoch over the balanced one's."""
        return self.equal_shares_epoch_s / self.epoch_s


def counted(n: int, noun: str) -> str:
    """``"1 round"``, ``"3 rounds"``: a count as the messages and the monitor print it."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def sync_per_round(sync_s: float, rounds_per_epoch: int, what: str = "") -> str:
    """The synchronisation a round pays, as the trainer's warning and the CLI print it.

    ``"9 ms{what} in each of 3 rounds an epoch"``, or ``"in an epoch's one round"``.
    """
    where = (
        "in an epoch's one round"
        if rounds_per_epoch == 1
        else f"in each of {rounds_per_epoch} rounds an epoch"
    )
    return f"{1000 * sync_s:.0f} ms{what} {where}"


def predict_epoch(
    counts: Mapping[Hashable, int],
    speeds: Mapping[Hashable, float],
    fixed_s: Mapping[Hashable, float],
    sync_s: float,
    rounds_per_epoch: int,
    min_rows: int = 1,
    measured_efficiency: float | None = None,
) -> EpochPrediction:
    """Predict one epoch of the rows of ``counts`` in ``rounds_per_epoch`` rounds.

    Worker ``i`` takes ``rounds * fixed_s[i] + n_i / speeds[i]`` of an epoch; every round
    adds ``sync_s`` (sending the model, the tasks, gathering, the merge). One process alone
    takes ``sum(counts) / max(speeds)``: the same per-row speed, without rounds.

    With ``measured_efficiency`` the predicted efficiency is the cost model's and the
    measured one weighed by :data:`MEASURED_WEIGHT`, and the epochs with rounds (the fit's
    shares, balanced, equal) are stretched (or shortened) by the same factor; one process
    alone has no rounds and keeps its time.

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
    measured_efficiency : float, optional
        Parallel efficiency the fit measured so far (docs/design.md, "Definitions"), > 0.

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
    >>> p = predict_epoch({"a": 3000, "b": 3000, "c": 1000}, speeds, {}, 0.0, 1, 1, 0.5)
    >>> round(p.efficiency, 3), round(p.model_efficiency, 3), round(p.epoch_s, 3)
    (0.583, 0.667, 1.714)
    """
    if not speeds or min(speeds.values()) <= 0:
        raise ValueError(f"speeds must be a non-empty mapping of positive numbers, got {speeds}")
    if rounds_per_epoch < 1 or sync_s < 0:
        raise ValueError(
            f"need rounds_per_epoch >= 1 and sync_s >= 0, got {rounds_per_epoch}, {sync_s}"
        )
    if set(counts) != set(speeds):
        raise ValueError("counts and speeds must name the same workers")
    if measured_efficiency is not None and not measured_efficiency > 0:
        raise ValueError(f"measured_efficiency must be > 0, got {measured_efficiency}")
    k = rounds_per_epoch
    n_rows = sum(counts.values())
    per_epoch_fixed = {w: k * fixed_s.get(w, 0.0) for w in speeds}
    balanced, _ = balanced_shares(n_rows, speeds, per_epoch_fixed, min_rows=min_rows)

    def epoch(shares: Mapping[Hashable, float]) -> float:
        return max(per_epoch_fixed[w] + n / speeds[w] for w, n in shares.items()) + k * sync_s

    epoch_s = epoch(counts)
    fastest = max(speeds, key=speeds.get)
    ideal = n_rows / sum(speeds.values())
    model_efficiency = ideal / epoch_s if epoch_s > 0 else 1.0
    efficiency, stretch = model_efficiency, 1.0
    if measured_efficiency is not None:
        efficiency = (
            1 - MEASURED_WEIGHT
        ) * model_efficiency + MEASURED_WEIGHT * measured_efficiency
        stretch = model_efficiency / efficiency
    return EpochPrediction(
        rounds_per_epoch=k,
        epoch_s=stretch * epoch_s,
        balanced_epoch_s=stretch * epoch(balanced),
        equal_shares_epoch_s=stretch * epoch({w: n_rows / len(speeds) for w in speeds}),
        fastest_alone_epoch_s=n_rows / speeds[fastest],
        fastest=fastest,
        efficiency=efficiency,
        model_efficiency=model_efficiency,
        measured_efficiency=measured_efficiency,
    )


def mean_epoch(epochs: Sequence[EpochPrediction]) -> EpochPrediction:
    """The mean epoch of a fit's remaining epochs, each predicted by :func:`predict_epoch`
    for the same rows and workers (the last epoch may have more rounds than the others).

    Times are averaged; the efficiencies are the ideal epoch (the same for every epoch) over
    the mean times, so a long epoch weighs as much as its seconds. ``rounds_per_epoch`` is
    the first epoch's.

    Examples
    --------
    >>> speeds = {"a": 4000.0, "b": 2000.0, "c": 1000.0}
    >>> one = predict_epoch({"a": 4000, "b": 2000, "c": 1000}, speeds, {}, 0.5, 1)
    >>> four = predict_epoch({"a": 4000, "b": 2000, "c": 1000}, speeds, {}, 0.5, 4)
    >>> (one.epoch_s, four.epoch_s), mean_epoch([one, one, four]).epoch_s
    ((1.5, 3.0), 2.0)
    >>> round(mean_epoch([one, one, four]).efficiency, 3), mean_epoch([one]) == one
    (0.5, True)
    """
    if not epochs:
        raise ValueError("no epoch to average")
    first = epochs[0]
    if len(epochs) == 1:
        return first
    n = len(epochs)
    ideal = first.epoch_s * first.efficiency

    def mean(field: str) -> float:
        return sum(getattr(e, field) for e in epochs) / n

    epoch_s = mean("epoch_s")
    model_epoch_s = sum(ideal / e.model_efficiency for e in epochs) / n
    return replace(
        first,
        epoch_s=epoch_s,
        balanced_epoch_s=mean("balanced_epoch_s"),
        equal_shares_epoch_s=mean("equal_shares_epoch_s"),
        efficiency=ideal / epoch_s,
        model_efficiency=ideal / model_epoch_s,
    )

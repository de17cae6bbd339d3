"""How many rounds an epoch is split into, chosen from measured costs (pure).

A round costs its compute plus an overhead that does not shrink with its rows: the
synchronisation (sending ``w_t``, submitting the tasks, gathering the deltas, the merge)
and each worker's fixed cost per round. Fewer, longer rounds spend less of the fit on that
overhead; more local steps between merges can cost accuracy, so the steps a round may hold
are bounded, tightly in the fit's last epoch (docs/design.md, "Rounds sized from measured
costs").
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

__all__ = [
    "AUTO_FIRST_EPOCH_ROUNDS",
    "EARLY_LOCAL_STEPS",
    "MAX_LOCAL_STEPS",
    "SYNC_BUDGET",
    "RoundSize",
    "first_wave_ramp",
    "landed_rows_cover",
    "ramp_length",
    "round_schedule",
    "round_share",
    "size_rounds",
]

#: Rounds of a fit's first epoch with ``rounds_per_epoch="auto"``, before any round has
#: measured the overhead.
AUTO_FIRST_EPOCH_ROUNDS = 4

#: Largest fraction of a round its overhead may take.
SYNC_BUDGET = 0.05

#: Most local mini-batch steps in one round of a fit's last epoch: below the fewest measured
#: to cost accuracy (208; docs/design.md, "Rounds sized from measured costs").
MAX_LOCAL_STEPS = 128

#: Most local mini-batch steps in one round of an epoch before the last: the later epochs
#: train away what longer rounds cost there, so the overhead budget decides (a bound of
#: 2048 cost no accuracy where it was measured; docs/design.md).
EARLY_LOCAL_STEPS = 2048


@dataclass(frozen=True)
class RoundSize:
    """A choice of rounds per epoch and what decided it.

    Attributes
    ----------
    rounds_per_epoch : int
        Regular rounds of the next epoch.
    overhead_fraction : float
        Predicted share of each round spent on overhead at that size.
    bound : {"budget", "steps", "epoch"}
        ``"budget"``: the most rounds whose overhead stays within the budget;
        ``"steps"``: more rounds than the budget allows, because fewer would hold more
        than ``max_local_steps`` steps; ``"epoch"``: one round per epoch, whose overhead
        may still exceed the budget (rounds do not span epochs).
    """

    rounds_per_epoch: int
    overhead_fraction: float
    bound: str


def local_step_bound(
    epoch: int,
    last_epoch: int,
    *,
    max_local_steps: int = MAX_LOCAL_STEPS,
    early_local_steps: int = EARLY_LOCAL_STEPS,
) -> int:
    """Most steps a round of ``epoch`` may hold: ``max_local_steps`` in the fit's last
    epoch (``last_epoch`` or later), ``early_local_steps`` before it.

    The final model is the merge of the last epoch's rounds, and nothing trains away what
    their drift costs; an earlier epoch's longer rounds are followed by epochs of short ones.

    Parameters
    ----------
    epoch : int
        The epoch about to start (1-based).
    last_epoch : int
        The fit's last epoch (``max_iter``; a fit that stops early ends before it).
    max_local_steps, early_local_steps : int
        The bounds of the last epoch and of the epochs before it, each at least 1.

    Returns
    -------
    int
    """
    if max_local_steps < 1 or early_local_steps < 1:
        raise ValueError(
            "max_local_steps and early_local_steps must be >= 1, got "
            f"{max_local_steps}, {early_local_steps}"
        )
    return max_local_steps if epoch >= last_epoch else early_local_steps


def size_rounds(
    compute_s: float,
    overhead_s: float,
    largest_share: int,
    batch_size: int,
    *,
    budget: float = SYNC_BUDGET,
    max_local_steps: int = MAX_LOCAL_STEPS,
) -> RoundSize:
    """Rounds per epoch that keep each round's overhead within ``budget`` of the round.

    With ``k`` rounds a round lasts ``compute_s / k + overhead_s``; its overhead fraction
    stays within the budget while ``k <= compute_s * budget / (overhead_s * (1 - budget))``.
    The most such rounds are chosen (frequent merges, frequent chances to re-balance), but
    at least enough that no round holds more than ``max_local_steps`` steps of the largest
    share, and at most one round per step.

    Parameters
    ----------
    compute_s : float
        Seconds of compute an epoch takes on the worker that takes longest, without the
        fixed per-round costs.
    overhead_s : float
        Seconds each round costs whatever its size: synchronisation plus the largest fixed
        per-round cost.
    largest_share : int
        Rows of the largest share.
    batch_size : int
        Rows per mini-batch step.
    budget : float, default=SYNC_BUDGET
        Largest fraction of a round its overhead may take, in (0, 1).
    max_local_steps : int, default=MAX_LOCAL_STEPS
        Most steps in one round.

    Returns
    -------
    RoundSize
    """
    if not 0 < budget < 1:
        raise ValueError(f"budget must be in (0, 1), got {budget}")
    if batch_size < 1 or max_local_steps < 1:
        raise ValueError(
            f"batch_size and max_local_steps must be >= 1, got {batch_size}, {max_local_steps}"
        )
    if not (math.isfinite(compute_s) and math.isfinite(overhead_s)):
        raise ValueError(f"costs must be finite, got {compute_s}, {overhead_s}")
    compute_s, overhead_s = max(compute_s, 0.0), max(overhead_s, 0.0)
    steps = max(1, math.ceil(largest_share / batch_size))
    fewest = max(1, math.ceil(steps / max_local_steps))
    # Divided in this order, a denormal overhead cannot underflow to a zero divisor.
    allowed = math.inf if overhead_s == 0 else compute_s / overhead_s * (budget / (1 - budget))
    most = steps if allowed >= steps else math.floor(allowed)
    if most >= fewest:
        k, bound = most, "budget"
    elif fewest > 1:
        k, bound = fewest, "steps"
    else:
        k, bound = 1, "epoch"
    round_s = compute_s / k + overhead_s
    fraction = overhead_s / round_s if round_s > 0 else 0.0
    return RoundSize(k, fraction, bound)


def ramp_length(round_s: float, first_round_s: float, min_rounds: int, max_rounds: int) -> int:
    """Ramp rounds before regular rounds of ``round_s`` seconds (see
    :class:`hmdspt.core.config.TrainerConfig`).

    No ramp (0) when a regular round is shorter than ``2 * first_round_s``: its halves would be
    shorter than a round's synchronisation allows, so a ramp costs time and buys nothing
    (docs/design.md, "Round loop"). Otherwise at least ``min_rounds`` (0: no ramp), more
    while the first ramp round, ``1 / 2**k`` of a regular round, would be longer than
    ``first_round_s``, at most ``max_rounds``.

    >>> ramp_length(1.3, 0.05, 3, 5), ramp_length(0.3, 0.05, 3, 5), ramp_length(0.09, 0.05, 3, 5)
    (5, 3, 0)
    """
    if not (round_s >= 0 and first_round_s > 0 and 0 <= min_rounds <= max_rounds):
        raise ValueError(
            f"need round_s >= 0, first_round_s > 0 and 0 <= min_rounds <= max_rounds, got "
            f"{round_s}, {first_round_s}, {min_rounds}, {max_rounds}"
        )
    if min_rounds == 0 or round_s < 2 * first_round_s:
        return 0
    needed = math.ceil(math.log2(round_s / first_round_s))
    return min(max_rounds, max(min_rounds, needed))


def first_wave_ramp(
    rounds_per_epoch: int,
    ramp_rounds: int,
    max_ramp_rounds: int,
    landed: Mapping[Hashable, int],
    pending: Mapping[Hashable, int],
) -> int:
    """``ramp_rounds``, raised (up to ``max_ramp_rounds``) until the epoch's first round
    draws each worker's share from the rows that have ``landed`` on it alone, not those
    still ``pending`` (a second staging wave).

    A first round whose share the landed rows cannot cover waits for the rest of the rows
    before it starts (:meth:`hmdspt.parallel.waves.StagingWaves.settle`); a shorter first
    round starts at once and the rest lands while it trains. Each step halves the first
    round (:func:`round_schedule`).

    >>> first_wave_ramp(4, 0, 5, {"a": 125}, {"a": 875})  # 1/8 landed: one ramp round
    1
    >>> first_wave_ramp(1, 3, 5, {"a": 125}, {"a": 875}), first_wave_ramp(4, 0, 5, {}, {})
    (3, 0)
    """
    ramp = ramp_rounds
    while ramp < max_ramp_rounds and not landed_rows_cover(
        landed, pending, rounds_per_epoch * 2**ramp
    ):
        ramp += 1
    return ramp


def landed_rows_cover(
    landed: Mapping[Hashable, int], pending: Mapping[Hashable, int], rounds_left: int
) -> bool:
    """Whether every worker's :func:`round_share` of a round with ``rounds_left`` rounds
    left in the epoch can be drawn from its ``landed`` rows, its ``pending`` ones (still on
    their way) counted in its share but not drawn.

    >>> landed_rows_cover({"a": 125}, {"a": 875}, 8), landed_rows_cover({"a": 125}, {"a": 875}, 4)
    (True, False)
    """
    return all(
        round_share(landed.get(w, 0), n, rounds_left) <= landed.get(w, 0)
        for w, n in pending.items()
    )


def round_share(due: int, pending: int, rounds_left: int) -> int:
    """A worker's rows in one round: its share, ``ceil((due + pending) / rounds_left)``, of
    the rows it has yet to train this epoch, ``due`` landed and ``pending`` still on their
    way (a second staging wave); the round draws them from the landed ones.

    >>> round_share(10, 0, 3), round_share(10, 14, 3), round_share(0, 5, 0)
    (4, 8, 5)
    """
    return -(-(due + pending) // max(rounds_left, 1))


def round_schedule(rounds_per_epoch: int, ramp_rounds: int = 0) -> list[int]:
    """The ``rounds_left`` of each round of an epoch (``RoundSpec.rounds_left`` in
    :mod:`hmdspt.parallel.worker`).

    A worker processes ``ceil(due / rounds_left)`` of the rows it has not yet processed
    this epoch, so any schedule ending in 1 processes every row exactly once. A regular
    epoch is ``[R, R - 1, ..., 1]``: ``R`` equal rounds. A ramp puts ``ramp_rounds``
    short rounds first, ``R * 2**k`` for ``k = ramp_rounds, ..., 1``: the first holds
    ``1 / 2**ramp_rounds`` of a regular round's rows and each next one about twice as many.

    Why a ramp: the first rounds after the warm start are where local models drift
    apart fastest (the loss falls steeply), so merging early and often keeps them
    together, as in post-local SGD (Lin et al., ICLR 2020) and the growing
    synchronisation periods of Haddadpour et al. (NeurIPS 2019). It also gives the
    online scorer real round timings, and the user a first validation score, after a
    fraction of a round instead of a whole one. It costs ``ramp_rounds`` extra
    synchronisations once per fit.

    Parameters
    ----------
    rounds_per_epoch : int
        Regular rounds of the epoch, ``R >= 1``.
    ramp_rounds : int, default=0
        Short rounds before them.

    Returns
    -------
    schedule : list of int

    Examples
    --------
    >>> round_schedule(2)
    [2, 1]
    >>> round_schedule(1, ramp_rounds=3)
    [8, 4, 2, 1]
    """
    if rounds_per_epoch < 1 or ramp_rounds < 0:
        raise ValueError(
            f"need rounds_per_epoch >= 1 and ramp_rounds >= 0, got {rounds_per_epoch}, "
            f"{ramp_rounds}"
        )
    ramp = [rounds_per_epoch * 2**k for k in range(ramp_rounds, 0, -1)]
    return ramp + list(range(rounds_per_epoch, 0, -1))

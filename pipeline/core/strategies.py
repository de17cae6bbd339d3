"""The sync strategies and partition policies, as small classes looked up by name.

The round loop (:mod:`hmdspt.parallel.trainer`) is one loop for every strategy; what differs
between strategies lives here, as the methods and attributes of two kinds of object:

- a :class:`SyncStrategy` says what a worker returns and how the driver combines it:
  :class:`HMDSPTSync` (``"hmdspt"``), :class:`LocalSync` (``"local"``), :class:`BSPSync`
  (``"bsp"``);
- a :class:`PartitionPolicy` says how many rows each worker holds and when rows move:
  :class:`ProportionalPartition` (``"proportional"``), :class:`EqualPartition`
  (``"equal"``). The simulator (:mod:`hmdspt.simulate`) drives the same objects.

:data:`SYNC_STRATEGIES` and :data:`PARTITION_POLICIES` map the names users pass
(``sync="bsp"``) to the classes; they are the one list of choices, read by the trainer's
configuration, the estimators' parameter validation and the command line. A new strategy is
one class and one registration (``docs/design.md``, "Strategies")::

    class MomentumLocalSync(LocalSync):
        '''Plain row-weighted average, then block momentum.'''

        def make_momentum(self, config):
            return merge.BlockMomentum(config.block_momentum, config.block_lr)

    SYNC_STRATEGIES["local-momentum"] = MomentumLocalSync

Like scikit-learn's optimizers (``sklearn/neural_network/_stochastic_optimizers.py``) the
classes hold the arithmetic only; the loop that calls them, the cluster and the run log stay
in the trainer. Everything here is numpy and the core.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hmdspt.core import costs, merge, partition, rounds

if TYPE_CHECKING:
    from hmdspt.core.nn import MLP

__all__ = [
    "PARTITION_POLICIES",
    "SYNC_STRATEGIES",
    "WORKER_MODES",
    "BSPSync",
    "EqualPartition",
    "HMDSPTSync",
    "LocalSync",
    "PartitionPolicy",
    "ProportionalPartition",
    "SyncStrategy",
    "get_partition",
    "get_sync",
]

#: The kinds of work a worker does in a round (``RoundSpec.mode``): ``"delta"``, local
#: mini-batch steps returning ``w_i - w_t``; ``"gradient"``, one gradient over the round's
#: rows. A sync strategy picks one (:attr:`SyncStrategy.worker_mode`).
WORKER_MODES = ("delta", "gradient")


# ---------------------------------------------------------------------------------------
# sync strategies
# ---------------------------------------------------------------------------------------


class SyncStrategy:
    """What a worker returns each round and how the driver combines it (the base class).

    Subclasses set the class attributes and override the methods that differ. Methods that
    depend on settings take ``config``, an object with the attributes of
    :class:`hmdspt.parallel.trainer.TrainerConfig` (``block_momentum``, ``block_lr``,
    ``normalize_steps``, ``rounds_per_epoch``, ...).

    Attributes
    ----------
    worker_mode : {"delta", "gradient"}
        What a worker computes and returns (:data:`WORKER_MODES`).
    warm_starts : bool
        Run the warm-start pilot fit on the driver before round one (fresh fits).
    ramps : bool
        Open a fresh fit's first epoch with short ramp rounds
        (:func:`hmdspt.core.rounds.round_schedule`).
    remembers_speed : bool
        A worker's rows per busy second in this strategy's rounds are those the probe
        measures (local mini-batch steps), so its regular rounds may be remembered as the
        worker's speed (:func:`hmdspt.parallel.worker.remembered_speed`).
    """

    worker_mode: ClassVar[str] = "delta"
    warm_starts: ClassVar[bool] = False
    ramps: ClassVar[bool] = False
    remembers_speed: ClassVar[bool] = True

    def rounds_per_epoch(self, n_rows: int, batch_size: int, config: Any) -> int:
        """Regular rounds of the fit's first epoch: ``config.rounds_per_epoch``, or
        :data:`hmdspt.core.rounds.AUTO_FIRST_EPOCH_ROUNDS` when that is ``"auto"``."""
        if config.rounds_per_epoch == "auto":
            return rounds.AUTO_FIRST_EPOCH_ROUNDS
        return int(config.rounds_per_epoch)

    def sizes_rounds(self, config: Any) -> bool:
        """Whether later epochs' rounds are sized from measured costs
        (:func:`hmdspt.core.rounds.size_rounds`): with ``rounds_per_epoch="auto"``."""
        return config.rounds_per_epoch == "auto"

    def make_momentum(self, config: Any) -> merge.BlockMomentum:
        """The driver's block momentum: none (``mu=0``, ``eta=1``: the merged update as is)."""
        return merge.BlockMomentum(momentum=0.0, lr=1.0)

    def worker_alpha(self, alpha: float) -> float:
        """The L2 penalty the workers apply in their rounds: the model's own."""
        return alpha

    def local_lr_scale(self, config: Any, optimizer: Any) -> float:
        """Factor on the model's learning rate in the workers' local steps: 1."""
        return 1.0

    def combine(
        self,
        model: MLP,
        payloads: Sequence[np.ndarray],
        rows: Sequence[int],
        steps: Sequence[int],
        *,
        optimizer: Any,
        momentum: merge.BlockMomentum,
        config: Any,
    ) -> None:
        """Update ``model.params`` in place from one round's payloads.

        Parameters
        ----------
        model : MLP
            The global model.
        payloads : sequence of ndarray
            Each worker's decompressed payload (a delta or a gradient), in a fixed order.
        rows, steps : sequence of numbers
            What each worker processed, as its rows' sum of sample weights (its row
            count when the fit is unweighted), and the local steps it took, in the same
            order. Weighting by the sample weight keeps the merge unbiased.
        optimizer : optimizer of :func:`hmdspt.core.nn.make_optimizer`
            The driver's optimizer (its learning rate is also the workers' schedule).
        momentum : BlockMomentum
            What :meth:`make_momentum` made for this fit.
        config : TrainerConfig
            The fit's settings.
        """
        raise NotImplementedError


class LocalSync(SyncStrategy):
    """``"local"``: local SGD. Workers return ``w_i - w_t`` after local mini-batch steps;
    the driver adds their plain row-weighted average (no momentum, no warm start)."""

    def normalize_steps(self, config: Any) -> bool:
        """Normalise the merge by the workers' local step counts (FedNova): no."""
        return False

    def combine(
        self,
        model: MLP,
        payloads: Sequence[np.ndarray],
        rows: Sequence[int],
        steps: Sequence[int],
        *,
        optimizer: Any,
        momentum: merge.BlockMomentum,
        config: Any,
    ) -> None:
        if not any(r and s for r, s in zip(rows, steps)):
            return
        delta = merge.merge_deltas(
            payloads, rows, steps, normalize_steps=self.normalize_steps(config)
        )
        momentum.step(model.params, delta)


class HMDSPTSync(LocalSync):
    """``"hmdspt"``: deltas after local steps, merged normalised by step counts (FedNova,
    ``config.normalize_steps``), then block momentum (BMUF: ``config.block_momentum``,
    ``config.block_lr``), the workers' steps scaled by ``config.local_lr_scale``; a fresh fit
    starts from a warm-start pilot fit and ramp rounds."""

    warm_starts = True
    ramps = True

    def normalize_steps(self, config: Any) -> bool:
        """``config.normalize_steps`` (False: the plain average, for ablation)."""
        return bool(config.normalize_steps)

    def make_momentum(self, config: Any) -> merge.BlockMomentum:
        return merge.BlockMomentum(momentum=config.block_momentum, lr=config.block_lr)

    def local_lr_scale(self, config: Any, optimizer: Any) -> float:
        """``config.local_lr_scale`` where ``optimizer`` (one of :mod:`hmdspt.core.nn`'s)
        ``scales_local_steps``, else 1: a merge moves the model about as far as one worker's
        steps, so each step is made larger where that keeps it bounded (Adam)."""
        return float(config.local_lr_scale) if optimizer.scales_local_steps else 1.0


class BSPSync(SyncStrategy):
    """``"bsp"``: bulk-synchronous SGD. Workers return the sum of their rows' data
    gradients; the driver adds the L2 term once, divides by the rows and takes one step of
    its optimizer, so a round is a single-process step on the union batch. An epoch has one
    round per global mini-batch."""

    worker_mode = "gradient"
    # Gradients over all the round's rows cost otherwise per row than the probe's steps.
    remembers_speed = False

    def rounds_per_epoch(self, n_rows: int, batch_size: int, config: Any) -> int:
        """One round per global mini-batch: ``ceil(n_rows / batch_size)``."""
        return math.ceil(n_rows / batch_size)

    def sizes_rounds(self, config: Any) -> bool:
        """Never: a round is one global mini-batch by definition."""
        return False

    def worker_alpha(self, alpha: float) -> float:
        """0: workers return data gradients only; :meth:`combine` adds the L2 term once."""
        return 0.0

    def combine(
        self,
        model: MLP,
        payloads: Sequence[np.ndarray],
        rows: Sequence[int],
        steps: Sequence[int],
        *,
        optimizer: Any,
        momentum: merge.BlockMomentum,
        config: Any,
    ) -> None:
        total = sum(rows)
        if not total:
            return
        grad = model.grad
        grad[...] = 0
        for g in payloads:
            grad += g
        if model.alpha:  # the L2 term once for the global batch
            model.add_l2_gradient(grad)
        grad /= total
        optimizer.update(model.params, grad)


# ---------------------------------------------------------------------------------------
# partition policies
# ---------------------------------------------------------------------------------------


class PartitionPolicy:
    """How many rows each worker holds, and when rows move (the base class).

    Parameters
    ----------
    threshold : float, default=0.05
        Re-balance only when the predicted round time improves by more than this
        fraction (:class:`hmdspt.core.partition.RebalancePolicy`).
    min_rows : int, default=1
        Fewest rows a worker that holds any keeps (so its speed keeps being measured).

    Attributes
    ----------
    uses_speeds : bool
        Shares follow the workers' measured speeds: before the rows are first staged the
        trainer measures them (checkpoint, speed memory or probe), and with such shares
        every worker is busy for the whole round, so its speed may be remembered.
    rebalances : bool
        Rows move between rounds as the scores change. A worker that joins is always
        given rows (``force``).
    rebalancer : RebalancePolicy
        Holds the validated ``threshold`` and ``min_rows`` (:meth:`plan` applies them).
    """

    uses_speeds: ClassVar[bool] = True
    rebalances: ClassVar[bool] = True

    def __init__(self, threshold: float = 0.05, min_rows: int = 1) -> None:
        self.rebalancer = partition.RebalancePolicy(threshold=threshold, min_rows=min_rows)
        self.min_rows = self.rebalancer.min_rows

    def weights(self, scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
        """What the rows are apportioned by, per worker, from its score (rows per second)."""
        raise NotImplementedError

    def shares(self, n_rows: int, scores: Mapping[Hashable, float]) -> dict[Hashable, int]:
        """Rows per worker, from the workers' scores.

        With fewer than ``min_rows`` rows for each worker, only the workers with the
        highest weights that can each hold ``min_rows`` get rows
        (:func:`hmdspt.core.partition.fitting_workers`); the others are left out.

        Parameters
        ----------
        n_rows : int
            Rows to share.
        scores : mapping of worker to float
            Every worker's score, finite and > 0.

        Returns
        -------
        counts : dict
            Rows per chosen worker, summing to ``n_rows``, in the order of ``scores``.
        """
        fitting = partition.fitting_workers(n_rows, self.weights(scores), self.min_rows)
        return partition.apportion(n_rows, fitting, self.min_rows)

    def target(
        self,
        n_rows: int,
        weights: Mapping[Hashable, float],
        fixed_s: Mapping[Hashable, float] | None = None,
    ) -> dict[Hashable, int]:
        """The layout a re-balance moves to: ``n_rows`` apportioned by ``weights``."""
        return partition.apportion(n_rows, weights, self.min_rows)

    def plan(
        self,
        current: Mapping[Hashable, int],
        scores: Mapping[Hashable, float],
        n_rows: int,
        force: bool = False,
        *,
        fixed_s: Mapping[Hashable, float] | None = None,
        epochs_left: float | None = None,
        move_cost: Callable[[int], float] | None = None,
    ) -> list[partition.Move] | None:
        """Moves to carry out before the next round, or None to keep the layout.

        An epoch of worker ``i`` is predicted to take ``fixed_s[i] + rows_i / scores[i]``
        (no fixed cost without ``fixed_s``); the target is :meth:`target` (for proportional
        shares: equal finish times, proportional to ``scores`` without fixed costs), and
        the rows move when it shortens the predicted epoch by more than ``threshold``. With
        ``epochs_left`` and ``move_cost`` as well, they move only when the saving over the
        rest of the fit, ``epochs_left`` times the epoch's predicted improvement, exceeds
        ``move_cost(rows rebuilt)``, the rows of every shard the moves rebuild
        (:func:`hmdspt.core.partition.rows_rebuilt`); and a move that rebuilds shards for
        less than it saves over those epochs is left out first.

        Parameters
        ----------
        current : mapping of worker to int
            Rows each member holds now (0 for members without rows), in the order of
            ``scores``.
        scores : mapping of worker to float
            Every member's speed, rows per second.
        n_rows : int
            Rows of the data set.
        force : bool, default=False
            Plan even when this policy does not re-balance (a worker joined and must be
            given rows), and rank again which workers hold rows when there are fewer rows
            than workers; neither the threshold nor the cost of moving holds it back.
        fixed_s : mapping of worker to float, optional
            Seconds per epoch each worker spends whatever its share (per-round fixed costs
            and communication, times rounds per epoch).
        epochs_left : float, optional
            Epochs the fit has still to run (the saving is earned over them).
        move_cost : callable, optional
            Predicted seconds of a re-balance that rebuilds shards of a number of rows
            (:meth:`hmdspt.core.costs.MoveCost.seconds`).

        Returns
        -------
        moves : list of Move or None
        """
        if not (self.rebalances or force):
            return None
        weights = self.weights(scores)
        fitting = partition.fitting_workers(n_rows, weights, self.min_rows)
        holders = [w for w in current if current[w]]
        if len(fitting) < len(weights) and len(holders) == len(fitting) and not force:
            # Fewer rows than workers: the holders keep them while their ranking by
            # (noisy) scores changes; a join (force) ranks again.
            fitting = {w: weights[w] for w in holders}
        fixed = {w: float(fixed_s.get(w, 0.0)) for w in fitting} if fixed_s else None
        target = self.target(sum(current.values()), fitting, fixed)
        moves = partition.plan_moves(current, target)
        if not moves:
            return None
        joined = any(current.get(w, 0) < self.min_rows for w in fitting)
        if force or joined:  # correctness, not speed: no hysteresis
            return moves
        if epochs_left is not None and move_cost is not None:
            moves = _worth_their_shards(current, moves, scores, fixed, epochs_left, move_cost)
        now = _epoch_s(current, scores, fixed)
        after = _epoch_s(partition.apply_moves(current, moves), scores, fixed)
        saving = now - after
        if not saving > self.rebalancer.threshold * now:
            return None
        if epochs_left is not None and move_cost is not None:
            if not epochs_left * saving > move_cost(partition.rows_rebuilt(current, moves)):
                return None
        return moves


def _worth_their_shards(
    current: Mapping[Hashable, int],
    moves: list[partition.Move],
    scores: Mapping[Hashable, float],
    fixed: Mapping[Hashable, float] | None,
    epochs_left: float,
    move_cost: Callable[[int], float],
) -> list[partition.Move]:
    """``moves`` less each one that rebuilds a shard for less than it saves.

    A move rebuilds its receiver's whole shard (:func:`hmdspt.core.partition.rows_rebuilt`),
    so a few rows that balance a shard all but exactly can cost as much as the move that
    does the work: on the testbed a re-balance of the 1.6M-row job sent 15,396 rows to one
    worker and 491 to another, rebuilding that second worker's 461,645 rows for them. Moves
    are dropped one at a time, the smallest first, while dropping one loses less over the
    epochs left (its rows stay on their sender) than the rebuilding it saves. Any subset
    of a plan is a plan: no worker both sends and receives.

    Dropping a move changes only its two workers' rows, so each candidate is priced from
    the plan's totals in constant time, and the three slowest holders are kept in a heap
    (the simulator plans for thousands of workers).
    """
    kept = sorted(moves, key=lambda m: m.rows)  # the smallest first; stable
    if len(kept) < 2:
        return list(moves)
    counts = dict(partition.apply_moves(current, kept))
    touches: dict[Hashable, int] = {}
    for m in kept:
        if m.rows:
            for w in (m.source, m.destination):
                touches[w] = touches.get(w, 0) + 1
    rebuilt = sum(int(counts[w]) for w in touches)
    slowest = _Slowest({w: _worker_epoch_s(w, n, scores, fixed) for w, n in counts.items() if n})
    fixed_s = fixed or {}
    while len(kept) > 1:
        top = slowest.top(3)
        fit_s = epochs_left * (top[0][0] if top else 0.0)
        build_s = move_cost(rebuilt)
        for i in range(len(kept)):
            source, destination, rows = kept[i].source, kept[i].destination, kept[i].rows
            # The slowest holder but these two, then these two with the move undone.
            worst = 0.0
            for t, w in top:
                if w != source and w != destination:
                    worst = t
                    break
            rest_rebuilt = rebuilt
            undone = ((source, counts[source] + rows), (destination, counts[destination] - rows))
            for w, n in undone:
                if n:  # _worker_epoch_s, inlined: this loop prices every candidate
                    t = fixed_s.get(w, 0.0) + n / scores[w]
                    if t > worst:
                        worst = t
                if rows:
                    rest_rebuilt += (n if touches[w] > 1 else 0) - counts[w]
            if epochs_left * worst - fit_s < build_s - move_cost(rest_rebuilt):
                break
        else:
            break
        del kept[i]  # its rows stay put
        for w, delta in ((source, rows), (destination, -rows)):
            counts[w] += delta
            if rows:
                touches[w] -= 1
            slowest.set(w, _worker_epoch_s(w, counts[w], scores, fixed) if counts[w] else None)
        rebuilt = rest_rebuilt
    left = {id(m) for m in kept}
    return [m for m in moves if id(m) in left]


class _Slowest:
    """Each holder's predicted epoch, the slowest found in O(log n): a max-heap whose stale
    entries (a time since replaced) are skipped as they surface."""

    def __init__(self, times: Mapping[Hashable, float]) -> None:
        self.version = dict.fromkeys(times, 0)
        self.order = {w: i for i, w in enumerate(times)}  # ties: the earlier holder first
        self.heap = [(-t, self.order[w], w, 0) for w, t in times.items()]
        heapq.heapify(self.heap)

    def set(self, w: Hashable, t: float | None) -> None:
        """``w``'s new time, or None when it holds no rows."""
        self.version[w] = self.version.get(w, 0) + 1
        if t is not None:
            order = self.order.setdefault(w, len(self.order))
            heapq.heappush(self.heap, (-t, order, w, self.version[w]))

    def top(self, k: int) -> list[tuple[float, Hashable]]:
        """The ``k`` largest times with their holders, the largest first."""
        found: list[tuple[float, int, Hashable, int]] = []
        while self.heap and len(found) < k:
            entry = heapq.heappop(self.heap)
            if self.version[entry[2]] == entry[3]:
                found.append(entry)
        for entry in found:
            heapq.heappush(self.heap, entry)
        return [(-entry[0], entry[2]) for entry in found]


def _worker_epoch_s(
    w: Hashable,
    rows: int,
    speeds: Mapping[Hashable, float],
    fixed_s: Mapping[Hashable, float] | None,
) -> float:
    """Predicted seconds of an epoch of ``rows`` rows on worker ``w``."""
    extra = fixed_s.get(w, 0.0) if fixed_s else 0.0
    return extra + rows / speeds[w]


def _epoch_s(
    counts: Mapping[Hashable, int],
    speeds: Mapping[Hashable, float],
    fixed_s: Mapping[Hashable, float] | None,
) -> float:
    """Predicted seconds of an epoch on layout ``counts``: its slowest holder's."""
    worst = 0.0
    for w, n in counts.items():
        if n:
            worst = max(worst, _worker_epoch_s(w, n, speeds, fixed_s))
    return worst


class ProportionalPartition(PartitionPolicy):
    """``"proportional"``: rows by measured speed (with fixed costs: equal finish times),
    re-balanced between rounds when the predicted epoch improves by more than ``threshold``
    and the saving pays for the move (:meth:`PartitionPolicy.plan`)."""

    def weights(self, scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
        """The scores themselves."""
        return dict(scores)

    def target(
        self,
        n_rows: int,
        weights: Mapping[Hashable, float],
        fixed_s: Mapping[Hashable, float] | None = None,
    ) -> dict[Hashable, int]:
        """Shares with equal predicted finish times, fixed costs included
        (:func:`hmdspt.core.costs.balanced_shares`); proportional without them."""
        if not fixed_s:
            return super().target(n_rows, weights)
        return costs.balanced_shares(n_rows, weights, fixed_s, min_rows=self.min_rows)[0]


class EqualPartition(PartitionPolicy):
    """``"equal"``: equal shares; rows move only to give a joining worker its share."""

    uses_speeds = False
    rebalances = False

    def weights(self, scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
        """1 for every worker."""
        return dict.fromkeys(scores, 1.0)


# ---------------------------------------------------------------------------------------
# registries
# ---------------------------------------------------------------------------------------

#: Sync strategies by the name users pass (``sync=``); register a new one by adding it.
SYNC_STRATEGIES: dict[str, type[SyncStrategy]] = {
    "hmdspt": HMDSPTSync,
    "local": LocalSync,
    "bsp": BSPSync,
}
#: Partition policies by the name users pass (``partition=``).
PARTITION_POLICIES: dict[str, type[PartitionPolicy]] = {
    "proportional": ProportionalPartition,
    "equal": EqualPartition,
}


def _lookup(registry: Mapping[str, type], what: str, name: Any) -> type:
    if isinstance(name, str) and name in registry:
        return registry[name]
    choices = ", ".join(repr(k) for k in registry)
    raise ValueError(f"{what} must be one of {choices}, got {name!r}")


def get_sync(name: str) -> SyncStrategy:
    """The sync strategy registered as ``name`` (:data:`SYNC_STRATEGIES`).

    Raises
    ------
    ValueError
        ``name`` is not registered; the message names it and the choices.

    Examples
    --------
    >>> get_sync("bsp").worker_mode
    'gradient'
    """
    return _lookup(SYNC_STRATEGIES, "sync", name)()


def get_partition(name: str, threshold: float = 0.05, min_rows: int = 1) -> PartitionPolicy:
    """The partition policy registered as ``name`` (:data:`PARTITION_POLICIES`).

    Parameters
    ----------
    name : str
        A key of :data:`PARTITION_POLICIES`.
    threshold, min_rows
        See :class:`PartitionPolicy`.

    Raises
    ------
    ValueError
        ``name`` is not registered; the message names it and the choices.

    Examples
    --------
    >>> get_partition("equal").shares(10, {"a": 4.0, "b": 1.0})
    {'a': 5, 'b': 5}
    """
    return _lookup(PARTITION_POLICIES, "partition", name)(threshold=threshold, min_rows=min_rows)

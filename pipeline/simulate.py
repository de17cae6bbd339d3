"""Discrete-event simulation of HMDSPT rounds on 8 to 4,096+ workers (pure numpy, no Dask).

The simulator replaces the cluster, not the algorithm: it drives the same partition policy
object as :mod:`hmdspt.parallel.trainer` (:func:`hmdspt.core.strategies.get_partition`): the
policy's ``uses_speeds`` says whether the workers are probed first, its ``shares`` give the
first shards, and every round the simulated measurements (rows, busy and communication
seconds) go to the project's real :class:`hmdspt.core.costs.RoundCostModel` and the
policy's ``plan`` (the trainer's re-balance decision, with the same speeds, fixed costs,
epochs left and :class:`hmdspt.core.costs.MoveCost`) says whether and how to move rows.
Only the clock is simulated.

A round (times from the round's start, docs/design.md, "The round"):

1. **Broadcast** ``w_t`` (``params_bytes``). ``merge="flat"``: the driver sends it to the
   workers one after another through its own link, worker ``k`` receiving it at
   ``task_overhead/2 + latency + (k + 1) * (P / bandwidth + per_message)``.
   ``merge="tree"``: a binomial-tree broadcast, every holder forwarding once per hop, so
   worker ``k`` receives it after ``ceil(log2(k + 2))`` hops of
   ``latency + P / bandwidth + per_message``.
2. **Compute**: ``busy_i = rows_i / speed_i(t)``, with the speed drifting from round to round
   (:class:`Drift`), straggler episodes (:class:`Stragglers`) and per-round jitter, each
   worker's own (``noise``) and shared by all workers (``common_noise``).
3. **Gather and merge**. Flat: the deltas queue on the driver's link in the order they are
   ready (a FIFO server: each takes ``P / bandwidth + per_message``), then the driver merges
   all of them (``n * P / merge_Bps``). Tree: pairwise reductions over ``ceil(log2 n)``
   levels, each a transfer plus one add of ``P`` bytes, the root sent to the driver.

``wall = merged update at the driver``; per worker ``comm_i = arrival_i - busy_i`` (receive
``w_t`` plus send ``Δ_i``, as the trainer's driver-side estimate) and
``idle_i = max(wall - busy_i - comm_i, 0)``. ``merge_s`` is the time from the last worker's
end of compute to the merged update (the gather + merge that the barrier adds).

:func:`calibrate` fits the speeds, both jitters, the scheduler overhead and the merge rate
to the ``round`` events of a real run log, so that a run can be replayed and predicted
(``benchmarks/bench_simulation.py`` validates the simulator that way).

Re-balancing moves rows between rounds (worker to worker, in parallel); its time is reported
as ``rebalance_s`` and, as in the trainer's log, is not part of the round's wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hmdspt.core import partition, strategies
from hmdspt.core.costs import MoveCost, RoundCostModel
from hmdspt.core.partition import rows_rebuilt
from hmdspt.core.speed import OnlineScorer

__all__ = [
    "Calibration",
    "Drift",
    "NetworkModel",
    "SimResult",
    "Stragglers",
    "calibrate",
    "make_speeds",
    "simulate_run",
]

#: A (100, 128, 64, 10) MLP, float32: the reference shape of the scoring benchmark.
DEFAULT_PARAMS_BYTES = 4 * (100 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10)
#: One core's rows per second at that shape (docs/design.md, "Measured on this machine").
DEFAULT_ROWS_PER_S = 256 / 1.1e-3


@dataclass(frozen=True)
class NetworkModel:
    """Costs of moving parameters between the driver and the workers.

    The defaults are fitted to a 2-core machine's measured costs (docs/design.md, "Measured
    on this machine").

    Parameters
    ----------
    latency_s : float
        Fixed cost of one transfer; transfers on different links overlap.
    bandwidth_Bps : float
        Bytes per second of one link. The driver has one link: in a flat round its
        broadcast and its fan-in are serialized on it.
    task_overhead_s : float
        Scheduler round trip of one task (half before the compute, half after); overlaps
        between workers.
    per_message_s : float
        Driver CPU per message sent or received (serialization, bookkeeping); serialized.
    merge_Bps : float
        Bytes of deltas merged (weighted add) per second.
    """

    latency_s: float = 0.007
    bandwidth_Bps: float = 450e6
    task_overhead_s: float = 0.012
    per_message_s: float = 2e-4
    merge_Bps: float = 2e9

    @classmethod
    def free(cls) -> NetworkModel:
        """A network that costs nothing (the analytic limit)."""
        return cls(0.0, math.inf, 0.0, 0.0, math.inf)

    def hop_s(self, nbytes: float) -> float:
        """One transfer of ``nbytes`` bytes over one link, with the driver's handling."""
        return self.latency_s + nbytes / self.bandwidth_Bps + self.per_message_s

    def add_s(self, nbytes: float) -> float:
        """Merging ``nbytes`` bytes of deltas."""
        return nbytes / self.merge_Bps


@dataclass(frozen=True)
class Drift:
    """Slow change of every worker's speed: a mean-reverting multiplicative random walk.

    ``log m_i(t+1) = (1 - reversion) * log m_i(t) + N(0, sigma)``, speed = base * m.

    Parameters
    ----------
    sigma : float
        Standard deviation of the log step per round.
    reversion : float
        Pull back to the base speed per round, in ``[0, 1]`` (0: a pure random walk).
    """

    sigma: float = 0.02
    reversion: float = 0.1


@dataclass(frozen=True)
class Stragglers:
    """Episodes in which a worker slows down ``factor`` times for ``duration`` rounds.

    Parameters
    ----------
    prob : float
        Per round, the chance that a worker not straggling starts an episode.
    factor : float
        Slowdown of a straggler (``>= 1``).
    duration : int
        Rounds an episode lasts.
    events : sequence of (worker, start_round, n_rounds, factor)
        Deterministic episodes in addition to the random ones (rounds count from 0).
    """

    prob: float = 0.0
    factor: float = 4.0
    duration: int = 5
    events: tuple[tuple[int, int, int, float], ...] = ()


def make_speeds(
    n_workers: int,
    kind: str = "lognormal",
    *,
    sigma: float = 0.5,
    generations: Sequence[float] = (1.0, 2.0, 4.0),
    base: float = DEFAULT_ROWS_PER_S,
    seed: int = 0,
) -> np.ndarray:
    """Base speeds (rows per second) of ``n_workers`` heterogeneous workers.

    Parameters
    ----------
    n_workers : int
        Number of workers.
    kind : {"lognormal", "generations", "equal"}
        ``lognormal``: ``base * exp(N(0, sigma))``; ``generations``: equal numbers of
        workers of each hardware generation, ``base * g`` (with a 3 % spread inside a
        generation); ``equal``: all ``base``.
    sigma : float
        Log-normal spread.
    generations : sequence of float
        Relative speed of each generation.
    base : float
        Speed of a relative-1 worker.
    seed : int
        Random seed.

    Returns
    -------
    speeds : ndarray of float, shape (n_workers,)
    """
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        return base * np.exp(rng.normal(0.0, sigma, n_workers))
    if kind == "generations":
        g = np.asarray(generations, dtype=float)[np.arange(n_workers) % len(generations)]
        return base * g * np.exp(rng.normal(0.0, 0.03, n_workers))
    if kind == "equal":
        return np.full(n_workers, float(base))
    raise ValueError(f"unknown speed distribution {kind!r}")


@dataclass
class SimResult:
    """Per-round outcome of :func:`simulate_run` (arrays have one row per round).

    Attributes
    ----------
    wall_s, merge_s, ideal_s, rebalance_s, broadcast_s : ndarray (rounds,)
        Round wall time, gather + merge after the last compute, ideal time
        ``Σ rows / Σ speed``, time of the row moves decided after the round, time until
        the last worker has ``w_t``.
    rows, busy_s, comm_s, idle_s, speed : ndarray (rounds, n_workers)
        Per worker and round; ``speed`` is the true speed the worker had.
    fastest_idle_fraction : ndarray (rounds,)
        ``idle / wall`` of the round's fastest worker.
    efficiency : ndarray (rounds,)
        ``ideal_s / wall_s``.
    rows_moved : ndarray of int (rounds,)
        Rows moved by the policy after each round.
    scorer : OnlineScorer
        The plain speed estimate, as the run left it (it stands in for unmeasured workers).
    costs : RoundCostModel
        The real round cost model the policy was given, as the run left it.
    elapsed_s : float
        Host seconds the simulation took.
    """

    n_workers: int
    partition: str
    merge: str
    wall_s: np.ndarray
    merge_s: np.ndarray
    ideal_s: np.ndarray
    rebalance_s: np.ndarray
    broadcast_s: np.ndarray
    rows: np.ndarray
    busy_s: np.ndarray
    comm_s: np.ndarray
    idle_s: np.ndarray
    speed: np.ndarray
    fastest_idle_fraction: np.ndarray
    efficiency: np.ndarray
    rows_moved: np.ndarray
    scorer: Any = field(repr=False, default=None)
    costs: Any = field(repr=False, default=None)
    elapsed_s: float = 0.0

    def idle_fraction(self) -> np.ndarray:
        """Run idle fraction per worker: ``Σ idle_i / Σ wall``."""
        return self.idle_s.sum(axis=0) / self.wall_s.sum()

    def summary(self) -> dict[str, float]:
        """Run-level figures (docs/design.md, "Definitions").

        ``fastest_idle_fraction`` is that of the worker with the highest mean true speed;
        ``efficiency`` is ``Σ ideal / Σ wall``; ``merge_share`` is ``Σ merge / Σ wall``.
        """
        fastest = int(np.argmax(self.speed.mean(axis=0)))
        wall = float(self.wall_s.sum())
        return {
            "n_workers": float(self.n_workers),
            "rounds": float(len(self.wall_s)),
            "mean_wall_s": float(self.wall_s.mean()),
            "mean_merge_s": float(self.merge_s.mean()),
            "mean_broadcast_s": float(self.broadcast_s.mean()),
            "merge_share": float(self.merge_s.sum() / wall),
            "fastest_idle_fraction": float(self.idle_s[:, fastest].sum() / wall),
            "efficiency": float(self.ideal_s.sum() / wall),
            "rows_moved": float(self.rows_moved.sum()),
            "elapsed_s": self.elapsed_s,
        }


# ---------------------------------------------------------------------------------------
# one round's clock
# ---------------------------------------------------------------------------------------


def _broadcast_times(n: int, p_bytes: float, net: NetworkModel, merge: str) -> np.ndarray:
    """When each worker has ``w_t`` and its task (seconds from the round's start)."""
    k = np.arange(n, dtype=float)
    head = net.task_overhead_s / 2
    if merge == "flat":
        per = p_bytes / net.bandwidth_Bps + net.per_message_s
        return head + net.latency_s + (k + 1) * per
    depth = np.ceil(np.log2(k + 2))
    return head + depth * net.hop_s(p_bytes)


def _gather(
    ready: np.ndarray, p_bytes: float, net: NetworkModel, merge: str
) -> tuple[np.ndarray, float]:
    """Per-worker end of its send, and the time the merged update is at the driver."""
    n = len(ready)
    tail = net.task_overhead_s / 2
    if merge == "flat":
        # FIFO on the driver's link: a_k = max(a_{k-1}, x_k) + c, in order of readiness;
        # closed form a_k = (k + 1) c + cummax_j<=k (x_j - j c).
        c = p_bytes / net.bandwidth_Bps + net.per_message_s
        order = np.argsort(ready, kind="stable")
        x = ready[order] + net.latency_s + tail
        j = np.arange(n, dtype=float)
        if c == 0.0:
            a_sorted = np.maximum.accumulate(x)
        else:
            a_sorted = (j + 1) * c + np.maximum.accumulate(x - j * c)
        arrival = np.empty(n)
        arrival[order] = a_sorted
        return arrival, float(a_sorted[-1] + net.add_s(n * p_bytes))
    hop = net.hop_s(p_bytes)
    arrival = ready + hop
    level = ready.copy()
    add = net.add_s(p_bytes)
    while len(level) > 1:
        odd = len(level) % 2
        pairs = np.maximum(level[0 : len(level) - odd : 2], level[1::2]) + hop + add
        level = np.concatenate([pairs, level[-1:]]) if odd else pairs
    wall = float(level[0] + hop + tail) if n > 1 else float(arrival[0] + tail)
    return arrival, wall


def _resolve_speeds(n_workers: int, speeds: Any, seed: int) -> np.ndarray:
    if speeds is None:
        speeds = "lognormal"
    if isinstance(speeds, str):
        return make_speeds(n_workers, speeds, seed=seed)
    s = np.asarray(speeds, dtype=float)
    if s.shape != (n_workers,) or not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"speeds must be {n_workers} positive finite numbers")
    return s


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------


def simulate_run(
    n_workers: int,
    speeds: np.ndarray | Sequence[float] | str | None = None,
    partition: str = "proportional",
    merge: str = "flat",
    n_rows: int = 160_000,
    rounds: int = 10,
    params_bytes: float = DEFAULT_PARAMS_BYTES,
    network: NetworkModel | None = None,
    drift: Drift | None = None,
    stragglers: Stragglers | None = None,
    *,
    rounds_per_epoch: int = 1,
    noise: float = 0.0,
    common_noise: float = 0.0,
    probe_noise: float = 0.0,
    rebalance_threshold: float = 0.05,
    min_rows: int = 1,
    halflife: float = 4.0,
    rebalance_every: int = 1,
    bytes_per_row: float = 4 * 100,
    rows_schedule: np.ndarray | None = None,
    seed: int = 0,
) -> SimResult:
    """Simulate ``rounds`` synchronous HMDSPT rounds on ``n_workers`` simulated workers.

    Parameters
    ----------
    n_workers : int
        Number of workers.
    speeds : array of float, str or None
        Base speeds in rows per second, or a :func:`make_speeds` kind (default log-normal,
        sigma 0.5).
    partition : {"proportional", "equal"} or another key of ``strategies.PARTITION_POLICIES``
        The partition policy (:func:`hmdspt.core.strategies.get_partition`), driven as the
        trainer drives it. ``proportional``: shards from a probe, then the real scorer and
        the policy's re-balance plan every ``rebalance_every`` rounds; ``equal``: equal
        shares, never re-balanced.
    merge : {"flat", "tree"}
        Driver fan-out/fan-in, or binomial-tree broadcast and pairwise reduction.
    n_rows : int
        Rows of the data set (all shards together).
    rounds : int
        Rounds to simulate.
    params_bytes : float
        Size of ``w_t`` and of each delta.
    network : NetworkModel, optional
        Transfer costs (default: :class:`NetworkModel` defaults).
    drift : Drift, optional
        Speed drift between rounds (default none).
    stragglers : Stragglers, optional
        Straggler episodes (default none).
    rounds_per_epoch : int
        A round trains ``shard_i / rounds_per_epoch`` rows on worker ``i``.
    noise : float
        Log-normal jitter of each worker's busy time in each round, independent between
        workers (measurement noise, a worker's own neighbours).
    common_noise : float
        Log-normal jitter of a round's busy times shared by all workers (load on a shared
        host, or a shared file system, slows every worker at once). It lengthens rounds
        but, unlike ``noise``, does not unbalance them.
    probe_noise : float
        Log-normal error of the initial probe's speeds.
    rebalance_threshold, min_rows : float, int
        The policy's ``threshold`` and ``min_rows``
        (:class:`hmdspt.core.strategies.PartitionPolicy`).
    halflife : float
        Passed to :class:`hmdspt.core.costs.RoundCostModel` (windows after which a
        window's weight has halved), as the trainer's default.
    rebalance_every : int
        Ask the policy every this many rounds (its exact-fraction apportioning costs
        ~0.1 s at 4,096 workers).
    bytes_per_row : float
        Size of a moved row, for ``rebalance_s``.
    rows_schedule : ndarray (rounds, n_workers), optional
        Rows per worker per round to replay (e.g. from a real run log); overrides the
        partitioning, the scorer is still updated.
    seed : int
        Seed of every random draw: equal seeds, equal results.

    Returns
    -------
    SimResult
    """
    policy = _partition_policy(partition, rebalance_threshold, min_rows)
    if merge not in ("flat", "tree"):
        raise ValueError(f"merge must be 'flat' or 'tree', got {merge!r}")
    if n_workers < 1 or rounds < 1 or rounds_per_epoch < 1 or rebalance_every < 1:
        raise ValueError("n_workers, rounds, rounds_per_epoch, rebalance_every must be >= 1")
    if min(noise, common_noise, probe_noise) < 0:
        raise ValueError("noise, common_noise and probe_noise must be >= 0")
    t_start = time.perf_counter()
    net = network if network is not None else NetworkModel()
    rng = np.random.default_rng(seed)
    base = _resolve_speeds(n_workers, speeds, seed)
    n = n_workers
    names = list(range(n))

    # the project's real cost models and the trainer's partition policy; the plain
    # scorer only stands in for workers the cost model has not measured (equal shares)
    scorer = OnlineScorer()
    costs = RoundCostModel(halflife=halflife)
    move_cost = MoveCost()
    for i in names:
        scorer.add_worker(i)
    if policy.uses_speeds:  # the trainer probes the workers
        probe = base * np.exp(rng.normal(0.0, probe_noise, n)) if probe_noise else base
        for i in names:
            scorer.update_speed(i, float(probe[i]))
            costs.observe_probe(i, float(probe[i]), 1.0)
    counts = policy.shares(n_rows, scorer.scores())
    # The trainer measures its first staging: modelled like a re-balance of every row.
    move_cost.observe(n_rows, net.latency_s + n_rows / n * bytes_per_row / net.bandwidth_Bps)

    if rows_schedule is not None:
        rows_schedule = np.asarray(rows_schedule, dtype=float)
        if rows_schedule.shape != (rounds, n):
            raise ValueError(f"rows_schedule must have shape {(rounds, n)}")

    st = stragglers if stragglers is not None else Stragglers()
    strag_left = np.zeros(n, dtype=np.int64)
    strag_factor = np.ones(n)
    log_m = np.zeros(n)

    out = {k: np.zeros((rounds, n)) for k in ("rows", "busy_s", "comm_s", "idle_s", "speed")}
    wall_s, merge_s, ideal_s, rebalance_s, bcast_s = (np.zeros(rounds) for _ in range(5))
    fastest_idle = np.zeros(rounds)
    rows_moved = np.zeros(rounds, dtype=np.int64)

    for r in range(rounds):
        # --- speeds of this round: drift, stragglers
        if drift is not None and r > 0:
            log_m = (1.0 - drift.reversion) * log_m + rng.normal(0.0, drift.sigma, n)
        if st.prob > 0:
            start = (strag_left == 0) & (rng.random(n) < st.prob)
            strag_left[start] = st.duration
            strag_factor[start] = st.factor
        for w, r0, dur, f in st.events:
            if r == r0:
                strag_left[w] = dur
                strag_factor[w] = f
        slow = np.where(strag_left > 0, strag_factor, 1.0)
        speed = base * np.exp(log_m) / slow
        strag_left = np.maximum(strag_left - 1, 0)

        # --- the round's clock
        if rows_schedule is not None:
            rows = rows_schedule[r]
        else:
            rows = np.fromiter(counts.values(), dtype=float, count=n) / rounds_per_epoch
        jitter = np.exp(rng.normal(0.0, noise, n)) if noise else 1.0
        if common_noise:  # drawn only when asked: other seeds' streams stay as they were
            jitter = jitter * math.exp(rng.normal(0.0, common_noise))
        busy = rows / speed * jitter
        recv = _broadcast_times(n, params_bytes, net, merge)
        ready = recv + busy
        arrival, wall = _gather(ready, params_bytes, net, merge)
        comm = arrival - busy
        idle = np.maximum(wall - arrival, 0.0)
        eff_speed = np.where(busy > 0, rows / np.where(busy > 0, busy, 1.0), speed)

        out["rows"][r] = rows
        out["busy_s"][r] = busy
        out["comm_s"][r] = comm
        out["idle_s"][r] = idle
        out["speed"][r] = eff_speed
        wall_s[r] = wall
        merge_s[r] = wall - float(ready.max())
        bcast_s[r] = float(recv.max())
        ideal_s[r] = rows.sum() / eff_speed.sum()
        fastest_idle[r] = idle[int(np.argmax(eff_speed))] / wall if wall > 0 else 0.0

        # --- measure (real cost model), then re-balance (the trainer's policy)
        for i in names:
            scorer.update(i, float(rows[i]), float(busy[i]))
            costs.observe(i, float(rows[i]), float(busy[i]), float(comm[i]), wall)
        if rows_schedule is None and (r + 1) % rebalance_every == 0:
            speeds, fixed = costs.epoch_costs(names, rounds_per_epoch, scorer.scores())
            moves = policy.plan(
                counts,
                speeds,
                n_rows,
                fixed_s=fixed,
                epochs_left=(rounds - r - 1) / rounds_per_epoch,
                move_cost=move_cost.seconds,
            )
            if moves:
                rebuilt = rows_rebuilt(counts, moves)
                counts = _apply_moves(counts, moves)
                moved = sum(m.rows for m in moves)
                rows_moved[r] = moved
                per_src: dict = {}
                for m in moves:
                    per_src[m.source] = per_src.get(m.source, 0) + m.rows
                rebalance_s[r] = net.latency_s + max(per_src.values()) * bytes_per_row / (
                    net.bandwidth_Bps
                )
                move_cost.observe(rebuilt, rebalance_s[r])

    return SimResult(
        n_workers=n,
        partition=partition,
        merge=merge,
        wall_s=wall_s,
        merge_s=merge_s,
        ideal_s=ideal_s,
        rebalance_s=rebalance_s,
        broadcast_s=bcast_s,
        rows=out["rows"],
        busy_s=out["busy_s"],
        comm_s=out["comm_s"],
        idle_s=out["idle_s"],
        speed=out["speed"],
        fastest_idle_fraction=fastest_idle,
        efficiency=np.where(wall_s > 0, ideal_s / np.where(wall_s > 0, wall_s, 1.0), 1.0),
        rows_moved=rows_moved,
        scorer=scorer,
        costs=costs,
        elapsed_s=time.perf_counter() - t_start,
    )


# ---------------------------------------------------------------------------------------
# calibration from measured rounds
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Simulator inputs fitted to measured rounds (see :func:`calibrate`).

    Attributes
    ----------
    speeds : ndarray (n_workers,)
        Rows per second of each worker: the geometric mean over the rounds of
        ``rows / busy_s`` (the median of the log-normal model, which is what
        :func:`simulate_run` multiplies its jitter onto).
    noise : float
        Standard deviation of the log speed of a worker in a round, independent between
        workers (``simulate_run(noise=...)``).
    common_noise : float
        Standard deviation of the log speed shared by all workers in a round
        (``simulate_run(common_noise=...)``).
    network : NetworkModel
        ``base`` with the scheduler overhead and the merge rate fitted.
    rounds : int
        Rounds the calibration used.
    """

    speeds: np.ndarray
    noise: float
    common_noise: float
    network: NetworkModel
    rounds: int


def calibrate(
    rows: np.ndarray,
    busy_s: np.ndarray,
    comm_s: np.ndarray,
    merge_s: np.ndarray,
    params_bytes: float,
    *,
    merge: str = "flat",
    base: NetworkModel | None = None,
) -> Calibration:
    """Fit the simulator's speeds, jitter and overheads to measured rounds.

    The busy times are modelled as ``rows / speed_i * exp(c_t + e_ti)``: ``c_t`` is shared
    by all workers in round ``t`` (load of the host), ``e_ti`` is each worker's own.
    With ``r_ti = log(rows_ti / busy_ti) - log(speed_i)`` (``speed_i`` the geometric mean),
    ``c_t`` is estimated by ``mean_i r_ti``; the unbiased variance estimates are
    ``noise**2 = Σ (r_ti - c_t)**2 / ((T - 1)(n - 1))`` and
    ``common_noise**2 = max(Σ c_t**2 / (T - 1) - noise**2 / n, 0)`` (the mean of ``n``
    independent errors carries ``noise**2 / n`` of variance itself). Splitting the two
    matters: independent jitter unbalances a round (the slowest draw sets its length, the
    others idle), common jitter only lengthens it.

    The network keeps ``base``'s latency, bandwidth and per-message costs; the merge rate
    is ``n * params_bytes / mean(merge_s)`` and the scheduler overhead is what is left of
    the measured ``comm_s`` once the modelled transfers are subtracted (the mean over
    workers and rounds, at least 0).

    Parameters
    ----------
    rows, busy_s, comm_s : ndarray (rounds, n_workers)
        Per round and worker, as in the run log's ``round`` events.
    merge_s : ndarray (rounds,)
        The driver's merge time per round, as the trainer logs it (combining the deltas
        only; :attr:`SimResult.merge_s` also counts the gather before it).
    params_bytes : float
        Size of ``w_t`` and of each delta.
    merge : {"flat", "tree"}
        How the measured rounds merged.
    base : NetworkModel, optional
        Latency, bandwidth and per-message costs (default :class:`NetworkModel` defaults).

    Returns
    -------
    Calibration
    """
    rows = np.asarray(rows, dtype=float)
    busy = np.asarray(busy_s, dtype=float)
    comm = np.asarray(comm_s, dtype=float)
    merge_s = np.asarray(merge_s, dtype=float)
    if rows.ndim != 2 or rows.shape != busy.shape or rows.shape != comm.shape:
        raise ValueError("rows, busy_s and comm_s must be arrays of the same shape (rounds, n)")
    if merge_s.shape != (rows.shape[0],):
        raise ValueError("merge_s must have one entry per round")
    if not (np.all(rows > 0) and np.all(busy > 0)):
        raise ValueError("every worker must have processed rows in busy time > 0 each round")
    t, n = rows.shape
    log_speed = np.log(rows / busy)
    speeds = np.exp(log_speed.mean(axis=0))
    resid = log_speed - np.log(speeds)
    common = resid.mean(axis=1)
    own = resid - common[:, None]
    noise = float(np.sqrt((own**2).sum() / ((t - 1) * (n - 1)))) if t > 1 and n > 1 else 0.0
    if t > 1:
        var_c = float((common**2).sum() / (t - 1)) - (noise**2 / n if n > 1 else 0.0)
        common_noise = math.sqrt(max(var_c, 0.0))
    else:
        common_noise = 0.0

    net = base if base is not None else NetworkModel()
    mean_merge = float(merge_s.mean())
    merge_Bps = n * params_bytes / mean_merge if mean_merge > 0 else math.inf
    bare = NetworkModel(net.latency_s, net.bandwidth_Bps, 0.0, net.per_message_s, merge_Bps)
    modelled = []
    for r in range(t):
        ready = _broadcast_times(n, params_bytes, bare, merge) + busy[r]
        arrival, _ = _gather(ready, params_bytes, bare, merge)
        modelled.append(arrival - busy[r])
    overhead = max(float(comm.mean() - np.mean(modelled)), 0.0)
    network = NetworkModel(net.latency_s, net.bandwidth_Bps, overhead, net.per_message_s, merge_Bps)
    return Calibration(speeds, noise, common_noise, network, t)


# Thin indirections to the core (kept as module attributes so that the names resolve at call
# time, e.g. under a test's monkeypatch; ``simulate_run``'s argument hides the module name).
def _partition_policy(name: str, threshold: float, min_rows: int) -> strategies.PartitionPolicy:
    return strategies.get_partition(name, threshold=threshold, min_rows=min_rows)


def _apply_moves(counts: dict, moves: list) -> dict:
    """:func:`hmdspt.core.partition.apply_moves` (the real one)."""
    return partition.apply_moves(counts, moves)

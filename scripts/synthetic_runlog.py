"""Synthetic run logs: a TEST FIXTURE that imitates the trainer's run log.

The trainer writes real logs (the monitor's tests make one with a small real fit, see
``tests/browser/real_run.py``); synthetic ones remain for what a real fit cannot give on
demand: torn, empty and failed logs, lost and joined workers, and very long runs (the
benchmark's 64 workers x 5,000 rounds).

:class:`SyntheticRun` writes one through :class:`hmdspt.core.runlog.RunLogWriter` (so the
schema is the writer's, not a copy of it): workers with speeds in a fixed ratio
(4:2:1 by default, "emulated" as in DESIGN.md), an initial partition from noisy probe
scores, online scores, re-balances with moves, a loss that decays and a validation score
that rises. The numbers follow DESIGN.md's definitions (``idle = wall - busy - comm``) and
the figures measured there (~40 ms communication, ~1.5 s rounds). Nothing here trains.

Times are virtual: the run starts at ``start_time`` and every event is stamped with the
virtual clock, so a log of 5,000 rounds is written in seconds.

Usage::

    python scripts/synthetic_runlog.py runs/ --rounds 200 --workers 3
    python scripts/synthetic_runlog.py runs/ --rounds 200 --partition equal
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hmdspt.core.runlog import RunLogWriter, new_run_id

__all__ = ["SyntheticRun", "make_log"]


class SyntheticRun:
    """A fake run that appends realistic events to a run log, a few rounds at a time.

    Parameters
    ----------
    path : str or path-like
        The log file (appended to; parent directories are created).
    n_workers : int, default=3
        Number of workers.
    speeds : sequence of float, optional
        True compute speeds in rows per second; by default tiers of 4000, 2000 and 1000
        (the 4:2:1 of DESIGN.md), repeated for more workers.
    partition : {"proportional", "equal"}, default="proportional"
        HMDSPT's shares (proportional to the scores, re-balanced) or equal shares.
    n_samples : int, default=24000
        Training rows.
    rounds_per_epoch : int, default=4
        An epoch is split into this many rounds.
    val_every : int, default=2
        Log a validation score every this many rounds.
    emulated : bool, default=True
        Write ``emulation`` (speeds and method) into the config, as the trainer does on
        the local emulated cluster.
    seed : int, default=0
        Seed of the noise.
    run_id : str, optional
        Run id; by default derived from ``start_time``.
    start_time : float, optional
        Virtual unix time of ``run_start``; now by default.
    best_score : float, default=0.95
        Validation score the run tends to.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        n_workers: int = 3,
        speeds: Sequence[float] | None = None,
        partition: str = "proportional",
        n_samples: int = 24_000,
        rounds_per_epoch: int = 4,
        val_every: int = 2,
        emulated: bool = True,
        seed: int = 0,
        run_id: str | None = None,
        start_time: float | None = None,
        best_score: float = 0.95,
    ) -> None:
        if partition not in ("proportional", "equal"):
            raise ValueError(f"partition must be 'proportional' or 'equal', got {partition!r}")
        self.rng = np.random.default_rng(seed)
        self.n_workers = int(n_workers)
        tiers = (4000.0, 2000.0, 1000.0)
        if speeds is None:
            speeds = [tiers[i % 3] for i in range(self.n_workers)]
        self.speeds = np.asarray(speeds, dtype=float)
        if len(self.speeds) != self.n_workers:
            raise ValueError("need one speed per worker")
        self.names = [f"w{i}" for i in range(self.n_workers)]
        self.partition_kind = partition
        self.n_samples = int(n_samples)
        self.rounds_per_epoch = int(rounds_per_epoch)
        self.val_every = int(val_every)
        self.emulated = emulated
        self.best_score = float(best_score)
        self.clock = time.time() if start_time is None else float(start_time)
        self.t0 = self.clock
        self.log = RunLogWriter(path, run_id=run_id or new_run_id(self.clock))
        self.round_no = 0
        self.scores = np.zeros(self.n_workers)
        self.shards = np.zeros(self.n_workers, dtype=np.int64)
        self.alive = np.ones(self.n_workers, dtype=bool)
        self.n_params = 41 * 64 + 64 + 64 * 32 + 32 + 32 * 5 + 5

    @property
    def path(self) -> Path:
        return self.log.path

    @property
    def run_id(self) -> str:
        return self.log.run_id

    def _tick(self, seconds: float) -> float:
        self.clock += float(seconds)
        return self.clock

    def _apportion(self, weights: np.ndarray) -> np.ndarray:
        # Largest remainder, so the shares add up to n_samples exactly.
        raw = weights / weights.sum() * self.n_samples
        rows = np.floor(raw).astype(np.int64)
        rest = self.n_samples - rows.sum()
        rows[np.argsort(raw - rows)[::-1][:rest]] += 1
        return rows

    def _weights(self) -> np.ndarray:
        if self.partition_kind == "proportional":
            return self.scores * self.alive
        return self.alive.astype(float)

    def _repartition(self, target: np.ndarray, seconds: float) -> None:
        diff = target - self.shards
        give = [[i, -d] for i, d in enumerate(diff) if d < 0]
        moves = []
        for j, d in enumerate(diff):
            while d > 0 and give:
                take = min(d, give[0][1])
                moves.append((self.names[give[0][0]], self.names[j], int(take)))
                d -= take
                give[0][1] -= take
                if give[0][1] == 0:
                    give.pop(0)
        self.shards = target
        self.log.partition(
            self.round_no - 1,
            dict(zip(self.names, self.shards.tolist())),
            moves,
            int(sum(m[2] for m in moves)),
            seconds,
            timestamp=self._tick(seconds),
        )

    def start(self) -> SyntheticRun:
        """Write ``run_start``, the probe scores and the initial partition."""
        config = {
            "partition": self.partition_kind,
            "sync": "micro-difference",
            "rounds_per_epoch": self.rounds_per_epoch,
            "momentum": 0.5,
            "rebalance_threshold": 0.05,
            "synthetic": True,
        }
        if self.emulated:
            # The shape the trainer writes for a local emulated cluster.
            config["emulation"] = {
                "speeds": (self.speeds / self.speeds.min()).tolist(),
                "method": "duty cycle: sleep (k-1) x thread CPU time of each compute chunk",
            }
        workers = [
            {
                "name": n,
                "address": f"tcp://127.0.0.1:{40000 + i}",
                "nthreads": 1,
                "memory": 2**31,
            }
            for i, n in enumerate(self.names)
        ]
        self.log.run_start(
            config=config,
            workers=workers,
            dataset={"name": "synthetic-kdd", "n_samples": self.n_samples, "n_features": 41},
            model={"layers": [41, 64, 32, 5], "n_params": self.n_params},
            timestamp=self.clock,
        )
        # Probes are short, so noisier than the online scores.
        self.scores = self.speeds * self.rng.normal(1.0, 0.08, self.n_workers)
        t = self._tick(0.5)
        for name, s in zip(self.names, self.scores):
            self.log.score(-1, name, s, "probe", uncertainty=0.08 * s, timestamp=t)
        self.shards = np.zeros(self.n_workers, dtype=np.int64)
        self._repartition(self._apportion(self._weights()), 0.2)
        return self

    def rounds(self, n: int) -> SyntheticRun:
        """Append ``n`` rounds (with online scores and re-balances when they pay)."""
        for _ in range(int(n)):
            r = self.round_no
            epoch = r // self.rounds_per_epoch
            rows = np.maximum(self.shards // self.rounds_per_epoch, 0)
            # Speed drifts a little round to round (contention with neighbours).
            speed = self.speeds * self.rng.normal(1.0, 0.04, self.n_workers)
            busy = rows / speed
            comm = self.rng.uniform(0.03, 0.05, self.n_workers)
            merge = 0.004 + 0.00002 * self.n_workers
            wall = float(np.max(busy + comm) + merge)
            steps = np.ceil(rows / 256).astype(int)
            progress = (r + 1) / self.rounds_per_epoch
            loss = 0.06 + 1.5 * math.exp(-progress / 3.0) + abs(self.rng.normal(0, 0.01))
            val = None
            if (r + 1) % self.val_every == 0:
                val = self.best_score - 0.75 * math.exp(-progress / 2.5)
                val = round(val + self.rng.normal(0, 0.004), 4)
            bytes_in = self.n_params * 4
            workers = {
                name: {
                    "rows": int(rows[i]),
                    "steps": int(steps[i]),
                    "busy_s": float(busy[i]),
                    "comm_s": float(comm[i]),
                    "bytes_in": bytes_in,
                    "bytes_out": bytes_in,
                }
                for i, name in enumerate(self.names)
                if rows[i] > 0
            }
            self.log.round(r, epoch, wall, merge, loss, val, workers, timestamp=self._tick(wall))
            measured = np.where(busy > 0, rows / np.where(busy > 0, busy, 1.0), self.scores)
            self.scores = 0.7 * self.scores + 0.3 * measured
            t = self.clock
            for i, name in enumerate(self.names):
                if self.alive[i]:
                    self.log.score(r, name, self.scores[i], "online", timestamp=t)
            self.round_no += 1
            if self.partition_kind == "proportional":
                target = self._apportion(self._weights())
                # Re-balance only when it saves more than 5 % of the round (hysteresis).
                now = np.max(self.shards / self.scores)
                then = np.max(target / self.scores)
                if now - then > 0.05 * now:
                    self._repartition(target, 0.05)
        return self

    def worker_lost(self, index: int, reason: str = "heartbeat timeout") -> SyntheticRun:
        """Log that worker ``index`` left; its rows go to the others."""
        self.log.worker_lost(
            self.names[index], round=self.round_no, reason=reason, timestamp=self._tick(0.1)
        )
        self.alive[index] = False
        self._repartition(self._apportion(self._weights()), 0.3)
        return self

    def worker_joined(self, index: int) -> SyntheticRun:
        """Log that worker ``index`` came back; it gets rows at the next re-balance."""
        self.log.worker_joined(
            self.names[index],
            round=self.round_no - 1,
            address=f"tcp://127.0.0.1:{40000 + index}",
            nthreads=1,
            memory=2**31,
            timestamp=self._tick(0.1),
        )
        self.alive[index] = True
        self.scores[index] = self.speeds[index]
        self._repartition(self._apportion(self._weights()), 0.3)
        return self

    def checkpoint(self) -> SyntheticRun:
        """Log a checkpoint after the last round."""
        self.log.checkpoint(
            self.round_no - 1,
            f"checkpoints/{self.run_id}/round-{self.round_no - 1}.npz",
            timestamp=self._tick(0.05),
        )
        return self

    def end(self, status: str = "completed", reason: str | None = None) -> SyntheticRun:
        """Write ``run_end`` (with the writer's own ``summarize``) and close the log."""
        from hmdspt.core.runlog import read_events, summarize

        summary = summarize(read_events(self.path), run_id=self.run_id)
        wall = self.clock - self.t0
        self.log.run_end(status, wall, summary=summary, reason=reason, timestamp=self._tick(0.01))
        self.log.close()
        return self


def make_log(
    path: str | os.PathLike,
    n_rounds: int,
    n_workers: int = 3,
    *,
    partition: str = "proportional",
    status: str | None = "completed",
    reason: str | None = None,
    events: bool = True,
    **kwargs,
) -> SyntheticRun:
    """Write a synthetic run log of ``n_rounds`` rounds (a test fixture).

    Parameters
    ----------
    path : str or path-like
        The log file.
    n_rounds : int
        Training rounds.
    n_workers : int, default=3
        Workers.
    partition : {"proportional", "equal"}, default="proportional"
        HMDSPT's shares or the equal-shares baseline.
    status : str or None, default="completed"
        ``run_end`` status; None leaves the run open (as if still running), so more
        rounds can be appended with ``run.rounds(k)``.
    reason : str, optional
        ``run_end`` reason (e.g. for ``status="failed"``).
    events : bool, default=True
        Add a worker loss and return and a checkpoint in the middle of the run (when it
        has at least 8 rounds and 2 workers).
    **kwargs
        Passed to :class:`SyntheticRun` (``speeds``, ``seed``, ``run_id``, ...).

    Returns
    -------
    run : SyntheticRun
        Its writer is closed if ``status`` was given, open otherwise.
    """
    run = SyntheticRun(path, n_workers=n_workers, partition=partition, **kwargs).start()
    if events and n_rounds >= 8 and n_workers >= 2:
        first = n_rounds // 2
        run.rounds(first).checkpoint().worker_lost(n_workers - 1).rounds(2)
        run.worker_joined(n_workers - 1).rounds(n_rounds - first - 2)
    else:
        run.rounds(n_rounds)
    if status is not None:
        run.end(status, reason)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a synthetic run log (a test fixture).")
    p.add_argument("folder", type=Path)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--partition", choices=["proportional", "equal"], default="proportional")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    run_id = new_run_id()
    path = args.folder / f"{run_id}.jsonl"
    make_log(
        path,
        args.rounds,
        args.workers,
        partition=args.partition,
        seed=args.seed,
        run_id=run_id,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

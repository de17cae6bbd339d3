"""Rows staged in two waves: round one starts before the last row has arrived.

With ``TrainerConfig.first_wave_fraction`` below 1, staging from the driver's memory sends
each worker the first part of its rows, and the rest follows while the first rounds train
(:class:`hmdspt.parallel.shards.SecondWave`). :class:`StagingWaves` keeps that rest's
book-keeping for a fit: the rows on their way (which count in a round's share of the due
rows, ``RoundSpec.pending_rows``), the first wave's rows not yet trained, and when to join
the rest into the shards (docs/design.md, "Round loop").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hmdspt.core.rounds import landed_rows_cover
from hmdspt.parallel.rebalance import join_second_wave
from hmdspt.parallel.shards import SecondWave

__all__ = ["StagingWaves"]


class StagingWaves:
    """The second staging wave of ``trainer``'s fit, from staging until it is one shard
    with the first (it holds the wave; the trainer holds the shards)."""

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer
        self.wave: SecondWave | None = None
        # Each worker's rows of the first wave not yet trained this epoch.
        self.first_wave_due: dict[str, int] = {}
        self.staging_started = 0.0  # time.perf_counter() when the rows' staging began

    def begin(self, staging_started: float) -> int:
        """Take the second wave out of the trainer's just-staged rows; the rows on their
        way (0 when every row landed before round one)."""
        staged = self.trainer.staged
        self.wave, staged.second_wave = staged.second_wave, None
        self.staging_started = staging_started
        later = {} if self.wave is None else self.wave.counts
        self.first_wave_due = {w: n - later.get(w, 0) for w, n in staged.counts.items()}
        return int(sum(later.values()))

    def pending_rows(self, worker: str) -> int:
        """``worker``'s rows still on their way."""
        return 0 if self.wave is None else self.wave.counts.get(worker, 0)

    def travelling(self) -> bool:
        """Whether rows are still on their way; a wave that has landed is joined first."""
        if self.wave is None:
            return False
        if not self.wave.landed():
            return True
        self.join()
        return False

    def landed_and_pending(self) -> tuple[dict[str, int], dict[str, int]]:
        """Each worker's rows due this epoch that have landed, and its rows on their way."""
        pending = {} if self.wave is None else dict(self.wave.counts)
        return dict(self.first_wave_due), pending

    def settle(self, rounds_left: int) -> None:
        """Before a round: join the wave once it has landed, or now (waiting for it) when a
        worker's share of this round needs rows that have not."""
        if self.wave is None:
            return
        if not self.wave.landed() and landed_rows_cover(
            self.first_wave_due, self.wave.counts, rounds_left
        ):
            return
        self.join()

    def join(self) -> None:
        """Join the wave (:meth:`take`) and recover the workers that left before their rows
        were one shard."""
        gone = self.take()
        if gone:
            self.trainer._recover(gone)

    def take(self) -> set[str]:
        """Join the wave into the shards (waiting for it); the workers that left before
        their rows were one shard (to recover). Once every row has landed, the cost of
        moving rows is observed from all of them, over the time they took."""
        t = self.trainer
        wave, self.wave = self.wave, None
        if wave is None:
            return set()
        gone = join_second_wave(t.staged, wave)
        if wave.ended_at is not None:
            t.move_cost.observe(sum(t.staged.counts.values()), wave.ended_at - self.staging_started)
        return gone

    def count_trained(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        """While the wave travels: the first wave's rows a round trained."""
        if self.wave is not None:
            for addr, res in results.items():
                self.first_wave_due[addr] = self.first_wave_due.get(addr, 0) - res["rows"]

    def release(self) -> None:
        """Nothing of a wave still on its way stays on the workers."""
        if self.wave is not None:
            self.wave.release()
            self.wave = None

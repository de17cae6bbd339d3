"""Held-out scores of a fit's rounds, computed beside the next round where they can be.

:class:`RoundScores` scores a merged round on the caller's held-out data when it is due
(``TrainerConfig.eval_resolution``), then logs the round and calls the caller's
``on_round``; a round that does not end an epoch is scored in a background thread while
the next round trains (docs/design.md, "Round loop"). The seconds the loop waits on a score
are kept apart: they are not training time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the round loop imports this module
    from hmdspt.parallel.rounds import RoundRecord

__all__ = ["CallerError", "RoundScores"]


class CallerError(Exception):
    """What the caller's ``on_round`` raised, carried out of the loop to be raised as it is
    (not as a training error: the caller's code, the caller's exception)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class RoundScores:
    """The held-out scores of ``trainer``'s fit and the rounds' events that wait for them
    (it holds the pending score and the seconds waited; the trainer holds the rounds)."""

    def __init__(self, trainer: Any) -> None:  # a hmdspt.parallel.trainer.Trainer
        self.trainer = trainer
        self.last_scored_s = -np.inf  # training seconds at the last score
        self.waited_s = 0.0  # seconds the loop waited on evaluate, not counted as training
        # A round's score computed while the next round trains: its round event and
        # on_round wait for it.
        self._pending: tuple[Future, RoundRecord, dict[str, Any]] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.on_score: Callable[[float, float], None] | None = None
        self.on_round: Callable[[RoundRecord], None] | None = None

    def timed(self, evaluate: Callable[[], float]) -> float:
        """``evaluate()``, its seconds counted as waited."""
        start = time.perf_counter()
        try:
            return float(evaluate())
        finally:
            self.waited_s += time.perf_counter() - start

    def score_round(
        self,
        record: RoundRecord,
        fields: dict[str, Any],
        evaluate: Callable[[np.ndarray], float] | None,
        force: bool,
        overlap: bool,
    ) -> None:
        """Score the round just merged when it is due, then log it and call ``on_round``.

        Due: always when ``force`` (an epoch's end), else when the training seconds since
        the last score are at least ``eval_resolution`` of those so far. With ``overlap``
        the score is computed in a background thread on a copy of the parameters while
        the next round trains (:meth:`flush` collects it): scoring 40,000 rows on the
        driver took about as long as a round's synchronisation, with the workers idle.
        """
        t = self.trainer
        self.flush()  # one pending at most, logged in round order
        record.training_s = t.training_seconds()
        due = evaluate is not None and (
            force
            or record.training_s - self.last_scored_s
            >= t.config.eval_resolution * record.training_s
        )
        if not due:
            self._write(record, fields)
            return
        self.last_scored_s = record.training_s
        params = t.model.params.copy()
        if overlap:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="hmdspt-score")
            self._pending = (self._pool.submit(evaluate, params), record, fields)
            return
        record.val_score = self.timed(lambda: evaluate(params))
        self._write(record, fields)

    def flush(self) -> None:
        """Wait for a round's background score, then log the round and call ``on_round``."""
        if self._pending is None:
            return
        future, record, fields = self._pending
        self._pending = None
        start = time.perf_counter()
        try:
            record.val_score = float(future.result())
        finally:
            self.waited_s += time.perf_counter() - start  # only what the loop waited
        self._write(record, fields)

    def _write(self, record: RoundRecord, fields: dict[str, Any]) -> None:
        if record.val_score is not None and self.on_score is not None:
            self.on_score(record.training_s, record.val_score)
        self.trainer._log("round", val_score=record.val_score, **fields)
        if self.on_round is not None:
            try:
                self.on_round(record)
            except Exception as exc:
                raise CallerError(exc) from exc

    def close(self) -> None:
        """Log a round still being scored (a failing ``evaluate`` is dropped: the fit's own
        error is what is raised), then stop the background thread."""
        try:
            self.flush()
        except Exception:
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

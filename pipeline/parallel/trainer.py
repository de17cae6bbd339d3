"""The HMDSPT round loop on a Dask cluster: one loop, the strategies as objects.

One synchronous round (see ``docs/design.md``): every worker runs
:func:`hmdspt.parallel.worker.run_round` on its own rows, called straight from the driver
with ``w_t`` (not as a task); the driver combines what comes back; timings update the
scores; when the hysteresis rule says so, rows move worker to worker before the next round.

The loop holds no branch on a strategy's name: ``sync`` and ``partition`` name objects of
:mod:`hmdspt.core.strategies`, which the loop calls. The sync strategies differ in what a
worker returns and how the driver combines it:

================  ==========================  =========================================
``sync``          what a worker returns        how the driver combines
================  ==========================  =========================================
``"hmdspt"``      delta after local steps      step-normalised merge + block momentum,
                                               after a warm-start pilot fit and with
                                               short ramp rounds opening the first epoch
``"local"``       delta after local steps      plain row-weighted average (no momentum,
                                               no warm start)
``"bsp"``         gradient of its rows         summed into one global mini-batch
                                               gradient; one optimizer step per round
================  ==========================  =========================================

``partition="proportional"`` gives rows in proportion to measured speed and re-balances;
``"equal"`` gives equal shares and never moves rows (but to take in a worker that joined).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from distributed import Client, span

from hmdspt.core import strategies
from hmdspt.core.callers import user_stacklevel
from hmdspt.core.checkpoint import (
    Checkpoint,
    check_fingerprint,
    load_latest_checkpoint,
    save_checkpoint,
)
from hmdspt.core.config import COMPRESSION_MODES, TrainerConfig
from hmdspt.core.costs import MoveCost, RoundCostModel
from hmdspt.core.nn import MLP, divergence_message, make_optimizer, minibatch_pass
from hmdspt.core.rounds import first_wave_ramp, ramp_length, round_schedule
from hmdspt.core.runlog import RunLogWriter, new_run_id, read_events, summarize
from hmdspt.core.shard import DataError
from hmdspt.core.speed import OnlineScorer, WorkerEstimate
from hmdspt.parallel import shards
from hmdspt.parallel.checkpoints import checkpoint_to_state, fingerprint, state_to_checkpoint
from hmdspt.parallel.client import blas_limit_for_own_workers, scheduler_workers
from hmdspt.parallel.forecast import Forecast
from hmdspt.parallel.heldout import CallerError, RoundScores
from hmdspt.parallel.lifecycle import (
    InterruptWatch,
    close_run,
    deferred_interrupts,
    open_run,
)
from hmdspt.parallel.membership import Membership
from hmdspt.parallel.placement import Placement
from hmdspt.parallel.recovery import Recovery
from hmdspt.parallel.rounds import RoundRecord, RoundRunner, TrainingError
from hmdspt.parallel.sources import InMemory, WorkerRead
from hmdspt.parallel.waves import StagingWaves
from hmdspt.parallel.worker import RoundSpec, run_key

__all__ = [
    "COMPRESSION_MODES",
    "RoundRecord",
    "Trainer",
    "TrainerConfig",
    "TrainingError",
]


#: The run_end reason of a fit the user interrupted.
_INTERRUPTED = "interrupted (KeyboardInterrupt)"


def _raised_by_an_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a ``KeyboardInterrupt`` was being handled."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def _in_fit_span_with_blas_limit(fit: Callable) -> Callable:
    """Run ``fit`` in one ``distributed.span`` (the Dask dashboard groups its tasks), with
    the BLAS limit of workers that are threads of this process."""

    @functools.wraps(fit)
    def in_span(self, *args: Any, **kwargs: Any):
        with span("hmdspt-fit", self.run_id), blas_limit_for_own_workers(self.client):
            return fit(self, *args, **kwargs)

    return in_span


class Trainer:
    """Runs the round loop for one fit.

    Parameters
    ----------
    client : distributed.Client
        Client of the cluster to train on.
    model : MLP
        The global model; its flat ``params`` vector is updated in place.
    optimizer_kwargs : dict
        Keyword arguments of :func:`hmdspt.core.nn.make_optimizer` (with ``solver``).
    batch_size : int
        Mini-batch size (local batches; the global batch of ``sync="bsp"``).
    config : TrainerConfig
        The strategy and its settings.
    """

    def __init__(
        self,
        client: Client,
        model: MLP,
        optimizer_kwargs: dict,
        batch_size: int,
        config: TrainerConfig,
    ) -> None:
        config.validate()
        self.client = client
        # Kept for messages: the client forgets it once the scheduler is gone.
        self._scheduler_address = getattr(getattr(client, "scheduler", None), "address", "?")
        self.model = model
        self.optimizer_kwargs = dict(optimizer_kwargs)
        self.batch_size = int(batch_size)
        self.config = config
        self.run_id = new_run_id()
        # What else a checkpoint must match: the trainer sees encoded targets, not labels.
        self.fingerprint_extra: dict[str, Any] = {}
        self.scorer = OnlineScorer()
        # Shares and re-balancing follow the round cost model (fixed cost + rows / speed,
        # over windows longer than a CPU scheduler period); moves are paid for from
        # what moving rows was measured to cost.
        self.costs = RoundCostModel(min_window_s=config.cost_window_s)
        self.move_cost = MoveCost()
        self.sync_strategy = strategies.get_sync(config.sync)
        self.partition_policy = strategies.get_partition(
            config.partition, threshold=config.rebalance_threshold, min_rows=config.min_rows
        )
        self.momentum = self.sync_strategy.make_momentum(config)
        # bsp steps a global optimizer on the driver; the others step local ones.
        self.driver_optimizer = make_optimizer(
            n_params=model.n_params, dtype=model.dtype, **self.optimizer_kwargs
        )
        self.staged: shards.StagedData | None = None
        self._pilot_speed: float | None = None  # rows per second of the warm-start pilot
        # Set when the probe was skipped as unable to pay (Placement.measure_speeds).
        self.unprobed: dict[str, float] | None = None
        self.speeds_logged = False  # whether a score event was written (Placement.log_score)
        # The first epoch's until fit knows the rows (bsp's) or has sized an epoch (auto).
        self._rounds_per_epoch = self.sync_strategy.rounds_per_epoch(1, self.batch_size, config)
        self.log: RunLogWriter | None = None
        self._owner_recorded = False  # whether the scheduler knows this run's owner
        self.round_index = 0
        self.history: list[RoundRecord] = []
        self.rows_seen: dict[int, np.ndarray] = {}
        # With record_row_ids: (row ids, sum of their sample weights) per worker and round.
        self.weights_seen: list[tuple[np.ndarray, float]] = []
        self.active: set[str] = set()  # registered workers believed alive
        self._disturbed_epochs: set[int] = set()  # epochs in which rows were re-staged
        self._restaged_rows: Counter[int] = Counter()  # epoch -> rows re-staged during it
        self._due_rows = 0  # rows the workers have yet to process in the running epoch
        self._catching_up = False  # in an epoch's catch-up rounds (see fit)
        self.loss_curve: list[float] = []  # mean training loss of each complete epoch
        self.divergence_warning: str | None = None  # written to the run log once
        # What an epoch was predicted to cost, after the first epoch (Forecast.predict).
        self.prediction: dict[str, Any] | None = None
        self._epoch = 0
        self._epoch_complete = True  # epoch 0, "before the first": a fit starts with 1
        self._source: InMemory | WorkerRead | None = None  # re-stages a lost worker's rows
        self.n_rows = 0
        self._names: dict[str, str] = {}
        self._start = time.perf_counter()
        # perf_counter at the user's call that started the fit: its wall time counts from
        # there (set by fit).
        self._called_at = self._start
        self.resumed_from: Checkpoint | None = None  # the checkpoint this fit continued
        self._restored_scores: dict[str, dict] = {}  # worker name -> saved estimate
        self._restored_extra: tuple[dict, dict] = ({}, {})  # checkpoint_extra's, restored
        self._resumed = False  # whether a state was restored (load_state_dict)
        self._checkpoint_extra: Callable[[], dict] | None = None
        # The fit's collaborators: they act on this trainer's state and hold none.
        self.membership = Membership(client)  # open while fit runs
        self.rounds = RoundRunner(self)
        self.recovery = Recovery(self)
        self.placement = Placement(self)
        self.forecast = Forecast(self)
        # Rows still on their way after round one started (config.first_wave_fraction).
        self.waves = StagingWaves(self)
        self.scores = RoundScores(self)  # held-out scores, and the rounds' events after them

    # ------------------------------------------------------------------ set-up
    def _workers(self) -> dict[str, dict]:
        workers = scheduler_workers(self.client)
        if not workers:
            # An adaptive cluster (dask-jobqueue) may still be starting them.
            raise TrainingError(
                "the cluster has no workers: start some (cluster.scale(n)) or wait for them "
                "(client.wait_for_workers(n)) before the fit"
            )
        return workers

    @property
    def run_log_path(self) -> Path | None:
        """The run log: ``run_log`` itself when it names a ``.jsonl`` file, else
        ``<run_log>/<run_id>.jsonl`` (a folder of runs)."""
        if not self.config.run_log:
            return None
        path = Path(self.config.run_log)
        return path if path.suffix == ".jsonl" else path / f"{self.run_id}.jsonl"

    def _register(self, workers: dict[str, dict]) -> None:
        for addr in sorted(workers):
            info = workers[addr]
            self._names[addr] = str(info.get("name", addr))
            self.scorer.add_worker(addr, prior=info.get("nthreads", 1))
            # Scores are saved by worker name: addresses change when a cluster restarts.
            saved = self._restored_scores.get(self._names[addr])
            if saved is not None:
                self.scorer.estimates[addr] = WorkerEstimate(**saved)
            self.active.add(addr)

    def _initial_counts(self, n_rows: int, workers: dict[str, dict]) -> dict[str, int]:
        return self.placement.initial_counts(n_rows, workers)

    def _ramp_rounds(self, rounds_per_epoch: int) -> int:
        """How many ramp rounds open the first epoch (:func:`ramp_length`, raised by
        :func:`first_wave_ramp` while rows are on their way)."""
        cfg = self.config
        counts = {a: n for a, n in self.staged.counts.items() if n}
        speeds = self._first_round_speeds(counts)
        ramp = cfg.ramp_rounds
        if speeds:
            round_s = max(n / rounds_per_epoch / speeds[a] for a, n in counts.items())
            ramp = ramp_length(
                round_s, cfg.ramp_first_round_s, cfg.ramp_rounds, cfg.max_ramp_rounds
            )
        if not (cfg.ramp_rounds and self.waves.travelling()):
            return ramp
        # Rows still on their way: a first round the first wave covers starts at once, where
        # a longer one waits for the rest (KDD (64, 32), four rounds in epoch one and no
        # ramp, waited 0.2-0.35 s for it on the emulated cluster).
        landed, pending = self.waves.landed_and_pending()
        return first_wave_ramp(rounds_per_epoch, ramp, cfg.max_ramp_rounds, landed, pending)

    def _first_round_speeds(self, counts: dict[str, int]) -> dict[str, float]:
        """The speeds that size the first round: the measured ones, or for equal shares
        (not probed) the pilot's on the driver; none when neither is known."""
        if counts and all(self.scorer.is_measured(a) for a in counts):
            return {a: self.scorer.score(a) for a in counts}
        if counts and self._pilot_speed:
            return {a: self._pilot_speed for a in counts}
        return {}

    def _pilot_fit(self, X_pilot: np.ndarray, Y_pilot: np.ndarray) -> None:
        """Warm start: a short in-process fit on a small sample, before round one."""
        optimizer = make_optimizer(
            n_params=self.model.n_params, dtype=self.model.dtype, **self.optimizer_kwargs
        )
        rng = np.random.default_rng(self.config.seed)
        for _ in range(self.config.warm_start_epochs):
            minibatch_pass(
                self.model,
                optimizer,
                X_pilot,
                Y_pilot,
                rng.permutation(len(X_pilot)),
                self.batch_size,
            )

    def _shard_key(self, worker: str) -> str:
        """Key of rows scattered to ``worker``: named after the run, so that the workers
        free them when the run ends, even those of a scatter cut short."""
        return run_key(self.run_id, self.client.id, "shard")

    def _log(self, event: str, **fields: Any) -> None:
        self.scores.flush()  # a round scored in the background is logged first
        if self.log is not None:
            getattr(self.log, event)(**fields)

    # ------------------------------------------------------------------- fit
    @_in_fit_span_with_blas_limit
    def fit(
        self,
        X: Any,
        Y: np.ndarray,
        max_epochs: int,
        on_epoch_end: Callable[[int, float], bool] | None = None,
        dataset: dict | None = None,
        evaluate: Callable[[np.ndarray], float] | None = None,
        checkpoint_extra: Callable[[], dict] | None = None,
        on_resume: Callable[[dict, dict], None] | None = None,
        called_at: float | None = None,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_score: Callable[[float, float], None] | None = None,
    ) -> list[RoundRecord]:
        """Train for up to ``max_epochs`` epochs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Inputs (anything :func:`hmdspt.parallel.shards.stage` accepts that is in
            memory), or a :class:`hmdspt.parallel.sources.WorkerRead` (then ``Y`` is
            None): data the workers read and re-read themselves.
        Y : ndarray of shape (n_samples, n_outputs) or (n_samples, n_outputs + 1), or None
            Encoded targets, in the model's dtype; one more column carries sample
            weights (:func:`hmdspt.core.nn.weighted_targets`), which then travel with
            their rows and weight the merge.
        max_epochs : int
            Upper bound on epochs.
        on_epoch_end : callable, optional
            ``on_epoch_end(epoch, mean_loss) -> stop``: called after every epoch with
            ``self.model.params`` current; returning True ends the fit.
        dataset : dict, optional
            Description recorded in the run log.
        evaluate : callable, optional
            ``evaluate(params) -> score`` of the flat parameter vector ``params`` (a copy
            the trainer gives it) on held-out data; logged as the round's ``val_score``.
            A round that does not end an epoch is scored in a background thread while
            the next round trains, so ``evaluate`` must not touch ``self.model``; the
            round's event and ``on_round`` wait for its score. Only the time the loop
            waits on it is left out of the training seconds.
        checkpoint_extra : callable, optional
            ``checkpoint_extra() -> dict`` of the caller's own state, saved with every
            checkpoint (JSON-native values; ndarrays are saved as arrays).
        on_resume : callable, optional
            ``on_resume(extra, extra_arrays)``: called with what ``checkpoint_extra``
            returned when the checkpoint was written, once the fit resumed from it.
        called_at : float, optional
            ``time.perf_counter()`` at the user's call that started this fit (e.g. the
            estimator's ``fit``); by default when this method is called. The fit's wall
            time (``run_end.wall_s``, the utilisation in its summary) counts from there.
        on_round : callable, optional
            ``on_round(record)``: called with each round's :class:`RoundRecord` once it
            is complete (merged, scored, logged), e.g. to draw progress; an exception it
            raises ends the fit (``run_end`` failed, naming it) and is raised as it is.
        on_score : callable, optional
            ``on_score(training_s, score)``: called, in order and from this thread, with
            each held-out score (the warm start's, then the rounds') and the training
            seconds (:meth:`training_seconds`) at which the scored parameters were the
            model's.

        Returns
        -------
        history : list of RoundRecord

        Raises
        ------
        hmdspt.core.checkpoint.CheckpointError
            With ``resume=True``, when the newest good checkpoint belongs to a model of
            another shape (layer sizes, parameter count, dtype, activations, solver).
        TrainingError
            Every worker was lost, a worker failed, or the training diverged (a round's
            loss or the merged parameters are not finite). The run log's ``run_end``
            then says ``failed``, with the reason.

        Notes
        -----
        Resuming restores the global parameters in place, the driver optimizer's state
        vectors, learning rate and Adam step, the block momentum, the scores (matched by
        worker name), the round counter and the epoch, and skips the warm start. A
        checkpoint written at an epoch's end resumes with the next epoch; one written
        mid-epoch restarts that epoch from its first round with the saved parameters (the
        rows processed before the interruption are processed again: the epoch's rows are
        re-staged on a cluster that may differ, so its position cannot be resumed). The
        workers' local optimizer state (``sync="hmdspt"``/``"local"``) is not saved; it
        restarts from zero, as it does when a worker joins.
        """
        self._called_at = time.perf_counter() if called_at is None else float(called_at)
        cfg = self.config
        # Arrays on the driver, or data the workers read (hmdspt.parallel.sources).
        source = X if isinstance(X, (InMemory, WorkerRead)) else InMemory(X, Y)
        n_rows = self.n_rows = source.n_rows
        self._checkpoint_extra = checkpoint_extra
        self.scores.on_round = on_round
        self.scores.on_score = on_score
        if cfg.resume:
            # Before the log and the cluster: a mismatch is reported as itself.
            self._resume()
        start_epoch = self._start_epoch()
        if cfg.run_log:
            self.log = RunLogWriter(self.run_log_path, run_id=self.run_id)
        status, reason = "failed", None
        interrupts = InterruptWatch().install()
        try:
            workers = self._open_run(source, n_rows, dataset)
            self._stage_rows(source, n_rows, workers)
            if self._resumed:
                self._log_resume(start_epoch, on_resume)
            elif self.sync_strategy.warm_starts and cfg.warm_start_rows and cfg.warm_start_epochs:
                self._warm_start(source, n_rows, evaluate)
            self._rounds_per_epoch = self._first_rounds_per_epoch(n_rows)
            ramp_rounds = (
                self._ramp_rounds(self._rounds_per_epoch)
                if self.sync_strategy.ramps and not self._resumed
                else 0
            )
            for epoch in range(start_epoch, max_epochs + 1):
                ramp = ramp_rounds if epoch == start_epoch else 0
                if self._train_epoch(
                    epoch, start_epoch, max_epochs, ramp, evaluate, on_epoch_end, interrupts
                ):
                    break
            # A Ctrl-C swallowed after the last round's check (in a finalizer during the
            # last round or the epoch's end) still stops the fit.
            interrupts.raise_if_swallowed()
            status = "completed"
            return self.history
        except KeyboardInterrupt:
            status, reason = "stopped", _INTERRUPTED
            raise
        except CallerError as exc:
            reason = f"on_round raised {type(exc.error).__name__}: {exc.error}"
            raise exc.error from None
        except Exception as exc:
            if _raised_by_an_interrupt(exc):
                # A Ctrl-C that lands inside a lock's wait surfaces as the lock's own
                # error ("release unlocked lock"): it is still the user's interrupt.
                status, reason = "stopped", _INTERRUPTED
                raise KeyboardInterrupt from exc
            reason = f"{type(exc).__name__}: {exc}"
            if self.client.status != "running":
                # Whatever failed first (a worker's call cut off, as here it always is),
                # the cause is the client's: say only that.
                if self.client.status in ("closing", "closed"):
                    reason = f"the client was closed during the fit, in round {self.round_index}"
                else:
                    reason = (
                        f"lost the connection to the scheduler at {self._scheduler_address} "
                        f"in round {self.round_index}"
                    )
                raise TrainingError(reason) from exc
            if isinstance(exc, (TrainingError, DataError)):
                raise  # bad rows are the input's fault (a ValueError), not the cluster's
            raise TrainingError(reason) from exc
        finally:
            # A Ctrl-C during the clean-up waits for it to end (main thread only); one
            # that lands before the wait is set up, taking the watch down included,
            # starts the clean-up again. It is then raised if the fit had completed;
            # otherwise the fit's own exception goes on.
            finished = interrupted = False
            held = None
            while not finished:
                try:
                    interrupts.uninstall()
                    with deferred_interrupts() as held:
                        self._finish(status, reason)
                        finished = True
                except KeyboardInterrupt:
                    interrupted = True
            if status == "completed" and held:
                held.replay()  # what the Ctrl-C would have done: by default, raise
            elif status == "completed" and interrupted:
                raise KeyboardInterrupt

    def _open_run(
        self, source: InMemory | WorkerRead, n_rows: int, dataset: dict | None
    ) -> dict[str, dict]:
        """Record the run's owner on the scheduler, start the membership, register the
        workers and log ``run_start``; the workers, as the scheduler lists them."""
        cfg = self.config
        self._owner_recorded = open_run(self.client, self.run_id)
        self.membership.start()  # before the workers are listed: no change is missed
        workers = self._workers()
        self._register(workers)
        self._log(
            "run_start",
            config={
                **{k: v for k, v in vars(cfg).items() if k != "run_log"},
                "batch_size": self.batch_size,
                **self.optimizer_kwargs,
            },
            workers=[
                {
                    "name": self._names[a],
                    "address": a,
                    "nthreads": workers[a].get("nthreads"),
                    "memory": workers[a].get("memory_limit"),
                }
                for a in sorted(workers)
            ],
            dataset={"n_rows": n_rows, "n_features": source.n_features, **(dataset or {})},
            model={
                "layers": list(self.model.layer_sizes),
                "n_params": self.model.n_params,
                "hidden_activation": self.model.hidden_activation,
                "out_activation": self.model.out_activation,
            },
            called_at=time.time() - (time.perf_counter() - self._called_at),
        )
        return workers

    def _stage_rows(
        self, source: InMemory | WorkerRead, n_rows: int, workers: dict[str, dict]
    ) -> None:
        """Give the rows out (:meth:`_initial_counts`) and stage them; a worker lost
        meanwhile is left out, and its rows go to the survivors."""
        cfg = self.config
        counts = self._initial_counts(n_rows, workers)
        self._source = source  # kept to re-stage the rows of a lost worker
        t0 = time.perf_counter()
        self.staged = source.stage(
            self.client,
            counts,
            seed=cfg.seed,
            dtype=self.model.dtype,
            skip_lost=True,
            key_name=self._shard_key,
            first_wave=cfg.first_wave_fraction,
        )
        staging_s = time.perf_counter() - t0
        later = self.waves.begin(t0)
        if not later:  # else once every row has landed (StagingWaves.take)
            self.move_cost.observe(sum(self.staged.counts.values()), staging_s)
        extra = {"unprobed": self.unprobed} if self.unprobed else {}
        if later:
            extra["second_wave"] = later
        self._log_partition(self.round_index, [], staging_s, **extra)
        lost = {a for a, n in counts.items() if n} - set(self.staged.counts)
        if lost:
            self._recover(lost)  # raises when nobody is left

    def _log_resume(self, start_epoch: int, on_resume: Callable[[dict, dict], None] | None) -> None:
        """Log the checkpoint this fit resumed from and hand its caller's state back."""
        ckpt = self.resumed_from
        if self.log is not None and ckpt is not None:
            self.log.write(
                "resume",
                round=self.round_index,
                epoch=start_epoch,
                path=str(ckpt.path),
                from_run_id=ckpt.meta.get("run_id"),
            )
        if on_resume is not None:
            extra, extra_arrays = self._restored_extra
            on_resume(dict(extra), dict(extra_arrays))

    def _warm_start(
        self,
        source: InMemory | WorkerRead,
        n_rows: int,
        evaluate: Callable[[np.ndarray], float] | None,
    ) -> None:
        """The warm start: a pilot fit on the driver on a sample of the rows, scored like
        a round's model."""
        cfg = self.config
        sample = np.random.default_rng(cfg.seed).choice(
            n_rows, size=min(cfg.warm_start_rows, n_rows), replace=False
        )
        X_pilot, Y_pilot = source.sample(self.client, self.staged, np.sort(sample))
        t_pilot = time.perf_counter()
        self._pilot_fit(
            np.ascontiguousarray(X_pilot, dtype=self.model.dtype),
            np.ascontiguousarray(Y_pilot, dtype=self.model.dtype),
        )
        t_pilot = time.perf_counter() - t_pilot
        self._pilot_speed = len(X_pilot) * cfg.warm_start_epochs / max(t_pilot, 1e-9)
        # The warm-started model is the fit's model from now until round one ends:
        # scored like a round's, so the accuracy curve starts where training does.
        # Not counted by eval_resolution: it would skip round one's score when that
        # round is short (a ramp round), and round one is where the curve moves most.
        pilot_score = None
        if evaluate is not None:
            trained_s = self.training_seconds()
            pilot_score = self.scores.timed(lambda: evaluate(self.model.params.copy()))
            if self.scores.on_score is not None:
                self.scores.on_score(trained_s, pilot_score)
        if self.log is not None:
            self.log.warm_start(len(X_pilot), cfg.warm_start_epochs, t_pilot, pilot_score)

    def _first_rounds_per_epoch(self, n_rows: int) -> int:
        """Rounds of the first epoch, by the sync strategy, at most one a row."""
        cfg = self.config
        rounds_per_epoch = self.sync_strategy.rounds_per_epoch(n_rows, self.batch_size, cfg)
        if rounds_per_epoch > n_rows:
            # Every round after the n-th would have no row to train (and the schedule
            # of rounds_per_epoch=10**9 alone filled the driver's memory).
            if cfg.rounds_per_epoch != "auto":
                warnings.warn(
                    f"rounds_per_epoch={cfg.rounds_per_epoch} is more than the "
                    f"{n_rows} training rows; it is clipped to {n_rows}",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            rounds_per_epoch = n_rows
        return rounds_per_epoch

    def _train_epoch(
        self,
        epoch: int,
        start_epoch: int,
        max_epochs: int,
        ramp_rounds: int,
        evaluate: Callable[[np.ndarray], float] | None,
        on_epoch_end: Callable[[int, float], bool] | None,
        interrupts: InterruptWatch,
    ) -> bool:
        """One epoch: its rounds sized (and, after the first, the fit's rest predicted),
        its rounds run with the re-balances between them, the catch-up rounds of rows
        re-staged in its last round, its end checked, logged and checkpointed. Returns
        whether the fit ends with it (out of time, or ``on_epoch_end`` said stop)."""
        cfg = self.config
        self._epoch, self._epoch_complete = epoch, False
        if epoch > start_epoch and self.sync_strategy.sizes_rounds(cfg):
            self._rounds_per_epoch = self.forecast.rounds_per_epoch(
                epoch, self._rounds_per_epoch, max_epochs
            )
        if epoch == start_epoch + 1:
            self.forecast.predict(epoch, self._rounds_per_epoch, max_epochs)
        epoch_loss, epoch_rows = 0.0, 0
        out_of_time = False
        schedule = round_schedule(self._rounds_per_epoch, ramp_rounds)
        for r, rounds_left in enumerate(schedule):
            interrupts.raise_if_swallowed()
            out_of_time = self._out_of_time()
            last = r == len(schedule) - 1 or out_of_time
            record = self._round(epoch, r == 0, rounds_left, evaluate, last)
            epoch_loss += record.loss_sum
            epoch_rows += record.rows
            if out_of_time:
                break
            # Mid-epoch checkpoints; the epoch's last round is saved after
            # on_epoch_end, so the caller's epoch book-keeping is in it.
            if not last and self.round_index % cfg.checkpoint_every == 0:
                self._save_checkpoint(epoch, epoch_complete=False)
            self._maybe_rebalance(
                epochs_left=max_epochs - epoch + (len(schedule) - r - 1) / len(schedule)
            )
        if out_of_time:
            if on_epoch_end is not None:
                on_epoch_end(epoch, epoch_loss / max(epoch_rows, 1))
            self._save_checkpoint(epoch, epoch_complete=True)
            return True
        # Rows of a worker lost in the epoch's last round were re-staged after it:
        # catch-up rounds process them, so no row of the epoch is left out.
        self._catching_up = True
        while self._due_rows:
            interrupts.raise_if_swallowed()
            record = self._round(epoch, False, 1, evaluate, True)
            epoch_loss += record.loss_sum
            epoch_rows += record.rows
        self._catching_up = False
        mean_loss = self._end_epoch(epoch, epoch_loss, epoch_rows)
        stop = on_epoch_end is not None and on_epoch_end(epoch, mean_loss)
        self._save_checkpoint(epoch, epoch_complete=True)
        return bool(stop)

    def _end_epoch(self, epoch: int, loss_sum: float, rows: int) -> float:
        """Check and log a complete epoch; its mean training loss.

        Every row is processed at least once per epoch. Exactly once, unless rows of a
        lost worker were re-staged during the epoch: those it had processed in earlier
        rounds are processed again, and counted as ``duplicates``.
        """
        duplicates = rows - self.n_rows
        if duplicates < 0 or (duplicates and epoch not in self._disturbed_epochs):
            raise TrainingError(f"epoch {epoch} processed {rows} rows, expected {self.n_rows}")
        mean_loss = loss_sum / rows
        self.scores.flush()
        if self.log is not None:
            self.log.write(
                "epoch",
                epoch=epoch,
                round=self.round_index,
                rows=rows,
                duplicates=duplicates,
                restaged=self._restaged_rows[epoch],
                loss=mean_loss,
            )
        self.loss_curve.append(mean_loss)
        if self.divergence_warning is None:
            self.divergence_warning = divergence_message(self.loss_curve)
            if self.divergence_warning is not None and self.log is not None:
                self.log.write("warning", round=self.round_index, message=self.divergence_warning)
        return mean_loss

    # ------------------------------------------------------------ checkpoints
    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed into this model (with
        :attr:`fingerprint_extra`, what the caller adds: a classifier's classes)."""
        return {**fingerprint(self.model, self.optimizer_kwargs), **self.fingerprint_extra}

    def state_dict(self) -> dict[str, Any]:
        """The fit's checkpointable state, copied: what a checkpoint holds.

        The global parameters, the driver optimizer's state vectors, learning rate and
        Adam step, the block momentum's velocity, the round counter, the epoch (and
        whether it is complete), the scores by worker name, what ``checkpoint_extra``
        returns (see :meth:`fit`), the run id and the model's :meth:`fingerprint`.
        :meth:`load_state_dict` restores it into a fresh trainer, whose :meth:`fit` then
        continues as one resumed from a checkpoint file does.
        """
        extra: dict[str, Any] = {}
        extra_arrays: dict[str, np.ndarray] = {}
        if self._checkpoint_extra is not None:
            for key, value in self._checkpoint_extra().items():
                if isinstance(value, np.ndarray):
                    extra_arrays[key] = value
                else:
                    extra[key] = value
        velocity = self.momentum.velocity
        return {
            "run_id": self.run_id,
            "fingerprint": self.fingerprint(),
            "params": self.model.params.copy(),
            "optimizer": {
                "vectors": {
                    name: vector.copy()
                    for name, vector in self.driver_optimizer.state_vectors().items()
                },
                "learning_rate": float(self.driver_optimizer.learning_rate),
                "t": getattr(self.driver_optimizer, "t", None),
            },
            "momentum": {"velocity": None if velocity is None else velocity.copy()},
            "round_index": int(self.round_index),
            "epoch": int(self._epoch),
            "epoch_complete": bool(self._epoch_complete),
            "scores": {
                self._names.get(addr, str(addr)): {
                    "prior": est.prior,
                    "mean": est.mean,
                    "var": est.var,
                    "n_updates": est.n_updates,
                }
                for addr, est in self.scorer.estimates.items()
                if est.n_updates  # unmeasured ones hold NaN, which JSON cannot carry
            },
            "extra": extra,
            "extra_arrays": extra_arrays,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, before :meth:`fit`.

        The parameters are restored in place (views share the vector); the block
        momentum's ``mu`` and ``eta`` stay this fit's (they are settings); scores go to
        the workers of the same names as they register. :meth:`fit` then skips the warm
        start and starts with the epoch after a complete one, or restarts an incomplete
        one from its first round.

        Raises
        ------
        hmdspt.core.checkpoint.CheckpointError
            The state belongs to a model of another shape (:meth:`fingerprint`).
        """
        check_fingerprint(state.get("fingerprint", {}), self.fingerprint())
        self.model.params[...] = state["params"]
        vectors = state["optimizer"]["vectors"]
        for name, vector in self.driver_optimizer.state_vectors().items():
            if name in vectors:
                vector[...] = vectors[name]
        self.driver_optimizer.learning_rate = float(state["optimizer"]["learning_rate"])
        if state["optimizer"].get("t") is not None and hasattr(self.driver_optimizer, "t"):
            self.driver_optimizer.t = int(state["optimizer"]["t"])
        self.momentum.load_state_dict(
            {
                "momentum": self.momentum.momentum,
                "lr": self.momentum.lr,
                "velocity": state["momentum"].get("velocity"),
            }
        )
        self._restored_scores = dict(state.get("scores", {}))
        for addr, name in self._names.items():
            if name in self._restored_scores:
                self.scorer.estimates[addr] = WorkerEstimate(**self._restored_scores[name])
        self.round_index = int(state["round_index"])
        self._epoch = int(state["epoch"])
        self._epoch_complete = bool(state["epoch_complete"])
        self._restored_extra = (dict(state.get("extra", {})), dict(state.get("extra_arrays", {})))
        self._resumed = True

    def _start_epoch(self) -> int:
        """The epoch :meth:`fit` starts with (after the state restored, if any)."""
        if not self._resumed:
            return 1
        return max(1, self._epoch + 1 if self._epoch_complete else self._epoch)

    def _save_checkpoint(self, epoch: int, epoch_complete: bool) -> Path | None:
        """Save :meth:`state_dict` at this round boundary (no-op without ``checkpoint_dir``)."""
        self._epoch, self._epoch_complete = epoch, epoch_complete
        if not self.config.checkpoint_dir:
            return None
        self.scores.flush()  # the rounds before it are logged (and scored) before it
        arrays, meta = state_to_checkpoint(self.state_dict())
        path = save_checkpoint(self.config.checkpoint_dir, arrays, meta)
        self._log(
            "checkpoint",
            round=self.round_index,
            path=str(path),
            epoch=epoch,
            epoch_complete=epoch_complete,
        )
        return path

    def _resume(self) -> int:
        """Restore the newest good checkpoint, if any; return the epoch to start with."""
        ckpt = load_latest_checkpoint(self.config.checkpoint_dir)
        if ckpt is None:
            return 1
        # Another model's file (an in-process fit's, another shape) is refused by its
        # fingerprint before its fields are read: they may not be a cluster fit's.
        check_fingerprint(ckpt.meta.get("fingerprint", {}), self.fingerprint())
        self.load_state_dict(checkpoint_to_state(ckpt))
        self.resumed_from = ckpt
        return self._start_epoch()

    # ----------------------------------------------------------------- a round
    def _spec(self, new_epoch: bool, rounds_left: int) -> RoundSpec:
        return self.rounds.spec(new_epoch, rounds_left)

    def _round(
        self,
        epoch: int,
        new_epoch: bool,
        rounds_left: int,
        evaluate: Callable[[np.ndarray], float] | None = None,
        epoch_end: bool = False,
    ) -> RoundRecord:
        """One round (:meth:`hmdspt.parallel.rounds.RoundRunner.run`)."""
        return self.rounds.run(epoch, new_epoch, rounds_left, evaluate, epoch_end)

    def training_seconds(self) -> float:
        """Seconds since the user's call (see :meth:`fit`), less the time the loop waited on
        ``evaluate``."""
        return time.perf_counter() - self._called_at - self.scores.waited_s

    def _out_of_time(self) -> bool:
        """Whether the time budget is spent (checked before a round, which then is last)."""
        limit = self.config.max_seconds
        return limit is not None and self.training_seconds() >= limit

    # ------------------------------------------------- membership and recovery
    def _sync_membership(self, grace_s: float = 0.0) -> None:
        """Before a round: re-stage lost workers' rows, take in new ones (:class:`Recovery`)."""
        self.recovery.sync(grace_s)

    def _recover(self, lost: set[str]) -> None:
        """Drop lost workers; re-stage their rows onto the survivors (:class:`Recovery`)."""
        self.recovery.recover(lost)

    def _apply(self, results: dict[str, dict]) -> None:
        self.rounds.apply(results)

    # -------------------------------------------------------------- rebalance
    def _maybe_rebalance(self, force: bool = False, epochs_left: float | None = None) -> None:
        """Move rows when the partition policy's plan says so (:class:`Placement`); not
        while the second staging wave travels (a worker that joined gets rows after it)."""
        if self.waves.travelling():
            return
        self.placement.maybe_rebalance(force, epochs_left)

    def _log_partition(self, round_: int, moves: list, seconds: float, **extra: Any) -> None:
        self.placement.log_partition(round_, moves, seconds, **extra)

    # ------------------------------------------------------------------- end
    def _finish(self, status: str, reason: str | None) -> None:
        """End the run; never raises. ``run_end`` first, as the slower clean-up may be cut
        short, then the staged rows are released and every worker drops the run's state
        and data."""
        self.scores.close()  # the last rounds' events before run_end
        if self.log is not None:
            wall = time.perf_counter() - self._called_at
            summary = None
            if status == "completed" and not self.log.stopped:
                try:
                    summary = summarize(
                        read_events(self.log.path), run_id=self.run_id, fit_wall_s=wall
                    )
                except (OSError, ValueError):  # the log went missing or unreadable
                    pass
            self._log(
                "run_end",
                status=status,
                wall_s=wall,
                summary=summary,
                reason=reason,
            )
            self.log.close()
        self.waves.release()  # before the run ends on the workers
        if self.staged is not None:
            self.final_counts = dict(self.staged.counts)
            self.staged.release()
        # Not through a client that is not connected: its calls wait out its reconnect (30 s
        # by default) before they fail. The workers drop the run with its client
        # (RunOwnersPlugin) if the scheduler lives on; if it is gone, so is their state.
        if self.client.status == "running":
            try:
                close_run(self.client, self.run_id, self._owner_recorded)
            except Exception:  # the cluster may be gone; nothing to clean then
                pass
        self.membership.close()  # no handler of this fit stays on the client

    def _speed(self, addr: str) -> float:
        """A worker's speed as its shares follow it: the round cost model's once it has
        measured the worker, else the scorer's (0 for a worker never scored)."""
        if self._cost_measured(addr):
            return float(self.costs.speed(addr))
        return float(self.scorer.score(addr)) if addr in self.scorer.workers else 0.0

    def _fixed_s(self, addr: str) -> float:
        """The round cost model's fixed seconds per round of a worker (0 until measured)."""
        return float(self.costs.fixed_s(addr)) if self._cost_measured(addr) else 0.0

    def _cost_measured(self, addr: str) -> bool:
        return addr in self.costs.workers and self.costs.is_measured(addr)

    def report(self) -> dict[str, dict[str, float]]:
        """Per worker: rows held, busy s, idle s, idle fraction, final score and fixed
        seconds per round (the speed and the fixed cost its shares follow)."""
        totals: dict[str, dict[str, float]] = {}
        wall = sum(r.wall_s for r in self.history)
        for record in self.history:
            for name, w in record.workers.items():
                t = totals.setdefault(name, {"busy_s": 0.0, "comm_s": 0.0, "idle_s": 0.0})
                for key in t:
                    t[key] += w[key]
        counts = getattr(self, "final_counts", {})
        for addr, name in self._names.items():
            t = totals.setdefault(name, {"busy_s": 0.0, "comm_s": 0.0, "idle_s": 0.0})
            t["rows"] = int(counts.get(addr, 0))
            t["idle_fraction"] = t["idle_s"] / wall if wall else 0.0
            t["score"] = self._speed(addr)
            t["fixed_s"] = self._fixed_s(addr)
        return totals

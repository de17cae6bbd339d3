"""The round loop's settings, :class:`TrainerConfig`: one source for the trainer, the
estimator's parameters and the CLI's flags.

Pure: it imports no Dask, so the estimator and the CLI read the defaults without loading the
cluster layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

from hmdspt.core import strategies
from hmdspt.core.merge import COMPRESSION_METHODS
from hmdspt.core.paths import check_folder_writable
from hmdspt.core.rounds import EARLY_LOCAL_STEPS, MAX_LOCAL_STEPS, SYNC_BUDGET

__all__ = ["COMPRESSION_MODES", "TrainerConfig"]

COMPRESSION_MODES = COMPRESSION_METHODS  # what workers may send


@dataclass
class TrainerConfig:
    """Settings of the round loop (the estimator fills it from its parameters).

    Attributes
    ----------
    sync : {"hmdspt", "local", "bsp"} or another key of ``strategies.SYNC_STRATEGIES``
        Synchronisation strategy (:mod:`hmdspt.core.strategies`).
    partition : {"proportional", "equal"} or another key of ``strategies.PARTITION_POLICIES``
        Row shares by measured speed, or equal.
    rounds_per_epoch : int or "auto"
        Rounds an epoch is split into (``sync="bsp"``: one round per global mini-batch).
        ``"auto"``: the first epoch has ``AUTO_FIRST_EPOCH_ROUNDS``; each later one as
        many as keep a round's measured overhead within ``sync_budget`` of the round, with
        at most ``max_local_steps`` steps per round in the fit's last epoch and
        ``early_local_steps`` before it (:func:`hmdspt.core.rounds.size_rounds`).
    sync_budget : float
        ``rounds_per_epoch="auto"``: largest fraction of a round its overhead may take.
    max_local_steps : int
        ``rounds_per_epoch="auto"``: most mini-batch steps a worker takes in one round of
        the fit's last epoch.
    early_local_steps : int
        ``rounds_per_epoch="auto"``: the same in the epochs before the last
        (:func:`hmdspt.core.rounds.local_step_bound`); set to ``max_local_steps``, every
        epoch has the same bound.
    block_momentum : float
        Block momentum ``mu`` of the merged delta (``sync="hmdspt"`` only).
    block_lr : float
        Step ``eta`` applied to the momentum (``sync="hmdspt"`` only). Above 1 a fit can
        diverge: 1.5 did in two of three fits of the embedded default (docs/design.md,
        "Block momentum").
    local_lr_scale : float
        ``sync="hmdspt"``: the workers' local steps use the model's learning rate times
        this, with ``solver="adam"`` (whose steps are bounded by the rate); SGD keeps the
        model's rate (at rate 0.3 a 1.5x step diverged). A merge averages the workers'
        deltas, so it moves the model about as far as one worker's steps; the larger local
        step makes up part of the rest (docs/design.md, "Block momentum").
    normalize_steps : bool
        ``sync="hmdspt"``: normalise the merge by local step counts (FedNova); False
        uses the plain row-weighted average (for ablation).
    compression : {"none", "float16", "topk"}
        What workers send (top-k keeps ``topk`` of the entries, with error feedback).
    topk : float
        Fraction kept by top-k compression.
    warm_start_rows, warm_start_epochs : int
        Size of the pilot fit run before round one (``sync="hmdspt"``); 0 turns it off.
    first_wave_fraction : float
        Rows the driver holds: the fraction of each worker's rows staged before round
        one. The rest follow while the first rounds train, which draw from the rows that
        have landed; each worker's rows become one shard once all have landed, or before
        the first round that needs them. 1 stages every row before round one. Data the
        workers read (Dask collections, files) is staged in one wave.
    ramp_rounds : int
        ``sync="hmdspt"``, a fresh fit: the first epoch starts with at least this many
        short rounds, each twice the rows of the one before (see
        :func:`hmdspt.core.rounds.round_schedule`), unless a regular round is
        predicted shorter than ``2 * ramp_first_round_s`` (then none:
        :func:`hmdspt.core.rounds.ramp_length`), and more while the first round would
        need rows of the second staging wave still on their way
        (:func:`hmdspt.core.rounds.first_wave_ramp`); 0 turns the ramp off.
    ramp_first_round_s : float
        More ramp rounds, up to ``max_ramp_rounds``, while the first would carry more
        than this many seconds of compute (:func:`hmdspt.core.rounds.ramp_length`).
        About twice a round's synchronisation: in shorter rounds synchronisation and
        per-round jitter decide the idle time (docs/design.md, "Round loop"). The round's length is
        predicted from the measured speeds (probe or memory); equal shares, which are not
        probed, use the warm-start pilot's speed on the driver; without either, the ramp
        has ``ramp_rounds`` rounds.
    max_ramp_rounds : int
        Most ramp rounds (each costs one synchronisation).
    probe_seconds : float or None
        None: an adaptive probe that stops when each worker's speed is known to 5 %
        (capped by the data set's size, see :func:`hmdspt.parallel.scoring.score_workers`),
        skipped by a re-balancing policy when an epoch is shorter than the probe
        (:func:`hmdspt.core.speed.probe_pays`); a number: a fixed probe of that many
        seconds, always run.
    reuse_speeds_s : float
        ``partition="proportional"``: when every worker remembers its speed from a fit
        of the same model shape whose last round ended at most this many seconds ago
        (:func:`hmdspt.parallel.worker.remembered_speed`), those speeds replace the probe;
        0 never uses them.
    cost_window_s : float
        Busy seconds over which the round cost model measures a worker before it fits a
        point (rounds are added up until then): three periods of the Linux CFS default,
        so that a quota-throttled worker is not measured in one burst. 0 fits every round.
    rebalance_threshold : float
        Re-balance only when the predicted epoch time improves by more than this
        fraction, in ``[0, 1)`` (hysteresis), and, in a fit, only when the saving over
        the epochs left exceeds the predicted cost of the re-balance, from the shards it
        rebuilds (docs/design.md, "Re-balancing that pays").
    min_rows : int
        Fewest rows any worker keeps (so its speed keeps being measured).
    quiet_workers : bool
        While the fit runs, each worker's statistical profiler is paused and its event
        loop's tick measured every second instead of every 20 ms; the last of a worker's
        fits to end (or its driver disappearing) gives both back as they were
        (:data:`hmdspt.parallel.worker.QUIET_CALLBACKS`). Without this, fits of the
        embedded default on the testbed took about a tenth longer (docs/design.md,
        "Quiet workers"); False keeps the dashboard's profile of the fit.
    seed : int
        Seeds staging, row orders and the pilot.
    max_seconds : float or None
        Stop after the round during which the fit passed this many seconds of training
        (:meth:`hmdspt.parallel.trainer.Trainer.training_seconds`, from the user's call:
        the time ``evaluate`` took is not counted; the last epoch is then partial: its
        rows were not all processed).
    eval_resolution : float
        Relative resolution in time of the evaluations: after a round, ``evaluate`` runs
        when the training seconds since its last run are at least this fraction of the
        training seconds so far (the last round of an epoch is always evaluated). The
        curve is dense where it moves fast, at the start, and bsp's many short rounds are
        not evaluated one by one: about ``ln(T / t_round) / eval_resolution``
        evaluations over a fit of ``T`` seconds.
    broadcast_timeout_s : float
        Longest wait for a worker to take a round (and the ``w_t`` sent with it). A
        worker that refuses it because it is not running (paused for memory, or retiring
        without leaving) is asked again about once a second and fails the fit after this
        long; workers that leave meanwhile are recovered as soon as they are seen gone.
    stall_warning_s : float
        Seconds a round waits on workers that took it but have not answered before a
        warning (and a ``warning`` event in the run log) names them, once a round: a
        worker busy with another task (a Dask worker runs one task a thread) holds the
        round, and the fit, until it is free, without a word otherwise.
    record_row_ids : bool
        Workers return the ids of the rows they processed;
        ``hmdspt.parallel.trainer.Trainer.rows_seen`` then counts, per epoch, how often
        each row was processed, and ``weights_seen`` lists each worker's row ids and
        the sum of their sample weights it reported, round by round (for audits and
        tests).
    run_log : str or None
        The JSON-lines run log: a ``.jsonl`` file to append to, or a folder in which
        ``<run_id>.jsonl`` is written; None writes none.
    emulation : dict or None
        Description of emulated heterogeneity, recorded in the run log.
    checkpoint_dir : str or None
        Folder of checkpoints (:mod:`hmdspt.core.checkpoint`); None writes none. A checkpoint
        holds the global parameters, the driver optimizer's state, the block momentum,
        the scores (by worker name), the round counter and the epoch; it is written after
        every ``checkpoint_every``-th round and after every epoch. The last two are kept.
    checkpoint_every : int
        Rounds between two checkpoints (epoch ends are always checkpointed).
    resume : bool
        Before round one, continue from the newest good checkpoint of ``checkpoint_dir``
        when there is one (see :meth:`hmdspt.parallel.trainer.Trainer.fit`); a fresh fit
        when there is none.
    """

    sync: str = "hmdspt"
    partition: str = "proportional"
    rounds_per_epoch: int | str = "auto"
    sync_budget: float = SYNC_BUDGET
    max_local_steps: int = MAX_LOCAL_STEPS
    early_local_steps: int = EARLY_LOCAL_STEPS
    block_momentum: float = 0.5
    block_lr: float = 1.0
    local_lr_scale: float = 1.5
    normalize_steps: bool = True
    compression: str = "none"
    topk: float = 0.1
    warm_start_rows: int = 2000
    warm_start_epochs: int = 2
    first_wave_fraction: float = 0.125
    ramp_rounds: int = 3
    ramp_first_round_s: float = 0.1
    max_ramp_rounds: int = 5
    probe_seconds: float | None = None
    reuse_speeds_s: float = 600.0
    cost_window_s: float = 0.3
    rebalance_threshold: float = 0.05
    min_rows: int = 1
    quiet_workers: bool = True
    seed: int = 0
    run_log: str | None = None
    emulation: dict | None = None
    record_row_ids: bool = False
    broadcast_timeout_s: float = 20.0
    stall_warning_s: float = 30.0
    eval_resolution: float = 0.05
    max_seconds: float | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    resume: bool = False

    def validate(self) -> None:
        strategies.get_sync(self.sync)  # each raises naming the bad value and the choices
        strategies.get_partition(self.partition)
        if self.compression not in COMPRESSION_MODES:
            raise ValueError(
                f"compression must be one of {COMPRESSION_MODES}, got {self.compression!r}"
            )
        rpe = self.rounds_per_epoch
        whole = isinstance(rpe, Integral) and not isinstance(rpe, bool)
        if rpe != "auto" and not (whole and rpe >= 1):
            raise ValueError(f"rounds_per_epoch must be 'auto' or an integer >= 1, got {rpe!r}")
        if not 0 < self.sync_budget < 1:
            raise ValueError(f"sync_budget must be in (0, 1), got {self.sync_budget}")
        if self.max_local_steps < 1:
            raise ValueError(f"max_local_steps must be >= 1, got {self.max_local_steps}")
        if not 0 < self.first_wave_fraction <= 1:
            raise ValueError(
                f"first_wave_fraction must be in (0, 1], got {self.first_wave_fraction}"
            )
        if self.early_local_steps < 1:
            raise ValueError(f"early_local_steps must be >= 1, got {self.early_local_steps}")
        if not 0 <= self.block_momentum < 1:
            raise ValueError(f"block_momentum must be in [0, 1), got {self.block_momentum}")
        if self.ramp_rounds < 0:
            raise ValueError(f"ramp_rounds must be >= 0, got {self.ramp_rounds}")
        if self.max_ramp_rounds < self.ramp_rounds:
            raise ValueError(
                f"max_ramp_rounds must be >= ramp_rounds, got {self.max_ramp_rounds} < "
                f"{self.ramp_rounds}"
            )
        if not self.local_lr_scale > 0:
            raise ValueError(f"local_lr_scale must be > 0, got {self.local_lr_scale}")
        if not self.stall_warning_s > 0:
            raise ValueError(f"stall_warning_s must be > 0, got {self.stall_warning_s}")
        if not self.ramp_first_round_s > 0:
            raise ValueError(f"ramp_first_round_s must be > 0, got {self.ramp_first_round_s}")
        if not self.reuse_speeds_s >= 0:
            raise ValueError(f"reuse_speeds_s must be >= 0, got {self.reuse_speeds_s}")
        if not (math.isfinite(self.cost_window_s) and self.cost_window_s >= 0):
            raise ValueError(
                f"cost_window_s must be a finite number >= 0, got {self.cost_window_s}"
            )
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if not self.eval_resolution >= 0:
            raise ValueError(f"eval_resolution must be >= 0, got {self.eval_resolution}")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume=True needs a checkpoint_dir to resume from")
        if self.checkpoint_dir:  # before any work, not at the first save
            check_folder_writable(self.checkpoint_dir, "checkpoint_dir")

"""Faults of a fit that used to end it or lose rows silently (issue 14, second pass).

Each test is named after the defect it covers: a worker lost while the rows are first
staged (defect 2), a worker lost in an epoch's last round (3), a diverging fit (11) and
fewer rows than workers (13c). Kills need worker processes; the rest runs on in-process
clusters.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import threading
import time
import warnings

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits, make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.nn import MLP, divergence_message
from hmdspt.core.partition import fitting_workers
from hmdspt.core.runlog import read_events
from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.cluster import local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig, TrainingError
from hmdspt.parallel.worker import set_slowdown
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(8)


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = make_classification(
        n_samples=n, n_features=20, n_informative=12, n_classes=3, random_state=seed
    )
    return X.astype(np.float32), y, np.eye(3, dtype=np.float32)[y]


def _config(log, **config) -> TrainerConfig:
    return TrainerConfig(run_log=str(log), probe_seconds=0.3, record_row_ids=True, **config)


def _model(n_features: int = 20, n_outputs: int = 3) -> MLP:
    model = MLP((n_features, 32, n_outputs))
    model.initialize(np.random.RandomState(0))
    return model


_ADAM = dict(solver="adam", learning_rate_init=0.003)


def _kill(cluster, address: str) -> None:
    """SIGKILL the worker process at ``address`` (its nanny starts a fresh one, which
    joins under a new address, as after a crash)."""
    (nanny,) = [n for n in cluster.workers.values() if n.worker_address == address]
    os.kill(nanny.process.process.pid, signal.SIGKILL)


def _when(condition, action, timeout: float = 120.0, poll_s: float = 0.001) -> threading.Thread:
    """Run ``action()`` in a thread as soon as ``condition()`` holds."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                action()
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _last_worker(client) -> tuple[str, str]:
    """The address and name of the worker whose address sorts last."""
    workers = scheduler_workers(client)
    address = sorted(workers)[-1]
    return address, workers[address]["name"]


def _staging() -> bool:
    """The in-memory staging's sender thread exists: the first shard's scatter started it,
    and the last shard's scatter has not begun."""
    return any(t.name.startswith("hmdspt-stage") for t in threading.enumerate())


def _probing(client) -> bool:
    """A worker is running its speed probe."""
    return any("probe_task" in str(k) for keys in client.processing().values() for k in keys)


def _fit_killing_the_last_worker(
    moment, X, Y, config: TrainerConfig, max_epochs: int, poll_s: float = 0.001
) -> tuple[Trainer, str]:
    """A fit on three process workers whose last (:func:`_last_worker`) is SIGKILLed as
    soon as ``moment(client)`` holds; the trainer and the victim's name."""
    with local_cluster(speeds=(1, 1, 1)) as cluster, Client(cluster) as client:
        victim, victim_name = _last_worker(client)
        killer = _when(lambda: moment(client), lambda: _kill(cluster, victim), poll_s=poll_s)
        trainer = Trainer(client, _model(), _ADAM, 256, config)
        trainer.fit(X, Y, max_epochs=max_epochs)
        killer.join()
    return trainer, victim_name


@pytest.mark.timeout(300)
def test_a_worker_lost_while_the_rows_are_first_staged_is_survived(tmp_path):
    # Large enough that staging three shards takes tens of milliseconds.
    X, _, Y = _data(200_000)
    log = tmp_path / "staging-kill.jsonl"
    # Shards are sent in address order: the last one's scatter starts last.
    config = _config(log, rounds_per_epoch=2)
    trainer, victim_name = _fit_killing_the_last_worker(lambda client: _staging(), X, Y, config, 2)
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [(e["worker"], e["round"]) for e in lost] == [(victim_name, 0)]
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"
    assert sorted(trainer.rows_seen) == [1, 2]
    for epoch, seen in trainer.rows_seen.items():
        assert (seen == 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
    assert sum(trainer.final_counts.values()) == len(X)


@pytest.mark.timeout(300)
def test_a_worker_lost_during_the_speed_probe_is_survived(tmp_path):
    # It was waited on for the probe's timeout (70 s), and then the fit failed.
    X, _, Y = _data(20_000)
    log = tmp_path / "probe-kill.jsonl"
    config = TrainerConfig(run_log=str(log), probe_seconds=1.0, record_row_ids=True)
    trainer, victim_name = _fit_killing_the_last_worker(_probing, X, Y, config, 1, poll_s=0.005)
    events = read_events(log)
    names = [w["name"] for w in events[0]["workers"]]
    before = events[: next(i for i, e in enumerate(events) if e["event"] == "partition")]
    probed = [e["worker"] for e in before if e["event"] == "score"]
    assert sorted(probed) == sorted(n for n in names if n != victim_name)  # the two that stayed
    lost = [(e["worker"], e["round"]) for e in events if e["event"] == "worker_lost"]
    assert lost == [(victim_name, 0)]
    assert events[-1]["status"] == "completed"
    assert (trainer.rows_seen[1] == 1).all()


class _ActsAsTheRoundStarts(Trainer):
    """A trainer that calls :meth:`act` on one staged worker (the first by address) in round
    ``act_in_round``, as the round's calls (with ``w_t``) are about to go out."""

    def __init__(self, *args, cluster, act_in_round: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster, self.act_in_round, self.victim = cluster, act_in_round, None

    def act(self, address: str) -> None:
        raise NotImplementedError

    def _spec(self, new_epoch: bool, rounds_left: int):
        spec = super()._spec(new_epoch, rounds_left)
        if self.round_index == self.act_in_round and self.victim is None:
            self.victim = sorted(self.staged.futures)[0]
            self.act(self.victim)
        return spec


class _KillsAsTheRoundStarts(_ActsAsTheRoundStarts):
    """SIGKILLs the worker: it dies while its round runs, its result never comes back and
    its rows are re-staged after the round, due again in the running epoch."""

    def act(self, address: str) -> None:
        _kill(self.cluster, address)


@pytest.mark.timeout(300)
def test_a_worker_lost_in_an_epochs_last_round_loses_no_row_and_counts_duplicates(tmp_path):
    X, _, Y = _data(12000)
    log = tmp_path / "last-round-kill.jsonl"
    with local_cluster(speeds=(2, 1, 1)) as cluster, Client(cluster) as client:
        # No ramp: epoch 1 is rounds 1, 2, 3 and round 3 is its last.
        config = _config(log, rounds_per_epoch=3, ramp_rounds=0)
        trainer = _KillsAsTheRoundStarts(
            client, _model(), _ADAM, 128, config, cluster=cluster, act_in_round=3
        )
        trainer.fit(X, Y, max_epochs=3)
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [e["round"] for e in lost] == [3]
    assert events[-1]["status"] == "completed"
    seen = trainer.rows_seen[1]
    assert (seen >= 1).all(), f"epoch 1 left {int((seen == 0).sum())} rows unprocessed"
    epochs = {e["epoch"]: e for e in events if e["event"] == "epoch"}
    assert sorted(epochs) == [1, 2, 3]
    first = epochs[1]
    assert first["rows"] == int(seen.sum())
    assert first["duplicates"] == int(seen.sum()) - len(X) == int((seen - 1).sum()) > 0
    assert first["restaged"] > 0
    for epoch in (2, 3):
        assert (trainer.rows_seen[epoch] == 1).all()
        assert epochs[epoch]["duplicates"] == 0 and epochs[epoch]["rows"] == len(X)
    assert sum(trainer.final_counts.values()) == len(X)


class _HangsAsTheRoundStarts(_ActsAsTheRoundStarts):
    """The worker hangs in its round: its round handler never answers, and its connection
    stays open (as a stopped process's would), until the scheduler removes it a moment
    later, without closing it (as ``worker-ttl`` does with a worker that stopped
    heartbeating)."""

    def act(self, address: str) -> None:
        from hmdspt.parallel.worker import ROUND_OP

        (worker,) = [w for w in self.cluster.workers.values() if w.address == address]

        async def hang(**kwargs):
            await asyncio.Event().wait()

        worker.handlers[ROUND_OP] = hang
        scheduler = self.cluster.scheduler

        def remove() -> None:
            time.sleep(0.5)  # the calls are out by then
            self.cluster.sync(
                scheduler.remove_worker, address, stimulus_id="test-hang", close=False
            )

        threading.Thread(target=remove, daemon=True).start()


@pytest.mark.timeout(120)  # a round that waits on the hung call for good fails here
def test_a_worker_that_hangs_in_a_round_is_dropped_once_the_scheduler_removes_it(tmp_path):
    X, _, Y = _data(6000)
    log = tmp_path / "hang.jsonl"
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        config = _config(log, rounds_per_epoch=3, ramp_rounds=0)
        trainer = _HangsAsTheRoundStarts(
            client, _model(), _ADAM, 128, config, cluster=cluster, act_in_round=2
        )
        trainer.fit(X, Y, max_epochs=2)
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [e["round"] for e in lost] == [2]
    assert events[-1]["status"] == "completed"
    assert (trainer.rows_seen[1] >= 1).all()  # the hung round's rows ran again
    assert (trainer.rows_seen[2] == 1).all()
    assert sum(trainer.final_counts.values()) == len(X)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3,
            threads_per_worker=1,
            processes=False,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def test_a_diverging_fit_fails_at_its_round_and_the_run_log_says_so(client, tmp_path):
    X, y, _ = _data(3000)
    log = tmp_path / "diverged.jsonl"
    clf = BPNNClassifier(
        (32,),
        client=client,
        solver="sgd",
        learning_rate_init=1e6,
        max_iter=20,
        rounds_per_epoch=2,
        run_log=log,
        random_state=0,
    )
    with pytest.raises(TrainingError, match=r"training diverged in round \d+: the loss is"):
        clf.fit(X, y)
    end = read_events(log)[-1]
    assert end["event"] == "run_end" and end["status"] == "failed"
    assert "training diverged in round" in end["reason"]
    assert "lower learning_rate_init" in end["reason"]


def test_a_fit_whose_loss_climbs_is_warned_about_once_in_the_run_log(client, tmp_path):
    X, y, _ = _data(3000)
    log = tmp_path / "climbing.jsonl"
    warnings.simplefilter("ignore", ConvergenceWarning)
    clf = BPNNClassifier(
        (32,),
        client=client,
        learning_rate_init=1e6,  # Adam: the loss climbs to ~1e10 and stays finite
        max_iter=8,
        rounds_per_epoch=2,
        run_log=log,
        random_state=0,
    )
    clf.fit(X, y)
    events = read_events(log)
    # (A small fit on one machine is also warned about as slower than one process.)
    warned = [e for e in events if e["event"] == "warning" and "diverg" in e["message"]]
    assert len(warned) == 1, [e["loss"] for e in events if e["event"] == "round"]
    assert "lower learning_rate_init" in warned[0]["message"]
    assert warned[0]["round"] >= 1
    assert events[-1]["status"] == "completed"


def _prefixes_warned(curve: list[float]) -> list[int]:
    """Epochs (1-based) after which :func:`divergence_message` fires on the curve so far."""
    return [k for k in range(1, len(curve) + 1) if divergence_message(curve[:k]) is not None]


def test_divergence_message_fires_on_a_diverging_curve_and_on_non_finite_losses():
    X, y, _ = _data(3000)
    warnings.simplefilter("ignore", ConvergenceWarning)
    curve = BPNNClassifier(
        (32,), learning_rate_init=1e6, max_iter=6, random_state=0, client=False
    ).fit(X, y)
    assert _prefixes_warned(curve.loss_curve_), curve.loss_curve_
    message = divergence_message([2.3e9, 1.3e10, 2.4e10])
    assert message is not None and "\n" not in message
    assert "lower learning_rate_init" in message
    assert divergence_message([0.9, float("nan")]) is not None
    assert divergence_message([float("inf")]) is not None
    assert divergence_message([]) is None
    assert divergence_message([1.0, 1.1, 1.2]) is not None  # rose twice, above epoch 1
    assert divergence_message([1.0, 0.5, 0.6, 0.7]) is None  # rose twice, below epoch 1


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_divergence_message_stays_quiet_on_normal_fits(solver):
    warnings.simplefilter("ignore", ConvergenceWarning)
    digits_X, digits_y = load_digits(return_X_y=True)
    X, y, _ = _data(4000)
    # One seed per data set, a different one each (two each doubled the test's time).
    for seed, (features, labels) in enumerate(((digits_X, digits_y), (X, y))):
        # In-process, as written: the module's cluster client is active meanwhile.
        fit = BPNNClassifier((64,), solver=solver, random_state=seed, client=False)
        fit.fit(features, labels)
        assert _prefixes_warned(fit.loss_curve_) == [], fit.loss_curve_


def test_an_exception_of_the_callers_on_round_ends_the_fit_as_it_is(client, tmp_path):
    # The caller's code, the caller's exception: it was raised as a TrainingError, so
    # `except KeyError` in the caller's own code did not catch it.
    X, _, Y = _data(600)
    log = tmp_path / "callback.jsonl"
    trainer = Trainer(client, _model(), _ADAM, 128, _config(log, rounds_per_epoch=2))

    def on_round(record) -> None:
        if record.round == 2:
            raise KeyError("the caller's bug")

    with pytest.raises(KeyError, match="the caller's bug"):
        trainer.fit(X, Y, max_epochs=3, on_round=on_round)
    end = read_events(log)[-1]
    assert end["event"] == "run_end" and end["status"] == "failed"
    assert end["reason"] == 'on_round raised KeyError: "the caller\'s bug"'
    assert all(not n for n in client.run(_runs_held).values())  # the workers let it go


def _runs_held(dask_worker) -> int:
    from hmdspt.parallel.worker import WORKER_PLUGIN_NAME

    return len(dask_worker.plugins[WORKER_PLUGIN_NAME].runs)


def test_fewer_rows_than_workers_trains_on_the_fastest_workers(client, tmp_path):
    X, _, Y = _data(2)
    log = tmp_path / "two-rows.jsonl"
    trainer = Trainer(client, _model(), _ADAM, 128, _config(log, rounds_per_epoch=2))
    trainer.fit(X, Y, max_epochs=3)
    events = read_events(log)
    assert events[-1]["status"] == "completed"
    first = next(e for e in events if e["event"] == "partition")
    assert len(first["rows"]) == 3 and sorted(first["rows"].values()) == [0, 1, 1]
    for epoch, seen in trainer.rows_seen.items():
        assert (seen == 1).all(), f"epoch {epoch}: {seen}"
    assert sum(trainer.final_counts.values()) == 2


class _ScalesAfterTheMembershipCheck(Trainer):
    """A trainer that adds a worker to its (in-process) cluster in ``scale_in_round``."""

    def __init__(self, *args, cluster, scale_in_round: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster, self.scale_in_round = cluster, scale_in_round

    def _sync_membership(self, grace_s: float = 0.0) -> None:
        super()._sync_membership(grace_s)
        if self.round_index == self.scale_in_round:
            n = len(self.cluster.workers) + 1
            self.cluster.scale(n)
            self.client.wait_for_workers(n, timeout=60)


def test_fewer_rows_than_workers_still_takes_in_a_joining_worker(tmp_path):
    X, _, Y = _data(2)
    log = tmp_path / "two-rows-join.jsonl"
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        # Two rows go to the two fastest workers: the first two are slowed down (emulated)
        # so that the joining one is the fastest whatever else the machine runs. Unslowed,
        # a loaded machine's timings of one-row rounds ranked it last in 3 of 13 runs.
        for address in cluster.scheduler.workers:
            set_slowdown(client, address, 30.0)
        config = _config(log, rounds_per_epoch=2)
        trainer = _ScalesAfterTheMembershipCheck(
            client, _model(), _ADAM, 128, config, cluster=cluster, scale_in_round=3
        )
        trainer.fit(X, Y, max_epochs=6)
    events = read_events(log)
    assert events[-1]["status"] == "completed"
    assert [e["round"] for e in events if e["event"] == "worker_joined"] == [4]
    last = [e for e in events if e["event"] == "partition"][-1]
    assert len(last["rows"]) == 3 and last["rows"]["2"] == 1, last
    assert sorted(last["rows"].values()) == [0, 1, 1], last
    for epoch, seen in trainer.rows_seen.items():
        assert (seen == 1).all(), f"epoch {epoch}: {seen}"


def test_fitting_workers_keeps_the_fastest_that_can_each_get_min_rows():
    scores = {"a": 1.0, "b": 3.0, "c": 2.0}
    assert fitting_workers(10, scores, min_rows=1) == scores
    assert fitting_workers(2, scores, min_rows=1) == {"b": 3.0, "c": 2.0}
    assert fitting_workers(5, scores, min_rows=3) == {"b": 3.0}
    assert fitting_workers(0, scores, min_rows=0) == scores
    with pytest.raises(ValueError, match="too few rows"):
        fitting_workers(2, scores, min_rows=3)


def test_a_fit_whose_client_is_closed_fails_at_once_saying_so(tmp_path):
    """Its message nested the worker's cut-off call under "lost the connection to the
    scheduler" where the user had closed the client. (A scheduler that is lost: the fit's
    end no longer waits out the client's reconnect, 30 s by default, in calls to it;
    closing an in-process cluster whose scheduler was closed takes 30 s itself, so that
    is checked by a script, not here.)"""
    X, y = make_classification(n_samples=2000, n_features=6, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster:
        client = Client(cluster)

        def on_round(record):
            if record.round == 3:
                client.close()

        model = BPNNClassifier(
            (8,), max_iter=20, rounds_per_epoch=4, random_state=0, client=client,
            run_log=str(tmp_path / "run.jsonl"),
        )  # fmt: skip
        said = "the client was closed during the fit, in round 4"
        with warnings.catch_warnings(), pytest.raises(TrainingError, match=f"^{said}$"):
            warnings.simplefilter("ignore")
            model.fit(X, y, on_round=on_round)
    (end,) = [e for e in read_events(tmp_path / "run.jsonl") if e["event"] == "run_end"]
    assert end["status"] == "failed" and end["reason"] == said


def test_a_round_held_by_a_worker_busy_with_another_task_is_warned_about(tmp_path):
    """A worker runs one task a thread: a round waited behind another task of the user's
    (two minutes in an audit) with nothing said. Named once the round has waited
    ``stall_warning_s``; the round still waits, and the fit completes."""
    X, y = make_classification(n_samples=2000, n_features=6, random_state=0)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        busy = sorted(scheduler_workers(client))[0]
        held = []

        def on_round(record):
            if record.round == 2:  # the next round's call queues behind it on that worker
                held.append(client.submit(time.sleep, 1.5, workers=[busy], pure=False))

        model = BPNNClassifier(
            (8,), max_iter=2, rounds_per_epoch=4, random_state=0, client=client,
            run_log=str(tmp_path / "run.jsonl"),
            trainer_options={"stall_warning_s": 0.3, "ramp_rounds": 0},
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(X, y, on_round=on_round)
        held[0].result()
    stalled = [
        str(w.message) for w in caught if "which took it and have not answered" in str(w.message)
    ]
    assert len(stalled) == 1 and re.match(r"round \d+ has waited [\d.]+ s on worker", stalled[0])
    logged = [e for e in read_events(tmp_path / "run.jsonl") if e["event"] == "warning"]
    assert [e["message"] for e in logged if "have not answered" in e["message"]] == stalled
    assert model.n_iter_ == 2

"""The round loop on a real (emulated heterogeneous) Dask cluster."""

import os
import pickle
import signal
import threading
import time
import warnings
from functools import partial

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.nn import MLP, weighted_targets
from hmdspt.core.runlog import read_events
from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.cluster import local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig, TrainingError
from hmdspt.parallel.worker import get_slowdowns, set_slowdown
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(13)


@pytest.fixture(scope="module")
def client():
    """Emulated 2:1 speeds on worker threads of this process: these tests check the loop's
    logic, not what separate processes change (kills and losses start clusters of their own)."""
    with local_cluster(speeds=(2, 1), processes=False) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=4000, n_features=20, n_informative=10, n_classes=3, random_state=0
    )
    return X.astype(np.float32), y


def _trainer(client, n_features, n_classes, **config):
    model = MLP((n_features, 32, n_classes))
    model.initialize(np.random.RandomState(0))
    optimizer = dict(solver="adam", learning_rate_init=0.003)
    return Trainer(client, model, optimizer, 128, TrainerConfig(**config))


def test_every_row_is_processed_exactly_once_per_epoch_while_rows_move(client, data, tmp_path):
    X, y = data
    # Weighted targets: each row's sample weight must stay with it through every move.
    weights = (np.arange(len(X)) % 4).astype(np.float32)
    Y = weighted_targets(np.eye(3, dtype=np.float32)[y], weights)
    moves = []
    # Rows move only when the predicted saving pays for rebuilding the shards, so the faster
    # worker turns 8x slower after the first round: its rows must move mid-fit. Up to three
    # fits, each checked, until one has moved rows (a busy machine can blur the speeds).
    slowdowns = get_slowdowns(client)
    fast = min(slowdowns, key=slowdowns.get)

    def slow_down_once(record) -> None:
        if record.round == 1:
            set_slowdown(client, fast, 8.0 * slowdowns[fast])

    for attempt in range(3):
        log = tmp_path / f"run-{attempt}.jsonl"
        # threshold 0 and a cost model fitted every round: re-balance whenever the speeds
        # predict a gain that pays for its move, to move rows mid-epoch.
        trainer = _trainer(
            client,
            20,
            3,
            rounds_per_epoch=3,
            rebalance_threshold=0.0,
            cost_window_s=0.0,
            record_row_ids=True,
            run_log=str(log),
            probe_seconds=0.3,
        )
        try:
            trainer.fit(X, Y, max_epochs=3, on_round=slow_down_once)
        finally:
            set_slowdown(client, fast, slowdowns[fast])
        assert sorted(trainer.rows_seen) == [1, 2, 3]
        for epoch, seen in trainer.rows_seen.items():
            assert (seen == 1).all(), f"epoch {epoch}: rows seen {np.bincount(seen)} times"
        assert sum(trainer.final_counts.values()) == len(X)
        for row_ids, weight in trainer.weights_seen:  # each worker's report of each round
            assert weight == pytest.approx(float(weights[row_ids].sum()), rel=1e-6)
        partitions = [e for e in read_events(log) if e["event"] == "partition"]
        moves.append(sum(e["rows_moved"] for e in partitions[1:]))  # after the staging
        if moves[-1]:
            break
    assert moves[-1], f"the test needs at least one re-balance between rounds: {moves}"


@pytest.mark.parametrize("sync", ["hmdspt", "local", "bsp"])
def test_each_strategy_learns_in_the_same_loop(client, data, sync):
    X, y = data
    warnings.simplefilter("ignore", ConvergenceWarning)
    clf = BPNNClassifier(
        (32,),
        client=client,
        sync=sync,
        max_iter=4,
        random_state=0,
        batch_size=200,
        rounds_per_epoch=2,
        learning_rate_init=0.003,
    )
    clf.fit(X[:3000], y[:3000])
    assert clf.n_iter_ == 4 and len(clf.loss_curve_) == 4
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert clf.score(X[3000:], y[3000:]) > 0.6


def test_cluster_fit_logs_every_round_and_reports_per_worker(client, data, tmp_path):
    X, y = data
    log = tmp_path / "fit.jsonl"
    warnings.simplefilter("ignore", ConvergenceWarning)
    clf = BPNNClassifier(
        (32,),
        client=client,
        max_iter=2,
        rounds_per_epoch=2,
        early_stopping=True,
        random_state=0,
        run_log=log,
    )
    clf.fit(X, y)
    events = read_events(log)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert events[-1]["status"] == "completed"
    per_epoch = [sum(e.get("epoch") == k for e in events if e["event"] == "round") for k in (1, 2)]
    # 2 epochs of 2 rounds; the first opens with the ramp rounds the speeds call for.
    assert per_epoch[1] == 2 and 2 <= per_epoch[0] <= 2 + 5, per_epoch
    # Speeds from a probe before round one, or, for a fit too small for one to pay, from
    # its first rounds: either way the log has every worker's.
    first = next(e for e in events if e["event"] == "partition")
    scored: dict[str, dict] = {}  # each worker's first score
    for e in events:
        if e["event"] == "score":
            scored.setdefault(e["worker"], e)
    assert set(scored) == {"worker-0", "worker-1"}
    probed = {e["source"] == "probe" and e["round"] == 0 for e in scored.values()}
    assert probed == {"unprobed" not in first}, (first, scored)
    rounds = [e for e in events if e["event"] == "round"]
    for r in rounds:
        assert set(r["workers"]) == {"worker-0", "worker-1"}
        for w in r["workers"].values():
            assert w["idle_s"] >= 0 and w["busy_s"] > 0
    assert set(clf.training_report_) == {"worker-0", "worker-1"}
    for w in clf.training_report_.values():
        assert {"rows", "busy_s", "idle_s", "idle_fraction", "score"} <= set(w)
    assert sum(w["rows"] for w in clf.training_report_.values()) == int(len(X) * 0.9)
    # A model fitted on a cluster is plain arrays: it predicts locally and pickles.
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(clone.predict(X), clf.predict(X))


def test_bad_strategy_values_are_refused(client, data):
    X, y = data
    with pytest.raises(ValueError, match="'sync' parameter"):
        BPNNClassifier(client=client, sync="async").fit(X, y)
    with pytest.raises(ValueError, match="rounds_per_epoch must be 'auto' or an integer >= 1"):
        TrainerConfig(rounds_per_epoch=0).validate()


def test_more_rounds_per_epoch_than_rows_are_clipped_to_the_rows_with_a_warning(client, data):
    # A round after the n-th has no row to train; 10**9 rounds' schedule filled the memory.
    X, y = data
    X, Y = X[:40], np.eye(3, dtype=np.float32)[y[:40]]
    trainer = _trainer(
        client, X.shape[1], 3, rounds_per_epoch=100, probe_seconds=0.1, record_row_ids=True
    )
    with pytest.warns(UserWarning, match=r"^rounds_per_epoch=100 is more than the 40 training"):
        trainer.fit(X, Y, max_epochs=1)
    assert len(trainer.history) == 40
    assert (trainer.rows_seen[1] == 1).all()


def _fit_killing_a_worker(tmp_path, kill: bool, seed: int = 0):
    """Fit on a 3-worker cluster; optionally SIGKILL one worker after round 2."""
    X, y = make_classification(
        n_samples=12000, n_features=20, n_informative=12, n_classes=3, random_state=seed
    )
    Y = np.eye(3, dtype=np.float32)[y]
    log = tmp_path / f"kill-{kill}.jsonl"
    with local_cluster(speeds=(2, 1, 1)) as cluster, Client(cluster) as c:
        victim = list(cluster.workers.values())[1]

        def kill_after_round_two():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if log.exists() and sum(e["event"] == "round" for e in read_events(log)) >= 2:
                    os.kill(victim.process.process.pid, signal.SIGKILL)  # really kill it
                    return
                time.sleep(0.02)

        killer = threading.Thread(target=kill_after_round_two)
        if kill:
            killer.start()
        trainer = _trainer(
            c, 20, 3, rounds_per_epoch=3, record_row_ids=True, run_log=str(log), probe_seconds=0.3
        )
        trainer.fit(X, Y, max_epochs=8)
        if kill:
            killer.join()
        accuracy = float((trainer.model.forward(X.astype(np.float32)).argmax(1) == y).mean())
    return trainer, read_events(log), accuracy


def test_a_killed_worker_is_survived_without_losing_rows(tmp_path):
    trainer, events, accuracy = _fit_killing_a_worker(tmp_path, kill=True)
    kinds = [e["event"] for e in events]
    assert "worker_lost" in kinds and events[-1]["status"] == "completed"
    restaged = [e for e in events if e["event"] == "partition" and e.get("restaged")]
    assert restaged and restaged[0]["restaged"] > 0
    # After recovery every row is again processed exactly once per epoch; in the epoch
    # of the loss at least once, the repeats counted in its epoch event.
    disturbed = trainer._disturbed_epochs
    assert disturbed and max(disturbed) < 8
    duplicates = {e["epoch"]: e["duplicates"] for e in events if e["event"] == "epoch"}
    for epoch, seen in trainer.rows_seen.items():
        assert (seen >= 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
        assert duplicates[epoch] == seen.sum() - len(seen)
        if epoch > max(disturbed):
            assert (seen == 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
    assert sum(trainer.final_counts.values()) == trainer.n_rows
    _, _, undisturbed = _fit_killing_a_worker(tmp_path, kill=False)
    # Losing a worker must not cost accuracy; it may gain some (two replicas average to a
    # model that moves further per epoch, and some rows run twice), so the band is one-sided.
    assert accuracy >= undisturbed - 0.01, (accuracy, undisturbed)


class _ActsAfterTheMembershipCheck(Trainer):
    """A trainer whose cluster changes just after a round's membership check.

    ``act(trainer, worker)`` runs once, in round ``act_in_round``, on the last staged
    worker, just before the round's calls go out: a worker that is not running refuses
    its round (``WorkerNotRunning``) and is asked again until ``broadcast_timeout_s``.
    """

    act_in_round = 3

    def __init__(self, *args, act, **kwargs):
        super().__init__(*args, **kwargs)
        self.act, self.acted_on = act, None

    def _sync_membership(self, grace_s: float = 0.0) -> None:
        super()._sync_membership(grace_s)
        if self.round_index == self.act_in_round and self.acted_on is None:
            self.acted_on = sorted(self.staged.futures)[-1]
            self.act(self, self.acted_on)


def _acting_trainer(client, log, act, **config):
    model = MLP((20, 32, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(
        rounds_per_epoch=3, record_row_ids=True, run_log=str(log), probe_seconds=0.3, **config
    )
    optimizer = dict(solver="adam", learning_rate_init=0.003)
    return _ActsAfterTheMembershipCheck(client, model, optimizer, 128, config, act=act)


def _retire(trainer, worker):
    """What ``--lifetime`` does: a graceful retirement, the worker leaves."""
    trainer.client.retire_workers([worker], close_workers=True)


@pytest.mark.timeout(120)
def test_a_worker_retired_before_its_round_is_recovered_not_waited_for(tmp_path):
    X, y = make_classification(
        n_samples=6000, n_features=20, n_informative=12, n_classes=3, random_state=0
    )
    Y = np.eye(3, dtype=np.float32)[y]
    log = tmp_path / "retire.jsonl"
    # Worker threads: a retirement is the scheduler's doing, not a process's end.
    with local_cluster(speeds=(2, 1, 1), processes=False) as cluster, Client(cluster) as c:
        # A timeout far beyond the test's: waiting it out is a failure.
        trainer = _acting_trainer(c, log, _retire, broadcast_timeout_s=600.0)
        trainer.fit(X, Y, max_epochs=4)
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert len(lost) == 1 and lost[0]["round"] == trainer.act_in_round
    victim = trainer._names[trainer.acted_on]
    assert lost[0]["worker"] == victim
    assert events[-1]["status"] == "completed"
    later = [e for e in events if e["event"] == "round" and e["round"] > lost[0]["round"]]
    assert later and all(victim not in e["workers"] for e in later)
    for epoch, seen in trainer.rows_seen.items():
        if epoch > max(trainer._disturbed_epochs):
            assert (seen == 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
    assert sum(trainer.final_counts.values()) == trainer.n_rows


def _pause(cluster, trainer, worker):
    """The worker stays in the cluster but runs nothing, as when it is over its memory."""
    (held,) = [w for w in cluster.workers.values() if w.address == worker]
    held.memory_manager.memory_pause_fraction = 1e-6
    while scheduler_workers(trainer.client)[worker]["status"] != "paused":
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_worker_that_stays_without_running_fails_the_fit_named(tmp_path, data):
    X, y = data
    Y = np.eye(3, dtype=np.float32)[y]
    log = tmp_path / "paused.jsonl"
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,  # the workers' memory managers are reachable from here
            memory_limit="1GiB",
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as cluster,
        Client(cluster) as c,
    ):
        trainer = _acting_trainer(c, log, partial(_pause, cluster), broadcast_timeout_s=2.0)
        with pytest.raises(TrainingError, match=r"status paused.*still in the cluster"):
            trainer.fit(X, Y, max_epochs=4)
    end = read_events(log)[-1]
    assert end["event"] == "run_end" and end["status"] == "failed"


def test_losing_every_worker_ends_the_fit_with_a_clear_error(tmp_path):
    X, y = make_classification(n_samples=20000, n_features=20, n_classes=2, random_state=0)
    log = tmp_path / "lost.jsonl"
    with local_cluster(speeds=(1,)) as cluster, Client(cluster) as c:
        victim = next(iter(cluster.workers.values()))

        def kill_forever():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if log.exists() and any(e["event"] == "round" for e in read_events(log)):
                    victim.auto_restart = False  # the nanny must not bring it back
                    os.kill(victim.process.process.pid, signal.SIGKILL)
                    return
                time.sleep(0.02)

        killer = threading.Thread(target=kill_forever)
        killer.start()
        clf = BPNNClassifier(
            (64,), client=c, max_iter=50, rounds_per_epoch=4, run_log=log, random_state=0
        )
        with pytest.raises(TrainingError, match="every worker was lost"):
            clf.fit(X, y)
        killer.join()
    end = read_events(log)[-1]
    assert end["event"] == "run_end" and end["status"] == "failed" and end["reason"]


def test_a_cluster_without_workers_is_refused_naming_how_to_get_some(data):
    """An adaptive cluster may have none yet: the message says how to start or await them."""
    X, y = data
    with LocalCluster(n_workers=0, processes=False, **FREE_PORTS) as cluster:
        with pytest.raises(TrainingError, match=r"no workers: start some \(cluster.scale\(n\)\)"):
            BPNNClassifier(client=cluster, max_iter=1).fit(X, y)


def test_eval_set_scores_go_to_the_run_log_and_eval_curve(client, data, tmp_path):
    X, y = data
    log = tmp_path / "eval.jsonl"
    warnings.simplefilter("ignore", ConvergenceWarning)
    clf = BPNNClassifier(
        (32,), client=client, max_iter=3, rounds_per_epoch=2, run_log=log, random_state=0
    )
    clf.fit(X[:3000], y[:3000], eval_set=(X[3000:], y[3000:]))
    events = read_events(log)
    rounds = [e for e in events if e["event"] == "round"]
    logged = [e["val_score"] for e in rounds]
    scored = [s for s in logged if s is not None]
    epoch_ends = [
        a for a, b in zip(rounds, rounds[1:] + [None]) if b is None or b["epoch"] > a["epoch"]
    ]
    assert len(epoch_ends) == 3
    assert all(e["val_score"] is not None for e in epoch_ends)  # always scored
    assert rounds[0]["val_score"] is not None  # the warm start's score does not skip it
    # The curve starts with the warm-started model, scored before round one.
    (warm,) = [e for e in events if e["event"] == "warm_start"]
    assert warm["val_score"] is not None and warm["rows"] > 0
    assert [s for _, s in clf.eval_curve_] == pytest.approx([warm["val_score"], *scored])
    assert scored[-1] == pytest.approx(clf.score(X[3000:], y[3000:]))
    times = [t for t, _ in clf.eval_curve_]
    assert times == sorted(times)


def test_early_stopping_reads_the_score_of_the_round_that_ended_the_epoch(
    client, data, tmp_path, monkeypatch
):
    """Without an eval_set the trainer scores the early-stopping split: an epoch's last
    round is scored in the loop, with the workers waiting, and early stopping reads that
    score instead of scoring the same parameters on the same rows again."""
    X, y = data
    log = tmp_path / "early.jsonl"
    warnings.simplefilter("ignore", ConvergenceWarning)
    scored_rows = []
    score = BPNNClassifier._score_unchecked

    def counted(self, X, *args, **kwargs):
        scored_rows.append(len(X))
        return score(self, X, *args, **kwargs)

    monkeypatch.setattr(BPNNClassifier, "_score_unchecked", counted)
    clf = BPNNClassifier(
        (32,),
        client=client,
        max_iter=3,
        rounds_per_epoch=2,
        early_stopping=True,
        n_iter_no_change=10,
        run_log=log,
        random_state=0,
    )
    clf.fit(X[:3000], y[:3000])
    events = read_events(log)
    rounds = [e for e in events if e["event"] == "round"]
    epoch_ends = [
        a for a, b in zip(rounds, rounds[1:] + [None]) if b is None or b["epoch"] > a["epoch"]
    ]
    assert clf.validation_scores_ == pytest.approx([e["val_score"] for e in epoch_ends])
    (warm,) = [e for e in events if e["event"] == "warm_start"]
    logged = [warm["val_score"]] + [e["val_score"] for e in rounds if e["val_score"] is not None]
    assert len(scored_rows) == len(logged), (scored_rows, logged)  # each score logged once
    assert set(scored_rows) == {3000 - int(3000 * 0.9)}  # all on the early-stopping split


def test_time_spent_evaluating_is_not_training_time(client, data):
    """Scoring held-out data is the caller's measurement: the time the loop waits on it
    does not fill the time box; a score computed while the next round trains costs none."""
    X, y = data
    Y = np.eye(3, dtype=np.float32)[y]
    sleep_s, in_loop, beside = 0.05, [], []

    def slow_evaluate(params):
        on_main = threading.current_thread() is threading.main_thread()
        (in_loop if on_main else beside).append(1)
        time.sleep(sleep_s)
        return 0.5

    made = time.perf_counter()
    trainer = _trainer(client, 20, 3, rounds_per_epoch=4, max_seconds=0.6, probe_seconds=0.1)
    trainer.fit(X, Y, max_epochs=1000, evaluate=slow_evaluate)
    elapsed = time.perf_counter() - made
    # The warm start's and the epochs' last rounds' scores run in the loop; the other
    # rounds' beside the next round.
    assert in_loop and beside
    assert trainer.training_seconds() <= elapsed - sleep_s * len(in_loop)
    # The box closed on training seconds, however long the evaluations slept.
    assert trainer.training_seconds() >= 0.6
    times = [r.training_s for r in trainer.history]
    assert times == sorted(times)


def test_an_evaluate_that_fails_beside_the_next_round_fails_the_fit(client, data, tmp_path):
    X, y = data
    Y = np.eye(3, dtype=np.float32)[y]
    log = tmp_path / "failing.jsonl"
    trainer = _trainer(
        client, 20, 3, rounds_per_epoch=4, eval_resolution=0, probe_seconds=0.1, run_log=str(log)
    )
    calls = []

    def evaluate(params):
        calls.append(threading.current_thread() is threading.main_thread())
        if len(calls) == 3:  # round two's score, computed beside round three
            raise ValueError("held-out data went bad")
        return 0.5

    with pytest.raises(TrainingError, match="held-out data went bad"):
        trainer.fit(X, Y, max_epochs=2, evaluate=evaluate)
    assert calls[-1] is False  # it failed in the background thread
    end = read_events(log)[-1]
    assert end["event"] == "run_end" and end["status"] == "failed"


class _ParamsAfterMerge(Trainer):
    """Records the sum of the global parameters as each round's merge leaves them."""

    merged: list[float]

    def _apply(self, results):
        super()._apply(results)
        self.merged.append(float(self.model.params.astype(np.float64).sum()))


def test_a_round_scored_while_the_next_trains_is_scored_on_its_own_parameters(
    client, data, tmp_path
):
    X, y = data
    Y = np.eye(3, dtype=np.float32)[y]
    model = MLP((20, 16, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(
        rounds_per_epoch=4, eval_resolution=0, probe_seconds=0.1, run_log=str(tmp_path / "l")
    )
    trainer = _ParamsAfterMerge(
        client, model, dict(solver="adam", learning_rate_init=0.003), 64, config
    )
    trainer.merged = []
    scored_in = []

    def evaluate(params):
        scored_in.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.1)  # longer than a round: the next round's results are in meanwhile
        return float(params.astype(np.float64).sum())

    trainer.fit(X, Y, max_epochs=2, evaluate=evaluate)
    assert not all(scored_in)  # some were scored beside the next round
    assert [r.val_score for r in trainer.history] == pytest.approx(trainer.merged)
    events = read_events(trainer.run_log_path)
    rounds = [e for e in events if e["event"] == "round"]
    assert [e["round"] for e in rounds] == [r.round for r in trainer.history]
    assert [e["val_score"] for e in rounds] == pytest.approx(trainer.merged)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)


@pytest.mark.parametrize("resolution", [0.0, 1e9])
def test_eval_resolution_decides_which_rounds_are_scored(client, data, resolution):
    X, y = data
    Y = np.eye(3, dtype=np.float32)[y]
    trainer = _trainer(
        client, 20, 3, rounds_per_epoch=5, eval_resolution=resolution, probe_seconds=0.1
    )
    trainer.fit(X, Y, max_epochs=2, evaluate=lambda params: 0.5)
    scored = [r.val_score is not None for r in trainer.history]
    if resolution == 0:
        assert all(scored)  # every round
    else:
        # Only the first round (nothing scored before it) and every epoch's last one.
        last_of_epoch = [
            i == len(trainer.history) - 1 or trainer.history[i + 1].epoch > r.epoch
            for i, r in enumerate(trainer.history)
        ]
        expected = [i == 0 or last for i, last in enumerate(last_of_epoch)]
        assert scored == expected and sum(scored) < len(scored)


def test_predict_on_a_dask_array_is_a_dask_array_computed_blockwise(client, data):
    import dask.array as da

    X, y = data
    warnings.simplefilter("ignore", ConvergenceWarning)
    clf = BPNNClassifier((16,), max_iter=3, random_state=0, client=False).fit(X, y)
    dX = da.from_array(X, chunks=(700, 7))
    labels = clf.predict(dX)
    proba = clf.predict_proba(dX)
    assert isinstance(labels, da.Array) and labels.numblocks == (6,)
    np.testing.assert_array_equal(labels.compute(), clf.predict(X))
    # float32: the softmax shift is per block, so agreement is to float32 rounding.
    np.testing.assert_allclose(proba.compute(), clf.predict_proba(X), rtol=1e-5, atol=1e-7)


def test_round_schedule_ramps_up_and_ends_every_epoch_with_one_round_left():
    from hmdspt.core.rounds import round_schedule

    assert round_schedule(1) == [1]
    assert round_schedule(3) == [3, 2, 1]
    assert round_schedule(2, ramp_rounds=3) == [16, 8, 4, 2, 1]
    # Rows each round takes under the worker's rule ceil(due / rounds_left): the ramp's
    # rounds grow about twice each time, and the epoch covers every row exactly once.
    due, taken = 8000, []
    for rounds_left in round_schedule(1, ramp_rounds=3):
        take = -(-due // rounds_left)
        taken.append(take)
        due -= take
    assert due == 0 and sum(taken) == 8000
    assert taken[0] == 1000 and taken[0] < taken[1] < taken[2]
    with pytest.raises(ValueError, match="ramp_rounds"):
        round_schedule(1, ramp_rounds=-1)
    with pytest.raises(ValueError, match="ramp_rounds"):
        TrainerConfig(ramp_rounds=-1).validate()


def test_rounds_go_on_while_the_active_memory_manager_drops_replicas(tmp_path):
    """Each worker's ``w_t`` is a key of its own: a key scattered to several workers is a
    replicated key, and with no task waiting on it (a round is a call to the worker, not
    a task) the active memory manager would drop copies before the rounds read them."""
    import dask

    X, y = make_classification(
        n_samples=3000, n_features=10, n_informative=6, n_classes=3, random_state=0
    )
    amm = {
        "distributed.scheduler.active-memory-manager.start": True,
        "distributed.scheduler.active-memory-manager.interval": "5ms",
    }
    with (
        dask.config.set(amm),
        LocalCluster(n_workers=3, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as c,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        clf = BPNNClassifier((8,), client=c, max_iter=10, rounds_per_epoch=8, random_state=0)
        clf.fit(X, y)
    assert clf.n_iter_ == 10

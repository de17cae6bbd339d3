"""Workers remember their measured speed; a later fit of the same shape skips the probe.

Emulated 2:1 clusters on worker threads of this process (what is remembered is a worker's
own, whether it is a thread or a process) and one in-process cluster of equal workers, all
of them slowed down ``SLOWER`` times more; the run log is the witness.
"""

import warnings

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.nn import MLP
from hmdspt.core.rounds import ramp_length, round_schedule
from hmdspt.core.runlog import read_events
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.cluster import local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig
from hmdspt.parallel.worker import (
    MIN_REMEMBERED_BUSY_S,
    forget_speeds,
    get_slowdowns,
    remembered_speed,
    set_slowdown,
    speed_key,
    unremembered_busy_s,
)
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(14)

HIDDEN = (256, 256)  # enough compute per row that a short fit is remembered (>= 0.3 s busy)
# Every worker emulates a machine this many times slower than this one: a fit is busy the
# MIN_REMEMBERED_BUSY_S it needs on an eighth of the rows, its time asleep, not computing
# (at 4, the fast worker's busy time fell to 0.26 s on a machine twice as fast).
SLOWER = 8


def _slowed(client) -> None:
    for address, k in get_slowdowns(client).items():
        set_slowdown(client, address, k * SLOWER)


@pytest.fixture(scope="module")
def client():
    with local_cluster(speeds=(2, 1), processes=False) as cluster, Client(cluster) as c:
        _slowed(c)
        yield c


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=5_000, n_features=20, n_informative=10, n_classes=3, random_state=0
    )
    return X.astype(np.float32), np.eye(3, dtype=np.float32)[y]


def _fit(client, data, log, hidden=HIDDEN, epochs=3, batch_size=128, **config):
    X, Y = data
    model = MLP((X.shape[1], *hidden, Y.shape[1]))
    model.initialize(np.random.RandomState(0))
    config.setdefault("rounds_per_epoch", 2)
    # A fixed probe: at 2,500 rows a worker these fits are too small for the adaptive probe
    # to pay (hmdspt.core.speed.probe_pays, at the driver's measured speed), and what these
    # tests check is what replaces a probe.
    config.setdefault("probe_seconds", 0.2)
    trainer = Trainer(
        client,
        model,
        dict(solver="adam", learning_rate_init=0.001),
        batch_size,
        TrainerConfig(run_log=str(log), **config),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        trainer.fit(X, Y, max_epochs=epochs)
    return trainer, read_events(log)


def _scores(events):
    return [e for e in events if e["event"] == "score" and e["round"] == 0]


def _regular_rounds(events, rounds_per_epoch=2):
    """The rounds after the ramp rounds that open the first epoch (not remembered)."""
    rounds = [e for e in events if e["event"] == "round"]
    n_ramp = sum(e["epoch"] == 1 for e in rounds) - rounds_per_epoch
    return rounds[n_ramp:]


def _key(data, hidden=HIDDEN, batch_size=128):
    X, Y = data
    return speed_key((X.shape[1], *hidden, Y.shape[1]), batch_size, np.float32, "relu", "softmax")


def _busy_s(events) -> dict[str, float]:
    """Each worker's busy seconds over the fit's rounds."""
    busy: dict[str, float] = {}
    for e in events:
        if e["event"] == "round":
            for worker, w in e["workers"].items():
                busy[worker] = busy.get(worker, 0.0) + w["busy_s"]
    return busy


def test_a_second_fit_of_the_same_shape_starts_from_the_speeds_the_first_measured(
    client, data, tmp_path
):
    client.run(forget_speeds)
    first, first_events = _fit(client, data, tmp_path / "first.jsonl")
    assert {e["source"] for e in _scores(first_events)} == {"probe"}
    # What each worker measured over the first fit's regular rounds, from the run log.
    rows, busy = {}, {}
    for e in _regular_rounds(first_events):
        for name, w in e["workers"].items():
            rows[name] = rows.get(name, 0) + w["rows"]
            busy[name] = busy.get(name, 0.0) + w["busy_s"]
    assert min(busy.values()) >= MIN_REMEMBERED_BUSY_S, "the test's fit is too short"

    second, events = _fit(client, data, tmp_path / "second.jsonl")
    scores = _scores(events)
    assert {e["source"] for e in scores} == {"remembered"}
    assert {e["worker"] for e in scores} == set(rows)
    for e in scores:
        assert e["from_run_id"] == first.run_id
        assert 0 <= e["age_s"] < 600
        assert e["score"] == pytest.approx(rows[e["worker"]] / busy[e["worker"]], rel=1e-9)
    # The remembered speeds set the shares, as a probe's would.
    names = {a: i["name"] for a, i in scheduler_workers(client).items()}
    shares = next(e["rows"] for e in events if e["event"] == "partition")
    fast, slow = sorted(shares, key=lambda n: -next(e["score"] for e in scores if e["worker"] == n))
    assert shares[fast] > shares[slow]
    assert set(names.values()) == set(shares)


def test_fits_too_short_to_be_remembered_add_up_until_they_are(client, data, tmp_path):
    # A grid search's fits: each alone too short to leave a memory, so each would probe.
    client.run(forget_speeds)
    # About 0.1 s busy a fit here (0.2 s on 5,000 rows): three or four fits make a memory,
    # on a machine a few times faster or slower too.
    short = (data[0][:2_500], data[1][:2_500])
    names = {a: str(i["name"]) for a, i in scheduler_workers(client).items()}
    totals: dict[str, dict] = {}  # per worker: what its memory must hold, from the logs
    for n in range(1, 11):
        trainer, events = _fit(client, short, tmp_path / f"short{n}.jsonl", epochs=1)
        if {e["source"] for e in _scores(events)} == {"remembered"}:
            break
        for name in names.values():
            total = totals.setdefault(name, dict(rows=0, busy_s=0.0, fits=0, done=None))
            if total["busy_s"] >= MIN_REMEMBERED_BUSY_S:  # remembered: the next total starts
                total.update(rows=0, busy_s=0.0, fits=0)
            total["fits"] += 1
            for e in _regular_rounds(events):
                total["rows"] += e["workers"][name]["rows"]
                total["busy_s"] += e["workers"][name]["busy_s"]
            if total["busy_s"] >= MIN_REMEMBERED_BUSY_S:
                total["done"] = dict(total, run_id=trainer.run_id)
        carried = client.run(unremembered_busy_s, _key(data))
        for address, memory in client.run(remembered_speed, _key(data), 600.0).items():
            busy_s = totals[names[address]]["busy_s"]
            expected = busy_s if busy_s < MIN_REMEMBERED_BUSY_S else 0.0
            assert carried[address] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            done = totals[names[address]]["done"]
            if done is None:
                assert memory is None, (n, memory)
                continue
            assert memory is not None, (n, done)
            assert memory["speed"] == pytest.approx(done["rows"] / done["busy_s"], rel=1e-9)
            assert (memory["fits"], memory["run_id"]) == (done["fits"], done["run_id"])
    else:
        pytest.fail(f"ten short fits left no memory on every worker: {totals}")
    assert n > 2, "the test's fits are long enough to be remembered one by one"
    assert max(e["fits"] for e in _scores(events)) > 1
    # Totals stop carrying on once they are older than reuse_speeds_s.
    client.run(forget_speeds)
    for k in range(n):  # one more than made a memory above
        _fit(client, short, tmp_path / f"apart{k}.jsonl", epochs=1, reuse_speeds_s=1e-6)
    memories = client.run(remembered_speed, _key(data), 600.0).values()
    assert all(m is None or m["fits"] == 1 for m in memories), memories


def test_no_reuse_when_switched_off_forgotten_too_old_or_another_shape(client, data, tmp_path):
    client.run(forget_speeds)
    _fit(client, data, tmp_path / "a.jsonl")
    memories = client.run(remembered_speed, _key(data), 600.0)
    assert all(m is not None and m["speed"] > 0 for m in memories.values())
    assert all(m is None for m in client.run(remembered_speed, _key(data), 0.0).values())
    assert all(m is None for m in client.run(remembered_speed, _key(data, (64,)), 600.0).values())

    # Each of these only has to start (its scores say where its speeds came from).
    _, events = _fit(client, data, tmp_path / "off.jsonl", epochs=1, reuse_speeds_s=0)
    assert {e["source"] for e in _scores(events)} == {"probe"}
    _, events = _fit(client, data, tmp_path / "shape.jsonl", epochs=1, hidden=(128, 128))
    assert {e["source"] for e in _scores(events)} == {"probe"}
    assert sum(client.run(forget_speeds).values()) >= 2
    _, events = _fit(client, data, tmp_path / "forgotten.jsonl", epochs=1)
    assert {e["source"] for e in _scores(events)} == {"probe"}


@pytest.mark.parametrize(
    "config",
    # bsp in mini-batches of 2048 rows: few round trips, each busy enough to count.
    [dict(sync="bsp", partition="equal", epochs=3, batch_size=2048), dict(partition="equal")],
    ids=["bsp", "equal-shares"],
)
def test_fits_that_do_not_load_every_worker_alike_leave_no_memory(client, data, tmp_path, config):
    # bsp's gradients cost differently per row; with equal shares the fast workers idle
    # while the slow ones run with less contention than a proportional fit gives them.
    client.run(forget_speeds)
    _, events = _fit(client, data, tmp_path / "fit.jsonl", **config)
    # Busy long enough that a proportional fit would have been remembered.
    assert min(_busy_s(events).values()) >= MIN_REMEMBERED_BUSY_S, _busy_s(events)
    key = _key(data, batch_size=config.get("batch_size", 128))
    assert all(m is None for m in client.run(remembered_speed, key, 600.0).values())


def test_the_ramp_has_as_many_rounds_as_the_measured_speeds_call_for(client, data, tmp_path):
    client.run(forget_speeds)
    # At least one ramp round, more as the predicted round length calls for.
    rpe, cfg = 2, TrainerConfig(ramp_rounds=1)
    _, events = _fit(client, data, tmp_path / "ramp.jsonl", epochs=1, ramp_rounds=1)
    speeds = {e["worker"]: e["score"] for e in _scores(events)}
    shares = next(e["rows"] for e in events if e["event"] == "partition")
    round_s = max(n / rpe / speeds[w] for w, n in shares.items())
    expected = ramp_length(round_s, cfg.ramp_first_round_s, cfg.ramp_rounds, cfg.max_ramp_rounds)
    rounds = [e for e in events if e["event"] == "round"]
    assert len(rounds) == len(round_schedule(rpe, expected))
    # Equal shares are not probed: the warm-start pilot's speed on the driver stands in.
    _, events = _fit(
        client, data, tmp_path / "equal.jsonl", epochs=1, partition="equal", ramp_rounds=1
    )
    (pilot,) = [e for e in events if e["event"] == "warm_start"]
    shares = next(e["rows"] for e in events if e["event"] == "partition")
    round_s = max(shares.values()) / rpe / (pilot["rows"] * pilot["epochs"] / pilot["seconds"])
    expected = ramp_length(round_s, cfg.ramp_first_round_s, cfg.ramp_rounds, cfg.max_ramp_rounds)
    assert len([e for e in events if e["event"] == "round"]) == len(round_schedule(rpe, expected))
    # Neither (no probe, no pilot): the configured number of ramp rounds.
    _, events = _fit(
        client,
        data,
        tmp_path / "unknown.jsonl",
        epochs=1,
        partition="equal",
        warm_start_rows=0,
        ramp_rounds=2,
    )
    assert len([e for e in events if e["event"] == "round"]) == rpe + 2


def test_ramp_length_brings_the_first_round_under_the_bound():
    assert ramp_length(1.3, 0.05, 3, 5) == 5  # 1.3 / 32 = 0.04 s
    assert ramp_length(1.3, 0.05, 3, 4) == 4  # capped
    assert ramp_length(0.3, 0.05, 1, 5) == 3  # 0.3 / 8 = 0.0375 s; 0.3 / 4 would be 0.075
    assert ramp_length(0.3, 0.05, 3, 5) == 3
    # Rounds shorter than twice the bound get no ramp: its rounds would be all overhead.
    assert ramp_length(0.1, 0.05, 3, 5) == 3
    assert ramp_length(0.099, 0.05, 3, 5) == 0
    assert ramp_length(0.002, 0.05, 3, 5) == 0
    assert ramp_length(9.9, 0.05, 0, 5) == 0  # 0 turns it off
    for round_s in (0.1, 0.4, 0.8, 1.6):
        k = ramp_length(round_s, 0.05, 1, 10)
        assert round_s / 2**k <= 0.05 < round_s / 2 ** (k - 1)
    with pytest.raises(ValueError, match="first_round_s"):
        ramp_length(1.0, 0.0, 3, 5)
    with pytest.raises(ValueError, match="min_rounds <= max_rounds"):
        ramp_length(1.0, 0.05, 3, 2)
    with pytest.raises(ValueError, match="max_ramp_rounds"):
        TrainerConfig(ramp_rounds=3, max_ramp_rounds=2).validate()
    with pytest.raises(ValueError, match="ramp_first_round_s"):
        TrainerConfig(ramp_first_round_s=0).validate()
    with pytest.raises(ValueError, match="reuse_speeds_s"):
        TrainerConfig(reuse_speeds_s=-1).validate()


def test_in_process_workers_keep_their_own_round_state_and_memory_on_their_plugins(data, tmp_path):
    """Threads of one process share the worker module: state is keyed by worker, on each
    worker's own HMDSPTWorkerPlugin, and a closed worker's memory goes with it."""
    from hmdspt.parallel.worker import WORKER_PLUGIN_NAME

    X, Y = data
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as c,
    ):
        _slowed(c)
        trainer, events = _fit(c, data, tmp_path / "threads.jsonl", record_row_ids=True)
        for seen in trainer.rows_seen.values():
            assert (seen == 1).all()
        workers = scheduler_workers(c)
        memories = c.run(remembered_speed, _key(data), 600.0)
        assert sorted(memories) == sorted(workers)
        # Each worker's memory holds its own rows' busy time, not the process's. A worker
        # whose share was too small to be busy MIN_REMEMBERED_BUSY_S remembers nothing
        # (a probe upset by the other thread can give it one, and a short fit keeps it).
        per_worker = {}
        for e in _regular_rounds(events):
            for name, w in e["workers"].items():
                per_worker[name] = per_worker.get(name, 0.0) + w["busy_s"]
        remembered = 0
        for address, memory in memories.items():
            busy = per_worker[str(workers[address]["name"])]
            if busy < MIN_REMEMBERED_BUSY_S:
                assert memory is None, (busy, memory)
                continue
            remembered += 1
            assert memory["run_id"] == trainer.run_id
            assert round(memory["busy_s"], 9) == round(busy, 9)
        assert remembered, per_worker  # the check above ran for at least one worker
        # A model trained by two workers that shared one local model would not learn.
        model = trainer.model
        accuracy = (model.forward(X).argmax(1) == Y.argmax(1)).mean()
        assert accuracy > 0.8
        # The memories live on each worker's own plugin (no module-level table).
        held = c.run(lambda dask_worker: len(dask_worker.plugins[WORKER_PLUGIN_NAME].speeds))
        assert held == {a: int(m is not None) for a, m in memories.items()}
        plugins = [w.plugins[WORKER_PLUGIN_NAME] for w in cluster.workers.values()]
        assert plugins[0] is not plugins[1]
    assert [len(p.speeds) for p in plugins] == [0, 0]  # torn down with the workers

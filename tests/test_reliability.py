"""Faults during a fit on a real (emulated heterogeneous) cluster: a straggler, a joiner.

A killed worker and losing every worker are covered in ``tests/test_trainer.py``
(``test_a_killed_worker_is_survived_without_losing_rows``,
``test_losing_every_worker_ends_the_fit_with_a_clear_error``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from distributed import Client
from sklearn.datasets import make_classification

from hmdspt.core.nn import MLP
from hmdspt.core.runlog import read_events, summarize
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.cluster import local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig
from hmdspt.parallel.worker import get_slowdowns, set_slowdown

pytestmark = pytest.mark.heavy(6)

STRAGGLER_ROUND = 3  # the slowdown is applied once this many rounds are logged
SLOWDOWN = 4.0  # factor by which the straggler's speed drops


def _rounds_logged(log: Path) -> int:
    return sum(e["event"] == "round" for e in read_events(log)) if log.exists() else 0


def _when_rounds(log: Path, n: int, action, timeout: float = 60.0) -> threading.Thread:
    """Start a thread that runs ``action()`` once ``n`` rounds are in the run log."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _rounds_logged(log) >= n:
                action()
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _trainer(client: Client, layers: tuple[int, ...], log: Path, **config) -> Trainer:
    model = MLP(layers)
    model.initialize(np.random.RandomState(0))
    optimizer = dict(solver="adam", learning_rate_init=0.003)
    return Trainer(
        client,
        model,
        optimizer,
        128,
        TrainerConfig(run_log=str(log), probe_seconds=0.3, record_row_ids=True, **config),
    )


def _data(n: int, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(
        n_samples=n, n_features=n_features, n_informative=10, n_classes=3, random_state=0
    )
    return X.astype(np.float32), np.eye(3, dtype=np.float32)[y]


def _address_of(client: Client, name: str) -> str:
    info = scheduler_workers(client)
    return next(a for a, w in info.items() if w["name"] == name)


@pytest.fixture(scope="module")
def straggler_fit(tmp_path_factory, machine_alone):
    """A fit on speeds 2:1 whose fastest worker (worker-0) slows down 4x after round 3.

    Rounds last ~0.3-0.6 s of compute (50 features, 512-256 hidden units, 2 rounds per
    epoch), so the speeds are measured on real work, not on scheduling overhead.
    """
    log = tmp_path_factory.mktemp("straggler") / "run.jsonl"
    X, Y = _data(30000, 50)
    change: dict[str, object] = {}
    with local_cluster(speeds=(2, 1)) as cluster, Client(cluster) as client:
        victim = _address_of(client, "worker-0")

        def slow_down() -> None:
            set_slowdown(client, victim, SLOWDOWN * cluster.emulation.slowdowns["worker-0"])
            change["round"] = _rounds_logged(log)
            change["slowdowns"] = get_slowdowns(client)

        trainer = _trainer(client, (50, 512, 256, 3), log, rounds_per_epoch=2)
        with machine_alone():  # the shares follow measured speeds: no other test beside it
            watcher = _when_rounds(log, STRAGGLER_ROUND, slow_down)
            trainer.fit(X, Y, max_epochs=5)
            watcher.join()
    return trainer, read_events(log), change


def test_a_straggler_loses_rows_within_three_rounds(straggler_fit):
    trainer, events, change = straggler_fit
    assert change["slowdowns"][_victim_address(events)] == SLOWDOWN
    changed_at = int(change["round"])
    before = _rows_at(events, "worker-0", changed_at)
    later = [
        e for e in events if e["event"] == "partition" and changed_at < e["round"] <= changed_at + 3
    ]
    assert any(e["rows"]["worker-0"] < before for e in later), (before, later)
    assert sum(trainer.final_counts.values()) == trainer.n_rows
    for epoch, seen in trainer.rows_seen.items():  # moves never lose or repeat a row
        assert (seen == 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"


def test_after_the_rebalance_each_workers_rows_follow_its_measured_speed(straggler_fit):
    """The balance that brings the fastest worker's idle back down. The idle fraction is a
    speed, so ``python -m benchmarks.bench_straggler`` measures it (the same fit beside
    equal shares); this checks the shares it comes from."""
    _, events, change = straggler_fit
    rows, speed = shares_after(events, int(change["round"]) + 3)
    print(f"after the re-balance: rows {rows}, measured speed {speed}")
    # Within 25 %, the bound the worth benchmarks hold shares to: a re-balance that would
    # not pay over the rest of the fit leaves a few per cent. Left on the old shares (2:1
    # rows at speeds 0.5:1), worker-0's row share would be twice its speed share.
    for name in rows:
        assert abs(rows[name] / speed[name] - 1) <= 0.25, (rows, speed)


def shares_after(events: list[dict], first_round: int) -> tuple[dict, dict]:
    """Each worker's share of the rows and of the measured speed (rows over busy seconds)
    summed over the rounds after ``first_round``."""
    rounds = [e for e in events if e["event"] == "round" and e["round"] > first_round]
    assert rounds, "no rounds after the re-balance window"
    workers = summarize(rounds)["workers"]  # rows, and mean_speed: Σ rows / Σ busy
    rows = {name: w["rows"] for name, w in workers.items()}
    speed = {name: w["mean_speed"] for name, w in workers.items()}
    return (
        {name: round(r / sum(rows.values()), 4) for name, r in rows.items()},
        {name: round(v / sum(speed.values()), 4) for name, v in speed.items()},
    )


def _victim_address(events: list[dict]) -> str:
    start = next(e for e in events if e["event"] == "run_start")
    return next(w["address"] for w in start["workers"] if w["name"] == "worker-0")


def _rows_at(events: list[dict], name: str, round_: int) -> int:
    """Rows of worker ``name`` per the last partition at or before ``round_``."""
    parts = [e for e in events if e["event"] == "partition" and e["round"] <= round_]
    return int(parts[-1]["rows"][name])


def test_a_worker_joining_mid_fit_gets_rows_from_the_next_round(tmp_path):
    log = tmp_path / "join.jsonl"
    # Worker threads: a join is the scheduler's event whatever the worker runs in, and a
    # thread joins within the fit's 15 rounds even on a loaded machine (a worker process
    # took several seconds to start there).
    X, Y = _data(20000, 20)
    with local_cluster(speeds=(2, 1), processes=False) as cluster, Client(cluster) as client:
        watcher = _when_rounds(log, 2, lambda: cluster.scale(3))
        trainer = _trainer(client, (20, 256, 3), log, rounds_per_epoch=3)
        trainer.fit(X, Y, max_epochs=5)
        watcher.join()
    events = read_events(log)
    joined = [e for e in events if e["event"] == "worker_joined"]
    assert len(joined) == 1, f"{len(joined)} joins; last round {_rounds_logged(log)}; " + str(
        [
            (e["event"], e.get("round"), e.get("worker"), e.get("reason"))
            for e in events
            if e["event"] in ("worker_joined", "worker_lost", "run_end")
        ]
    )
    name, at = joined[0]["worker"], joined[0]["round"]
    assert name not in {"worker-0", "worker-1"}
    rounds = [e for e in events if e["event"] == "round" and e["round"] > at]
    shares = [(e["round"], e["workers"].get(name, {}).get("rows", 0)) for e in rounds]
    assert rounds and rounds[0]["round"] == at + 1, shares
    assert shares[0][1] > 0, shares  # a share from the next round on
    assert all(rows > 0 for _, rows in shares), shares
    last = [e for e in events if e["event"] == "partition"][-1]
    assert sum(last["rows"].values()) == len(X) and last["rows"][name] > 0
    for epoch, seen in trainer.rows_seen.items():
        assert (seen == 1).all(), f"epoch {epoch}: {np.bincount(seen)}"
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"

"""Utilisation: per worker, compute seconds over the fit's wall time from the user's call.

Issue 15, point 3. ``busy_s`` of the rounds is a worker's compute; the fit's wall time runs
from the user's ``fit()`` call (``run_start.called_at``) to ``run_end``, so staging, the
probe, the warm start, re-balancing, communication and waiting all count as not computing.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.nn import MLP
from hmdspt.core.runlog import read_events, summarize
from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.trainer import Trainer, TrainerConfig


def _round(t: float, wall: float, busy: dict[str, float]) -> dict:
    return {
        "event": "round",
        "run_id": "r",
        "time": t,
        "round": 1,
        "epoch": 1,
        "wall_s": wall,
        "merge_s": 0.0,
        "loss": 1.0,
        "workers": {
            name: {"rows": 100, "steps": 1, "busy_s": b, "comm_s": 0.1} for name, b in busy.items()
        },
    }


def _hand_made_run(end: bool = True) -> list[dict]:
    """Called at t=1000; run_start at 1000.5; rounds end at 1004 and 1006 (walls 2 s);
    ``fast`` computes 1.5 + 0.5 s, ``slow`` 1.8 + 1.8 s; run_end at 1010 (10 s)."""
    events = [
        {
            "event": "run_start",
            "run_id": "r",
            "time": 1000.5,
            "called_at": 1000.0,
            "config": {},
            "workers": [],
            "dataset": {},
            "model": {},
        },
        _round(1004.0, 2.0, {"fast": 1.5, "slow": 1.8}),
        _round(1006.0, 2.0, {"fast": 0.5, "slow": 1.8}),
    ]
    if end:
        events.append(
            {
                "event": "run_end",
                "run_id": "r",
                "time": 1010.0,
                "status": "completed",
                "wall_s": 10.0,
                "summary": None,
                "reason": None,
            }
        )
    return events


def test_utilisation_is_busy_seconds_over_the_fit_wall_time_from_the_call():
    s = summarize(_hand_made_run())
    assert s["fit_wall_s"] == pytest.approx(10.0)  # run_end.wall_s
    fast, slow = s["workers"]["fast"], s["workers"]["slow"]
    assert fast["utilisation"] == pytest.approx(2.0 / 10.0)  # busy 2 s of a 10 s fit
    assert slow["utilisation"] == pytest.approx(3.6 / 10.0)
    assert s["fastest_worker"] == "fast" and s["fastest_utilisation"] == pytest.approx(0.2)
    # Idle stays what it was: over the rounds' walls, communication left out.
    assert fast["idle_fraction"] == pytest.approx((0.4 + 1.4) / 4.0)
    assert s["wall_s"] == pytest.approx(4.0)  # Σ round wall, unchanged


def test_utilisation_before_run_end_counts_to_the_latest_event():
    events = _hand_made_run(end=False)
    s = summarize(events)
    assert s["fit_wall_s"] == pytest.approx(1006.0 - 1000.0)  # from called_at
    assert s["workers"]["fast"]["utilisation"] == pytest.approx(2.0 / 6.0)
    # A log written before called_at existed: from run_start's time.
    del events[0]["called_at"]
    assert summarize(events)["fit_wall_s"] == pytest.approx(1006.0 - 1000.5)
    # The trainer gives the wall time it is about to log in run_end.
    s = summarize(events, fit_wall_s=8.0)
    assert s["fit_wall_s"] == 8.0 and s["workers"]["slow"]["utilisation"] == pytest.approx(0.45)


def test_utilisation_is_undefined_without_a_fit_wall_time():
    rounds = _hand_made_run(end=False)[1:]  # no run_start: no call to count from
    s = summarize(rounds)
    assert s["fit_wall_s"] is None and s["workers"]["fast"]["utilisation"] is None
    assert summarize([])["fit_wall_s"] is None


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=3000, n_features=10, n_informative=6, n_classes=3, random_state=0
    )
    return X.astype(np.float32), y


class _TimedArray:
    """Array-like input that notes when the estimator converts it (inside ``fit()``)."""

    def __init__(self, X: np.ndarray) -> None:
        self._X = X
        self.shape = X.shape
        self.converted_at: float | None = None

    def __len__(self) -> int:
        return len(self._X)

    def __array__(self, dtype=None, copy=None):
        if self.converted_at is None:
            self.converted_at = time.time()
        return self._X if dtype is None else self._X.astype(dtype)


def test_in_process_cluster_fit_summary_has_utilisation_from_the_fit_call(client, data, tmp_path):
    X, y = data
    timed = _TimedArray(X)
    clf = BPNNClassifier(
        (16,), client=client, max_iter=2, rounds_per_epoch=2, random_state=0,
        run_log=tmp_path / "fit.jsonl",
    )  # fmt: skip
    called = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(timed, y)
    events = read_events(clf.run_log_path_)
    start, end = events[0], events[-1]
    assert start["event"] == "run_start" and end["event"] == "run_end"
    # The clock starts at the user's call, before the estimator even looks at X.
    assert called - 1e-3 <= start["called_at"] <= timed.converted_at <= start["time"]
    rounds = [e for e in events if e["event"] == "round"]
    assert start["called_at"] + end["wall_s"] >= rounds[-1]["time"] - 1e-3
    assert start["called_at"] + end["wall_s"] <= end["time"] + 1e-3
    summary = end["summary"]
    assert summary["fit_wall_s"] == end["wall_s"]
    assert end["wall_s"] >= summary["wall_s"] == pytest.approx(sum(e["wall_s"] for e in rounds))
    assert set(summary["workers"]) == {w["name"] for w in start["workers"]}
    for w in summary["workers"].values():
        assert 0 < w["utilisation"] <= 1
        assert w["utilisation"] == pytest.approx(w["busy_s"] / end["wall_s"])
    # Read back later, the log gives the same figures.
    assert summarize(events)["workers"] == summary["workers"]


def test_a_trainer_used_directly_counts_from_its_own_fit_call(client, data, tmp_path):
    X, y = data
    model = MLP((10, 16, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(partition="equal", run_log=str(tmp_path / "t.jsonl"), rounds_per_epoch=2)
    trainer = Trainer(client, model, {"solver": "adam", "learning_rate_init": 0.003}, 64, config)
    time.sleep(0.3)  # the time between making the trainer and fitting is not the fit's
    called = time.time()
    trainer.fit(X, np.eye(3, dtype=np.float32)[y], max_epochs=1)
    events = read_events(trainer.run_log_path)
    start, end = events[0], events[-1]
    assert start["called_at"] >= called - 1e-3
    assert end["time"] - end["wall_s"] >= called - 1e-3
    assert end["summary"]["fit_wall_s"] == end["wall_s"]

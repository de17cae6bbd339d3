"""Tests of the speed estimators: OnlineScorer (pure) and the probe on a real cluster."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks._common import busy_cpu_seconds, own_cpu_seconds
from pipeline.scoring import OnlineScorer, score_workers

LAYERS = (100, 128, 64, 10)  # DESIGN.md's reference shape


# ------------------------------------------------------------------------- OnlineScorer
def test_scoring_module_imports_no_dask():
    code = (
        "import sys; from pipeline.scoring import OnlineScorer; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]; "
        "assert not bad, bad"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_halflife_sets_the_weight_of_a_new_measurement():
    assert OnlineScorer(halflife=1).alpha == pytest.approx(0.5)
    assert OnlineScorer(halflife=2).alpha == pytest.approx(1 - 0.5**0.5)


def test_exponentially_weighted_mean_and_variance():
    s = OnlineScorer(halflife=1, first_rel_std=0.1)  # a = 0.5
    s.update("w", rows=1000, busy_s=1.0)
    assert s.score("w") == 1000.0
    assert s.std("w") == pytest.approx(100.0)  # first_rel_std * first measurement
    s.update("w", rows=4000, busy_s=2.0)  # 2000 samples/s
    # mean = 1000 + 0.5 * 1000; var = 0.5 * (100**2 + 0.5 * 1000**2)
    assert s.score("w") == pytest.approx(1500.0)
    assert s.std("w") == pytest.approx(math.sqrt(0.5 * (100**2 + 0.5 * 1000**2)))
    s.update_speed("w", 1500.0)
    assert s.score("w") == pytest.approx(1500.0)
    assert s.rel_std("w") == pytest.approx(s.std("w") / 1500.0)
    assert s.estimates["w"].n_updates == 3


def test_the_first_measurement_replaces_the_prior():
    s = OnlineScorer()
    s.add_worker("a", prior=8.0)
    s.add_worker("b", nthreads=2)
    s.add_worker("c", memory_limit=2**30)  # memory is no speed hint: default prior 1
    assert s.scores() == {"a": 8.0, "b": 2.0, "c": 1.0}
    assert not s.is_measured("a") and s.rel_std("a") == math.inf
    s.update("a", rows=500, busy_s=1.0)  # the probe: 500 samples/s, whatever the prior said
    assert s.score("a") == 500.0 and s.is_measured("a")
    # Unmeasured workers are scaled by the measured speed per prior unit (500 / 8).
    assert s.scores() == {"a": 500.0, "b": pytest.approx(125.0), "c": pytest.approx(62.5)}


def test_uncertainty_shrinks_with_consistent_measurements_and_grows_on_a_surprise():
    s = OnlineScorer(halflife=2)
    rel = []
    for speed in (1000, 1010, 990, 1000, 1005, 995):
        s.update_speed("w", speed)
        rel.append(s.rel_std("w"))
    assert rel[0] == pytest.approx(s.first_rel_std)
    assert all(b < a for a, b in zip(rel, rel[1:]))
    s.update_speed("w", 400)  # turned into a straggler
    assert s.rel_std("w") > rel[-1]
    assert 400 < s.score("w") < 1000


def test_rounds_without_rows_or_time_carry_no_information():
    s = OnlineScorer()
    s.update("idle", rows=0, busy_s=0.0)
    assert "idle" in s.workers and not s.is_measured("idle")
    s.update("w", rows=100, busy_s=1.0)
    s.update("w", rows=0, busy_s=0.5)
    assert s.score("w") == 100.0 and s.estimates["w"].n_updates == 1


def test_add_and_remove_workers_and_bad_input():
    s = OnlineScorer()
    s.update("a", 100, 1.0)
    s.add_worker("a")  # rejoined: may be another machine, start over
    assert not s.is_measured("a")
    s.remove_worker("a")
    s.remove_worker("never-seen")
    assert s.workers == []
    with pytest.raises(ValueError, match="halflife"):
        OnlineScorer(halflife=0)
    with pytest.raises(ValueError, match="first_rel_std"):
        OnlineScorer(first_rel_std=-1)
    with pytest.raises(ValueError, match="prior"):
        s.add_worker("b", prior=0)
    with pytest.raises(ValueError, match="speed"):
        s.update_speed("b", math.nan)
    with pytest.raises(KeyError):
        s.score("unknown")


# ---------------------------------------------------------------- probe on a real cluster


@pytest.fixture(scope="module")
def emulated():
    from distributed import Client

    from pipeline.cluster import local_cluster

    with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:
        yield cluster, client


@pytest.mark.timeout(90)
def test_probe_ratio_of_emulated_4_2_1_cluster_is_about_4(emulated):
    """The issue's acceptance test: fastest / slowest probe score within 15 % of 4.

    The emulation needs 1.75 of this machine's 2 cores. The machine is shared, and when other
    processes take a core the always-running fast worker loses most (measured: ~3.0 with
    one foreign core busy). So the probe is repeated a few times, each time measuring the
    CPU that processes outside this test used; a ratio out of bounds on a quiet machine
    fails at once; on a busy one it is retried, and after three busy attempts it fails too,
    with the load figures in the message (CI runs on a quiet machine).
    """
    _, client = emulated
    names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
    # This process hosts the scheduler and the nannies; the workers are child processes.
    pids = [os.getpid(), *client.run(os.getpid).values()]
    attempts = []
    for _ in range(3):
        busy0, own0, t0 = busy_cpu_seconds(), own_cpu_seconds(pids), time.perf_counter()
        scores = score_workers(client, LAYERS, seconds=3.0)
        wall = time.perf_counter() - t0
        foreign = (busy_cpu_seconds() - busy0 - (own_cpu_seconds(pids) - own0)) / wall
        by_name = {names[a]: v for a, v in scores.items()}
        ratio = by_name["worker-0"] / by_name["worker-2"]
        attempts.append(f"ratio {ratio:.2f} with {foreign:.2f} foreign cores busy")
        assert by_name["worker-0"] > by_name["worker-1"] > by_name["worker-2"], attempts
        if 3.4 <= ratio <= 4.6:
            print(attempts)  # shown with -rP
            return
        assert foreign > 0.25, f"probe ratio out of bounds on a quiet machine: {attempts}"
    pytest.fail(f"probe ratio out of bounds in every attempt (machine busy?): {attempts}")


@pytest.mark.timeout(60)
def test_score_workers_with_sample_rows_on_chosen_workers(emulated):
    _, client = emulated
    addresses = sorted(client.scheduler_info()["workers"])[:2]
    rng = np.random.RandomState(0)
    X = rng.standard_normal((300, 5))
    Y = np.eye(3, dtype=np.float32)[rng.randint(3, size=300)]
    t0 = time.perf_counter()
    scores = score_workers(
        client, (5, 16, 3), seconds=0.3, batch_size=64, X=X, Y=Y, workers=addresses
    )
    assert time.perf_counter() - t0 < 30
    assert set(scores) == set(addresses)
    assert all(v > 0 for v in scores.values())


def test_score_workers_needs_workers():
    class NoWorkers:
        def scheduler_info(self):
            return {"workers": {}}

    with pytest.raises(ValueError, match="no workers"):
        score_workers(NoWorkers(), LAYERS)

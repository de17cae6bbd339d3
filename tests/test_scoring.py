"""Tests of the speed estimators: OnlineScorer (pure) and the probe on a real cluster."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager

import numpy as np
import pytest

from benchmarks._common import busy_cpu_seconds, own_cpu_seconds
from hmdspt.core.nn import training_speed
from hmdspt.core.runlog import read_events
from hmdspt.core.speed import OnlineScorer, ProbeResult, chunk_speed, probe_pays
from hmdspt.parallel import worker
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.scoring import PROBE_MIN_S, probe_workers, score_workers
from hmdspt.parallel.worker import probe_task
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(7)  # probes on emulated clusters

LAYERS = (100, 128, 64, 10)  # the simulator's reference shape


# ------------------------------------------------------------------------- OnlineScorer
def test_scoring_module_imports_no_dask():
    code = (
        "import sys; from hmdspt.core.speed import OnlineScorer; "
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


# ------------------------------------------------------------ the probe, in this process
SMALL = (20, 32, 4)  # quick steps: tests of the stopping rules, not of speed


def test_chunk_speed_drops_hiccups_but_keeps_contention():
    rows = [100] * 20
    walls = [1.0] * 18 + [1.5, 10.0]  # one contended chunk, one hiccup
    speed, rel_se, dropped = chunk_speed(rows, walls)
    assert dropped == 1 and speed == pytest.approx(1900 / 19.5)  # the time average without it
    t = np.array(walls[:19]) / 100
    assert rel_se == pytest.approx(t.std(ddof=1) / math.sqrt(19) / t.mean())
    # The median ignores the contended chunk as well as the hiccup.
    assert chunk_speed(rows, walls, "median") == (100.0, 0.0, 0)
    assert chunk_speed([100], [1.0])[1] == math.inf  # one chunk: no spread known yet
    assert chunk_speed([100], [1.0], "median")[1] == math.inf
    with pytest.raises(ValueError, match="estimator"):
        chunk_speed(rows, walls, "mean")


def test_chunk_speed_keeps_slow_chunks_that_are_not_rare():
    """A worker under a CPU quota waits out the rest of each scheduling period inside one
    of its chunks: those are its speed, not hiccups (on the testbed at 100 ms, 4 of 11
    chunks of the 0.25-core worker were dropped and it read as fast as a whole core)."""
    quota_s, period_s, chunk_s = 0.025, 0.1, 0.008  # a 0.25-core worker's chunks
    walls, used = [], 0.0
    for _ in range(40):
        used += chunk_s
        waited = period_s - quota_s if used >= quota_s else 0.0
        used = 0.0 if waited else used
        walls.append(chunk_s + waited)
    speed, _, dropped = chunk_speed([1000] * 40, walls)
    assert dropped == 0 and speed == pytest.approx(40_000 / sum(walls))
    assert speed < 0.4 * 1000 / chunk_s  # near its quota, far from a whole core
    # The same chunks with one hiccup in twenty: that one goes.
    assert chunk_speed([1000] * 20, [chunk_s] * 19 + [10 * chunk_s])[2] == 1


def test_chunk_speed_relative_standard_errors_match_normal_theory():
    rng = np.random.default_rng(0)
    walls = rng.normal(1.0, 0.05, size=4000)
    rows = np.full(4000, 1000.0)
    speed, rel, dropped = chunk_speed(rows, walls)
    assert dropped == 0 and speed == pytest.approx(1000.0, rel=0.01)
    assert rel == pytest.approx(0.05 / math.sqrt(4000), rel=0.1)
    # se(median) of normal draws: sqrt(pi / 2) * sigma / sqrt(n)
    _, rel, _ = chunk_speed(rows, walls, "median")
    assert rel == pytest.approx(math.sqrt(math.pi / 2) * 0.05 / math.sqrt(4000), rel=0.1)


def test_adaptive_probe_stops_early_on_a_steady_worker():
    # Outside a worker nothing is throttled: a steady process, measured in a fraction of
    # the budget.
    r = probe_task(SMALL, batch_size=64, min_seconds=0.1, max_seconds=10.0, rel_tol=0.05)
    assert r["stop"] == "rel_tol", r
    assert 0.1 <= r["busy_s"] < 10.0
    assert r["chunks"] >= 8 and r["rel_se"] < 0.05
    assert r["rows"] == 64 * r["steps"]
    assert r["speed"] > 0 and r["mean_speed"] == pytest.approx(r["rows"] / r["busy_s"])
    assert r["speed"] == r["trimmed_speed"] and r["median_speed"] > 0
    r = probe_task(SMALL, batch_size=64, max_seconds=10.0, estimator="median")
    assert r["speed"] == r["median_speed"] and r["dropped"] == 0


def test_adaptive_probe_honours_max_seconds():
    r = probe_task(SMALL, batch_size=64, min_seconds=0.05, max_seconds=0.3, rel_tol=0.0)
    assert r["stop"] == "max_seconds"
    assert 0.3 <= r["busy_s"] < 0.3 + 0.25  # overrun: at most the last chunk


def test_adaptive_probe_row_budget_is_met_to_a_batch_but_never_below_the_minimum():
    # Budget above the minimum: stops at it, the last chunk cut to whole batches.
    r = probe_task(
        SMALL, batch_size=32, min_seconds=0.0, max_seconds=10.0, rel_tol=0.0, max_rows=20_000
    )
    assert r["stop"] == "max_rows"
    assert 20_000 <= r["rows"] < 20_000 + 32
    # Budget below the minimum: the minimum (min_seconds, 8 chunks) wins.
    r = probe_task(
        SMALL, batch_size=32, min_seconds=0.2, max_seconds=10.0, rel_tol=0.0, max_rows=10
    )
    assert r["stop"] == "max_rows"
    assert r["busy_s"] >= 0.2 and r["chunks"] >= 8
    assert r["busy_s"] < 2.0


def test_adaptive_probe_chunks_shrink_to_fit_a_row_budget(monkeypatch):
    # A budget of 8 chunks of 2 batches makes 2-batch chunks, not the default 16, so the
    # minimum of 8 chunks costs the budget's rows, not 8 x 16 batches. (The compute floor
    # of a chunk depends on this machine's speed: zero here, so the test does not.)
    monkeypatch.setattr(worker, "MIN_PROBE_CHUNK_CPU_S", 0.0)
    kw = dict(batch_size=32, min_seconds=0.0, max_seconds=10.0)
    r = probe_task(SMALL, rel_tol=0.0, max_rows=8 * 64, **kw)
    assert r["stop"] == "max_rows"
    assert (r["chunks"], r["rows"]) == (8, 8 * 64)
    # Without a budget the chunks keep their default length of 16 batches.
    r = probe_task(SMALL, rel_tol=1.0, **kw)
    assert r["rows"] == 16 * 32 * r["chunks"]
    # The floor: chunks never shrink below MIN_PROBE_CHUNK_CPU_S of compute.
    monkeypatch.setattr(worker, "MIN_PROBE_CHUNK_CPU_S", 1.0)
    r = probe_task(SMALL, rel_tol=1.0, max_rows=8 * 64, **kw)
    assert r["rows"] == 16 * 32 * r["chunks"]


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` at an odd address, as arrays may arrive through Dask's comms."""
    raw = np.empty(a.nbytes + 1, dtype=np.uint8)
    out = raw[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def test_probe_trains_on_aligned_copies_of_misaligned_sample_rows(monkeypatch):
    # A gather on misaligned rows is slower: the probe would score a cost that training
    # (on aligned shards) never pays.
    import hmdspt.parallel.worker as wt

    seen = []

    def recording_pass(model, optimizer, X, Y, *args, **kwargs):
        seen.append((X.flags.aligned, Y.flags.aligned))
        return real_pass(model, optimizer, X, Y, *args, **kwargs)

    real_pass = wt.minibatch_pass
    monkeypatch.setattr(wt, "minibatch_pass", recording_pass)
    rng = np.random.default_rng(0)
    X = _misaligned(rng.standard_normal((300, SMALL[0]), dtype=np.float32))
    Y = _misaligned(np.eye(SMALL[-1], dtype=np.float32)[rng.integers(SMALL[-1], size=300)])
    probe_task(SMALL, batch_size=32, X=X, Y=Y, min_seconds=0.0, max_seconds=0.05)
    assert seen and all(a and b for a, b in seen)


def test_probe_task_checks_its_settings():
    with pytest.raises(ValueError, match="seconds must be a finite number > 0"):
        probe_task(SMALL, seconds=0.0)
    with pytest.raises(ValueError, match="min_seconds <= max_seconds"):
        probe_task(SMALL, min_seconds=1.0, max_seconds=0.5)
    with pytest.raises(ValueError, match="rel_tol"):
        probe_task(SMALL, rel_tol=-0.1)
    with pytest.raises(ValueError, match="max_rows"):
        probe_task(SMALL, max_rows=0)
    with pytest.raises(ValueError, match="estimator"):
        probe_task(SMALL, estimator="mean")
    with pytest.raises(ValueError, match="hiccup_factor"):
        probe_task(SMALL, hiccup_factor=1.0)


# ---------------------------------------------------------------- probe on a real cluster
@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        (((20, 16, 3), float("nan")), {}, "seconds must be a finite number > 0, got nan"),
        (((20, 16, 3), float("inf")), {}, "seconds must be a finite number > 0, got inf"),
        (((20, 0, 3),), {}, r"layer_sizes must be a sequence of at least two whole numbers"),
        (("abc",), {}, r"layer_sizes must be a sequence .* got 'abc'"),
        (((20, 3), None, 0), {}, "batch_size and chunk_batches must be whole numbers >= 1"),
        (((20, 3),), {"max_seconds": float("nan")}, "max_seconds finite and > 0"),
        (((20, 3),), {"estimator": "mean"}, "estimator must be one of"),
        (((20, 3),), {"hidden_activation": "gelu"}, "hidden_activation must be one of"),
    ],
)
def test_score_workers_refuses_bad_settings_before_the_workers_see_them(
    client, caplog, args, options, match
):
    """One line, raised here: a probe of nan seconds had run for ever (its deadline was
    nan), and every other bad setting failed each worker's task, which logged its
    traceback, before the caller raised the first."""
    with caplog.at_level(logging.ERROR, logger="distributed.worker"):
        with pytest.raises(ValueError, match=match):
            score_workers(client, *args, **options)
    assert not [r for r in caplog.records if "Compute Failed" in r.getMessage()]


# ------------------------------------------------------------- when the probe can pay
def test_the_probe_pays_only_when_an_epochs_share_outlasts_its_least_time():
    # 10,000 rows on 2 workers at 50,000 rows/s: 0.1 s an epoch each.
    assert not probe_pays(10_000, 2, 50_000.0, probe_min_s=0.1)
    assert probe_pays(10_002, 2, 50_000.0, probe_min_s=0.1)
    assert probe_pays(10_000, 1, 50_000.0, probe_min_s=0.1)  # one worker holds them all
    for bad in ((10, 0, 1.0), (10, 2, 0.0), (10, 2, float("nan"))):
        with pytest.raises(ValueError, match="rows_per_s > 0 and n_workers >= 1"):
            probe_pays(*bad, probe_min_s=0.1)


def test_training_speed_times_steps_of_the_network_shape():
    speed = training_speed((20, 16, 3), 64, budget_s=0.005)
    assert math.isfinite(speed) and speed > 0
    regression = training_speed((20, 16, 1), 64, out_activation="identity", budget_s=0.005)
    assert math.isfinite(regression) and regression > 0


def test_a_fit_too_small_for_the_probe_to_pay_starts_on_equal_shares(client, tmp_path):
    """No probe: the log says why, the rows start equal, the rounds measure the workers."""
    from sklearn.datasets import make_classification

    from hmdspt import BPNNClassifier

    X, y = make_classification(
        n_samples=2000, n_features=10, n_informative=5, n_classes=3, random_state=0
    )
    log = tmp_path / "fit.jsonl"
    clf = BPNNClassifier(
        (16,), client=client, max_iter=3, rounds_per_epoch=2, random_state=0, run_log=log
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # too short to converge; slower than one process
        clf.fit(X, y)
    events = read_events(log)
    assert not [e for e in events if e["event"] == "score" and e["source"] == "probe"]
    first = next(e for e in events if e["event"] == "partition")
    assert first["round"] == 0
    assert first["unprobed"]["probe_min_s"] == PROBE_MIN_S
    assert 0 < first["unprobed"]["epoch_share_s"] <= PROBE_MIN_S
    rows = list(first["rows"].values())
    assert len(rows) == 2 and max(rows) - min(rows) <= 1
    assert all(w["score"] > 0 for w in clf.training_report_.values())  # measured online
    # The log has the speeds the rounds measured, once, whether or not rows moved.
    online = {e["worker"] for e in events if e["event"] == "score" and e["source"] == "online"}
    assert online == set(first["rows"])


@pytest.fixture(scope="module")
def emulated():
    from distributed import Client

    from hmdspt.parallel.cluster import local_cluster

    with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:
        yield cluster, client


def _foreign_cores(client, fn):
    """Run ``fn()``; its result and the cores processes outside this test used meanwhile."""
    # This process hosts the scheduler and the nannies; the workers are child processes.
    pids = [os.getpid(), *client.run(os.getpid).values()]
    busy0, own0, t0 = busy_cpu_seconds(), own_cpu_seconds(pids), time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    return result, (busy_cpu_seconds() - busy0 - (own_cpu_seconds(pids) - own0)) / wall


LOW, HIGH = 2 * 2**0.5, 4 * 2**0.5  # the geometric midpoints of 4 and its neighbours 2, 8


@pytest.mark.timeout(90)
def test_probe_ratio_of_emulated_4_2_1_cluster_is_about_4(emulated, machine_alone):
    """The probe tells a 4:2:1 cluster: its workers in speed order, and fastest / slowest
    nearer 4 than the 2 or 8 of a neighbouring mix (between 2*sqrt(2) and 4*sqrt(2)).

    How near 4 it comes (issue 3 asked within 15 %) is a speed, measured side by side by
    ``python -m benchmarks scoring``: on this host the median of three 2 s probes read 4.65
    once on a day its CPU ran at half speed. The emulated ratio varies from run to run, so
    the figure judged is the median of three probes (one when it is already within
    bounds). Each probe records the CPU used outside the test, which the failure message
    shows: foreign load slows the always-running fast worker most.

    A 2 s probe: the adaptive default (a few tenths of a second) is for training, where
    the online scorer refines it from the first round on.
    """
    _, client = emulated
    names = {a: w["name"] for a, w in scheduler_workers(client).items()}
    ratios, orders, attempts = [], [], []
    with machine_alone():  # the speeds the OS gives the workers, not another test's share
        for _ in range(3):
            result, foreign = _foreign_cores(
                client, lambda: probe_workers(client, LAYERS, seconds=2.0)
            )
            by_name = {names[a]: v for a, v in result.speeds.items()}
            ratios.append(by_name["worker-0"] / by_name["worker-2"])
            orders.append(by_name["worker-0"] > by_name["worker-1"] > by_name["worker-2"])
            attempts.append(
                f"ratio {ratios[-1]:.2f} (in order: {orders[-1]}) with {foreign:.2f} foreign "
                f"cores busy; probe took {result.wall_s:.2f} s"
            )
            if len(ratios) == 1 and orders[0] and LOW <= ratios[0] <= HIGH:
                break
    median = float(np.median(ratios))
    print(attempts)  # shown with -rP
    assert LOW <= median <= HIGH, f"median probe ratio {median:.2f}: {attempts}"
    assert 2 * sum(orders) > len(orders), f"workers out of speed order: {attempts}"


@pytest.mark.timeout(90)
def test_adaptive_probe_stops_early_on_steady_workers(emulated, machine_alone):
    """Every worker is measured to the tolerance and stops there, before the budget.

    The budget is raised above the default 2 s: on this 2-core machine, quiet, the slowest
    emulated worker's error after 2 s has been measured at 4.8-5.8 % (2026-12-01), either
    side of the 5 %, so the default budget would make the test a coin toss. Retried like the
    acceptance test, because a busy machine makes chunk speeds noisy.
    """
    _, client = emulated
    budget = 8.0
    attempts = []
    with machine_alone():  # the speeds' noise is the OS's, not another test's
        for _ in range(3):
            result, foreign = _foreign_cores(
                client, lambda: probe_workers(client, LAYERS, max_seconds=budget)
            )
            stops = {d["stop"] for d in result.details.values()}
            busy = max(d["busy_s"] for d in result.details.values())
            attempts.append(f"{result.summary()} with {foreign:.2f} foreign cores busy")
            assert stops <= {"rel_tol", "max_seconds"}, attempts
            assert busy < budget + 0.5, attempts  # the budget plus the last chunk
            if stops == {"rel_tol"}:
                # Stopped by the tolerance, not by the budget: that is what "early" means
                # here; how far before the budget is a speed, left to the benchmarks.
                details = result.details.values()
                assert all(d["rel_se"] < 0.05 and d["busy_s"] >= 0.1 for d in details)
                assert busy < budget, attempts
                return
    pytest.fail(f"probe ran to max_seconds in every attempt: {attempts}")


@pytest.mark.timeout(90)
def test_probe_rows_are_capped_by_a_fraction_of_an_epoch(emulated):
    _, client = emulated
    n_workers = len(scheduler_workers(client))
    # Budget above the minimum (min_seconds=0, 8 chunks of 16 batches of 32 rows): binding.
    n_total = 1_200_000
    result = probe_workers(
        client,
        LAYERS,
        batch_size=32,
        min_seconds=0.0,
        max_seconds=20.0,
        rel_tol=0.0,
        n_rows_total=n_total,
    )
    assert result.max_rows == int(0.05 * n_total / n_workers)
    assert {d["stop"] for d in result.details.values()} == {"max_rows"}
    assert result.rows <= 0.05 * n_total + n_workers * 32  # cut to whole batches
    assert result.epoch_fraction(n_total) == pytest.approx(result.rows / n_total)
    # Budget below the minimum: every worker still gets min_seconds and 8 chunks.
    result = probe_workers(
        client, LAYERS, min_seconds=0.1, max_seconds=20.0, rel_tol=0.0, n_rows_total=1000
    )
    for d in result.details.values():
        assert d["stop"] == "max_rows" and d["busy_s"] >= 0.1 and d["chunks"] >= 8
    assert max(d["busy_s"] for d in result.details.values()) < 5.0


@pytest.mark.timeout(60)
def test_score_workers_with_sample_rows_on_chosen_workers(emulated):
    _, client = emulated
    addresses = sorted(scheduler_workers(client))[:2]
    rng = np.random.RandomState(0)
    X = rng.standard_normal((300, 5))
    Y = np.eye(3, dtype=np.float32)[rng.randint(3, size=300)]
    scores = score_workers(
        client, (5, 16, 3), seconds=0.3, batch_size=64, X=X, Y=Y, workers=addresses
    )
    assert set(scores) == set(addresses)
    assert all(v > 0 for v in scores.values())


@pytest.mark.timeout(60)
def test_score_workers_fixed_seconds_is_the_original_probe(emulated):
    _, client = emulated
    result = probe_workers(client, (5, 16, 3), seconds=0.3, batch_size=64)
    for d in result.details.values():
        assert set(d) == {"rows", "steps", "busy_s", "speed"}
        assert d["busy_s"] >= 0.3 and d["speed"] == pytest.approx(d["rows"] / d["busy_s"])


def test_score_workers_needs_workers_and_consistent_settings(client):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=0, processes=False, **FREE_PORTS) as empty,
        Client(empty) as no_workers,
    ):
        with pytest.raises(ValueError, match="no workers"):
            score_workers(no_workers, LAYERS)
    with pytest.raises(ValueError, match="seconds fixes"):
        score_workers(client, LAYERS, seconds=1.0, n_rows_total=1000)
    with pytest.raises(ValueError, match="max_fraction"):
        score_workers(client, LAYERS, n_rows_total=1000, max_fraction=0)


def test_a_probe_that_outlasts_its_timeout_names_the_workers_still_probing(client):
    # It was a TimeoutError with no message ("hmdspt: error: TimeoutError: ").
    workers = scheduler_workers(client)
    with pytest.raises(TimeoutError) as raised:
        probe_workers(client, LAYERS, seconds=0.5, timeout=0.1)
    message = str(raised.value)
    assert message.startswith("the speed probe waited 0.1 s and ") and "\n" not in message
    for address, info in workers.items():
        assert f"{info['name']} ({address})" in message
    time.sleep(0.5)  # the cancelled probes' threads end before the next test


@contextmanager
def _one_of_two_workers_leaving():
    """A cluster of two worker threads, one of which closes 0.3 s from now."""
    import threading

    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        staying, leaving = sorted(scheduler_workers(client))
        (worker,) = [w for w in cluster.workers.values() if w.address == leaving]
        threading.Timer(0.3, lambda: cluster.sync(worker.close)).start()
        yield client, staying, leaving


def test_a_worker_that_leaves_during_a_probe_is_left_out_and_named():
    # Its probe, pinned to it, would never end: the wait ran out the timeout and failed.
    with _one_of_two_workers_leaving() as (client, staying, leaving):
        result = probe_workers(client, LAYERS, seconds=1.0, timeout=30)
    assert result.lost == [leaving]
    assert set(result.speeds) == set(result.details) == {staying}
    assert result.summary().endswith(f"; {leaving} left during it)")


def test_score_workers_names_a_worker_that_left_during_its_probe():
    # Its dict of speeds alone (as `hmdspt score` printed it) left the worker out unsaid.
    with _one_of_two_workers_leaving() as (client, staying, leaving):
        with pytest.warns(RuntimeWarning) as caught:
            speeds = score_workers(client, LAYERS, seconds=1.0, timeout=30)
    assert set(speeds) == {staying}
    assert [str(w.message) for w in caught] == [
        f"no speed for 1 worker(s) that left the cluster during the probe: {leaving}"
    ]


def test_score_workers_takes_the_cluster_as_the_estimators_client_does(client, tmp_path):
    """An address or a scheduler file (a client of its own, closed after), or the current
    client; None with no current client names what to pass."""
    address = client.scheduler.address
    layers = (5, 8, 3)
    assert set(score_workers(address, layers, seconds=0.05)) == set(scheduler_workers(client))
    with client.as_current():
        assert len(score_workers(None, layers, seconds=0.05)) == 2
    assert client.status == "running"  # the caller's client is left open
    # A worker to probe that is not in the cluster: named as such, not as one that left.
    with pytest.raises(ValueError, match="not workers of this cluster: tcp://192.0.2.9:1"):
        score_workers(client, layers, seconds=0.05, workers=["tcp://192.0.2.9:1"])
    # Without any client (a process of its own: this one has the fixture's): no new
    # cluster is started to be probed.
    code = (
        "from hmdspt import score_workers\n"
        "try:\n    score_workers(None, (5, 8, 3))\n"
        "except ValueError as e:\n    print(e)\n"
        "import distributed; assert not distributed.client._global_clients"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("score_workers: no current Dask client; pass a Client")


def test_probe_result_summary():
    r = ProbeResult(
        speeds={"a": 10.0, "b": 5.0},
        details={
            "a": {"rows": 100, "busy_s": 0.1, "stop": "rel_tol"},
            "b": {"rows": 50, "busy_s": 0.3, "stop": "max_rows"},
        },
        wall_s=0.35,
    )
    assert r.rows == 150 and r.epoch_fraction(1500) == pytest.approx(0.1)
    assert r.summary() == (
        "probe of 2 workers took 0.35 s (longest busy 0.30 s, 150 rows, "
        "stopped by max_rows/rel_tol)"
    )


def test_a_change_of_speed_restarts_the_estimate_after_two_rounds():
    s = OnlineScorer(halflife=2.0)
    for _ in range(5):
        s.update_speed("w", 1000.0)
    s.update_speed("w", 250.0)  # one round 4x slower: could be noise
    assert s.score("w") > 600
    s.update_speed("w", 250.0)  # confirmed: a straggler now
    assert s.score("w") == pytest.approx(250.0)
    s.update_speed("w", 1400.0)  # one fast outlier does not restart it
    assert s.score("w") < 700


def test_a_fit_that_skipped_the_probe_does_not_chase_the_noise_of_short_rounds(emulated, tmp_path):
    """Its first rounds' speeds stand in for the probe in the cost model: the rows move
    after the first round, and at most once more, when the workers' first windows of rounds
    replace those stand-ins (about 0.3 s of rounds, together: their rounds' wall time is
    one). The online scorer's speed of every round, which the plans took before, swung 2x
    between rounds of milliseconds and moved rows after almost every epoch (6.5 re-balances
    a fit on emulated digits, ``benchmarks/bench_probe_rule.py``)."""
    from sklearn.datasets import load_digits

    from hmdspt import BPNNClassifier

    _, client = emulated
    X, y = load_digits(return_X_y=True)
    log = tmp_path / "fit.jsonl"
    clf = BPNNClassifier(
        (64,),
        client=client,
        max_iter=20,
        batch_size=32,
        rounds_per_epoch=1,
        random_state=0,
        run_log=log,
        trainer_options={"reuse_speeds_s": 0.0},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # too short to converge; slower than one process
        clf.fit(X / 16.0, y)
    events = read_events(log)
    partitions = [e for e in events if e["event"] == "partition"]
    assert "unprobed" in partitions[0]
    assert len(partitions) <= 3, [p["round"] for p in partitions]

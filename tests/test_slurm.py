"""Integration tests against a real single-node SLURM (started by ci/slurm/start.sh).

Two pools of different sizes, a 1-core and a 2-core job, are submitted through ``sbatch``
by :func:`hmdspt.parallel.pools.start_pools` and attach to one scheduler; they are scored, an
HMDSPT fit runs on them end to end, and the run log must show both pools taking part with
rows following their scores. Then a pool's job is cancelled (``scancel``) and, in the
other test, retired by its ``--lifetime`` (the graceful way to meet a walltime) in the
middle of a fit, which must stop with a clear message instead of hanging.

Without a running SLURM they skip, naming how to start one (``bash ci/slurm/start.sh`` as
root, which installs Debian's slurm-wlm); CI sets ``HMDSPT_REQUIRE_ALL``, so there they fail.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from hmdspt.cli import main
from hmdspt.core.runlog import read_events, summarize
from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.pools import JobSubmissionError, PoolSpec, start_pools
from hmdspt.parallel.scoring import score_workers
from hmdspt.parallel.trainer import TrainingError
from tests.requires import missing

# Short fits on purpose: max_iter is reached long before convergence.
pytestmark = [
    pytest.mark.heavy(10),
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
]

START_HINT = (
    "these tests need a running single-node SLURM: start one with `bash ci/slurm/start.sh` "
    "as root (installs Debian's slurm-wlm; `bash ci/slurm/stop.sh` stops it)"
)


def _require_slurm() -> None:
    if not all(shutil.which(tool) for tool in ("sinfo", "sbatch", "scontrol")):
        missing(f"sinfo/sbatch/scontrol not found: {START_HINT}")
    # `scontrol ping` answers at once; sinfo retries a controller that is down for ~9 s.
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
    if "DOWN" in ping.stdout:
        first_line = ping.stdout.strip().splitlines()[0]
        missing(f"SLURM controller down (scontrol ping: {first_line!r}): {START_HINT}")
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        missing(f"sinfo timed out (controller down?): {START_HINT}")
    states = out.stdout.split()
    if out.returncode != 0 or not any(
        s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states
    ):
        missing(
            f"SLURM controller down or no usable node (sinfo: {out.stdout.strip()!r} "
            f"{out.stderr.strip()!r}): {START_HINT}"
        )


@pytest.fixture(scope="module")
def slurm_up():
    _require_slurm()


def _pools(**small_options) -> list[PoolSpec]:
    # CPUs=4 is advertised on 2 real cores (ci/slurm/start.sh) so both jobs run together.
    return [
        PoolSpec("small", cores=1, memory="1GiB", processes=1, options=small_options),
        PoolSpec("big", cores=2, memory="2GiB", processes=1),
    ]


def _common(tmp_path: Path) -> dict:
    return dict(
        interface="lo",
        walltime="00:10:00",
        log_directory=str(tmp_path / "slurm-logs"),
        death_timeout=60,
        # No worker dashboards: importing one (bokeh) costs each worker about a CPU-second,
        # and no test here looks at one.
        worker_extra_args=["--no-dashboard"],
    )


def _start(tmp_path: Path, pools: list[PoolSpec]):
    start = time.perf_counter()
    cluster = start_pools("slurm", pools, timeout=90, **_common(tmp_path))
    print(
        f"\nscale to all workers connected: {cluster.last_scale_s:.2f} s "
        f"(cluster object to connected {time.perf_counter() - start:.2f} s), "
        f"jobs {cluster.job_ids()}"
    )
    return cluster


def _data(n: int = 60_000, seed: int = 0):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n, n_features=40, n_informative=20, n_classes=5, random_state=seed
    )
    return X.astype(np.float32), y


def _squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return set(out.stdout.split())


@pytest.mark.timeout(150)
def test_two_pools_on_slurm_train_with_rows_following_scores(slurm_up, tmp_path):
    cluster = _start(tmp_path, _pools())
    job_ids = cluster.job_ids()
    with cluster, Client(cluster) as client:
        # Job scripts really carry each pool's resources.
        assert "--cpus-per-task=1" in cluster.job_script("small")
        assert "--cpus-per-task=2" in cluster.job_script("big")
        assert set(job_ids.values()) <= _squeue_ids()
        info = scheduler_workers(client)
        by_name = {w["name"]: w for w in info.values()}
        assert sorted(by_name) == ["big-0", "small-0"]
        assert by_name["small-0"]["nthreads"] == 1 and by_name["big-0"]["nthreads"] == 2
        assert by_name["small-0"]["resources"] == {"pool-small": 1}
        assert by_name["big-0"]["resources"] == {"pool-big": 1}
        assert cluster.workers_by_pool() == {"small": ["small-0"], "big": ["big-0"]}

        scores = score_workers(client, (40, 512, 256, 5), seconds=1.0)
        named = {info[a]["name"]: s for a, s in scores.items()}
        print("probe scores (rows/s):", {k: f"{v:,.0f}" for k, v in sorted(named.items())})
        assert all(s > 0 for s in named.values())

        X, y = _data()
        run_log = tmp_path / "run.jsonl"
        clf = BPNNClassifier(
            hidden_layer_sizes=(512, 256),
            max_iter=4,
            batch_size=256,
            rounds_per_epoch=1,
            random_state=0,
            client=client,
            run_log=run_log,
        )
        start = time.perf_counter()
        clf.fit(X, y)
        print(f"fit: {clf.n_iter_} epochs in {time.perf_counter() - start:.1f} s")
        assert clf.score(X[:5000], y[:5000]) > 0.5

    events = read_events(run_log)
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"
    rounds = [e for e in events if e["event"] == "round"]
    assert rounds and all(set(e["workers"]) == {"small-0", "big-0"} for e in rounds)
    assert all(e["workers"][w]["rows"] > 0 for e in rounds for w in e["workers"])

    # Rows follow the measured costs: the first split is proportional to the probe's
    # scores; a re-balance shortens the epoch its plan predicts from the costs logged
    # with it (speed and fixed seconds: a faster worker may still get fewer rows).
    latest: dict[str, dict] = {}
    partitions = checked = 0
    previous: dict[str, int] = {}
    for e in events:
        if e["event"] == "score":
            latest[e["worker"]] = e
        elif e["event"] == "partition":
            partitions += 1
            rows = e["rows"]
            if e["round"] == 0:  # the initial split is exactly proportional
                scores = {w: s["score"] for w, s in latest.items()}
                faster, slower = max(scores, key=scores.get), min(scores, key=scores.get)
                assert rows[faster] >= rows[slower]
                ratio = scores[faster] / scores[slower]
                assert rows[faster] / rows[slower] == pytest.approx(ratio, rel=0.01)
            elif e.get("rows_moved") and all("fixed_s" in s for s in latest.values()):

                def epoch_s(counts: dict[str, int]) -> float:
                    return max(s["fixed_s"] + counts[w] / s["score"] for w, s in latest.items())

                assert epoch_s(rows) < epoch_s(previous), (previous, rows, latest)
                checked += 1
            previous = rows
    print(f"partitions {partitions}, re-balances checked against their costs {checked}")
    assert partitions >= 1

    summary = summarize(events)
    idle = {w: summary["workers"][w]["idle_fraction"] for w in sorted(summary["workers"])}
    print(
        f"fastest worker {summary['fastest_worker']} idle fraction "
        f"{summary['fastest_idle_fraction']:.3f}; idle by worker "
        + ", ".join(f"{w} {v:.3f}" for w, v in idle.items())
        + f"; efficiency {summary['efficiency']:.3f}"
    )
    assert summary["fastest_worker"] in ("small-0", "big-0")
    # Jobs are cancelled when the cluster closes.
    deadline = time.monotonic() + 30
    while set(job_ids.values()) & _squeue_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(job_ids.values()) & _squeue_ids()


def _fit_losing_small(
    client, tmp_path: Path, trigger, max_iter: int, max_seconds: float | None = None
) -> tuple[str, float]:
    """Fit while pool ``small`` loses its worker; check the loss is reported, not hung on.

    ``trigger()`` runs in a thread once round 1 is logged. A trainer without recovery must
    stop with ``TrainingError("worker small-0 left the cluster during round N ...")``; one
    that recovers must log ``worker_lost`` for small-0 and finish on big-0 alone. Returns
    the outcome ("failed" or "recovered") and the seconds from round 1 to the fit's end.
    """
    X, y = _data(20_000)
    run_log = tmp_path / "run.jsonl"
    clf = BPNNClassifier(
        hidden_layer_sizes=(128,),
        max_iter=max_iter,  # outlasts the trigger, ends by itself
        tol=0.0,
        n_iter_no_change=max_iter,
        rounds_per_epoch=1,
        random_state=0,
        client=client,
        run_log=run_log,
        max_seconds=max_seconds,
    )
    fired: dict[str, float] = {}

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if run_log.exists() and any(e["event"] == "round" for e in read_events(run_log)):
                fired["at"] = time.perf_counter()
                trigger()
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    error = None
    try:
        clf.fit(X, y)
    except TrainingError as exc:
        error = exc
    took = time.perf_counter() - fired.get("at", time.perf_counter())
    watcher.join(timeout=5)
    assert "at" in fired, "the fit ended before the trigger"
    events = read_events(run_log)
    assert events[-1]["event"] == "run_end"
    if error is not None:
        print(f"fit failed {took:.1f} s after round 1: {error}")
        assert "worker small-0 left the cluster during round" in str(error)
        assert events[-1]["status"] == "failed"
        return "failed", took
    lost = [i for i, e in enumerate(events) if e["event"] == "worker_lost"]
    assert lost, "the fit completed but never noticed that small-0 left: pool loss is silent"
    assert events[lost[0]]["worker"] == "small-0"
    after = [e for e in events[lost[0] :] if e["event"] == "round"]
    assert after and all(set(e["workers"]) == {"big-0"} for e in after)
    assert events[-1]["status"] == "completed"
    print(f"fit recovered: small-0 lost in round {events[lost[0]]['round']}, {took:.1f} s")
    return "recovered", took


@pytest.mark.timeout(150)
def test_a_pool_adapts_on_slurm_submitting_and_cancelling_its_own_jobs(slurm_up, tmp_path):
    pools = [PoolSpec("small", count=0, cores=1, memory="1GiB", processes=1),
             PoolSpec("big", cores=1, memory="1GiB", processes=1)]  # fmt: skip
    cluster = _start(tmp_path, pools)
    with cluster, Client(cluster) as client:
        big_job = cluster.job_ids()["big-0"]
        cluster.adapt(
            pool="small", minimum_jobs=0, maximum_jobs=1, interval="200ms", wait_count=2,
            target_duration="1s",
        )  # fmt: skip
        # Load that lasts until the test lifts it (cancels it), however slowly the job
        # starts.
        futures = client.map(time.sleep, [90.0] * 16, pure=False)
        deadline = time.monotonic() + 60
        while cluster.workers_by_pool()["small"] != ["small-0"]:
            assert time.monotonic() < deadline, "the adaptive pool never grew"
            time.sleep(0.1)
        small_job = cluster.job_ids()["small-0"]
        assert small_job in _squeue_ids()  # a real SLURM job was submitted for it
        client.cancel(futures)
        del futures
        deadline = time.monotonic() + 60
        while cluster.workers_by_pool()["small"] or small_job in _squeue_ids():
            assert time.monotonic() < deadline, "the adaptive pool never gave its job back"
            time.sleep(0.2)
        assert cluster.pools["small"].count == 0
        assert cluster.workers_by_pool()["big"] == ["big-0"] and big_job in _squeue_ids()
    print(f"small-0 (job {small_job}) submitted under load and cancelled after it")


@pytest.mark.timeout(120)
def test_scancel_of_a_pool_job_mid_fit_is_reported_and_does_not_hang(slurm_up, tmp_path):
    cluster = _start(tmp_path, _pools())
    with cluster, Client(cluster) as client:
        job = cluster.job_ids()["small-0"]
        outcome, took = _fit_losing_small(
            client,
            tmp_path,
            lambda: subprocess.run(["scancel", job], check=True),
            max_iter=150,
        )
    print(f"scancel of job {job}: {outcome} after {took:.1f} s")  # a hang: the timeout


@pytest.mark.timeout(120)
def test_worker_lifetime_before_walltime_is_reported_and_does_not_hang(slurm_up, tmp_path):
    # dask-jobqueue's advice for walltimes: let workers retire themselves a little before
    # it (``--lifetime``); here 8 s after start, i.e. during the fit, which trains for 20 s
    # whatever the machine's speed (300 epochs, as before, took 6.9 s here by 2026-12-03).
    pools = _pools(worker_extra_args=["--lifetime", "8s"])
    cluster = _start(tmp_path, pools)
    assert "--lifetime 8s" in cluster.job_script("small")
    with cluster, Client(cluster) as client:
        outcome, took = _fit_losing_small(
            client, tmp_path, lambda: None, max_iter=10**6, max_seconds=20.0
        )
    print(f"--lifetime 8s: {outcome} after {took:.1f} s")  # a hang: the timeout


@pytest.mark.timeout(60)
def test_a_job_sbatch_refuses_is_one_line_naming_its_reason(slurm_up, tmp_path):
    """dask-jobqueue's error is a paragraph that starts 'Command exited with non-zero exit
    code.', and closing the cluster then raised an AssertionError in its place; the job of
    the pool sbatch took is cancelled."""
    before = _squeue_ids()
    pools = [
        PoolSpec("small", cores=1, memory="1GiB", processes=1, queue="no-such-partition"),
        PoolSpec("big", cores=2, memory="2GiB", processes=1),
    ]
    with pytest.raises(JobSubmissionError) as raised:
        start_pools("slurm", pools, timeout=30, **_common(tmp_path))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("sbatch failed (exit code 1): sbatch: error: ")
    assert "invalid partition" in message.lower(), message
    deadline = time.monotonic() + 20  # scancel'd jobs leave the queue within seconds
    while _squeue_ids() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _squeue_ids() - before


@pytest.mark.timeout(60)
def test_hmdspt_score_on_a_pool_sbatch_refuses_ends_in_one_line(slurm_up, tmp_path, capsys):
    config = tmp_path / "pools.yaml"
    config.write_text(
        "cluster: slurm\ncommon: {interface: lo, walltime: '00:10:00'}\n"
        "pools: {small: {cores: 1, memory: 1GiB, queue: no-such-partition}}\n"
    )
    assert main(["score", "--cluster-config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hmdspt: error: sbatch failed (exit code 1)"), err

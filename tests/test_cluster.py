"""Tests of the emulated local cluster, the throttle and ``connect`` (real worker processes),
and of the one HMDSPT worker plugin (in-process workers: its registration is what matters)."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster
from threadpoolctl import threadpool_info

from hmdspt.core.nn import MLP
from hmdspt.core.process import numpy_huge_page_advice
from hmdspt.estimator import _emulation_of
from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.cluster import EmulatedLocalCluster, connect, local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig
from hmdspt.parallel.worker import (
    WORKER_PLUGIN_NAME,
    HMDSPTWorkerPlugin,
    RoundSpec,
    ThrottleRecord,
    current_slowdown,
    get_slowdowns,
    probe_task,
    run_ids_held,
    set_slowdown,
    throttled,
)
from tests.clusters import FREE_PORTS
from tests.logs import kept_messages

pytestmark = pytest.mark.heavy(4)  # local clusters, some of processes

ROOT = Path(__file__).resolve().parents[1]


def _spin(cpu_seconds: float) -> None:
    """Burn about ``cpu_seconds`` of this thread's CPU time."""
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < cpu_seconds:
        x += sum(range(1000))


@pytest.fixture(scope="module")
def emulated():
    with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:
        yield cluster, client


def _by_name(client: Client) -> dict[str, str]:
    return {w["name"]: a for a, w in scheduler_workers(client).items()}


# ----------------------------------------------------------------- validation, no cluster
@pytest.mark.parametrize(
    "speeds",
    [(), [], (1, 0), (2, -1), (1, math.nan), (1, math.inf), ("4", 1), (True, 1), 4, "421"]
    + [(1e308, 1), (1, 2, 2001)],  # slower than the emulation goes (the sleep overflowed)
)
def test_local_cluster_rejects_bad_speeds(speeds):
    with pytest.raises(ValueError, match="speed"):
        local_cluster(speeds)


def test_speeds_may_be_any_iterable_of_numbers():
    import numpy as np

    from hmdspt.parallel.cluster import check_speeds

    assert check_speeds(np.array([4, 2, 1])) == (4.0, 2.0, 1.0)
    assert check_speeds(s for s in (3, 1.5)) == (3.0, 1.5)
    assert check_speeds((1000, 1)) == (1000.0, 1.0)  # the slowest the emulation goes


def test_throttle_sleeps_k_minus_one_times_thread_cpu():
    start = time.perf_counter()
    with throttled(slowdown=3) as record:
        _spin(0.03)
    wall = time.perf_counter() - start
    assert isinstance(record, ThrottleRecord)
    assert record.cpu_s >= 0.03
    assert record.sleep_s == pytest.approx(2 * record.cpu_s)
    assert wall >= record.cpu_s + record.sleep_s


def test_throttle_outside_a_worker_is_a_no_op():
    assert current_slowdown() == 1.0
    with throttled() as record:
        _spin(0.01)
    assert record.sleep_s == 0.0


@pytest.mark.parametrize("k", [0.5, 0, -1, math.nan, math.inf, "x", 1e308])
def test_throttle_rejects_bad_slowdown(k):
    with pytest.raises(ValueError, match="slowdown"):
        with throttled(slowdown=k):
            pass


@pytest.mark.parametrize("out_activation", ["softmax", "logistic", "identity"])
def test_probe_task_runs_real_steps_in_process(out_activation):
    result = probe_task((6, 8, 3), seconds=0.15, batch_size=32, out_activation=out_activation)
    assert result["steps"] >= 1
    assert result["rows"] == 32 * result["steps"]
    assert result["busy_s"] >= 0.15
    assert result["speed"] == pytest.approx(result["rows"] / result["busy_s"])
    assert set(result) == {"rows", "steps", "busy_s", "speed"}  # nothing about the slowdown


def test_probe_task_accepts_sample_rows_and_checks_them():
    import numpy as np

    X = np.random.RandomState(0).standard_normal((10, 4))  # float64, fewer rows than a batch
    result = probe_task((4, 5, 2), seconds=0.05, batch_size=16, X=X)
    assert result["rows"] % 16 == 0
    with pytest.raises(ValueError, match="X must have shape"):
        probe_task((3, 5, 2), seconds=0.05, X=X)
    with pytest.raises(ValueError, match="Y must have shape"):
        probe_task((4, 5, 2), seconds=0.05, X=X, Y=np.zeros((10, 4)))
    with pytest.raises(ValueError, match="Y must have shape"):
        probe_task((4, 5, 2), seconds=0.05, X=X, Y=np.zeros((9, 2)))
    # Weighted targets (one more column: the sample weights) are trained as rounds do.
    assert probe_task((4, 5, 2), seconds=0.05, batch_size=16, X=X, Y=np.ones((10, 3)))["rows"]


# ------------------------------------------------------------------------ real cluster
@pytest.mark.timeout(60)
def test_local_cluster_starts_neutrally_named_single_thread_workers(emulated):
    cluster, client = emulated
    assert isinstance(cluster, EmulatedLocalCluster)
    workers = scheduler_workers(client).values()
    assert sorted(w["name"] for w in workers) == ["worker-0", "worker-1", "worker-2"]
    assert [w["nthreads"] for w in workers] == [1, 1, 1]
    # One process per worker, none of them the test process.
    pids = client.run(os.getpid)
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
    assert cluster.emulation.speeds == {"worker-0": 4.0, "worker-1": 2.0, "worker-2": 1.0}
    assert cluster.emulation.slowdowns == {"worker-0": 1.0, "worker-1": 2.0, "worker-2": 4.0}
    assert "emulated speeds 4:2:1" in repr(cluster)


@pytest.mark.timeout(60)
def test_each_worker_gets_its_slowdown_and_one_blas_thread(emulated):
    _, client = emulated
    names = _by_name(client)
    slowdowns = get_slowdowns(client)
    assert {name: slowdowns[a] for name, a in names.items()} == {
        "worker-0": 1.0,
        "worker-1": 2.0,
        "worker-2": 4.0,
    }
    blas = client.run(threadpool_info)
    assert all(pool["num_threads"] == 1 for pools in blas.values() for pool in pools)


@pytest.mark.timeout(60)
def test_worker_processes_allocate_withoutnumpy_huge_page_advice(emulated):
    """The shards a worker receives land in memory mapped without huge pages (the kernel's
    compaction for them stalled the receiving workers: docs/design.md, "Round loop")."""
    _, client = emulated
    assert set(client.run(numpy_huge_page_advice).values()) == {False}


def test_in_process_workers_holdnumpy_huge_page_advice_off_until_the_last_of_them_closes():
    """In-process workers share the process's numpy: no huge page advice while any of them
    runs, the process's own setting back once they have all closed."""
    with _emulated_in_process() as cluster, Client(cluster) as client:
        during = numpy_huge_page_advice()
        client.retire_workers([next(iter(scheduler_workers(client)))], close_workers=True)
        with_one_left = numpy_huge_page_advice()
    after = numpy_huge_page_advice()
    assert (during, with_one_left, after) == (False, False, True)


def test_workers_asked_to_leave_numpy_alone_keep_its_huge_page_advice(advice_on):
    with local_cluster((2, 1), processes=False, blas_threads=None, numpy_huge_pages=None):
        during = numpy_huge_page_advice()
    assert during is True


@pytest.mark.parametrize("given", ["off", 0, 1])
def test_the_plugin_refuses_a_huge_page_advice_that_is_not_a_bool(given):
    with pytest.raises(ValueError, match=r"numpy_huge_pages must be True, False or None"):
        HMDSPTWorkerPlugin(numpy_huge_pages=given)


# In a fresh interpreter: OpenBLAS (0.3.31) ignores a thread count set from another thread
# once the main thread has set one, as earlier tests in this process may have.
IN_PROCESS_BLAS = """
import json
from distributed import Client
from threadpoolctl import threadpool_info
from hmdspt import local_cluster
from hmdspt.parallel.client import scheduler_workers

def blas():
    return sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})

before = blas()
with local_cluster(speeds=(2, 1), processes=False) as cluster, Client(cluster) as client:
    during = blas()
    client.retire_workers([next(iter(scheduler_workers(client)))], close_workers=True)
    with_one_left = blas()
print(json.dumps([before, during, with_one_left, blas()]))
"""


def test_in_process_workers_hold_one_blas_thread_until_the_last_of_them_closes():
    """In-process workers share the process's BLAS: one thread while any of them runs, the
    process's own limits back once they have all closed."""
    # Without the thread counts a Dask nanny started in this process wrote into its
    # environment (Nanny's pre-spawn-environ): BLAS starts as in a user's fresh interpreter.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "2"  # as on two cores, whatever this machine has
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", IN_PROCESS_BLAS], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    before, during, with_one_left, after = json.loads(run.stdout.splitlines()[-1])
    assert max(before) > 1
    assert during == with_one_left == [1]
    assert after == before


# The most natural first script: no `if __name__ == "__main__":`, so every worker process
# re-runs it as it starts.
UNGUARDED_SCRIPT = """
from hmdspt import local_cluster

with local_cluster(speeds=(2, 1)) as cluster:
    print("cluster up")
"""


def test_a_script_that_starts_a_cluster_unguarded_fails_at_once_naming_the_guard(tmp_path):
    """Each worker process says in one line what to do and exits; the driver stops at once
    (before, it waited out the 60 s start timeout and printed hundreds of traceback lines)."""
    script = tmp_path / "first.py"
    script.write_text(UNGUARDED_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "cluster up" not in run.stdout
    hints = [line for line in run.stderr.splitlines() if "ran again in a worker process" in line]
    assert len(hints) == 2, run.stderr  # one per worker process
    assert all('under `if __name__ == "__main__":`' in line for line in hints)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the cluster's worker processes failed to start"), last
    assert "WorkerStartTimeoutError" not in run.stderr


@pytest.mark.timeout(60)
def test_throttle_on_a_worker_applies_that_workers_slowdown(emulated):
    _, client = emulated
    address = _by_name(client)["worker-1"]  # k = 2

    # Nested, hence pickled by value: the worker need not import this test module.
    def chunk():
        start = time.perf_counter()
        with throttled() as record:
            cpu_start, x = time.thread_time(), 0
            while time.thread_time() - cpu_start < 0.05:
                x += sum(range(1000))
        return record.cpu_s, record.sleep_s, time.perf_counter() - start

    cpu, sleep, wall = client.submit(chunk, workers=[address], pure=False).result()
    assert sleep == pytest.approx(cpu)
    # Half the chunk's wall time (at least) is spent sleeping: CPU/wall <= 1/k.
    assert cpu / wall <= 0.5 + 1e-6


@pytest.mark.timeout(60)
def test_set_slowdown_changes_one_running_worker_only(emulated):
    _, client = emulated
    names = _by_name(client)
    before = get_slowdowns(client)
    target = names["worker-1"]
    try:
        set_slowdown(client, target, 6)
        after = get_slowdowns(client)
        assert after[target] == 6.0
        assert {a: k for a, k in after.items() if a != target} == {
            a: k for a, k in before.items() if a != target
        }
        with pytest.raises(ValueError, match="slowdown"):
            set_slowdown(client, target, 0.5)
    finally:
        set_slowdown(client, target, before[target])
    assert get_slowdowns(client) == before


@pytest.mark.timeout(120)
def test_a_restarted_worker_gets_its_slowdown_and_blas_limit_back(emulated):
    _, client = emulated
    before = _slowdowns_by_name(client)
    client.restart_workers([_by_name(client)["worker-2"]])
    assert before == {"worker-0": 1.0, "worker-1": 2.0, "worker-2": 4.0}
    assert _slowdowns_by_name(client) == before
    blas = client.run(threadpool_info, workers=[_by_name(client)["worker-2"]])
    assert all(pool["num_threads"] == 1 for pools in blas.values() for pool in pools)


@pytest.mark.timeout(60)
def test_connect_accepts_client_cluster_address_and_none(emulated):
    cluster, client = emulated
    assert connect(client) is client
    with connect(cluster) as c2:
        assert c2.scheduler.address == cluster.scheduler_address
    with connect(cluster.scheduler_address) as c3:
        assert len(scheduler_workers(c3)) == 3
    assert connect(None) is Client.current()
    with pytest.raises(TypeError, match="client must be a distributed.Client"):
        connect(42)


@pytest.mark.timeout(60)
def test_local_cluster_threads_and_clean_close():
    with local_cluster((1,), threads_per_worker=2) as cluster, Client(cluster) as client:
        (worker,) = scheduler_workers(client).values()
        assert worker["name"] == "worker-0" and worker["nthreads"] == 2
        assert cluster.emulation.slowdowns == {"worker-0": 1.0}
        pid = next(iter(client.run(os.getpid).values()))
    assert cluster.status.name == "closed"
    # The worker process is gone (allow the OS a moment to reap it).
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "worker process survived close()"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------- the one worker plugin (in-process)
OTHER_RUN = RoundSpec(
    run_id="other-run",
    layer_sizes=(4, 3, 2),
    hidden_activation="relu",
    out_activation="softmax",
    alpha=0.0,
    dtype="float32",
    optimizer={"solver": "adam", "learning_rate_init": 0.001},
    batch_size=8,
    mode="delta",
    new_epoch=True,
    rounds_left=1,
    learning_rate=0.001,
)


def _hold_run(spec: RoundSpec, dask_worker) -> None:
    """Start run ``spec.run_id``'s state on a worker, as its first round would."""
    dask_worker.plugins[WORKER_PLUGIN_NAME].state_for(spec)


def _hmdspt_plugins(dask_worker) -> list[str]:
    return sorted(name for name in dask_worker.plugins if name.startswith("hmdspt"))


def _slowdowns_by_name(client: Client) -> dict[str, float]:
    slowdowns = get_slowdowns(client)
    return {name: slowdowns[a] for name, a in _by_name(client).items()}


def _emulated_in_process(speeds=(2, 1)):
    return local_cluster(speeds, processes=False, blas_threads=None)


def _options_cluster(slowdowns: dict[str, float]) -> LocalCluster:
    """In-process workers each given its own plugin in its options: the scheduler does not
    know the plugin, so a fit's registration reaches every worker."""
    cluster = LocalCluster(n_workers=0, threads_per_worker=1, processes=False, **FREE_PORTS)
    template = cluster.new_spec
    for name, k in slowdowns.items():
        options = {**template["options"], "plugins": [HMDSPTWorkerPlugin(k)]}
        cluster.worker_spec[name] = {"cls": template["cls"], "options": options}
    cluster.scale(len(slowdowns))
    cluster.wait_for_workers(len(slowdowns))
    return cluster


def _short_fit(client: Client) -> str:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 20)).astype(np.float32)
    Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, len(X))]
    model = MLP((20, 16, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(partition="equal", warm_start_rows=0, ramp_rounds=0)
    trainer = Trainer(client, model, {"solver": "adam", "learning_rate_init": 0.003}, 64, config)
    trainer.fit(X, Y, max_epochs=2)
    return trainer.run_id


@pytest.mark.timeout(60)
def test_every_worker_has_one_hmdspt_plugin_holding_its_slowdown_and_its_runs():
    with _emulated_in_process() as cluster, Client(cluster) as client:
        client.run(_hold_run, OTHER_RUN)
        assert set(map(tuple, client.run(_hmdspt_plugins).values())) == {(WORKER_PLUGIN_NAME,)}
        for name, worker in cluster.workers.items():
            plugin = worker.plugins[WORKER_PLUGIN_NAME]
            assert isinstance(plugin, HMDSPTWorkerPlugin)
            assert plugin.slowdown == {"worker-0": 1.0, "worker-1": 2.0}[name]
            assert plugin.held() == ["other-run"]
        plugins = [w.plugins[WORKER_PLUGIN_NAME] for w in cluster.workers.values()]
        assert plugins[0] is not plugins[1]  # one interpreter, one plugin per worker


@pytest.mark.timeout(60)
@pytest.mark.parametrize("given", ["by local_cluster", "in worker options"])
def test_a_fit_registering_the_plugin_keeps_the_slowdowns_and_another_runs_state(given):
    if given == "by local_cluster":
        cluster = _emulated_in_process()
    else:
        cluster = _options_cluster({"worker-0": 1.0, "worker-1": 2.0})
    with cluster, Client(cluster) as client:
        set_slowdown(client, _by_name(client)["worker-0"], 3.0)  # a change made at run time
        client.run(_hold_run, OTHER_RUN)
        run_id = _short_fit(client)
        assert _slowdowns_by_name(client) == {"worker-0": 3.0, "worker-1": 2.0}
        held = client.run(run_ids_held)
        assert set(map(tuple, held.values())) == {("other-run",)}, (run_id, held)
        assert set(map(tuple, client.run(_hmdspt_plugins).values())) == {(WORKER_PLUGIN_NAME,)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("given", ["by local_cluster", "in worker options"])
def test_a_worker_that_joins_later_gets_the_plugin(given):
    if given == "by local_cluster":
        cluster = _emulated_in_process()
    else:
        cluster = _options_cluster({"worker-0": 1.0, "worker-1": 2.0})
    with cluster, Client(cluster) as client:
        if given == "in worker options":
            _short_fit(client)  # the fit's registration is what later workers get
        cluster.scale(3)
        client.wait_for_workers(3)
        assert set(map(tuple, client.run(_hmdspt_plugins).values())) == {(WORKER_PLUGIN_NAME,)}
        slowdowns = _slowdowns_by_name(client)
        assert {n: k for n, k in slowdowns.items() if n in ("worker-0", "worker-1")} == {
            "worker-0": 1.0,
            "worker-1": 2.0,
        }
        (joined,) = set(slowdowns) - {"worker-0", "worker-1"}
        assert slowdowns[joined] == 1.0  # not emulated: nobody gave it a slowdown
        client.run(_hold_run, OTHER_RUN, workers=[_by_name(client)[joined]])


@pytest.mark.timeout(60)
def test_unregistering_the_plugin_frees_the_run_state_it_held():
    with _emulated_in_process() as cluster, Client(cluster) as client:
        client.run(_hold_run, OTHER_RUN)
        models = [
            weakref.ref(w.plugins[WORKER_PLUGIN_NAME].runs["other-run"].state["model"])
            for w in cluster.workers.values()
        ]
        client.unregister_worker_plugin(WORKER_PLUGIN_NAME)
        deadline = time.monotonic() + 10
        while any(ref() is not None for ref in models):
            assert time.monotonic() < deadline, "a removed plugin's run state is still alive"
            gc.collect()
            time.sleep(0.05)


def test_the_commands_quiet_worker_logs_drop_only_what_the_command_says_itself():
    """A failed task's "Compute Failed" always (the command names the error); a failed
    heartbeat only once the worker is closing (its connections closed under it)."""
    import logging

    from distributed import LocalCluster

    from hmdspt.parallel.cluster import QuietWorkerLogs

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker", logging.ERROR, "", 0, message, (), None)

    heartbeat = record("Failed to communicate with scheduler during heartbeat.")
    compute_failed = record("Compute Failed\nKey: %s\n")
    with LocalCluster(n_workers=1, processes=False, **FREE_PORTS) as cluster:
        quiet = QuietWorkerLogs(cluster.workers[0])
        closing_only = QuietWorkerLogs(cluster.workers[0], compute_failed=False)
        assert not quiet.filter(compute_failed)
        assert closing_only.filter(compute_failed)  # local_cluster's: a user's task, shown
        for f in (quiet, closing_only):
            assert f.filter(heartbeat)  # a running worker that lost its scheduler: shown
            assert f.filter(record("Worker stream died during communication"))
    for f in (quiet, closing_only):
        assert not f.filter(heartbeat)  # the worker closed
        assert f.filter(record("Worker stream died during communication"))
    assert closing_only.filter(compute_failed)


def _quiet_filters(dask_worker) -> dict[str, list[bool]]:
    import logging

    from hmdspt.parallel.cluster import QUIETED_WORKER_LOGGERS, QuietWorkerLogs

    return {
        name: [
            f.compute_failed
            for f in logging.getLogger(name).filters
            if isinstance(f, QuietWorkerLogs) and f.worker is dask_worker
        ]
        for name in QUIETED_WORKER_LOGGERS
    }


def test_local_clusters_workers_drop_the_noise_of_their_close_and_the_commands_the_rest():
    """The README's cluster example printed a worker's "Failed to communicate with scheduler
    during heartbeat" traceback as its cluster closed (1 of 8 runs): ``local_cluster``'s
    worker processes quiet a closing worker's noise; a command's cluster quiets its
    workers' "Compute Failed" too, though ``local_cluster`` registered its plugin first."""
    from hmdspt import local_cluster
    from hmdspt.parallel.cluster import QUIETED_WORKER_LOGGERS, QuietWorkerLogsPlugin

    with local_cluster(speeds=(1,), **FREE_PORTS) as cluster, Client(cluster) as client:
        closing_only = dict.fromkeys(QUIETED_WORKER_LOGGERS, [False])
        assert list(client.run(_quiet_filters).values()) == [closing_only]
        client.register_plugin(QuietWorkerLogsPlugin())  # as the commands do
        both = dict.fromkeys(QUIETED_WORKER_LOGGERS, [False, True])
        assert list(client.run(_quiet_filters).values()) == [both]


_RELEASED = threading.Event()  # lets the task of an in-process worker below end


def _until_released() -> bool:
    return _RELEASED.wait(60)


def test_a_task_cancelled_by_the_commands_closing_cluster_logs_nothing():
    """A worker closed while it runs a task logs "Async instruction for <Task ...> ended
    with CancelledError" on ``distributed.worker.state_machine``: at the end of a command
    whose one worker's read failed, another still read its block, and the warning followed
    the command's one-line error (a run of the suite in a fresh venv failed on it)."""
    import logging

    from hmdspt.parallel.cluster import (
        QUIETED_WORKER_LOGGERS,
        QuietWorkerLogs,
        QuietWorkerLogsPlugin,
    )

    _RELEASED.clear()
    try:
        with (
            kept_messages("distributed.worker.state_machine") as messages,
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=False, **FREE_PORTS
            ) as cluster,
            Client(cluster) as client,
        ):
            client.register_plugin(QuietWorkerLogsPlugin())
            running = client.submit(_until_released, pure=False)
            deadline = time.monotonic() + 30
            while not any(client.processing().values()):
                assert time.monotonic() < deadline, "the task never started"
                time.sleep(0.01)
            # As the command's cluster closes; not waiting for the task's thread to end.
            client.sync(cluster.workers[0].close, executor_wait=False)
            del running
    finally:
        _RELEASED.set()
        for name in QUIETED_WORKER_LOGGERS:
            # The filters stay on a worker's loggers; here, the test process's.
            logger = logging.getLogger(name)
            for f in [f for f in logger.filters if isinstance(f, QuietWorkerLogs)]:
                logger.removeFilter(f)
    assert not [m for m in messages if "CancelledError" in m], messages


def test_n_workers_as_for_local_cluster_gives_that_many_workers_at_full_speed():
    with local_cluster(n_workers=2, processes=False) as cluster, Client(cluster) as client:
        assert len(scheduler_workers(client)) == 2
        assert set(cluster.emulation.slowdowns.values()) == {1.0}
        assert _emulation_of(client) is None  # nothing emulated: no "emulated" label
        with Client(cluster.scheduler_address) as by_address:
            assert _emulation_of(by_address) is None
    with local_cluster((2, 1), n_workers=2, processes=False) as cluster, Client(cluster) as c:
        assert cluster.emulation.slowdowns == {"worker-0": 1.0, "worker-1": 2.0}
        assert _emulation_of(c)["speeds"] == [2.0, 1.0]
        # Reached by its address, the cluster object unknown: the workers' slowdowns say.
        with Client(cluster.scheduler_address) as by_address:
            assert _emulation_of(by_address)["speeds"] == [2.0, 1.0]  # by worker name


@pytest.mark.parametrize(
    ("speeds", "n_workers", "match"),
    [
        ((4, 2, 1), 2, r"n_workers=2 disagrees with speeds \(4, 2, 1\) \(3 workers\)"),
        (None, 0, r"n_workers must be a positive integer, got 0"),
        (None, 1.5, r"n_workers must be a positive integer, got 1.5"),
    ],
)
def test_n_workers_that_is_not_a_count_or_disagrees_with_speeds_is_one_line(
    speeds, n_workers, match
):
    with pytest.raises(ValueError, match=match):
        local_cluster(speeds, n_workers=n_workers, processes=False)


def _blocked_signals(pid: int) -> int:
    """The signal mask (``SigBlk``) of a process's main thread, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk")), 16
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_worker_processes_start_with_sigint_blocked_and_the_caller_keeps_its_mask():
    """A Ctrl-C at the terminal goes to the driver and every worker process; one that came
    while a worker's interpreter started (before any handler of ours could be set) printed
    its traceback. The workers now begin with SIGINT blocked; the caller's mask is its own."""
    import dask

    sigint_bit = 1 << (signal.SIGINT - 1)
    mine = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    # Spawned, as by default: the tests' forkserver (conftest) passes on its own mask.
    with (
        dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}),
        local_cluster((2, 1)) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        assert all(_blocked_signals(pid) & sigint_bit for pid in pids.values()), pids
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mine
        for pid in pids.values():  # what the terminal sends them: held, not raised
            os.kill(pid, signal.SIGINT)
        assert client.run(os.getpid) == pids
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mine


def test_an_interrupt_while_the_workers_start_is_raised_and_leaves_no_process():
    """Ctrl-C while ``local_cluster`` starts its worker processes: the caller gets the
    ``KeyboardInterrupt`` (distributed's close of workers still starting raised an
    ``AssertionError`` in its place) and no worker process is left."""
    me = psutil.Process()

    def workers() -> set[int]:
        """Child processes but multiprocessing's servers, which outlive clusters by design."""
        found = set()
        for p in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = " ".join(p.cmdline())
                server = p.ppid() == me.pid and ("forkserver" in line or "resource_tracker" in line)
                if p.is_running() and not server:  # (a forkserver's workers carry its line)
                    found.add(p.pid)
        return found

    before = workers()

    def interrupt_once_a_worker_process_runs():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if workers() - before:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return
            time.sleep(0.005)

    # Python's own Ctrl-C handler: importing dask_jobqueue (tests/test_jobqueue_scripts.py
    # does, as the tests are collected) replaces it with one that raises SystemExit.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_a_worker_process_runs, daemon=True).start()
        with pytest.raises(KeyboardInterrupt), local_cluster((2, 1, 1)):
            time.sleep(60)  # (the interrupt comes while the workers start, not here)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while workers() - before:
        left = [psutil.Process(pid) for pid in workers() - before]
        assert time.monotonic() < deadline, [
            (p.pid, p.ppid(), p.status(), p.cmdline()[-1][:60]) for p in left
        ]
        time.sleep(0.05)

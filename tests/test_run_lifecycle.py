"""How a fit ends: interrupts, a full disk under the run log, a driver that dies.

Real signals, a real full file system (a small tmpfs) and real driver processes: a fit
must end with ``run_end`` in its log and leave no run state and no data on the workers,
whatever stopped it.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster, WorkerPlugin

from hmdspt.core.nn import MLP
from hmdspt.core.runlog import read_events
from hmdspt.parallel.trainer import Trainer, TrainerConfig
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(15)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

# A driver whose fit is interrupted: an in-process cluster, the estimator on it.
INTERRUPTED_DRIVER = """
import faulthandler, signal, sys, warnings
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump on a hang
import numpy as np
from distributed import Client, LocalCluster
from hmdspt.estimator import BPNNClassifier
from tests.clusters import FREE_PORTS  # no dashboard: its start costs ~0.4 s a process

rng = np.random.default_rng(0)
X = rng.standard_normal((20000, 20)).astype(np.float32)
y = rng.integers(0, 3, len(X))
with LocalCluster(
    n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS
) as cluster, Client(cluster) as client:
    clf = BPNNClassifier(
        (64,), client=client, max_iter=10**6, n_iter_no_change=10**6, run_log=sys.argv[1],
        partition="equal", random_state=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf.fit(X, y)
    # A SIGINT after the fit returned is this script's, not the fit's: landing in
    # LocalCluster.__exit__ it would make distributed wait 10 s for its loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("warned:", [str(w.message) for w in caught if "interrupted" in str(w.message)])
    print("predicted:", len(clf.predict(X[:10])), flush=True)
    print("run_id_:", clf.run_id_, "report:", sorted(clf.training_report_), flush=True)
"""

# A driver that trains on a cluster it reaches by address (the test's).
REMOTE_DRIVER = """
import sys
import numpy as np
from distributed import Client
from hmdspt.core.nn import MLP
from hmdspt.parallel.trainer import Trainer, TrainerConfig

rng = np.random.default_rng(0)
X = rng.standard_normal((8000, 20)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, len(X))]
model = MLP((20, 64, 3))
model.initialize(np.random.RandomState(0))
config = TrainerConfig(partition="equal", run_log=sys.argv[2], warm_start_rows=0)
with Client(sys.argv[1]) as client:
    trainer = Trainer(client, model, {"solver": "adam", "learning_rate_init": 0.003}, 64, config)
    trainer.fit(X, Y, max_epochs=10**6)
"""


def _rounds(log: Path) -> int:
    try:
        return sum(e["event"] == "round" for e in read_events(log))
    except FileNotFoundError:
        return 0


def _wait_for_rounds(log: Path, n: int, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 120
    while _rounds(log) < n:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the driver ended before round {n}: {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no round {n} in {log} within 120 s")
        time.sleep(0.01)


def _run_end(log: Path) -> list[dict]:
    return [e for e in read_events(log) if e["event"] == "run_end"]


def _interrupt_driver(tmp_path: Path, gaps_s: tuple[float, ...]) -> tuple[Path, str]:
    """Run INTERRUPTED_DRIVER, send it a SIGINT after its first round and one more after
    each gap; its run log and output."""
    log = tmp_path / "fit.jsonl"
    script = tmp_path / "driver.py"
    script.write_text(INTERRUPTED_DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_rounds(log, 1, proc)
        proc.send_signal(signal.SIGINT)
        for gap in gaps_s:
            time.sleep(gap)
            proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            # A hang must say where: every thread's stack, then the run log's end events.
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"the driver hung; run_end {_run_end(log)}; its output:\n{out[-20000:]}")
    finally:
        proc.kill()
        proc.wait()
    return log, out


def test_one_sigint_ends_the_run_with_run_end_stopped_and_keeps_the_model(tmp_path):
    log, out = _interrupt_driver(tmp_path, ())
    ends = _run_end(log)
    assert len(ends) == 1, out
    assert ends[0]["status"] == "stopped", ends[0]
    assert "interrupted" in ends[0]["reason"] and "KeyboardInterrupt" in ends[0]["reason"]
    # The estimator takes the interrupt as scikit-learn does: warns, keeps the model.
    assert "warned: ['Training interrupted by user.']" in out, out
    assert "predicted: 10" in out, out
    # The fitted attributes describe the interrupted fit.
    assert f"run_id_: {ends[0]['run_id']} report: [" in out, out


@pytest.mark.parametrize("gap_ms", [1, 3, 10])
def test_a_second_sigint_milliseconds_later_does_not_lose_run_end(tmp_path, gap_ms):
    log, out = _interrupt_driver(tmp_path, (gap_ms / 1000,))
    ends = _run_end(log)
    assert [e["status"] for e in ends] == ["stopped"], out


# A round's wait (call each worker, wait on the membership, cancel what is left) with a
# KeyboardInterrupt at its n-th point where a signal handler can run, for every n: after
# each, the event loop and the membership must still answer. A Ctrl-C once landed as a
# ``threading.Condition`` was entered and left its lock taken: the event loop then blocked
# on it, and the driver hung in the cluster's close.
INTERRUPT_POINTS_DRIVER = """
import asyncio, os, pickle, sys, threading, time
from distributed import Client, LocalCluster
from hmdspt.parallel.client import call_each
from hmdspt.parallel.membership import Membership
from tests.clusters import FREE_PORTS

# A handler runs as a Python function starts and after a C function returns (or fails),
# not between a C call's set-up and the call.
HANDLER_POINTS = {"call", "c_return", "c_exception"}

def nap(seconds):
    time.sleep(seconds)
    return seconds

def one_round(client, membership, workers, interrupt_at):
    seen = [0]
    def profile(frame, event, arg):
        if event in HANDLER_POINTS:
            seen[0] += 1
            if seen[0] == interrupt_at:
                sys.setprofile(None)
                raise KeyboardInterrupt
    call = {"function": pickle.dumps(nap), "args": pickle.dumps((0.02,))}
    pending = set(call_each(client, "run", {w: call for w in workers}).values())
    try:
        sys.setprofile(profile)
        try:
            while pending:
                done, gone = membership.wait_any(pending, workers)
                pending -= done
                for reply in done:
                    reply.result()
        finally:
            for reply in pending:
                reply.cancel()
            sys.setprofile(None)
    except KeyboardInterrupt:
        return seen[0], True
    return seen[0], False

def stuck(client, membership):
    ping = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), client.loop.asyncio_loop)
    try:
        ping.result(timeout=10)
    except TimeoutError:
        return "the event loop is blocked"
    reader = threading.Thread(target=membership.live, daemon=True)
    reader.start()
    reader.join(10)
    return "the membership's lock is held" if reader.is_alive() else None

with LocalCluster(
    n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS
) as cluster, Client(cluster) as client, Membership(client) as membership:
    workers = sorted(client.scheduler_info()["workers"])
    points, _ = one_round(client, membership, workers, 0)
    interrupted = 0
    for n in range(1, points + 1):
        interrupted += one_round(client, membership, workers, n)[1]
        problem = stuck(client, membership)
        if problem:
            print(f"a KeyboardInterrupt at point {n} of {points}: {problem}", flush=True)
            os._exit(1)
    print(f"points {points} interrupted {interrupted}", flush=True)
"""


def test_a_ctrl_c_anywhere_in_a_rounds_wait_leaves_no_lock_taken(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(INTERRUPT_POINTS_DRIVER)
    done = subprocess.run(
        [sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=300
    )
    found = re.search(r"points (\d+) interrupted (\d+)", done.stdout)
    assert done.returncode == 0 and found, done.stdout + done.stderr[-5000:]
    points, interrupted = map(int, found.groups())
    # Most points stop the wait (a few land in a finalizer, which swallows them).
    assert points >= 10 and interrupted >= points / 2, (points, interrupted)


def test_a_second_ctrl_c_while_the_fit_stops_is_noted_not_raised(sigint_raises):
    """Raised as the fit unwinds, it could land as a ``threading.Condition`` is entered
    (cancelling a call, waiting on a future) and leave that lock taken for good."""
    from hmdspt.parallel.lifecycle import InterruptWatch

    watch = InterruptWatch().install()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))  # bytecodes for the handler to run in
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))
        assert watch.pending
    finally:
        watch.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _InterruptsWhenCollected:
    """Sends this process a SIGINT from its ``__del__``: Python then raises the
    KeyboardInterrupt inside the finalizer, which prints "Exception ignored" and drops it,
    as it does when a Ctrl-C lands in distributed's ``Future.__del__``."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))  # bytecodes for the handler to run in, still inside __del__


def _fit_interrupted_after_round_one(cluster, log: Path, interrupt) -> None:
    """Fit on ``cluster`` until ``interrupt()``, called after round one's score, stops it
    with a KeyboardInterrupt (the test fails if none comes)."""
    X, Y = _data()
    calls = []

    def evaluate(params) -> float:
        calls.append(1)
        if len(calls) == 2:  # round one's score (a thread's: the signal reaches the loop)
            interrupt()
        return 0.0

    with Client(cluster) as client:
        trainer = _trainer(client, run_log=str(log), rounds_per_epoch=4, eval_resolution=0)
        with pytest.raises(KeyboardInterrupt):
            trainer.fit(X, Y, max_epochs=50, evaluate=evaluate)


def test_a_second_sigint_as_the_fit_takes_its_watch_down_does_not_lose_run_end(
    cluster, tmp_path, sigint_raises, monkeypatch
):
    """The window a 3 ms gap once hit under load: the second Ctrl-C lands as the clean-up
    takes the fit's interrupt watch down, before the clean-up holds interrupts back."""
    from hmdspt.parallel.lifecycle import InterruptWatch

    uninstall, second = InterruptWatch.uninstall, []

    def uninstall_as_a_second_sigint_lands(self) -> None:
        if not second:
            second.append(1)
            signal.raise_signal(signal.SIGINT)  # its handler runs before the next line
        uninstall(self)

    monkeypatch.setattr(InterruptWatch, "uninstall", uninstall_as_a_second_sigint_lands)
    log = tmp_path / "fit.jsonl"
    _fit_interrupted_after_round_one(cluster, log, lambda: signal.raise_signal(signal.SIGINT))
    assert second, "the second SIGINT was not sent"
    assert [e["status"] for e in _run_end(log)] == ["stopped"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


def _interrupt_inside_a_lock_wait() -> None:
    """What a Ctrl-C inside ``threading.Condition.wait`` raises (seen in CI with a 1 ms
    gap): the lock's own error, raised while the KeyboardInterrupt is handled."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise RuntimeError("release unlocked lock")  # noqa: B904 (as threading raises it)


def test_a_sigint_that_surfaces_as_a_lock_error_still_ends_the_run_stopped(cluster, tmp_path):
    log = tmp_path / "fit.jsonl"
    _fit_interrupted_after_round_one(cluster, log, _interrupt_inside_a_lock_wait)
    assert [e["status"] for e in _run_end(log)] == ["stopped"]
    assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallow
def test_a_sigint_a_finalizer_swallows_still_stops_the_fit(cluster, tmp_path, sigint_raises):
    log = tmp_path / "fit.jsonl"
    # The object is collected at once: its SIGINT's KeyboardInterrupt is swallowed.
    _fit_interrupted_after_round_one(cluster, log, _InterruptsWhenCollected)
    assert [e["status"] for e in _run_end(log)] == ["stopped"]
    assert _rounds(log) <= 3, "the fit went on after the interrupt"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


# ----------------------------------------------------------------------------------
# A full disk under the run log
# ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster:
        yield cluster


def _data(n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 20)).astype(np.float32)
    return X, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


def _trainer(client: Client, **config) -> Trainer:
    model = MLP((20, 32, 3))
    model.initialize(np.random.RandomState(0))
    config = TrainerConfig(partition="equal", warm_start_rows=0, ramp_rounds=0, **config)
    return Trainer(client, model, {"solver": "adam", "learning_rate_init": 0.003}, 64, config)


def _quieted(worker) -> list[str]:
    """The worker's callbacks a quiet run changes that are not as the worker set them up:
    the profiler running, the tick every ``distributed.admin.tick.interval``."""
    import dask
    from dask.utils import parse_timedelta

    from hmdspt.parallel.worker import QUIET_CALLBACKS

    tick_ms = 1000 * parse_timedelta(dask.config.get("distributed.admin.tick.interval"))
    own = {"profile": None, "profile-cycle": None, "tick": tick_ms}
    assert set(own) == set(QUIET_CALLBACKS)
    quieted = []
    for name, period in own.items():
        callback = worker.periodic_callbacks[name]
        if not callback.is_running() or (period is not None and callback.callback_time != period):
            quieted.append(name)
    return quieted


def _leftovers(cluster: LocalCluster) -> dict[str, dict]:
    """What each worker still holds: any data, HMDSPT run state, keys of ended runs, and
    its profiler or tick still quieted for a run."""
    from hmdspt.parallel.worker import orphan_keys, run_ids_held

    left = {}
    for name, worker in cluster.workers.items():
        held = {
            "data": sorted(map(str, worker.data)),
            "runs": run_ids_held(worker),
            "orphan_keys": orphan_keys(worker),
            "quieted": _quieted(worker),
        }
        if any(held.values()):
            left[name] = held
    return left


# How long a fit's clean-up may leave the scheduler's release of its keys in flight.
RUN_END_CLEANUP_S = 10.0


def _wait_until_clean(cluster: LocalCluster, timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while (left := _leftovers(cluster)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("quiet", [True, False])
def test_a_fit_quiets_the_workers_profiler_and_tick_and_gives_them_back(cluster, quiet):
    """``quiet_workers``: from the first round the workers' profiler is stopped and their
    tick slowed; after the fit both are as before. With False they are never touched."""
    X, Y = _data()
    during = []
    with Client(cluster) as client:
        assert _leftovers(cluster) == {}
        trainer = _trainer(client, rounds_per_epoch=3, quiet_workers=quiet)
        on_round = lambda record: during.append([_quieted(w) for w in cluster.workers.values()])  # noqa: E731
        trainer.fit(X, Y, max_epochs=1, on_round=on_round)
    assert len(during) == 3
    quieted = ["profile", "profile-cycle", "tick"] if quiet else []
    assert all(state == [quieted] * 2 for state in during), during
    assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


def test_a_quiet_round_as_a_task_quiets_its_worker_until_its_run_ends(cluster):
    """``round_task`` (the benchmarks' loop) honours ``quiet_workers`` as a fit's round
    calls do, from its worker thread; ending the run from the driver gives them back."""
    from hmdspt.core.shard import Shard
    from hmdspt.parallel.worker import RoundSpec, drop_run_state, round_task

    X, Y = _data(500)
    model = MLP((20, 32, 3))
    model.initialize(np.random.RandomState(0))
    spec = RoundSpec(
        run_id="quiet-task", layer_sizes=(20, 32, 3), hidden_activation="relu",
        out_activation="softmax", alpha=0.0, dtype="float32",
        optimizer={"solver": "adam", "learning_rate_init": 0.003}, batch_size=64,
        mode="delta", new_epoch=True, rounds_left=1, learning_rate=0.003, quiet_workers=True,
    )  # fmt: skip
    shard = Shard(X=X, y=Y, row_ids=np.arange(len(X), dtype=np.int64))
    address = next(iter(cluster.scheduler.workers))
    worker = next(w for w in cluster.workers.values() if w.address == address)
    with Client(cluster) as client:
        result = client.submit(round_task, shard, model.params, spec, workers=[address]).result()
        assert result["rows"] == len(X)
        deadline = time.monotonic() + RUN_END_CLEANUP_S  # quieted from the task's thread
        while _quieted(worker) != ["profile", "profile-cycle", "tick"]:
            assert time.monotonic() < deadline, _quieted(worker)
            time.sleep(0.05)
        client.run(drop_run_state, "quiet-task", workers=[address])
    assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


def test_a_full_disk_under_the_run_log_stops_the_log_not_the_fit(cluster, disk):

    X, Y = _data()
    with Client(cluster) as client:
        log = disk / "fit.jsonl"
        trainer = _trainer(client, run_log=str(log), rounds_per_epoch=4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = trainer.fit(X, Y, max_epochs=8)  # ~30 events fit in 8 KiB
        assert len(history) == 32  # the fit went on to its end
        stopped = [str(w.message) for w in caught if "run log" in str(w.message)]
        assert len(stopped) == 1, stopped
        assert re.fullmatch(
            rf"run log {re.escape(str(log))} stopped after \d+ events: "
            r"\[Errno 28\] No space left on device; training goes on",
            stopped[0],
        ), stopped[0]
        assert trainer.log.closed
        data = log.read_bytes()
        assert data.endswith(b"\n")
        assert read_events(log, strict=True)  # every line parses
        assert 0 < _rounds(log) < 32
        assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}


def test_a_fit_whose_run_log_is_under_a_file_fails_before_training(cluster, tmp_path):
    (tmp_path / "runs").write_text("a file, not a folder")
    X, Y = _data()
    with Client(cluster) as client:
        trainer = _trainer(client, run_log=str(tmp_path / "runs" / "fit.jsonl"))
        with pytest.raises(ValueError, match=r"runs is a file, not a folder$"):
            trainer.fit(X, Y, max_epochs=1)
        assert trainer.history == [] and trainer.staged is None


# ----------------------------------------------------------------------------------
# Leaks when a round is interrupted or the driver dies
# ----------------------------------------------------------------------------------
class OnNextTransition(WorkerPlugin):
    """Once armed, calls ``action`` when the next key makes the transition ``start`` (any if
    None) to ``finish`` on the worker, and records which runs the worker held just then.

    ``released -> memory`` is a scattered key landing (the only way a key goes from released
    straight to memory), before the worker has answered, so the driver has not yet told the
    scheduler.
    """

    def __init__(self, action, start="released", finish="memory", key_prefix="") -> None:
        self.action = action
        self.start, self.finish, self.key_prefix = start, finish, key_prefix
        self.armed = threading.Event()
        self.fired = threading.Event()
        self.held: list[str] = []
        self.worker = None

    def setup(self, worker) -> None:
        self.worker = worker

    def transition(self, key, start, finish, **kwargs) -> None:
        if not self.armed.is_set() or self.fired.is_set() or finish != self.finish:
            return
        if self.start is not None and start != self.start:
            return
        if str(key).startswith(self.key_prefix):
            from hmdspt.parallel.worker import run_ids_held

            self.fired.set()
            self.held = run_ids_held(self.worker)
            self.action()


def _arm_on_every_worker(cluster: LocalCluster, action, **when) -> list[OnNextTransition]:
    plugins = []
    for worker in cluster.workers.values():
        plugin = OnNextTransition(action, **when)
        cluster.sync(worker.plugin_add, plugin=plugin, name="test-on-next-transition")
        plugins.append(plugin)
    return plugins


class OnNextRound:
    """Once armed, calls ``action`` as the next round starts on ``worker`` (its round handler
    is called, :data:`hmdspt.parallel.worker.ROUND_OP`), and records which runs the worker
    held just then; the same interface as :class:`OnNextTransition`."""

    def __init__(self, action, worker) -> None:
        from hmdspt.parallel.worker import ROUND_OP

        self.action, self.worker = action, worker
        self.armed, self.fired = threading.Event(), threading.Event()
        self.held: list[str] = []
        handler = worker.handlers[ROUND_OP]  # set up by the fit's worker plugin

        async def round_started(**kwargs):
            if self.armed.is_set() and not self.fired.is_set():
                from hmdspt.parallel.worker import run_ids_held

                self.fired.set()
                self.held = run_ids_held(self.worker)
                self.action()
            return await handler(**kwargs)

        worker.handlers[ROUND_OP] = round_started
        self.restore = lambda: worker.handlers.__setitem__(ROUND_OP, handler)


def test_an_interrupted_round_leaves_no_state_or_keys_after_the_fit_ends(
    cluster, tmp_path, sigint_raises
):
    """A Ctrl-C as a round's calls (``w_t`` with them) land on the workers, after round 2."""
    X, Y = _data(8000)
    main = threading.main_thread().ident
    log = tmp_path / "fit.jsonl"
    plugins: list[OnNextRound] = []

    def arm() -> None:
        _wait_for_rounds(log, 2)  # the fit has set up its round handlers by now
        sigint = lambda: signal.pthread_kill(main, signal.SIGINT)  # noqa: E731
        plugins.extend(OnNextRound(sigint, w) for w in cluster.workers.values())
        for plugin in plugins:
            plugin.armed.set()

    try:
        with Client(cluster) as client:
            trainer = _trainer(client, run_log=str(log))
            threading.Thread(target=arm, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                trainer.fit(X, Y, max_epochs=10**6)
            assert any(p.fired.is_set() for p in plugins)
            assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}
    finally:
        for plugin in plugins:
            plugin.restore()
    assert [e["status"] for e in _run_end(log)] == ["stopped"]


# How long the workers may take to forget a SIGKILLed driver's run: the scheduler sees the
# driver's connection close (the kernel closes a killed process's sockets), then has every
# worker end the driver's runs. A bound for a loaded machine, not a measure of speed.
DRIVER_GONE_CLEANUP_S = 30.0

#: When the driver is killed: what lands on the workers just then (a round's start, its
#: call with w_t, is caught by OnNextRound instead).
KILL_POINTS = {
    "staging": dict(start="released", finish="memory"),  # its first shard lands
    "round": None,  # a round's call and its w_t land, after round 2
}


@pytest.mark.parametrize("during", list(KILL_POINTS))
def test_a_killed_driver_leaves_no_run_state_or_keys_on_the_workers(tmp_path, during):
    """SIGKILLed mid-fit: as its first shard lands, or as a round's call with ``w_t`` lands
    after round 2 (its state on the workers then); within
    ``DRIVER_GONE_CLEANUP_S`` the workers hold nothing of the run."""
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",  # the driver is another process
        host="127.0.0.1",
        scheduler_port=0,
        **FREE_PORTS,
    ) as cluster:
        log = tmp_path / "fit.jsonl"
        script = tmp_path / "driver.py"
        script.write_text(REMOTE_DRIVER)
        proc = subprocess.Popen(
            [sys.executable, str(script), cluster.scheduler_address, str(log)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            kill = lambda: os.kill(proc.pid, signal.SIGKILL)  # noqa: E731
            if KILL_POINTS[during] is not None:
                plugins = _arm_on_every_worker(cluster, kill, **KILL_POINTS[during])
            if during != "staging":
                _wait_for_rounds(log, 2, proc)
            if KILL_POINTS[during] is None:  # the fit has set up its round handlers by now
                plugins = [OnNextRound(kill, w) for w in cluster.workers.values()]
            for plugin in plugins:
                plugin.armed.set()
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        fired = [p for p in plugins if p.fired.is_set()]
        assert fired
        (run_id,) = {e["run_id"] for e in read_events(log)}
        if during != "staging":  # the run's state was on the worker when its driver died
            assert all(p.held == [run_id] for p in fired), [p.held for p in fired]
        assert _wait_until_clean(cluster, DRIVER_GONE_CLEANUP_S) == {}


def test_a_fit_that_fails_leaves_no_run_state_or_keys_on_the_workers(cluster, tmp_path):
    X, Y = _data(8000)
    log = tmp_path / "fit.jsonl"
    held_at_failure = []

    def fail_after_round_two(record) -> None:
        if record.round >= 2:
            held_at_failure.append(_leftovers(cluster))
            raise RuntimeError("a failure inside the fit")

    with Client(cluster) as client:
        trainer = _trainer(client, run_log=str(log))
        with pytest.raises(RuntimeError, match="a failure inside the fit"):
            trainer.fit(X, Y, max_epochs=10**6, on_round=fail_after_round_two)
        (at_failure,) = held_at_failure
        assert sorted(at_failure) == sorted(cluster.workers), at_failure
        assert all(w["runs"] == [trainer.run_id] for w in at_failure.values()), at_failure
        assert _wait_until_clean(cluster, RUN_END_CLEANUP_S) == {}
    assert [e["status"] for e in _run_end(log)] == ["failed"]

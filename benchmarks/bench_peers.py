"""HMDSPT beside its peers on the testbed (OS-enforced CPU quotas), on the user's clock.

Same data, model, optimizer, epochs and target for every system, on one
:class:`benchmarks.testbed.Testbed` (three slots at 1, 0.5 and 0.25 core by default):

- ``BPNNClassifier(client=None)`` and scikit-learn's ``MLPClassifier``, each in one
  process in the fastest slot;
- HMDSPT (``BPNNClassifier(client=...)``) with proportional and with equal shares, one
  Dask worker per slot;
- PyTorch DDP (gloo, ``DistributedSampler``), one rank per slot, at a global batch of
  about 256 and at 256 per rank (HMDSPT's per-worker batch);
- Spark MLlib's ``MultilayerPerceptronClassifier`` on a standalone cluster (master on
  the driver side, one 1-core worker per slot, its executors in the slot's group), with
  both of its solvers.

Data: the embedded default data set (``hmdspt train``'s, ``hmdspt.cli``), standardized,
written once to a temporary ``.npz`` that every peer reads (Spark: Parquet files of the
same arrays). Model: MLP (128, 64), ReLU, softmax output, Adam at 1e-3, batch 256,
8 epochs. Target: scikit-learn's median final test accuracy in this run minus 1 point.
Every accuracy curve scores the same 20,000 held-out rows; final accuracies use the whole
test set. Times run from the user's call (``fit()``, or the launch of the peer's command)
with the time spent scoring held-out rows left out where it can be measured: the table
says how for each system. The peers are installed into their own venv by
``benchmarks.peers.install``, never as dependencies of the package.

Run: ``python -m benchmarks peers`` or ``python -m benchmarks.bench_peers [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from hmdspt.cli import DEFAULT_SAMPLES
from hmdspt.compare import RunResult, held_out_sample, log_figures

from .testbed import LABEL, Testbed, unavailable_reason

PEERS_DIR = Path(__file__).resolve().parent / "peers"
DDP_SCRIPT = PEERS_DIR / "ddp_train.py"
SPARK_SCRIPT = PEERS_DIR / "spark_mlp.py"
REPO_ROOT = Path(__file__).resolve().parents[1]
HIDDEN = (128, 64)
BATCH = 256
LEARNING_RATE = 1e-3
TARGET_DROP = 0.01
EVAL_ROWS = 20_000
RUN_TIMEOUT_S = 900.0  # one fit of any system; a hung peer is killed, not waited for
SPARK_TIMEOUT_S = 1200.0  # one Spark application (all its maxIter fits)
SPARK_CLUSTER_TIMEOUT_S = 180.0
#: The Spark runs take at most about this long in all: one run per solver if the first
#: runs show that the asked-for number would take longer.
SPARK_TOTAL_BUDGET_S = 600.0
#: Seconds of fitting per solver in one application before larger maxIter are skipped.
SPARK_FIT_BUDGET_S = 150.0
#: Spark gd's stepSize: the best of 0.03 (Spark's default), 0.3, 1, 3 and 10 in a
#: 10-iteration trial on this data set, as a Spark user would tune it (``--gd-step``).
GD_STEP = 3.0
REFERENCE = "HMDSPT proportional"
#: The one process on the fastest worker alone, which HMDSPT is paired with in turns.
IN_PROCESS = "BPNNClassifier(client=None)"


@dataclasses.dataclass
class PeerRun:
    """One timed run of one system in one configuration.

    ``result.curve`` holds (seconds on the user's clock, scoring left out; held-out
    accuracy); ``result.wall_s`` is the wall time from the user's call to the trained
    model, scoring included.
    """

    system: str
    config: str
    result: RunResult
    startup_s: float | None = None  # command launched -> training begins (DDP, Spark)
    group_cpu_s: tuple[float, ...] = ()  # CPU seconds each slot's group used in the run
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.system, self.config)


@dataclasses.dataclass
class Row:
    """Medians over the runs of one (system, configuration)."""

    system: str
    config: str
    runs: list[PeerRun]
    wall_s: float
    to_target_s: float | None  # None: the median run did not reach the target
    reached: int
    final_accuracy: float
    accuracy_range: tuple[float, float]
    startup_s: float | None


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median where None counts as never (infinitely late); None if the median is never."""
    if not values:
        return None
    median = statistics.median(np.inf if v is None else float(v) for v in values)
    return None if np.isinf(median) else float(median)


def target_accuracy(sklearn_accuracies: Sequence[float], drop: float = TARGET_DROP) -> float:
    """The target: scikit-learn's median final test accuracy minus ``drop``."""
    if not sklearn_accuracies:
        raise ValueError("the target needs at least one scikit-learn run")
    return float(statistics.median(sklearn_accuracies)) - drop


def summarize_runs(runs: Sequence[PeerRun], target: float) -> list[Row]:
    """One row per (system, configuration), in the order they first appear."""
    groups: dict[tuple[str, str], list[PeerRun]] = {}
    for run in runs:
        groups.setdefault(run.key, []).append(run)
    rows = []
    for (system, config), members in groups.items():
        reach = [m.result.seconds_to(target) for m in members]
        accuracies = [m.result.final_accuracy for m in members]
        startups = [m.startup_s for m in members if m.startup_s is not None]
        rows.append(
            Row(
                system=system,
                config=config,
                runs=list(members),
                wall_s=float(statistics.median(m.result.wall_s for m in members)),
                to_target_s=median_or_none(reach),
                reached=sum(r is not None for r in reach),
                final_accuracy=float(statistics.median(accuracies)),
                accuracy_range=(min(accuracies), max(accuracies)),
                startup_s=float(statistics.median(startups)) if startups else None,
            )
        )
    return rows


def _seconds(value: float | None, width: int = 0) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}s}"


def _accuracy(row: Row) -> str:
    low, high = row.accuracy_range
    if f"{low:.4f}" == f"{high:.4f}":
        return f"{row.final_accuracy:.4f}"
    return f"{row.final_accuracy:.4f} ({low:.4f}-{high:.4f})"


def format_table(rows: Sequence[Row], target: float, notes: Sequence[str] = ()) -> str:
    """The issue's table: medians of fit wall, seconds to target and final accuracy.

    ``notes`` are printed under it, one line each.
    """
    lines = [
        "| system | configuration | runs | fit wall s | s to target | final accuracy "
        "| start-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        n = len(row.runs)
        if row.to_target_s is not None:
            reach = _seconds(row.to_target_s)
            if row.reached < n:
                reach += f" ({row.reached}/{n} reached)"
        else:
            reach = "not reached" + (f" ({row.reached}/{n} reached)" if row.reached else "")
        lines.append(
            f"| {row.system} | {row.config} | {n} | {_seconds(row.wall_s)} | {reach} "
            f"| {_accuracy(row)} | {_seconds(row.startup_s)} |"
        )
    lines.append(f"target accuracy {target:.4f}; medians over the runs")
    lines += notes
    return "\n".join(lines)


def ratio_lines(rows: Sequence[Row], reference: str = REFERENCE) -> list[str]:
    """HMDSPT (``reference``'s row) over each other row: fit wall and seconds to target.

    Below 1, HMDSPT took less time than that system.
    """
    ours = next((r for r in rows if r.system == reference), None)
    if ours is None:
        return [f"ratios: no {reference} row"]
    lines = [f"ratios {reference} / each system (below 1: {reference} takes less time)"]
    for row in rows:
        if row is ours:
            continue
        wall = f"{ours.wall_s / row.wall_s:.2f}" if row.wall_s > 0 else "-"
        if ours.to_target_s is None:
            reach = f"- ({reference} did not reach the target)"
        elif row.to_target_s is None:
            reach = "- (it did not reach the target)"
        else:
            reach = f"{ours.to_target_s / row.to_target_s:.2f}"
        lines.append(f"  / {row.system}, {row.config}: fit wall {wall}, s to target {reach}")
    return lines


def pair_lines(runs: Sequence[PeerRun], reference: str = REFERENCE) -> list[str]:
    """HMDSPT's fit wall over the one process's, run by run: the n-th of each ran in one turn.

    Empty when either ran no fit or their counts differ (then they did not run in turns).
    """
    ours = [r.result.wall_s for r in runs if r.system == reference]
    alone = [r.result.wall_s for r in runs if r.system == IN_PROCESS]
    if not ours or len(ours) != len(alone):
        return []
    pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, alone, strict=True))
    return [f"in turns, {reference} / {IN_PROCESS}, fit wall run by run: {pairs}"]


def run_lines(runs: Sequence[PeerRun], target: float, slot_names: Sequence[str]) -> list[str]:
    """Every run: wall, seconds to target, final accuracy, each group's CPU seconds."""
    lines = [f"every run (group CPU s: {' / '.join(slot_names)}):"]
    for i, run in enumerate(runs):
        to_target = run.result.seconds_to(target)
        cpu = " / ".join(f"{c:.1f}" for c in run.group_cpu_s) or "-"
        same = [r for r in runs[: i + 1] if r.key == run.key]
        lines.append(
            f"  {run.system}, {run.config} #{len(same)}: wall {run.result.wall_s:.2f} s, "
            f"to target {_seconds(to_target) if to_target is not None else 'not reached'}"
            f", final {run.result.final_accuracy:.4f}, start-up {_seconds(run.startup_s)}"
            f", group CPU s {cpu}" + (f"; {run.note}" if run.note else "")
        )
    return lines


# ------------------------------------------------------------------------ data
@dataclasses.dataclass
class DataFiles:
    npz: Path
    parquet: dict[str, Path]
    n_train: int
    n_test: int
    n_curve: int
    n_features: int
    n_classes: int
    arrays: dict[str, np.ndarray]


def prepare_data(
    directory: Path, train_rows: int | None, seed: int = 0, samples: int = DEFAULT_SAMPLES
) -> DataFiles:
    """The embedded default data set, standardized, written to ``data.npz`` (and Parquet).

    ``samples`` is the generator's size (80 % train, 20 % test; the embedded default has
    200,000); ``train_rows`` keeps a random subset of the training rows (and a quarter as
    many test rows); None keeps them all.
    """
    from sklearn.preprocessing import StandardScaler

    from hmdspt.cli import load_default_dataset

    X_train, X_test, y_train, y_test = load_default_dataset(seed, n_samples=samples)
    if train_rows is not None and train_rows < len(y_train):
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(len(y_train), train_rows, replace=False))
        keep_test = np.sort(rng.choice(len(y_test), max(1, train_rows // 4), replace=False))
        X_train, y_train, X_test, y_test = (
            X_train[keep],
            y_train[keep],
            X_test[keep_test],
            y_test[keep_test],
        )
    scaler = StandardScaler().fit(X_train)
    X_train = scaler.transform(X_train).astype(np.float32)
    X_test = scaler.transform(X_test).astype(np.float32)
    sample = held_out_sample(len(y_test), min(EVAL_ROWS, len(y_test)))
    arrays = {
        "X_train": X_train,
        "y_train": y_train,
        "X_test": X_test,
        "y_test": y_test,
        "X_curve": X_test[sample],
        "y_curve": y_test[sample],
    }
    directory.mkdir(parents=True, exist_ok=True)
    npz = directory / "data.npz"
    np.savez(npz, **arrays)
    parquet = {}
    for name in ("train", "curve", "test"):
        parquet[name] = directory / f"{name}.parquet"
        _write_parquet(parquet[name], arrays[f"X_{name}"], arrays[f"y_{name}"])
    return DataFiles(
        npz=npz,
        parquet=parquet,
        n_train=len(y_train),
        n_test=len(y_test),
        n_curve=len(sample),
        n_features=X_train.shape[1],
        n_classes=int(np.max(y_train)) + 1,
        arrays=arrays,
    )


def _write_parquet(path: Path, X: np.ndarray, y: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {f"f{i}": X[:, i] for i in range(X.shape[1])}
    columns["label"] = y.astype(np.float64)
    pq.write_table(pa.table(columns), path)


# --------------------------------------------------------------------- helpers
def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group (testbed processes lead their own)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _wait_all(
    procs: Sequence[subprocess.Popen],
    timeout: float,
    what: str,
    log: Path,
    poll: Callable[[], None] | None = None,
) -> None:
    """Wait for every process to exit 0 within ``timeout``; else kill them all and raise."""
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(
                    f"{what} failed (exit code {failed[0].returncode}): {_tail(log)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not finish in {timeout:.0f} s: {_tail(log)}")
            if poll is not None:
                poll()
            time.sleep(0.2)
        failed = [p for p in procs if p.returncode != 0]
        if failed:
            raise RuntimeError(f"{what} failed (exit code {failed[0].returncode}): {_tail(log)}")
    finally:
        for p in procs:
            _kill(p)


def _group_cpu(tb: Testbed) -> list[float]:
    return [tb.cpu_seconds(slot) for slot in tb.slots]


def _cpu_since(tb: Testbed, before: Sequence[float]) -> tuple[float, ...]:
    return tuple(after - b for after, b in zip(_group_cpu(tb), before, strict=True))


def _estimator_params(epochs: int) -> dict:
    return dict(
        hidden_layer_sizes=HIDDEN,
        max_iter=epochs,
        batch_size=BATCH,
        learning_rate_init=LEARNING_RATE,
        random_state=0,
    )


def _cores(tb: Testbed) -> str:
    return "/".join(f"{s.cores:g}" for s in tb.slots)


# ------------------------------------------------------------------ in-process
def run_in_process(tb: Testbed, system: str, data: DataFiles, epochs: int, work: Path) -> PeerRun:
    """scikit-learn's MLPClassifier or BPNNClassifier(client=None) in the fastest slot."""
    slot = max(tb.slots, key=lambda s: s.cores)
    tag = f"{system}-{time.monotonic_ns()}"
    out, log = work / f"{tag}.json", work / f"{tag}.log"
    before = _group_cpu(tb)
    with open(log, "w") as stream:
        proc = tb.popen(
            slot,
            [sys.executable, "-m", "benchmarks.peers.inproc", "--system", system]
            + ["--data", str(data.npz), "--out", str(out)]
            + ["--params", json.dumps(_estimator_params(epochs))],
            cwd=REPO_ROOT,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    _wait_all([proc], RUN_TIMEOUT_S, f"{system} in {slot.name}", log)
    done = json.loads(out.read_text())
    name = "scikit-learn MLPClassifier" if system == "sklearn" else IN_PROCESS
    curve = [(float(t), float(a)) for t, a in done["curve"]]
    result = RunResult(
        name, done["wall_s"], curve[-1][0], done["final_accuracy"], curve, done["epochs"]
    )
    return PeerRun(name, f"one process in {slot.name}", result, group_cpu_s=_cpu_since(tb, before))


# ---------------------------------------------------------------------- HMDSPT
def run_hmdspt(
    tb: Testbed, client, partition: str, data: DataFiles, epochs: int, work: Path
) -> PeerRun:
    """``BPNNClassifier(client=..., partition=...)`` on the testbed's Dask workers."""
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.estimator import BPNNClassifier

    a = data.arrays
    run_log = work / f"hmdspt-{partition}-{time.monotonic_ns()}.jsonl"
    clf = BPNNClassifier(
        client=client, partition=partition, run_log=run_log, **_estimator_params(epochs)
    )
    before = _group_cpu(tb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        called = time.perf_counter()
        clf.fit(a["X_train"], a["y_train"], eval_set=(a["X_curve"], a["y_curve"]))
        wall = time.perf_counter() - called
    cpu = _cpu_since(tb, before)
    # eval_curve_ counts from the start of training inside fit() and leaves out the
    # scoring of eval_set; shift it to the user's call.
    shift = getattr(clf, "_fit_start", called) - called
    curve = [(t + shift, score) for t, score in clf.eval_curve_]
    result = RunResult(
        f"HMDSPT {partition}",
        wall,
        curve[-1][0],
        float(clf.score(a["X_test"], a["y_test"])),
        curve,
        clf.n_iter_,
        run_log=str(run_log),
    )
    figures = log_figures(run_log)
    report = clf.training_report_
    rows = ", ".join(
        f"{s.name} {int(report[s.name]['rows'])}" for s in tb.slots if s.name in report
    )
    note = (
        f"rows per worker: {rows}; fastest worker idle "
        f"{100 * (figures['fastest_idle_fraction'] or 0):.0f} %, efficiency "
        f"{figures['efficiency'] or 0:.2f}, {figures['rounds']} rounds"
    )
    return PeerRun(
        f"HMDSPT {partition}",
        f"{len(tb.slots)} groups ({_cores(tb)} core), rounds per epoch {clf.rounds_per_epoch}",
        result,
        group_cpu_s=cpu,
        note=note,
    )


# ------------------------------------------------------------------------- DDP
def run_ddp(
    tb: Testbed, python: Path, data: DataFiles, epochs: int, batch_per_rank: int, work: Path
) -> PeerRun:
    """PyTorch DDP: one rank per slot (rank 0 in slot 0), gloo, DistributedSampler."""
    world = len(tb.slots)
    tag = f"ddp-{batch_per_rank}-{time.monotonic_ns()}"
    out, log = work / f"{tag}.json", work / f"{tag}.log"
    port = _free_port()
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    before = _group_cpu(tb)
    procs = []
    launched = time.time()
    with open(log, "w") as stream:
        for slot in tb.slots:
            env = {
                "RANK": str(slot.index),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": tb.slots[0].host,
                "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": slot.netns_link or "lo",
                "TMPDIR": str(tmp),  # torch's caches, if any, are removed with ``work``
            }
            procs.append(
                tb.popen(
                    slot,
                    [str(python), str(DDP_SCRIPT), "--data", str(data.npz), "--out", str(out)]
                    + ["--batch-per-rank", str(batch_per_rank), "--epochs", str(epochs)]
                    + ["--lr", str(LEARNING_RATE), "--hidden", ",".join(map(str, HIDDEN))],
                    env=env,
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                )
            )
    _wait_all(procs, RUN_TIMEOUT_S, f"DDP at {batch_per_rank} per rank", log)
    return ddp_run_from(json.loads(out.read_text()), launched, epochs, _cpu_since(tb, before))


def ddp_run_from(done: dict, launched: float, epochs: int, cpu: tuple[float, ...] = ()) -> PeerRun:
    """A :class:`PeerRun` from rank 0's JSON (``ddp_train.py``) and the launch stamp.

    Each evaluation's time is its stamp less the launch and less the scoring before it;
    the wall runs from the launch to the end of the last epoch.
    """
    curve = [(stamp - launched - scored, acc) for stamp, scored, acc, _ in done["curve"]]
    wall = done["trained"] - launched
    result = RunResult(
        "PyTorch DDP", wall, wall - done["scoring_s"], done["final_accuracy"], curve, epochs
    )
    per_rank, world = done["batch_per_rank"], done["world_size"]
    return PeerRun(
        "PyTorch DDP",
        f"global batch {per_rank * world} ({per_rank} per rank x {world})",
        result,
        startup_s=done["ready"] - launched,
        group_cpu_s=cpu,
        note=f"{done['steps_per_epoch']} steps per epoch per rank, torch {done['torch']}",
    )


# ----------------------------------------------------------------------- Spark
class SparkCluster:
    """A Spark standalone master on the driver side and one 1-core worker per slot.

    The workers run through :meth:`Testbed.popen`, so they and the executors they fork
    live in the slots' groups (:meth:`executor_groups` checks). Ports are free ones on
    the testbed's addresses; the REST server is off; logs, work directories and every
    JVM's temporary files are under ``work`` and removed with it.
    """

    def __init__(self, tb: Testbed, spark_home: Path, java: str, work: Path) -> None:
        self.tb = tb
        self.work = work
        self.spark_class = str(spark_home / "bin" / "spark-class")
        tmp = work / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        #: Every JVM's temporary files under ``work`` (none in /tmp), and no perf-data files.
        self.java_options = f"-Djava.io.tmpdir={tmp} -XX:-UsePerfData"
        self.env = {
            "SPARK_HOME": str(spark_home),
            "JAVA_HOME": str(Path(os.path.realpath(java)).parents[1]),
            "SPARK_CONF_DIR": str(work / "conf"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_DAEMON_JAVA_OPTS": self.java_options,
            "SPARK_LAUNCHER_OPTS": self.java_options,  # spark-class's own command builder
            "SPARK_LOCAL_DIRS": str(tmp),
            "TMPDIR": str(tmp),
        }
        self.master_url = ""
        self.master: subprocess.Popen | None = None
        self.workers: list[tuple] = []  # (slot, Popen)
        self.executors: dict[str, dict[int, bool]] = {}  # slot name -> {pid: in its group}

    def env_for(self, host: str) -> dict[str, str]:
        # SPARK_LOCAL_IP: the web UIs bind this address, not every interface.
        return {**self.env, "SPARK_LOCAL_IP": host, "SPARK_PUBLIC_DNS": host}

    def __enter__(self) -> SparkCluster:
        (self.work / "conf").mkdir(parents=True, exist_ok=True)
        host = self.tb.driver_host
        port = _free_port(host)
        self.master_url = f"spark://{host}:{port}"
        master_log = self.work / "master.log"
        with open(master_log, "w") as stream:
            self.master = self.tb.popen(
                None,
                [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", host]
                + ["--port", str(port), "--webui-port", str(_free_port(host))],
                env=self.env_for(host),
                stdout=stream,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_for(master_log, "I have been elected leader", 1)
            for slot in self.tb.slots:
                work_dir = self.work / f"worker-{slot.index}"
                work_dir.mkdir()
                with open(self.work / f"worker-{slot.index}.log", "w") as stream:
                    proc = self.tb.popen(
                        slot,
                        [self.spark_class, "org.apache.spark.deploy.worker.Worker"]
                        + ["--host", slot.host, "--cores", "1", "--memory", "2g"]
                        + ["--work-dir", str(work_dir), "--webui-port", "0", self.master_url],
                        env=self.env_for(slot.host),
                        stdout=stream,
                        stderr=subprocess.STDOUT,
                    )
                self.workers.append((slot, proc))
            self._wait_for(master_log, "Registering worker", len(self.tb.slots))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_for(self, log: Path, line: str, count: int) -> None:
        deadline = time.monotonic() + SPARK_CLUSTER_TIMEOUT_S
        while log.read_text(errors="replace").count(line) < count:
            if self.master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark standalone cluster did not start: {_tail(log)}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        for _, proc in self.workers:
            _kill(proc)
        if self.master is not None:
            _kill(self.master)

    def executor_groups(self) -> None:
        """Note every executor each worker has forked, and whether it is in the slot's groups.

        An executor is known by its application and executor id (the JVM may show up as
        more than one process); it counts as inside when each of its processes is in both
        of the slot's groups (``cpu`` and ``cpuacct``).
        """
        import psutil

        for slot, proc in self.workers:
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            cpu_members = set(_members(slot.cpu_cgroup))
            acct_members = set(_members(slot.cpuacct_cgroup))
            seen = self.executors.setdefault(slot.name, {})
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    argv = child.cmdline()
                    if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in argv:
                        continue
                    executor = f"{_argument(argv, '--app-id')}/{_argument(argv, '--executor-id')}"
                    inside = child.pid in cpu_members and child.pid in acct_members
                    seen[executor] = seen.get(executor, True) and inside

    def executor_summary(self) -> str:
        """Per slot, how many of the executors seen were inside its groups."""
        parts = []
        for slot, _ in self.workers:
            seen = self.executors.get(slot.name, {})
            parts.append(f"{slot.name} {sum(seen.values())} of {len(seen)}")
        return "executors inside their worker's groups: " + ", ".join(parts)


def _members(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _argument(argv: Sequence[str], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else "?"


@dataclasses.dataclass
class SparkPlan:
    """What one Spark application fits: maxIter schedules, gd's step, the fitting budget."""

    lbfgs_iters: tuple[int, ...]
    gd_iters: tuple[int, ...]
    gd_step: float
    budget_s: float  # per solver, seconds of fitting before larger maxIter are skipped
    partitions_per_core: int = 4


def run_spark(
    cluster: SparkCluster, python: Path, data: DataFiles, plan: SparkPlan, work: Path
) -> tuple[list[PeerRun], float]:
    """One Spark application fitting both solvers, each from scratch at every maxIter.

    Returns one run per solver and the application's wall seconds (launch to exit). Both
    solvers share the application's start-up (session, executors, data cached, a warm-up
    fit), which each would pay alone.
    """
    tb = cluster.tb
    partitions = plan.partitions_per_core * len(tb.slots)
    tag = f"spark-{time.monotonic_ns()}"
    out, log = work / f"{tag}.json", work / f"{tag}.log"
    local_dir = work / f"{tag}-local"
    local_dir.mkdir()
    before = _group_cpu(tb)
    launched = time.time()
    with open(log, "w") as stream:
        proc = tb.popen(
            None,
            [str(python), str(SPARK_SCRIPT), "--master", cluster.master_url]
            + ["--driver-host", tb.driver_host, "--out", str(out), "--local-dir", str(local_dir)]
            + [f"--{k}={v}" for k, v in data.parquet.items()]
            + ["--features", str(data.n_features), "--classes", str(data.n_classes)]
            + ["--hidden", ",".join(map(str, HIDDEN)), "--solvers", "l-bfgs,gd"]
            + ["--lbfgs-iters", ",".join(map(str, plan.lbfgs_iters))]
            + ["--gd-iters", ",".join(map(str, plan.gd_iters)), "--gd-step", str(plan.gd_step)]
            + ["--budget-s", str(plan.budget_s), "--partitions", str(partitions)]
            + ["--executors", str(len(tb.slots)), f"--java-options={cluster.java_options}"],
            env={**cluster.env_for(tb.driver_host), "PYSPARK_PYTHON": str(python)},
            cwd=work,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    _wait_all([proc], SPARK_TIMEOUT_S, "Spark MLP", log, cluster.executor_groups)
    app_wall = time.time() - launched
    runs = spark_runs_from(
        json.loads(out.read_text()), launched, len(tb.slots), _cpu_since(tb, before)
    )
    return runs, app_wall


def spark_runs_from(
    done: dict, launched: float, workers: int, cpu: tuple[float, ...] = ()
) -> list[PeerRun]:
    """One :class:`PeerRun` per solver from ``spark_mlp.py``'s JSON and the launch stamp.

    A fit at maxIter=k is what a user who asked for k iterations waits for: the shared
    start-up (launch -> training rows cached, plus the warm-up fit) and that fit. The
    run's wall and final accuracy are those of the largest maxIter.
    """
    startup = done["warmed"] - launched
    runs = []
    for solver in done["solvers"]:
        fits = solver["fits"]
        curve = [(startup + f["fit_s"], f["curve_accuracy"]) for f in fits]
        last = fits[-1]
        wall = startup + last["fit_s"]
        result = RunResult(
            "Spark MLlib MLP", wall, wall, last["test_accuracy"], curve, last["iterations"]
        )
        tried = ", ".join(
            f"maxIter {f['max_iter']}: fit {f['fit_s']:.1f} s, acc {f['test_accuracy']:.3f}"
            for f in fits
        )
        skipped = solver["skipped"]
        note = (
            f"session and data {done['loaded'] - launched:.1f} s, warm-up fit "
            f"{done['warmed'] - done['loaded']:.1f} s; {tried}"
            + (f"; maxIter {skipped} skipped (budget)" if skipped else "")
            + f"; BLAS {done.get('blas', '?')}, Spark {done.get('spark', '?')}"
            + "; group CPU of the whole application"
        )
        step = f" stepSize {solver['step_size']:g}" if solver["solver"] == "gd" else ""
        config = (
            f"{solver['solver']}{step}, {workers} workers x 1 core, {done['partitions']} "
            f"partitions, maxIter {'/'.join(str(f['max_iter']) for f in fits)}"
        )
        runs.append(PeerRun("Spark MLlib MLP", config, result, startup, group_cpu_s=cpu, note=note))
    return runs


# ------------------------------------------------------------------- the bench
@dataclasses.dataclass
class Settings:
    """What one benchmark run measures (``--quick`` shrinks rows, epochs and runs)."""

    runs: int
    epochs: int
    train_rows: int | None
    spark: SparkPlan
    systems: frozenset[str]
    cores: tuple[float, ...]
    link_mbit: float | None
    quota_seconds: float
    ceiling_seconds: float
    samples: int = DEFAULT_SAMPLES
    period_ms: float = 100.0
    pin: bool = False


def _quota_lines(tb: Testbed, settings: Settings) -> list[str]:
    """The testbed's own quota check and ceiling, one line each."""
    quotas = tb.check_quotas(settings.quota_seconds)
    ceiling = tb.ceiling(settings.ceiling_seconds)

    def slots(rows: list[dict], unit: str) -> str:
        return (
            "; ".join(
                f"{r['name']} {r['rate']:.0f} {unit}, {r['cores_used']:.2f} cores used, "
                f"throttled {100 * r['throttled']:.0f} %"
                for r in rows
            )
            + " (ratios "
            + " : ".join(f"{r['rate_ratio']:.2f}" for r in rows)
            + ")"
        )

    return [
        f"quota check (256x256 matmul, each group alone, {quotas['seconds']:g} s): "
        + slots(quotas["slots"], "iter/s"),
        f"ceiling alone (hmdspt.core.nn training loop, MLP {HIDDEN}, batch {BATCH}): "
        + slots(ceiling["alone"], "rows/s"),
        "ceiling together: " + slots(ceiling["together"], "rows/s"),
        f"combined ceiling {ceiling['combined']:.0f} rows/s = {ceiling['ratio']:.2f} x the "
        f"fastest slot alone (quotas allow {ceiling['quota_ratio']:.2f} x)",
    ]


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _measure_lines() -> list[str]:
    return [
        "how the times are measured (the user's clock; held-out scoring left out of "
        "'s to target' where it can be measured):",
        "- in-process: one process in the fastest group, in turns with HMDSPT's fits when "
        "both run (the Dask processes idle meanwhile); BPNNClassifier from its fit() "
        "call (eval_curve_, scoring eval_set left out); scikit-learn from its first "
        "partial_fit (one per epoch, scored after each, scoring left out)",
        "- HMDSPT: from BPNNClassifier.fit() on the driver (staging, probing, merging "
        "included; eval_curve_ leaves out scoring eval_set); one untimed warm-up fit first, "
        "so the workers have imported and remember their speeds, as on a cluster in use",
        "- PyTorch DDP: from the launch of the rank processes (Python and torch imports, "
        "process group, data loading = start-up); rank 0 scores every quarter epoch "
        "between two barriers, and that time is left out",
        "- Spark: from the launch of the application (JVM, session, every executor "
        "registered, training rows read from Parquet and cached, one maxIter=1 fit that "
        "loads classes and JIT-compiles = start-up), then one fit from scratch per maxIter; "
        "s to target = start-up + the fit of the smallest maxIter that reached the target; "
        "fit wall and final accuracy at the largest maxIter; scoring is separate and left "
        "out; Spark's MLP has sigmoid hidden layers and no other; native BLAS "
        "(Debian's OpenBLAS), as Spark's MLlib guide advises",
    ]


def _run_in_process(tb: Testbed, data: DataFiles, settings: Settings, work: Path):
    runs = []
    for _ in range(settings.runs):
        for system in ("bpnn", "sklearn"):
            runs.append(run_in_process(tb, system, data, settings.epochs, work))
    return runs


def _run_ddp(tb: Testbed, python: Path, data: DataFiles, settings: Settings, work: Path):
    global_batch = max(1, round(BATCH / len(tb.slots)))  # per rank, for a global ~256
    runs = []
    for _ in range(settings.runs):
        for per_rank in (global_batch, BATCH):
            runs.append(run_ddp(tb, python, data, settings.epochs, per_rank, work))
    return runs


def _run_spark(tb: Testbed, python: Path, data: DataFiles, settings: Settings, work: Path):
    """The Spark applications: ``settings.runs`` of them, or one if they would take long."""
    from .peers.install import ensure_java, ensure_native_blas, spark_home

    ensure_native_blas()
    spark_work = work / "spark"
    spark_work.mkdir()
    with SparkCluster(tb, spark_home(), ensure_java(), spark_work) as cluster:
        runs, first_wall = run_spark(cluster, python, data, settings.spark, spark_work)
        apps = 1 if first_wall * settings.runs > SPARK_TOTAL_BUDGET_S else settings.runs
        for _ in range(apps - 1):
            runs += run_spark(cluster, python, data, settings.spark, spark_work)[0]
        note = f"{apps} run(s) per solver"
        if apps < settings.runs:
            note += (
                f" ({settings.runs} would take about {first_wall * settings.runs / 60:.0f} "
                f"min, over the {SPARK_TOTAL_BUDGET_S / 60:.0f} min budget)"
            )
        note += f"; {cluster.executor_summary()}"
    return runs, note


def _run_hmdspt(tb: Testbed, data: DataFiles, settings: Settings, work: Path, in_process: bool):
    """HMDSPT's fits (proportional and equal shares) after one untimed warm-up fit; with
    ``in_process``, each run's one-process fits in turns with them, the order alternating.

    In turns, a drift of the shared machine's speed over the minutes of the sitting falls on
    both sides alike; the Dask processes idle while a one-process fit runs (stopping them
    for it measured the same: 8.05 against 8.13 s, four fits each, docs/design.md).
    """
    from distributed import Client

    address = tb.start_dask(nthreads=1)
    runs = []
    with Client(address) as client:
        warm = run_hmdspt(tb, client, "proportional", data, min(2, settings.epochs), work)
        print(f"untimed warm-up fit of HMDSPT: {warm.result.wall_s:.1f} s")
        for i in range(settings.runs):
            turn = [
                lambda p=p: run_hmdspt(tb, client, p, data, settings.epochs, work)
                for p in ("proportional", "equal")
            ]
            if in_process:
                one = [
                    lambda s=s: run_in_process(tb, s, data, settings.epochs, work)
                    for s in ("bpnn", "sklearn")
                ]
                turn = one + turn if i % 2 == 0 else turn + one
            runs += [fit() for fit in turn]
    return runs


def measure(settings: Settings) -> tuple[list[PeerRun], float, list[str], str]:
    """Every system on one testbed; returns the runs, the target, slot names, Spark's note.

    Every file of the run (data, logs, the peers' temporary files) lives in the
    testbed's temporary directory, which its teardown removes however the run ends.
    """
    python = None
    if settings.systems & {"ddp", "spark"}:
        from .peers.install import ensure_env, venv_python

        versions = ensure_env()
        python = venv_python()
        listed = ", ".join(f"{k} {v}" for k, v in versions.items())
        print(f"peers' venv: {python.parents[1]} ({listed})")
    runs: list[PeerRun] = []
    spark_note = ""
    target = 0.0
    with Testbed(
        settings.cores,
        link_mbit=settings.link_mbit,
        period_ms=settings.period_ms,
        pin=settings.pin,
    ) as tb:
        work = tb.tmpdir / "peers"
        work.mkdir()
        data = prepare_data(work / "data", settings.train_rows, samples=settings.samples)
        print(
            f"data: embedded default (hmdspt.cli) drawn at {settings.samples:,} rows, "
            f"standardized; {data.n_train} train / "
            f"{data.n_test} test rows, {data.n_features} features, {data.n_classes} classes; "
            f"the curves score {data.n_curve} held-out rows, final accuracies all test rows"
        )
        print(
            f"model: MLP {HIDDEN}, relu, softmax output; Adam lr {LEARNING_RATE:g}; batch "
            f"{BATCH}; {settings.epochs} epochs; {settings.runs} runs per system"
        )
        links = "loopback, unshaped"
        if settings.link_mbit is not None:
            links = f"tbf {settings.link_mbit:g} Mbit/s each way"
        pinned = "every slot on every CPU"
        if tb.cpus is not None:
            pinned = "pinned: " + ", ".join(
                f"{s.name} on CPU {c}" for s, c in zip(tb.slots, tb.cpus, strict=True)
            )
        print(
            f"testbed: {', '.join(s.name for s in tb.slots)}; {pinned}; CFS period "
            f"{tb.period_ms:g} ms; links {links}"
        )
        for line in _quota_lines(tb, settings):
            print(line)
        print(_load())
        # The one process runs in turns with HMDSPT when both are measured (after the
        # peers, which run while no Dask process is up).
        in_turns = {"inproc", "hmdspt"} <= settings.systems
        if "inproc" in settings.systems and not in_turns:
            runs += _run_in_process(tb, data, settings, work)
            print(f"in-process runs done; {_load()}")
        if "ddp" in settings.systems:
            runs += _run_ddp(tb, python, data, settings, work)
            print(f"DDP runs done; {_load()}")
        if "spark" in settings.systems:
            spark_runs, spark_note = _run_spark(tb, python, data, settings, work)
            runs += spark_runs
            print(f"Spark runs done; {_load()}")
        if "hmdspt" in settings.systems:
            runs += _run_hmdspt(tb, data, settings, work, in_process=in_turns)
            done = "HMDSPT and in-process runs, in turns," if in_turns else "HMDSPT runs"
            print(f"{done} done; {_load()}")
        sk = [r.result.final_accuracy for r in runs if r.system.startswith("scikit")]
        if sk:
            target = target_accuracy(sk)
        else:
            print("no scikit-learn run: target 0")
        slot_names = [s.name for s in tb.slots]
    return runs, target, slot_names, spark_note


SYSTEM_ORDER = (
    IN_PROCESS,
    "scikit-learn MLPClassifier",
    "HMDSPT proportional",
    "HMDSPT equal",
    "PyTorch DDP",
    "Spark MLlib MLP",
)


def ordered(runs: Sequence[PeerRun]) -> list[PeerRun]:
    """The issue's row order (stable within a system)."""
    return sorted(runs, key=lambda r: SYSTEM_ORDER.index(r.system))


def report(runs: Sequence[PeerRun], target: float, slot_names: Sequence[str], note: str) -> str:
    """The table, the ratios, every run and how each time was measured."""
    runs = ordered(runs)
    rows = summarize_runs(runs, target)
    parts = [
        format_table(rows, target, [f"Spark: {note}"] if note else []),
        "\n".join(ratio_lines(rows) + pair_lines(runs)),
        "\n".join(run_lines(runs, target, slot_names)),
        "\n".join(_measure_lines()),
    ]
    return "\n\n".join(parts)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def settings_from(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="20,000 rows, 2 epochs, 1 run: for development"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs per system (default 3)")
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs per fit (default 8; --quick 2)"
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help="rows the embedded default's generator draws, 80 %% of them for training "
        "(default 200,000: the embedded default)",
    )
    parser.add_argument(
        "--period-ms", type=float, default=100.0, help="the testbed's CFS period (default 100)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each slot to CPUs of its own, as separate machines (Testbed(pin=True))",
    )
    parser.add_argument(
        "--systems",
        default="inproc,hmdspt,ddp,spark",
        help="comma-separated subset of inproc,hmdspt,ddp,spark (inproc sets the target)",
    )
    parser.add_argument("--cores", default="1,0.5,0.25", help="quota per slot (default 1,0.5,0.25)")
    parser.add_argument("--link-mbit", type=float, default=None, help="shape the links")
    parser.add_argument("--lbfgs-iters", default=None, help="Spark l-bfgs maxIter values")
    parser.add_argument("--gd-iters", default=None, help="Spark gd maxIter values")
    parser.add_argument("--gd-step", type=float, default=GD_STEP, help="Spark gd's stepSize")
    args = parser.parse_args(argv)
    systems = frozenset(args.systems.split(","))
    unknown = sorted(systems - {"inproc", "hmdspt", "ddp", "spark"})
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from inproc, hmdspt, ddp, spark")
    iters = "2,5" if args.quick else "10,20,40"
    return Settings(
        runs=args.runs or (1 if args.quick else 3),
        epochs=args.epochs or (2 if args.quick else 8),
        train_rows=20_000 if args.quick else None,
        spark=SparkPlan(
            lbfgs_iters=_ints(args.lbfgs_iters or iters),
            gd_iters=_ints(args.gd_iters or iters),
            gd_step=args.gd_step,
            budget_s=SPARK_FIT_BUDGET_S,
        ),
        systems=systems,
        cores=tuple(float(c) for c in args.cores.split(",")),
        link_mbit=args.link_mbit,
        quota_seconds=1.0 if args.quick else 2.0,
        ceiling_seconds=1.5 if args.quick else 3.0,
        samples=args.samples,
        period_ms=args.period_ms,
        pin=args.pin,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from(argv)
    print(f"# HMDSPT beside its peers, {LABEL}")
    reason = unavailable_reason(link=settings.link_mbit is not None)
    if reason:
        print(f"not run: {reason}")
        return 2
    from ._common import header

    header("peers")
    print(_load())
    runs, target, slot_names, note = measure(settings)
    print()
    print(report(runs, target, slot_names, note))
    print(_load())
    return 0


if __name__ == "__main__":
    sys.exit(main())

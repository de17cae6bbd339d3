"""Command-line conventions (issue 16, point 10).

Usage errors exit 2, runtime errors 1, each with one line on stderr, as warnings are;
training progress is a tqdm bar driven by the fit's round callback; ``hmdspt compare``
prints a line as each run ends and gives each run one colour in every panel of its chart;
``hmdspt monitor DIR`` lists the logs of DIR's subfolders; plotting leaves the user's
matplotlib backend alone; ``--sync``, ``--partition`` and ``--rounds-per-epoch`` have help
and the estimator's defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

from hmdspt.cli import build_parser, main
from hmdspt.compare import RunResult
from hmdspt.core.runlog import read_events
from hmdspt.estimator import BPNNClassifier
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(8)  # CLI subprocesses, a cluster each


@pytest.fixture(scope="module")
def scheduler():
    """An in-process two-worker cluster the CLI joins with ``--scheduler`` (over TCP, so
    that a subprocess can join it too)."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", **FREE_PORTS
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def small_npz(tmp_path_factory):
    X, y = make_classification(
        n_samples=2000, n_features=10, n_classes=3, n_informative=6, random_state=0
    )
    path = tmp_path_factory.mktemp("data") / "small.npz"
    np.savez(path, X=X.astype(np.float32), y=y)
    return path


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of ``hmdspt ARGV`` run in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return code, capsys.readouterr().err


# ---------------------------------------------------------------------- exit codes
def test_a_missing_file_is_a_runtime_error_exit_1(tmp_path, capsys):
    code, err = _run(["train", "--in-process", "--data", str(tmp_path / "missing.npz")], capsys)
    assert code == 1, err
    assert err.splitlines() == [f"hmdspt: error: data file not found: {tmp_path}/missing.npz"]


def test_monitor_of_a_missing_folder_is_a_runtime_error_exit_1(tmp_path, capsys):
    code, err = _run(["monitor", str(tmp_path / "missing")], capsys)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "no run log or folder" in err


def test_unusable_data_is_a_runtime_error_exit_1(tmp_path, capsys):
    path = tmp_path / "nan.npz"
    np.savez(path, X=np.full((10, 2), np.nan), y=np.arange(10) % 2)
    code, err = _run(["train", "--in-process", "--data", str(path)], capsys)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "NaN/infinite" in err


def test_a_warning_is_one_line_without_the_library_source(tmp_path, capsys):
    """A warning raised inside the fit reaches the command's user as one line, as errors do;
    ``--debug`` keeps Python's form, with the file and line that raised it."""
    path = tmp_path / "tiny.npz"
    X, y = make_classification(n_samples=50, n_features=4, n_informative=2, random_state=0)
    np.savez(path, X=X, y=y)  # 40 training rows: the CLI's batch of 256 is clipped
    argv = ["train", "--in-process", "--data", str(path), "--epochs", "1", "--hidden", "4"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "batch_size" in line] == [
        "hmdspt: warning: Got `batch_size` less than 1 or larger than sample size. "
        "It is going to be clipped"
    ], err
    assert "estimator.py" not in err
    with pytest.warns(UserWarning, match="batch_size"):
        assert main(["--debug", *argv]) == 0
    assert "hmdspt: warning" not in capsys.readouterr().err


def test_lists_may_end_with_one_comma_as_a_one_item_tuple_is_written():
    args = build_parser().parse_args(["train", "--hidden", "128,", "--speeds", " 4, 2 ,1,"])
    assert args.hidden == (128,) and args.speeds == (4.0, 2.0, 1.0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--in-process", "--data", "{tmp}/d.csv"], "--target COLUMN is required"),
        (["train", "--in-process", "--data", "{tmp}/d.txt"], "unsupported data format '.txt'"),
        (["train", "--in-process", "--data", "{tmp}/gone.txt"], "unsupported data format"),
        (["compare", "--strategies", "hmdspt,nope"], "unknown strategy 'nope'"),
        # Each run's log is named by its strategy: a second run replaced the first's.
        (["compare", "--strategies", "hmdspt,local-equal,hmdspt"], "'hmdspt' named twice"),
        (["score", "--seconds", "-1"], "expected a positive number"),
        (["score", "--seconds", "nan"], "expected a positive number"),
        (["compare", "--max-seconds", "0"], "expected a positive number"),
        (["train", "--seed", "-1"], "expected an integer from 0 to"),
        (["train", "--hidden", "64,-1"], "expected positive integers"),
        (["train", "--hidden", "abc"], "expected comma-separated integers"),
        (["train", "--hidden", "10,,5"], "expected comma-separated integers"),  # a typo
        (["train", "--speeds", "4,,1"], "expected comma-separated numbers"),
        (["train", "--speeds", "4,-1"], "speeds must be positive numbers"),
        (["score", "--speeds", "0"], "speeds must be positive numbers"),
        (["monitor", "{tmp}", "--port", "70000"], "expected a port from 0 to 65535"),
        (
            ["train", "--scheduler", "tcp://127.0.0.1:1", "--cluster", "slurm"],
            "give either --scheduler or --cluster/--cluster-config",
        ),
        (["train", "--bogus"], "unrecognized arguments: --bogus"),
        (["cluster"], "the following arguments are required: --dry-run"),
        (["trian"], "invalid choice: 'trian'"),
    ],
)
def test_usage_problems_exit_2_with_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "d.csv").write_text("a,b\n1,2\n3,4\n")
    (tmp_path / "d.txt").write_text("1 2\n")
    code, err = _run([a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2, err
    assert "Traceback" not in err
    # argparse's own errors too: its usage block (nine lines for train) no longer above.
    (line,) = err.strip().splitlines()
    assert line.startswith("hmdspt") and ": error: " in line and message in line, err


def test_an_unknown_option_is_named_by_the_command_it_was_given_to(capsys):
    # argparse names the top parser for options no parser knows: "see hmdspt --help",
    # which does not list train's options.
    code, err = _run(["train", "--bogus", "1"], capsys)
    assert code == 2
    assert err.strip() == (
        "hmdspt train: error: unrecognized arguments: --bogus 1 (see hmdspt train --help)"
    )


# ------------------------------------------------------------------------ progress
def test_fit_calls_on_round_after_every_round(scheduler, small_npz):
    data = np.load(small_npz)
    records = []
    with Client(scheduler) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = BPNNClassifier(hidden_layer_sizes=(8,), max_iter=2, client=client, random_state=0)
        clf.fit(data["X"], data["y"], on_round=records.append)  # no run log to follow
    assert [r.round for r in records] == list(range(1, len(records) + 1))
    assert len(records) >= 2 and records[-1].epoch == 2
    assert all(r.rows > 0 and r.workers for r in records)


def test_train_progress_counts_every_round_in_a_line_an_epoch_off_a_terminal(
    scheduler, small_npz, tmp_path, capsys
):
    """stderr is not a terminal here (a log file): no bar redrawn with carriage returns,
    one line at each epoch's end with the figures the bar would show."""
    argv = ["train", "--scheduler", scheduler, "--data", str(small_npz), "--epochs", "2"]
    code, err = _run([*argv, "--hidden", "8", "--run-dir", str(tmp_path)], capsys)
    assert code == 0, err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("training: ")]
    assert [re.search(r"epoch (\d)/2", line).group(1) for line in lines] == ["1", "2"], err
    (log,) = tmp_path.glob("*.jsonl")
    rounds = [e for e in read_events(log) if e["event"] == "round"]
    counts = [int(re.match(r"training: (\d+) rounds", line).group(1)) for line in lines]
    assert counts == [sum(e["epoch"] == 1 for e in rounds), len(rounds)], lines
    assert "loss " in lines[-1] and "so far: fastest idle " in lines[-1]


# ------------------------------------------------------------------------- compare
# A line as each run ends: tests/test_cli.py's compare run checks it.


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_in_a_comparison_stops_it_not_only_the_run(scheduler, tmp_path):
    """A fit keeps its model when Ctrl-C stops it, as scikit-learn's do; a comparison whose
    run was cut short would compare it with full runs, so it stops altogether."""
    import signal
    import threading

    from hmdspt.compare import run_comparison

    X, y = make_classification(20_000, 20, n_informative=6, n_classes=3, random_state=0)
    ctrl_c = threading.Timer(
        0.5, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
    )
    with Client(scheduler) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Training interrupted by user.", convergence
        ctrl_c.start()
        try:
            with pytest.raises(KeyboardInterrupt):  # the in-process reference runs for long
                run_comparison(
                    client, X, y, X[:2000], y[:2000], strategies=["hmdspt"],
                    params={"max_iter": 1000, "hidden_layer_sizes": (32,)},
                    run_dir=tmp_path, echo=lambda *args: None,
                )  # fmt: skip
        finally:
            ctrl_c.cancel()
    assert not (tmp_path / "hmdspt.jsonl").exists()  # the runs after it never started


def _results() -> list[RunResult]:
    """Runs with and without an idle curve (in-process runs have none), in compare's order."""
    curve = [(0.5, 0.6), (1.0, 0.8)]
    idle = [(0.2, 0.1), (0.7, 0.05)]
    return [
        RunResult("bpnn-in-process", 1.0, 1.0, 0.8, curve, 2),
        RunResult("hmdspt", 1.0, 1.0, 0.8, curve, 2, idle_curve=idle),
        RunResult("hmdspt-equal", 1.0, 1.0, 0.8, curve, 2, idle_curve=idle),
        RunResult("sklearn-in-process", 1.0, 1.0, 0.8, curve, 2),
    ]


def test_compare_chart_gives_each_run_one_colour_in_every_panel(tmp_path, monkeypatch):
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    from hmdspt.compare import plot

    saved = []
    savefig = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot(_results(), 0.75, tmp_path / "c.png", "t")
    (figure,) = saved
    colours: dict[str, set[str]] = {}
    for ax in figure.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith(("_", "target")):
                colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    assert set(colours) == {r.name for r in _results()}
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({c.pop() for c in colours.values()}) == len(colours)  # and runs differ


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")]
)
def test_the_chart_is_written_in_the_format_its_name_says(tmp_path, suffix, magic):
    from hmdspt.compare import plot

    chart = plot(_results(), 0.75, tmp_path / f"c{suffix}", "t")
    assert chart.read_bytes().startswith(magic)


def test_a_chart_name_of_another_format_is_refused_before_any_work(tmp_path, capsys):
    code = main(["compare", "--chart", str(tmp_path / "c.txt")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.strip().endswith(
        "c.txt: a chart is written as .png, .pdf, .svg; give one of these suffixes"
    )
    assert "\n" not in err.strip()


def test_each_comparison_gets_a_folder_of_its_own(tmp_path):
    from hmdspt.compare import new_comparison_dir

    first, second = new_comparison_dir(tmp_path / "runs"), new_comparison_dir(tmp_path / "runs")
    assert first.parent == second.parent == tmp_path / "runs" and first != second
    assert first.name.split("-")[0] <= second.name.split("-")[0]  # named by time (to the ms)


def test_a_chart_that_fails_mid_write_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    import errno

    from matplotlib.figure import Figure

    from hmdspt.compare import plot

    chart = plot(_results(), 0.75, tmp_path / "c.png", "t")
    before = chart.read_bytes()

    def full_disk(self, fname, **kwargs):  # half a PNG, then the disk is full
        Path(fname).write_bytes(before[: len(before) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError, match="No space left"):
        plot(_results(), 0.75, chart, "t")
    assert chart.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png"]  # no partial file left


def test_compare_plot_leaves_the_matplotlib_backend_alone(tmp_path):
    code = (
        "import sys, matplotlib; matplotlib.use('svg'); "
        "from hmdspt.compare import RunResult, plot; "
        "c, i = [(0.5, 0.6), (1.0, 0.8)], [(0.2, 0.1), (0.7, 0.05)]; "
        "runs = [RunResult('a', 1, 1, 0.8, c, 2), RunResult('b', 1, 1, 0.8, c, 2, idle_curve=i)]; "
        "plot(runs, 0.75, sys.argv[1], 't'); "
        "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "False"]
    assert (tmp_path / "c.png").stat().st_size > 10_000


# ------------------------------------------------------------------------- monitor
def _log(path, run_id: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    event = {"event": "run_start", "run_id": run_id, "time": 0.0, "config": {}, "workers": []}
    path.write_text(json.dumps(event) + "\n")


def test_monitor_finds_the_logs_in_subfolders(tmp_path):
    from hmdspt.app.monitor import Monitor
    from hmdspt.app.rundata import list_runs

    _log(tmp_path / "train.jsonl", "a")
    _log(tmp_path / "compare" / "hmdspt.jsonl", "b")
    _log(tmp_path / "other" / "deeper" / "hmdspt.jsonl", "c")  # the same name elsewhere
    runs = list_runs(tmp_path)
    assert sorted(r.run_id for r in runs) == ["a", "b", "c"]
    labels = [r.label for r in runs]
    assert len(set(labels)) == 3, labels
    assert any(label.startswith("compare/hmdspt.jsonl") for label in labels), labels
    # The page's run picker offers them all.
    monitor = Monitor(path=str(tmp_path), live=False)
    assert len(monitor.param.run.objects) == 3


# ---------------------------------------------------------------------------- help
def _sub_commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


@pytest.mark.parametrize(
    "command, dests",
    [("train", ["sync", "partition", "rounds_per_epoch"]), ("compare", ["rounds_per_epoch"])],
)
def test_strategy_options_have_help_and_the_estimators_defaults(command, dests):
    params = BPNNClassifier().get_params()
    actions = {a.dest: a for a in _sub_commands()[command]._actions}
    for dest in dests:
        assert actions[dest].default == params[dest], dest
        assert actions[dest].help and "default" in actions[dest].help, dest


def test_every_option_has_help():
    missing = [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for name, sub in _sub_commands().items()
        for a in sub._actions
        if not a.help
    ]
    assert missing == []


def test_a_reader_that_closes_stdout_early_gets_no_error_line():
    """``hmdspt ... | head``: the command stops quietly, as other tools do (exit 1), with no
    error line or traceback about the broken pipe."""
    pools = Path(__file__).resolve().parents[1] / "examples" / "pools.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hmdspt", "cluster", "--dry-run", "--cluster", "slurm",
         "--cluster-config", str(pools)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    proc.stdout.close()  # before it writes: every write meets a closed pipe
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert stderr == ""


def test_ctrl_c_outside_a_fit_ends_with_130_and_one_line():
    """While it connects (before any fit): no traceback, the shell's code for Ctrl-C."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "hmdspt", "train", "--scheduler", "tcp://127.0.0.1:1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr.readline().startswith("connecting to the Dask scheduler")
    # At once: a Ctrl-C in the first moments used to be swallowed by the standard library's
    # first node-id lookup (uuid.getnode's bare except), as the Client started (3 of 30).
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["hmdspt: interrupted"]


def test_ctrl_c_before_a_dask_call_starts_adds_no_traceback(monkeypatch):
    """distributed's ``sync()``, interrupted before the coroutine it waits on has started,
    logs a ``NameError`` from its ``cancel`` callback on the event loop's thread; the
    command's filter drops that record (seen in 2 of 12 Ctrl-C's during a connect)."""
    import logging
    import threading

    import distributed.utils

    from hmdspt.cli import _UnstartedSyncCancel

    class InterruptedEvent(threading.Event):
        def wait(self, timeout=None):  # Ctrl-C at sync()'s first wait
            raise KeyboardInterrupt

    async def call():
        pass

    def logged_errors(filtered: bool) -> list[str]:
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("tornado.application")
        monkeypatch.setattr(logger, "handlers", [handler])  # no traceback on the test's stderr
        monkeypatch.setattr(logger, "propagate", False)
        monkeypatch.setattr(logger, "filters", [_UnstartedSyncCancel()] if filtered else [])
        runner = distributed.utils.LoopRunner(asynchronous=False)
        runner.start()
        # The loop is held until sync() has been interrupted, so that its coroutine and the
        # cancel callback are both queued, in that order, whatever the machine's load.
        release = threading.Event()
        runner.loop.add_callback(release.wait, 10)
        try:
            with monkeypatch.context() as m:
                m.setattr(distributed.utils.threading, "Event", InterruptedEvent)
                with pytest.raises(KeyboardInterrupt):
                    distributed.utils.sync(runner.loop, call)
            release.set()
            deadline = time.monotonic() + 5
            while not records and time.monotonic() < deadline and not filtered:
                time.sleep(0.01)
            time.sleep(0.1)  # the loop thread has run the cancel callback
        finally:
            release.set()
            runner.stop()
        return [type(r.exc_info[1]).__name__ for r in records if r.exc_info]

    assert logged_errors(filtered=False) == ["NameError"]  # what the filter is for
    assert logged_errors(filtered=True) == []
    monkeypatch.setattr(logging.getLogger("tornado.application"), "filters", [])
    main(["train", "--in-process", "--speeds", "2,1"])  # a usage error, after the set-up
    assert any(
        isinstance(f, _UnstartedSyncCancel)
        for f in logging.getLogger("tornado.application").filters
    )


def test_ctrl_c_at_the_terminal_during_a_fit_prints_no_worker_traceback(tmp_path):
    """A terminal's Ctrl-C goes to the whole process group, the command's worker processes
    too: the command stops the fit and reports it, and the workers leave it to the command
    (each printed a ``KeyboardInterrupt`` traceback before)."""
    import os
    import signal

    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=4000, n_features=10, random_state=0)
    data = tmp_path / "d.npz"
    np.savez(data, X=X.astype(np.float32), y=y)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hmdspt", "train", "--data", str(data), "--epochs", "500",
         "--hidden", "8", "--speeds", "2,1", "--run-dir", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        seen = []
        for line in proc.stderr:  # the fit's first rounds
            seen.append(line)
            if line.startswith("training:"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(seen) + err
    assert proc.returncode == 0, err
    assert "hmdspt: warning: Training interrupted by user." in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "test accuracy:" in out

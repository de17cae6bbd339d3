"""The hmdspt command line: its ``main()`` in this process, as ``python -m hmdspt`` calls it,
and as a user runs it (a subprocess) where the process is what is tested: the exit code of
a usage error and the lines ``hmdspt compare`` prints as each run ends.

The entry points themselves (``python -m hmdspt`` run, the ``hmdspt`` script's declaration
in the installed distribution) are tested in ``tests/test_layers.py``.
"""

import contextlib
import io
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass

import pytest

from hmdspt.cli import main

pytestmark = pytest.mark.heavy(16)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _hmdspt(*args: str) -> Result:
    """``hmdspt ARGS`` run by its ``main()`` in this process (no interpreter to start)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return Result(code, out.getvalue(), err.getvalue())


def _hmdspt_process(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``hmdspt ARGS`` as a user runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "hmdspt", *args], capture_output=True, text=True, timeout=timeout
    )


def _accuracy(stdout: str) -> float:
    return float(stdout.split("test accuracy:")[1].split()[0])


def test_train_in_process_on_embedded_default():
    result = _hmdspt("train", "--in-process", "--epochs", "1")
    assert result.returncode == 0, result.stderr
    assert _accuracy(result.stdout) > 0.8


@pytest.fixture(scope="module")
def emulated_train(tmp_path_factory):
    """One ``hmdspt train`` on an emulated two-worker cluster: its output and run-log folder."""
    runs = tmp_path_factory.mktemp("runs")
    result = _hmdspt(
        "train", "--epochs", "2", "--speeds", "2,1", "--hidden", "32", "--run-dir", str(runs)
    )
    assert result.returncode == 0, result.stderr
    return result, runs


def test_train_on_emulated_cluster_prints_worker_table_and_writes_run_log(emulated_train):
    from hmdspt.core.runlog import read_events

    result, tmp_path = emulated_train
    assert "heterogeneity emulated on one machine" in result.stdout
    assert "worker-0" in result.stdout and "worker-1" in result.stdout
    assert _accuracy(result.stdout) > 0.5  # 10 classes: chance is 0.1
    (log,) = tmp_path.glob("*.jsonl")
    events = read_events(log)
    assert log.stem == events[0]["run_id"]  # runs/<run_id>.jsonl
    assert "epoch 2/2" in result.stderr  # the progress bar (stderr: stdout holds results)
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"
    # The bar's running figures are the run log's summary once the last round is in.
    last = result.stderr.replace("\r", "\n").split("so far: ")[-1]
    idle, efficiency = re.match(r"fastest idle ([0-9.]+)%, efficiency ([0-9.]+)", last).groups()
    summary = events[-1]["summary"]
    assert float(idle) == pytest.approx(100 * summary["fastest_idle_fraction"], abs=0.051)
    assert float(efficiency) == pytest.approx(summary["efficiency"], abs=0.0051)
    # What equal shares and the fastest worker alone would cost, labelled as predicted,
    # with the figures of the run log's prediction.
    (prediction,) = [e for e in events if e["event"] == "prediction"]
    predicted = [line for line in result.stdout.splitlines() if line.startswith("predicted")]
    assert len(predicted) == 2, result.stdout
    # The speeds are emulated: said so wherever they are shown.
    assert prediction["emulated"] is True
    assert all(
        line.startswith("predicted (heterogeneity emulated on one machine)") for line in predicted
    )
    assert (
        f"equal shares on the same workers {prediction['equal_shares_epoch_s']:.3g} s"
        in (predicted[1])
    )
    assert f"speed-up of this fit {prediction['speedup']:.2f}x" in predicted[1]
    assert f"alone {prediction['fastest_alone_epoch_s']:.3g} s" in predicted[1]
    assert (
        f"efficiency {prediction['efficiency']:.2f} (the cost model's "
        f"{prediction['model_efficiency']:.2f}, the first epoch's measured "
        f"{prediction['measured_efficiency']:.2f} weighed 0.5)" in predicted[0]
    )


def test_train_worker_table_shows_utilisation_beside_idle(emulated_train):
    from hmdspt.core.runlog import read_events

    result, tmp_path = emulated_train
    lines = result.stdout.splitlines()
    (header,) = [line for line in lines if line.split()[:2] == ["worker", "samples/s"]]
    assert header.split()[-4:] == ["idle", "%", "util", "%"]  # the last column, beside idle
    (log,) = tmp_path.glob("*.jsonl")
    run_end = read_events(log)[-1]
    # Labelled: what the column is over, the run log's wall time (not the fit line's).
    fit_wall = f"{run_end['wall_s']:.2f} s from the fit() call to the run log's run_end"
    assert any(line.startswith(f"util %: busy s over the {fit_wall}") for line in lines), lines
    summary = run_end["summary"]  # the run log's summary: one source of truth
    for name, w in summary["workers"].items():
        (row,) = [line for line in lines if line.startswith(name + " ")]
        assert float(row.split()[-1]) == pytest.approx(100 * w["utilisation"], abs=0.051)


def test_train_worker_table_gives_the_fixed_cost_beside_the_speed(emulated_train):
    result, _ = emulated_train
    lines = result.stdout.splitlines()
    (header,) = [line for line in lines if line.split()[:2] == ["worker", "samples/s"]]
    assert header.split()[2:4] == ["fixed", "ms"]  # beside the speed it goes with
    assert any(line.startswith("samples/s, fixed ms: ") for line in lines), lines
    rows = [line.split() for line in lines if line.startswith("worker-")]
    assert len(rows) == 2  # --speeds 2,1
    for row in rows:
        assert float(row[1].replace(",", "")) > 0 and float(row[2]) >= 0, row


def test_score_prints_speed_and_share_per_worker():
    # 16:1, not 4:1: load from outside the workers compresses the emulation's ratio (its
    # sleeps follow thread CPU time), and a loaded CI read 4:1 as 0.84:1 (docs/design.md).
    result = _hmdspt("score", "--speeds", "16,1", "--seconds", "0.5", "--rows", "3000")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("worker-")]
    assert len(lines) == 2
    columns = [line.replace(",", "").split() for line in lines]
    speeds = [float(c[-2]) for c in columns]
    shares = [int(c[-1]) for c in columns]
    assert speeds[0] > speeds[1]
    assert sum(shares) == 3000
    # The printed shares follow the printed speeds (largest remainders: within a row).
    for speed, share in zip(speeds, shares):
        assert share == pytest.approx(3000 * speed / sum(speeds), abs=1)


def test_train_with_data_file_and_missing_target(tmp_path):
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(np.random.RandomState(0).rand(200, 3), columns=["a", "b", "c"])
    frame["label"] = (frame["a"] > 0.5).astype(int)
    path = tmp_path / "d.csv"
    frame.to_csv(path, index=False)
    # The file does not hold what the command names: runtime errors, as a missing file.
    result = _hmdspt("train", "--in-process", "--data", str(path), "--target", "nope")
    assert result.returncode == 1
    assert "'nope' not found" in result.stderr and "label" in result.stderr
    # For a cluster too, before it starts: on a batch system that means before its jobs.
    result = _hmdspt("train", "--speeds", "2,1", "--data", str(path), "--target", "nope")
    assert (result.returncode, result.stdout) == (1, "")  # no "cluster: ..." line
    assert "'nope' not found" in result.stderr
    # A missing file: tests/test_cli_conventions.py (in-process, the same main()).


def test_a_bad_value_exits_2_with_one_line():
    # The other usage errors run in-process (tests/test_cli_conventions.py): same main().
    result = _hmdspt_process("train", "--epochs", "0")
    assert result.returncode == 2
    assert "expected a positive integer" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_compare_prints_table_and_writes_chart(tmp_path):
    import numpy as np
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=3000, n_features=10, n_classes=3, n_informative=6, random_state=0
    )
    path = tmp_path / "small.npz"
    np.savez(path, X=X.astype(np.float32), y=y)
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "hmdspt", "compare", "--data", str(path), "--speeds", "2,1"]
    command += ["--hidden", "16", "--epochs", "2", "--max-seconds", "10", "--run-dir", str(runs)]
    command += ["--strategies", "hmdspt,sklearn-in-process"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, finished = [], {}
    try:
        for line in proc.stdout:
            lines.append(line)
            match = re.match(r"(\S+): done in [\d.]+ s", line)
            if match:
                # Printed when the run ended, not with the table once every run has.
                finished[match.group(1)] = any(runs.glob("*/compare.png"))
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    names = ("bpnn-in-process", "hmdspt", "sklearn-in-process")
    assert finished == dict.fromkeys(names, False)
    table = "".join(lines).split("target accuracy:")[1]
    for name in names:
        assert f"\n{name} " in table
    # The comparison's own folder, named by its start: another comparison replaces nothing.
    (folder,) = runs.iterdir()
    assert f"run logs: {folder}/<run>.jsonl\n" in lines
    assert f"chart: {folder / 'compare.png'}\n" in lines
    assert (folder / "compare.png").stat().st_size > 10_000
    assert (folder / "hmdspt.jsonl").exists()


# ------------------------------------------------------ one reading rule (issue 16, point 7)
def _bad_npz(name: str, path) -> None:
    """Write the bad ``.npz`` file ``name`` to ``path``."""
    import numpy as np

    rng = np.random.RandomState(0)
    if name == "garbage":
        path.write_bytes(rng.randint(0, 256, 400).astype(np.uint8).tobytes())
        return
    arrays = {
        "mismatch": dict(X=rng.rand(60, 3), y=np.arange(59) % 2),
        "text": dict(X=np.full((60, 3), "a"), y=np.arange(60) % 2),
        "no_arrays": dict(features=rng.rand(60, 3)),
        "scalar": dict(X=np.float64(1.0), y=np.arange(3)),
        "empty": dict(X=np.empty((0, 3)), y=np.empty(0)),
        "object_labels": dict(X=rng.rand(3, 2), y=np.array([{}, {}, {}], dtype=object)),
    }[name]
    np.savez(path, **arrays)


# Not NaN features: staging keeps them (data/README.md), the CLI refuses them.
BAD_NPZ = ["garbage", "mismatch", "text", "no_arrays", "scalar", "empty", "object_labels"]


@pytest.mark.parametrize("name", BAD_NPZ)
def test_a_bad_npz_gives_the_same_error_line_from_the_cli_and_from_staging(
    client, tmp_path, capsys, name
):
    from hmdspt.cli import main
    from hmdspt.parallel.shards import stage

    path = tmp_path / f"{name}.npz"
    _bad_npz(name, path)
    code = main(["train", "--in-process", "--epochs", "1", "--data", str(path)])
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = err.strip().splitlines()
    with pytest.raises(Exception) as raised:
        stage(client, path)
    assert line == f"hmdspt: error: {raised.value}"


def test_staging_keeps_nan_where_the_cli_refuses_it(client, tmp_path, capsys):
    import numpy as np

    from hmdspt.cli import main
    from hmdspt.parallel.shards import stage

    X = np.ones((60, 3))
    X[[5, 9], [2, 0]] = np.nan, np.inf
    np.savez(tmp_path / "nan.npz", X=X, y=np.arange(60) % 2)
    code = main(["train", "--in-process", "--data", str(tmp_path / "nan.npz")])
    assert code == 1
    assert capsys.readouterr().err.endswith(
        "nan.npz: X has NaN/infinite value(s), first a NaN at row 5, column 2; drop or impute "
        "them first\n"
    )
    staged = stage(client, tmp_path / "nan.npz")
    assert sum(np.isnan(f.result().X).sum() for f in staged.futures.values()) == 1


def test_a_nan_the_workers_read_is_one_line_naming_its_row(tmp_path):
    """On the cluster the command starts, the workers read the file: a NaN there ends the
    command as the in-process reader ends it, one line naming the row, without the
    workers' own traceback of the failed task."""
    frame = _frame(3000)
    frame.iloc[2345, 1] = float("nan")
    frame.to_csv(tmp_path / "bad.csv", index=False)
    result = _hmdspt_process(
        "train", "--speeds", "1,1", "--data", str(tmp_path / "bad.csv"), "--target", "label",
        "--epochs", "1", "--run-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"hmdspt: error: {tmp_path / 'bad.csv'}: X has NaN/infinite value(s), e.g. a NaN at "
        "row 2345, column 1; drop or impute them first"
    ]


def _frame(n_rows: int = 300):
    import pandas as pd
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=n_rows, n_features=4, n_redundant=0, random_state=0)
    frame = pd.DataFrame(X.astype("float32"), columns=["f0", "f1", "f2", "f3"])
    frame["label"] = y
    return frame


def _write(layout: str, folder, n_rows: int = 300):
    """The same rows as a gzip-compressed CSV file or a folder of two parquet files."""
    frame = _frame(n_rows)
    if layout == "csv.gz":
        path = folder / "d.csv.gz"
        frame.to_csv(path, index=False)
        return path
    path = folder / "d"
    path.mkdir()
    frame.iloc[: n_rows // 2].to_parquet(path / "part-0.parquet")
    frame.iloc[n_rows // 2 :].to_parquet(path / "part-1.parquet")
    return path


@pytest.mark.parametrize("layout", ["csv.gz", "parquet folder"])
def test_train_reads_a_compressed_csv_and_a_parquet_folder(tmp_path, capsys, layout):
    from hmdspt.cli import TEST_FRACTION, main
    from hmdspt.core.shard import held_out_rows

    path = _write(layout, tmp_path, n_rows=2000)
    argv = ["train", "--in-process", "--epochs", "60", "--hidden", "8", "--data", str(path)]
    code = main([*argv, "--target", "label"])
    out, err = capsys.readouterr()
    assert code == 0, err
    test_rows = int(held_out_rows(0, 0, 2000, TEST_FRACTION).sum())  # row by row, seed 0
    assert f"{2000 - test_rows} train / {test_rows} test rows, 4 features" in out
    assert _accuracy(out) > 0.6


@pytest.mark.parametrize("layout", ["csv.gz", "parquet folder"])
def test_the_cli_reads_the_rows_that_staging_stages(client, tmp_path, layout):
    import numpy as np

    from hmdspt.parallel.readers import read_file
    from hmdspt.parallel.shards import stage

    path = _write(layout, tmp_path)
    data = read_file(path, "label")
    assert data.features == ["f0", "f1", "f2", "f3"]
    np.testing.assert_array_equal(data.X, _frame()[data.features].to_numpy())
    staged = stage(client, path, target="label")
    for future in staged.futures.values():
        shard = future.result()
        np.testing.assert_array_equal(data.X[shard.row_ids], shard.X)
        np.testing.assert_array_equal(data.y[shard.row_ids], shard.y)


def test_a_table_stays_aligned_when_worker_names_are_addresses(capsys):
    from hmdspt.cli import _print_table

    rows = [
        {"name": "tcp://127.0.0.1:40309", "score": 359123.4, "idle": None},
        {"name": "w", "score": 9.0, "idle": 4.25},
    ]
    _print_table(rows, [("worker", "name", "s"), ("samples/s", "score", ",.0f"),
                        ("idle %", "idle", ".1f")])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "worker                    samples/s        idle %",
        "tcp://127.0.0.1:40309       359,123             -",
        "w                                 9           4.2",
    ]


def test_verbose_lines_go_above_the_progress_bar_not_glued_to_it():
    """Where stdout and stderr share a terminal (one buffer here), each line the fit prints
    starts a line of its own, and the bar is drawn again below it."""
    from hmdspt.cli import _RoundBar

    screen = io.StringIO()
    with (
        _RoundBar(2, file=screen, live=True) as progress,
        contextlib.redirect_stdout(screen),
        contextlib.redirect_stderr(screen),
    ):
        progress.bar.set_postfix_str("epoch 1/2", refresh=True)
        with progress.lines_above():
            print("Iteration 1, ", end="")  # a line printed in parts is kept whole
            print("loss = 0.5")
            print("hmdspt: warning: Training interrupted by user.", file=sys.stderr)
            print("no newline", end="")
    segments = re.split(r"[\r\n]", screen.getvalue())
    for text in ("Iteration 1, loss = 0.5", "hmdspt: warning: Training interrupted by user."):
        line = segments.index(text)  # a segment of its own
        assert any(s.startswith("training") for s in segments[line:])  # the bar, drawn again
    assert "no newline" in screen.getvalue()

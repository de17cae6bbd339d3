"""Bad input gets one line that names the problem (issue 7).

Estimator-level checks that already exist live in ``tests/test_estimator.py`` (NaN/inf,
mismatched lengths, empty data, one class, unseen labels in ``partial_fit``, wrong feature
count at predict); the command line's bad option values in ``tests/test_cli.py``; a failed
cluster fit's ``run_end`` (status ``failed`` with the reason) in ``tests/test_trainer.py``
(``test_losing_every_worker_ends_the_fit_with_a_clear_error``). Here: data files, the
command line's messages for them, and what the estimator tests do not cover yet.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from hmdspt.cli import main
from hmdspt.estimator import BPNNClassifier


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One broken data file per problem."""
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.RandomState(0)
    frame = pd.DataFrame(rng.rand(60, 3), columns=["a", "b", "c"])
    frame["label"] = (frame["a"] > 0.5).astype(int)

    def csv(name, f):
        f.to_csv(d / name, index=False)

    g = frame.copy()
    g.loc[3, "b"] = np.nan
    csv("nan.csv", g)
    g = frame.copy()
    g.loc[7, "c"] = np.inf
    csv("inf.csv", g)
    csv("text.csv", frame.assign(colour="red"))
    csv("header_only.csv", frame.iloc[:0])
    csv("one_class.csv", frame.assign(label=1))
    csv("good.csv", frame)
    csv("continuous.csv", frame.assign(label=rng.rand(60) * 100))
    g = frame.assign(label=np.where(frame["label"] == 1, "yes", "no").astype(object))
    g.loc[5, "label"] = None
    csv("no_label.csv", g)
    g = frame.assign(label=frame["label"].astype(float))
    g.loc[9, "label"] = np.nan
    csv("nan_label.csv", g)
    (d / "zero_bytes.csv").touch()
    np.savez(d / "mismatch.npz", X=rng.rand(60, 3), y=np.arange(59) % 2)
    np.savez(d / "nan.npz", X=np.where(rng.rand(60, 3) > 0.9, np.nan, 1.0), y=np.arange(60) % 2)
    np.savez(d / "text.npz", X=np.full((60, 3), "a"), y=np.arange(60) % 2)
    np.savez(d / "empty.npz", X=np.empty((0, 3)), y=np.empty(0))
    np.savez(d / "no_arrays.npz", features=rng.rand(60, 3))
    garbage = rng.randint(0, 256, 400).astype(np.uint8).tobytes()
    for ext in ("npz", "parquet", "csv"):
        (d / f"garbage.{ext}").write_bytes(garbage)
    (d / "folder.csv").mkdir()
    (d / "csv_folder").mkdir()
    csv("csv_folder/part-0.csv", frame)
    (d / "mixed_types").mkdir()  # a column numeric in the first file, text in the second
    frame.iloc[:30].to_parquet(d / "mixed_types" / "part-0.parquet")
    frame.iloc[30:].assign(b="red").to_parquet(d / "mixed_types" / "part-1.parquet")
    (d / "missing_column").mkdir()  # the second file lacks a column the first has
    frame.iloc[:30].to_parquet(d / "missing_column" / "part-0.parquet")
    frame.iloc[30:].drop(columns="b").to_parquet(d / "missing_column" / "part-1.parquet")
    return d


CASES = [
    ("nan.csv", ["--target", "label"], "NaN/infinite value(s), first a NaN at row 3, column 1"),
    ("inf.csv", ["--target", "label"], "first an infinite value at row 7, column 2"),
    # The target is named, so the remedy is not to name it.
    ("text.csv", ["--target", "label"], "['colour']; encode or drop these columns first"),
    ("header_only.csv", ["--target", "label"], "has no rows"),
    ("zero_bytes.csv", ["--target", "label"], "is empty"),
    ("one_class.csv", ["--target", "label"], "number of classes has to be greater than one"),
    ("good.csv", ["--target", "nope"], "target column 'nope' not found; columns are"),
    ("good.csv", [], "--target COLUMN is required"),
    ("mismatch.npz", [], "X has 60 rows but y has 59"),
    ("nan.npz", [], "NaN/infinite value(s)"),
    ("text.npz", [], "X is not numeric (dtype <U1)"),
    ("empty.npz", [], "has no rows"),
    ("no_arrays.npz", [], "has none of the arrays X/y, X_train/y_train, x/y, data/target"),
    ("garbage.npz", [], "not a valid .npz file"),
    ("garbage.parquet", ["--target", "label"], "cannot read"),
    ("garbage.csv", ["--target", "label"], "cannot read"),
    ("folder.csv", ["--target", "label"], "not a file"),
    ("csv_folder", ["--target", "label"], "a folder is read as parquet files, and "),
    # The folder's schema is its first file's: the second file's text column is named.
    (
        "mixed_types",
        ["--target", "label"],
        "mixed_types/part-1.parquet: ['b']; encode or drop these columns first",
    ),
    (
        "missing_column",
        ["--target", "label"],
        "missing_column/part-1.parquet: column(s) ['b'] missing, which ",
    ),
    ("missing.npz", [], "data file not found"),
    ("missing.csv", [], "data file not found"),  # before --target: the file is the first fix
    ("continuous.csv", ["--target", "label"], "Unknown label type: continuous. Maybe you are"),
    # Named by the file's row, not the row of the shuffled training part.
    (
        "no_label.csv",
        ["--target", "label"],
        "y has a missing label (None, NaN or NA), first at row 5",
    ),
    (
        "nan_label.csv",
        ["--target", "label"],
        "y has a missing label (None, NaN or NA), first at row 9",
    ),
]


#: Usage errors (exit 2): the command line is wrong whatever the file holds. The rest are
#: runtime errors (exit 1): the file is missing or unusable.
USAGE = {"--target COLUMN is required"}


@pytest.mark.parametrize("name, extra, message", CASES, ids=[c[0] + "".join(c[1]) for c in CASES])
def test_bad_data_file_exits_with_one_line(files, capsys, name, extra, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["train", "--in-process", "--epochs", "1", "--data", str(files / name), *extra])
    err = capsys.readouterr().err
    assert code == (2 if message in USAGE else 1), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hmdspt: error: "), err
    assert message in lines[0], lines[0]


@pytest.mark.parametrize(
    "speeds, message",
    [
        ("", "speeds must be positive numbers"),
        ("-1,2", "speeds must be positive numbers"),
        ("0", "speeds must be positive numbers"),
        ("a,b", "expected comma-separated numbers"),
        ("1e308,1", "the emulation slows a worker down 1000x at most"),
    ],
)
def test_bad_speeds_exit_2_with_one_line(capsys, speeds, message):
    with pytest.raises(SystemExit) as exit_:
        main(["train", f"--speeds={speeds}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_only_debug_shows_the_traceback(files, capsys):
    data = ["train", "--in-process", "--data", str(files / "garbage.npz")]
    assert main(data) == 1  # the same main() the command runs
    plain = capsys.readouterr().err
    assert "Traceback" not in plain and plain.strip().count("\n") == 0, plain
    # --debug lets the exception end the process, as a user sees it.
    args = [sys.executable, "-m", "hmdspt"]
    debug = subprocess.run([*args, "--debug", *data], capture_output=True, text=True, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "CliError" in debug.stderr


def test_a_multi_line_library_message_is_cut_to_its_first_line(capsys, monkeypatch, tmp_path):
    import hmdspt.cli as cli

    def boom(*_a, **_k):
        raise ValueError("Input X contains NaN.\nA long paragraph of advice.")

    monkeypatch.setattr(cli, "load_dataset", boom)
    # A sound file: the command line and the file's metadata are checked before reading.
    np.savez(tmp_path / "x.npz", X=np.zeros((4, 2)), y=np.arange(4) % 2)
    assert main(["train", "--in-process", "--data", str(tmp_path / "x.npz")]) == 1
    assert capsys.readouterr().err == "hmdspt: error: Input X contains NaN.\n"


# --------------------------------------------------------------- estimator (API)
def test_string_feature_columns_are_refused_by_the_estimator():
    X = np.array([["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]], dtype=object)
    with pytest.raises(ValueError, match="could not convert string to float"):
        BPNNClassifier(max_iter=1).fit(X, [0, 1, 0, 1])


def test_nan_in_partial_fit_and_predict_is_refused():
    rng = np.random.RandomState(0)
    X, y = rng.rand(40, 3), np.arange(40) % 2
    clf = BPNNClassifier((4,), random_state=0)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        clf.partial_fit(bad, y, classes=[0, 1])
    clf.partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="Input X contains NaN"):
        clf.predict(bad)


def test_unseen_labels_in_partial_fit_name_the_labels():
    rng = np.random.RandomState(0)
    X = rng.rand(20, 3)
    clf = BPNNClassifier((4,), random_state=0).partial_fit(X, np.arange(20) % 2, classes=[0, 1])
    with pytest.raises(ValueError, match="classes not in") as info:
        clf.partial_fit(X[:4], [0, 1, 7, 7])
    assert "7" in str(info.value)


@pytest.mark.parametrize(
    "command, option, named",
    [
        ("train", "--run-dir", "--run-dir {}"),
        ("compare", "--run-dir", "--run-dir {}"),
        ("compare", "--chart", "--chart {}"),
    ],
)
def test_a_file_in_an_output_paths_way_fails_before_any_work(
    tmp_path, capsys, command, option, named
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main([command, option, str(blocker / "out")])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""  # no cluster started, no data built, nothing compared
    where = named.format(blocker / "out")
    assert err.strip() == f"hmdspt: error: {where}: {blocker} is a file, not a folder"


@pytest.mark.parametrize(
    "command, option, named",
    [
        ("train", "--run-dir", "--run-dir /proc/hmdspt-none/runs"),
        ("compare", "--run-dir", "--run-dir /proc/hmdspt-none/runs"),
        ("compare", "--chart", "--chart's folder /proc/hmdspt-none"),
    ],
)
def test_an_output_folder_that_cannot_be_written_fails_before_any_work(
    capsys, command, option, named
):
    """A folder no file can be written in (here one under /proc, which refuses new entries
    even to root) ended the command only after the cluster had started and the data had
    been read (a chart's folder: after every comparison had run), with a bare
    "[Errno 2] No such file or directory: '/proc/x'"."""
    path = "/proc/hmdspt-none/runs" if option == "--run-dir" else "/proc/hmdspt-none/c.png"
    code = main([command, option, path])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""  # no cluster started, no data built, nothing compared
    assert err.strip() == f"hmdspt: error: {named}: cannot write there (No such file or directory)"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--in-process", "--speeds", "2,1"], "--in-process trains without a cluster"),
        (["--in-process", "--scheduler", "tcp://127.0.0.1:1"], "--in-process trains without"),
        (["--in-process", "--cluster", "local"], "--in-process trains without a cluster"),
        # How workers synchronise and share rows: an in-process fit has none to (it ignored them).
        (["--in-process", "--sync", "bsp"], "--in-process trains without a cluster"),
        (["--in-process", "--partition", "equal"], "--in-process trains without a cluster"),
        (["--in-process", "--rounds-per-epoch", "3"], "--in-process trains without a cluster"),
        (["--in-process", "--run-dir", "runs"], "--in-process trains without a cluster"),
        (["--speeds", "2,1", "--scheduler", "tcp://127.0.0.1:1"], "--speeds sets an emulated"),
        (["--speeds", "2,1", "--cluster", "slurm"], "--speeds sets an emulated local cluster"),
    ],
)
def test_options_that_would_be_ignored_are_refused_before_any_work(capsys, args, message):
    assert main(["train", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no cluster, no data
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"hmdspt: error: {message}")

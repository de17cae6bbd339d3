"""The hmdspt command line, run as a user runs it (a subprocess)."""

import subprocess
import sys

import pytest


def _hmdspt(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hmdspt", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _accuracy(stdout: str) -> float:
    return float(stdout.split("test accuracy:")[1].split()[0])


def test_train_in_process_on_embedded_default():
    result = _hmdspt("train", "--in-process", "--epochs", "3")
    assert result.returncode == 0, result.stderr
    assert _accuracy(result.stdout) > 0.8


def test_train_on_emulated_cluster_prints_worker_table_and_writes_run_log(tmp_path):
    from hmdspt.core.runlog import read_events

    result = _hmdspt(
        "train", "--epochs", "2", "--speeds", "2,1", "--hidden", "32", "--run-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "heterogeneity emulated on one machine" in result.stdout
    assert "worker-0" in result.stdout and "worker-1" in result.stdout
    assert _accuracy(result.stdout) > 0.5  # 10 classes: chance is 0.1
    (log,) = tmp_path.glob("*.jsonl")
    events = read_events(log)
    assert log.stem == events[0]["run_id"]  # runs/<run_id>.jsonl
    assert "epoch 2/2" in result.stderr  # the progress bar (stderr: stdout holds results)
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"


def test_train_worker_table_shows_utilisation_beside_idle(tmp_path):
    from hmdspt.core.runlog import read_events

    result = _hmdspt(
        "train", "--epochs", "1", "--speeds", "2,1", "--hidden", "16", "--run-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (header,) = [line for line in lines if line.startswith("worker  score")]
    assert header.split()[-4:] == ["idle", "%", "util", "%"]  # the last column, beside idle
    # Labelled: what the column is over.
    assert any(line.startswith("util %: busy s over the fit's") for line in lines)
    (log,) = tmp_path.glob("*.jsonl")
    summary = read_events(log)[-1]["summary"]  # the run log's summary: one source of truth
    for name, w in summary["workers"].items():
        (row,) = [line for line in lines if line.startswith(name + " ")]
        assert float(row.split()[-1]) == pytest.approx(100 * w["utilisation"], abs=0.051)


def test_score_prints_speed_and_share_per_worker():
    result = _hmdspt("score", "--speeds", "4,1", "--seconds", "1.5", "--rows", "3000")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("worker-")]
    assert len(lines) == 2
    shares = [int(line.split()[-1].replace(",", "")) for line in lines]
    assert sum(shares) == 3000 and shares[0] > shares[1]


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
    assert "'nope' not in" in result.stderr and "label" in result.stderr
    result = _hmdspt("train", "--in-process", "--data", str(tmp_path / "missing.npz"))
    assert result.returncode == 1 and "not found" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--epochs", "0"], "expected a positive integer"),
        (["train", "--hidden", "64,-1"], "expected positive integers"),
        (["train", "--hidden", "abc"], "expected comma-separated integers"),
        (["train", "--speeds", "4,-1"], "speeds must be positive numbers"),
        (["score", "--speeds", "0"], "speeds must be positive numbers"),
    ],
)
def test_bad_values_exit_2_with_one_line(args, message):
    result = _hmdspt(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_compare_prints_table_and_writes_chart(tmp_path):
    import numpy as np
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=3000, n_features=10, n_classes=3, n_informative=6, random_state=0
    )
    path = tmp_path / "small.npz"
    np.savez(path, X=X.astype(np.float32), y=y)
    result = _hmdspt(
        "compare",
        "--data",
        str(path),
        "--speeds",
        "2,1",
        "--hidden",
        "16",
        "--epochs",
        "2",
        "--max-seconds",
        "10",
        "--run-dir",
        str(tmp_path / "runs"),
        "--strategies",
        "hmdspt,hmdspt-equal,sklearn-in-process",
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("target accuracy:")[1]
    for name in ("bpnn-in-process", "hmdspt", "hmdspt-equal", "sklearn-in-process"):
        assert f"\n{name} " in table
    assert (tmp_path / "runs" / "compare.png").stat().st_size > 10_000
    assert (tmp_path / "runs" / "hmdspt.jsonl").exists()

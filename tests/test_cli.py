"""The hmdspt command line, run as a user runs it (a subprocess)."""

import subprocess
import sys

import pytest


def _hmdspt(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_train_on_embedded_default_prints_accuracy():
    result = _hmdspt("train", "--epochs", "20")
    assert result.returncode == 0, result.stderr
    accuracy = float(result.stdout.split("test accuracy:")[1].split()[0])
    assert accuracy > 0.9


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--epochs", "0"], "expected a positive integer"),
        (["train", "--hidden", "64,-1"], "expected positive integers"),
        (["train", "--hidden", "abc"], "expected comma-separated integers"),
    ],
)
def test_bad_values_exit_2_with_one_line(args, message):
    result = _hmdspt(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr

"""The output path checks: one line, before any work (hmdspt.core.paths)."""

import doctest
import os

import pytest

from hmdspt.core import paths
from hmdspt.core.paths import check_file_path, check_folder_path, check_folder_writable


def test_the_examples_hold():
    assert doctest.testmod(paths).failed == 0


def test_a_file_or_folder_in_the_way_is_named_and_a_new_path_passes(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"^run_log {tmp_path}: it is a folder, not a file$"):
        check_file_path(tmp_path, "run_log")
    with pytest.raises(ValueError, match="^ckpt .*: it is a file, not a folder$"):
        check_folder_path(blocker, "ckpt")
    for check in (check_file_path, check_folder_path):
        with pytest.raises(ValueError, match=f"{blocker} is a file, not a folder$"):
            check(blocker / "a" / "b", "x")
        check(tmp_path / "new" / "deeper", "x")  # made when first written
    check_folder_path(tmp_path, "x")
    check_file_path(blocker, "x")  # a file may be replaced


def test_a_folder_files_can_be_written_in_passes_and_is_left_as_it_was(tmp_path):
    (tmp_path / "kept.txt").write_text("x")
    check_folder_writable(tmp_path, "--run-dir")  # an existing folder
    check_folder_writable(tmp_path / "new" / "deeper", "--run-dir")  # made, then removed
    assert sorted(os.listdir(tmp_path)) == ["kept.txt"]  # no probe file, no folder left


def test_a_folder_that_cannot_be_written_in_is_named_with_the_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"{blocker} is a file, not a folder$"):
        check_folder_writable(blocker / "runs", "--run-dir")
    # /proc takes no new entries, even from root: only trying tells.
    with pytest.raises(
        ValueError, match="^--run-dir /proc/hmdspt-none/runs: cannot write there \\(.+\\)$"
    ):
        check_folder_writable("/proc/hmdspt-none/runs", "--run-dir")
    assert not os.path.exists("/proc/hmdspt-none")

"""Tests of hmdspt.core.runlog: writer, readers, tail and summary."""

import errno
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from hmdspt.core import runlog
from hmdspt.core.runlog import (
    EVENT_TYPES,
    HEAD_BYTES,
    SCHEMA_VERSION,
    RunLogTail,
    RunLogWriter,
    new_run_id,
    read_events,
    summarize,
    to_json_native,
)

ROOT = Path(__file__).resolve().parents[1]


def _write_all_events(log: RunLogWriter) -> list[dict]:
    workers = {
        "w0": dict(rows=400, steps=10, busy_s=1.0, comm_s=0.1, bytes_in=800, bytes_out=400),
        "w1": dict(rows=100, steps=3, busy_s=1.2, comm_s=0.1, idle_s=0.0),
    }
    return [
        log.run_start(
            config={"partition": "proportional", "rounds_per_epoch": 4},
            workers=[{"name": "w0", "address": "tcp://a:1", "nthreads": 1, "memory": 2**30}],
            dataset={"name": "kdd", "n_samples": 500, "n_features": 41},
            model={"layers": [41, 64, 5], "n_params": 3013},
        ),
        log.score(-1, "w0", 400.0, "probe", uncertainty=12.5),
        log.partition(-1, {"w0": 400, "w1": 100}, [("w1", "w0", 150)], 150, 0.02),
        log.warm_start(2000, 2, 0.05, 0.91),
        log.round_size(2, 3, 1.2, 0.05, 0.01, 0.04, "budget", 2048),
        log.prediction(2, 3, 0.05, 1.4, 1.3, 2.1, 2.0, "w0", 1.43, 0.8),
        log.round(0, 0, 1.3, 0.01, 0.7, None, workers),
        log.worker_lost("w1", round=1, reason="heartbeat"),
        log.worker_joined("w2", round=2, address="tcp://c:3", nthreads=1, memory=2**30),
        log.checkpoint(2, Path("/tmp/ckpt/round-2.npz")),
        log.run_end("completed", 12.5, summary={"efficiency": 0.9}, reason=None),
    ]


def test_round_trip_of_every_event_type(tmp_path):
    path = tmp_path / "sub" / "dir" / "run.jsonl"  # parent dirs are created
    with RunLogWriter(path, run_id="r1") as log:
        written = _write_all_events(log)
    assert log.closed
    events = read_events(path)
    assert events == written
    assert [e["event"] for e in events] == list(EVENT_TYPES)
    for e in events:
        assert e["run_id"] == "r1"
        assert isinstance(e["time"], float)
        assert list(e)[:3] == ["event", "run_id", "time"]
    start, score, partition, warm, size, prediction, round_, *_, checkpoint, end = events
    assert (warm["round"], warm["rows"], warm["val_score"]) == (0, 2000, 0.91)
    assert (size["epoch"], size["rounds_per_epoch"], size["bound"]) == (2, 3, "budget")
    assert size["step_bound"] == 2048
    assert (prediction["fastest"], prediction["speedup"]) == ("w0", 1.43)
    assert start["schema_version"] == SCHEMA_VERSION == 1
    assert score["uncertainty"] == 12.5 and score["source"] == "probe"
    assert partition["moves"] == [{"src": "w1", "dst": "w0", "rows": 150}]
    # idle_s filled in when absent: 1.3 - 1.0 - 0.1; missing byte counts become null.
    assert round_["workers"]["w0"]["idle_s"] == pytest.approx(0.2)
    assert round_["workers"]["w1"]["idle_s"] == 0.0
    assert round_["workers"]["w1"]["bytes_in"] is None
    assert round_["val_score"] is None
    assert checkpoint["path"] == "/tmp/ckpt/round-2.npz"
    assert end["summary"] == {"efficiency": 0.9}
    # One JSON object per line, newline-terminated.
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(EVENT_TYPES) + 1


def test_appends_to_existing_log(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path, run_id="a") as log:
        log.score(0, "w0", 1.0, "online")
    with RunLogWriter(path, run_id="b") as log:
        log.score(0, "w0", 2.0, "online")
    assert [(e["run_id"], e["score"]) for e in read_events(path)] == [("a", 1.0), ("b", 2.0)]


def test_numpy_values_serialise(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path) as log:
        log.write(
            "custom",
            f32=np.float32(0.5),
            i64=np.int64(7),
            flag=np.bool_(True),
            arr=np.arange(3, dtype=np.int32),
            mat=np.eye(2, dtype=np.float32),
            nested={np.int64(3): (np.float64(1.5), np.str_("x"))},
            dtype=np.dtype("float32"),
        )
    (e,) = read_events(path)
    assert e["f32"] == 0.5 and type(e["f32"]) is float
    assert e["i64"] == 7 and e["flag"] is True
    assert e["arr"] == [0, 1, 2] and e["mat"] == [[1.0, 0.0], [0.0, 1.0]]
    assert e["nested"] == {"3": [1.5, "x"]}
    assert e["dtype"] == "float32"


def test_nan_and_inf_become_null(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path) as log:
        log.round(
            3,
            1,
            1.0,
            0.01,
            np.float32("nan"),
            float("inf"),
            {"w0": dict(rows=1, steps=1, busy_s=np.nan, comm_s=0.0)},
            extra=np.array([1.0, np.nan, -np.inf]),
        )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    (e,) = read_events(path)
    assert e["loss"] is None and e["val_score"] is None
    assert e["extra"] == [1.0, None, None]
    assert e["workers"]["w0"]["busy_s"] is None and e["workers"]["w0"]["idle_s"] is None


def test_to_json_native_rejects_unknown_objects():
    with pytest.raises(TypeError, match="object"):
        to_json_native({"x": object()})
    with pytest.raises(TypeError, match="keys"):
        to_json_native({(1, 2): 3})


def test_writer_validation(tmp_path):
    with RunLogWriter(tmp_path / "run.jsonl") as log:
        with pytest.raises(ValueError, match="source"):
            log.score(0, "w0", 1.0, "guess")
        with pytest.raises(ValueError, match="lacks"):
            log.round(0, 0, 1.0, 0.0, 0.5, None, {"w0": {"rows": 1}})
        with pytest.raises(ValueError, match="reserved"):
            log.write("custom", run_id="other")
    with pytest.raises(ValueError, match="closed"):
        log.score(0, "w0", 1.0, "probe")


def test_fsync_after_every_event(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(runlog.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    with RunLogWriter(tmp_path / "run.jsonl", fsync=True) as log:
        log.score(0, "w0", 1.0, "probe")
        log.score(1, "w0", 1.0, "online")
    assert len(calls) == 2


def test_a_full_disk_stops_the_run_log_cleanly_with_one_warning(disk):
    workers = {f"w{i}": dict(rows=100, steps=3, busy_s=1.0, comm_s=0.1) for i in range(4)}

    path = disk / "run.jsonl"
    log = RunLogWriter(path, run_id="r1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(200):  # ~50 fit in 8 KiB
            log.round(i, 0, 1.0, 0.01, 0.5, None, workers)
        size = path.stat().st_size
        log.run_end("completed", 2.0)  # later writes are no-ops
    assert log.closed and log.stopped
    stopped = [str(w.message) for w in caught if "run log" in str(w.message)]
    assert len(stopped) == 1, stopped
    n = re.fullmatch(
        rf"run log {re.escape(str(path))} stopped after (\d+) events: "
        r"\[Errno 28\] No space left on device; training goes on",
        stopped[0],
    )
    assert n, stopped[0]
    data = path.read_bytes()
    assert len(data) == size and data.endswith(b"\n")  # no torn last line
    lines = data.splitlines()
    assert len(lines) == int(n.group(1)) > 0
    assert [json.loads(line)["round"] for line in lines] == list(range(len(lines)))


def test_a_run_log_under_a_regular_file_fails_with_one_line(tmp_path):
    (tmp_path / "x").write_text("a file, not a folder")
    for path in (tmp_path / "x" / "fit.jsonl", tmp_path / "x" / "y" / "fit.jsonl"):
        with pytest.raises(ValueError) as info:
            RunLogWriter(path)
        assert str(info.value) == f"run_log {path}: {tmp_path / 'x'} is a file, not a folder"


def test_a_run_log_that_cannot_be_written_is_named_as_the_parameter():
    """/proc takes no new entries, even from root. The error was a bare
    "[Errno 2] No such file or directory: '/proc/x'", naming no parameter."""
    path = "/proc/hmdspt-none/fit.jsonl"
    with pytest.raises(FileNotFoundError) as info:
        RunLogWriter(path)
    assert str(info.value) == f"run_log {path}: cannot write it (No such file or directory)"
    assert info.value.errno == errno.ENOENT


def test_new_run_id_sorts_by_time():
    a, b, c = new_run_id(1_700_000_000.1), new_run_id(1_700_000_000.2), new_run_id(1_800_000_000)
    assert a < b < c
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}", a)
    assert a.startswith("20231114T221320.100Z-")
    assert new_run_id() != new_run_id()


# --------------------------------------------------------------------------------- readers


def _line(record: dict) -> bytes:
    return json.dumps(record).encode() + b"\n"


def test_torn_last_line(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path, run_id="r") as log:
        log.score(0, "w0", 1.0, "probe")
        log.score(1, "w0", 2.0, "online")
    torn = _line({"event": "score", "run_id": "r", "time": 1.0, "score": 3.0})
    head, rest = torn[:20], torn[20:]
    with open(path, "ab") as f:
        f.write(head)
    assert [e["score"] for e in read_events(path)] == [1.0, 2.0]
    tail = RunLogTail(path)
    assert [e["score"] for e in tail.read_new()] == [1.0, 2.0]
    assert tail.pending_bytes == len(head)
    assert tail.read_new() == []
    with open(path, "ab") as f:
        f.write(rest)
    assert [e["score"] for e in tail.read_new()] == [3.0]
    assert tail.pending_bytes == 0 and tail.offset == path.stat().st_size
    assert [e["score"] for e in read_events(path)] == [1.0, 2.0, 3.0]


def test_invalid_complete_last_line_is_ignored(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_bytes(_line({"event": "score", "score": 1}) + b'{"event": "sco\n')
    assert [e["score"] for e in read_events(path)] == [1]
    with pytest.raises(ValueError, match="invalid"):
        read_events(path, strict=True)


def test_writer_ends_a_fragment_left_by_a_crash(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_bytes(_line({"event": "score", "score": 1}) + b'{"event": "ro')
    with RunLogWriter(path) as log:
        log.score(1, "w0", 2.0, "online")
    # The fragment is now a line of its own, skipped; the new event is intact.
    assert [e["score"] for e in read_events(path)] == [1, 2.0]
    tail = RunLogTail(path)
    assert len(tail.read_new()) == 2 and tail.skipped == 1


def test_tail_reads_only_new_bytes(tmp_path):
    path = tmp_path / "run.jsonl"
    tail = RunLogTail(path, strict=True)
    assert tail.read_new() == [] and tail.offset == 0  # no file yet
    with RunLogWriter(path, run_id="r") as log:
        for i in range(50):
            log.score(i, "w0", float(i), "online")
        first = tail.read_new()
        assert len(first) == 50
        size = path.stat().st_size
        assert tail.offset == size
        # Scribble over everything already read but the first bytes, which the tail reads
        # again to notice a rewrite (same length, still newline-free per line): a re-read
        # would now fail in strict mode or return wrong events.
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.seek(HEAD_BYTES)
            f.write(bytes(b if b == 0x0A else ord("#") for b in data[HEAD_BYTES:]))
        log.score(50, "w0", 50.0, "online")
        new_size = path.stat().st_size
        new = tail.read_new()
    assert [e["score"] for e in new] == [50.0]
    assert tail.offset == new_size and tail.offset - size == new_size - size
    assert tail.skipped == 0 and tail.pending_bytes == 0


def test_tail_with_tiny_chunks(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path) as log:
        written = [log.score(i, f"w{i}", i * 1.5, "online") for i in range(20)]
    tail = RunLogTail(path, chunk_size=7)  # every line spans several chunks
    assert tail.read_new() == written
    assert tail.offset == path.stat().st_size


def test_tail_restarts_on_truncation(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path) as log:
        log.score(0, "w0", 1.0, "probe")
        log.score(1, "w0", 2.0, "probe")
    tail = RunLogTail(path)
    assert len(tail.read_new()) == 2
    path.write_bytes(_line({"event": "score", "score": 9}))  # truncated and rewritten
    assert [e["score"] for e in tail.read_new()] == [9]
    assert tail.restarts == 1


def test_tail_counts_a_restart_when_a_larger_file_replaces_the_log(tmp_path):
    """rsync and scp write a temporary file and rename it over the log: the offset does not
    go back, so only the restart count tells a reader to start over."""
    path = tmp_path / "run.jsonl"
    lines = [_line({"event": "score", "score": i}) for i in range(6)]
    path.write_bytes(b"".join(lines[:3]))
    tail = RunLogTail(path)
    assert [e["score"] for e in tail.read_new()] == [0, 1, 2]
    assert tail.read_new() == [] and tail.restarts == 0  # nothing new is no restart
    offset = tail.offset
    tmp = tmp_path / "run.jsonl.tmp"
    tmp.write_bytes(b"".join(lines))
    os.replace(tmp, path)
    assert [e["score"] for e in tail.read_new()] == [0, 1, 2, 3, 4, 5]
    assert tail.offset > offset and tail.restarts == 1


def test_tail_restarts_when_the_log_is_rewritten_in_place_past_its_offset(tmp_path):
    """A new run on the same path truncates the file and writes it again through the same
    inode; by the next call it had grown past the offset, and the tail read the new run's
    later lines as if they followed the old run's."""
    path = tmp_path / "run.jsonl"
    old = [_line({"event": "score", "run_id": "old", "score": i}) for i in range(2)]
    new = [_line({"event": "score", "run_id": "new", "score": 10 + i}) for i in range(5)]
    path.write_bytes(b"".join(old))
    tail = RunLogTail(path)
    assert [e["score"] for e in tail.read_new()] == [0, 1]
    with open(path, "r+b") as f:  # the same inode, never smaller than the offset read
        f.write(b"".join(new))
    assert [e["score"] for e in tail.read_new()] == [10, 11, 12, 13, 14]
    assert tail.restarts == 1
    with open(path, "ab") as f:  # appending is no rewrite
        f.write(_line({"event": "score", "run_id": "new", "score": 15}))
    assert [e["score"] for e in tail.read_new()] == [15] and tail.restarts == 1


# --------------------------------------------------------------------------------- summary


def _two_worker_log(path: Path, run_id: str = "r") -> None:
    with RunLogWriter(path, run_id=run_id) as log:
        log.run_start(config={}, workers=[], dataset={}, model={})
        # Round 0: wall 2.0. fast: idle = 2.0 - 1.0 - 0.2 = 0.8 (computed by the writer);
        # slow: idle = 2.0 - 1.6 - 0.2 = 0.2.
        log.round(
            0,
            0,
            2.0,
            0.05,
            1.0,
            None,
            {
                "fast": dict(rows=400, steps=4, busy_s=1.0, comm_s=0.2, bytes_out=100),
                "slow": dict(rows=100, steps=1, busy_s=1.6, comm_s=0.2, bytes_out=50),
            },
        )
        # Round 1: wall 1.0, idle given explicitly.
        log.round(
            1,
            0,
            1.0,
            0.05,
            0.5,
            0.8,
            {
                "fast": dict(rows=300, steps=3, busy_s=0.6, comm_s=0.1, idle_s=0.3),
                "slow": dict(rows=200, steps=2, busy_s=0.8, comm_s=0.1, idle_s=0.1),
            },
        )
        log.worker_lost("slow", round=2)
        log.run_end("completed", 3.5, summary={})


def test_summarize_two_workers_by_hand(tmp_path):
    path = tmp_path / "run.jsonl"
    _two_worker_log(path)
    s = summarize(read_events(path))
    # Round 0 speeds 400 and 62.5 rows/s: ideal = 500 / 462.5.
    # Round 1 speeds 500 and 250 rows/s: ideal = 500 / 750.
    ideal = 500 / 462.5 + 500 / 750
    assert s["rounds"] == 2 and s["run_id"] == "r" and s["status"] == "completed"
    assert s["wall_s"] == pytest.approx(3.0)
    assert s["ideal_s"] == pytest.approx(ideal)
    assert s["efficiency"] == pytest.approx(ideal / 3.0)  # ≈ 0.5826
    assert s["merge_s"] == pytest.approx(0.1)
    fast, slow = s["workers"]["fast"], s["workers"]["slow"]
    assert fast["idle_fraction"] == pytest.approx((0.8 + 0.3) / 3.0)
    assert slow["idle_fraction"] == pytest.approx((0.2 + 0.1) / 3.0)
    assert fast["mean_speed"] == pytest.approx(700 / 1.6)
    assert slow["mean_speed"] == pytest.approx(300 / 2.4)
    assert fast["rows"] == 700 and fast["steps"] == 7 and isinstance(fast["rows"], int)
    assert fast["busy_s"] == pytest.approx(1.6) and fast["comm_s"] == pytest.approx(0.3)
    assert fast["bytes_out"] == 100 and fast["bytes_in"] is None
    assert s["fastest_worker"] == "fast"
    assert s["fastest_idle_fraction"] == pytest.approx(1.1 / 3.0)
    assert s["final_loss"] == 0.5 and s["final_val_score"] == 0.8
    assert s["workers_lost"] == 1 and s["workers_joined"] == 0
    json.dumps(s, allow_nan=False)  # JSON-native, ready for run_end(summary=...)


def test_summarize_picks_the_last_run(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path, run_id="old") as log:
        log.round(0, 0, 10.0, 0.0, 1.0, None, {"x": dict(rows=1, steps=1, busy_s=1, comm_s=0)})
    _two_worker_log(path, run_id="new")
    events = read_events(path)
    assert summarize(events)["rounds"] == 2
    old = summarize(events, run_id="old")
    assert old["rounds"] == 1 and old["efficiency"] == pytest.approx(0.1)


def test_summarize_empty():
    s = summarize([])
    assert s["rounds"] == 0 and s["efficiency"] is None and s["fastest_worker"] is None


def test_module_does_not_import_dask():
    code = "import sys, hmdspt.core.runlog; assert 'dask' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)

"""Fast tests of the monitor (app/rundata.py, app/monitor.py): no browser, no server.

Real run logs come from a small real fit on an emulated local cluster, made once per
session (tests/browser/real_run.py, ~5 s). Synthetic logs (scripts/synthetic_runlog.py, a
test fixture) cover what a real fit does not give on demand (torn, empty, failed logs,
lost and joined workers, appends); hand-made logs (RunLogWriter) are used where the
expected numbers must be known exactly.
"""

import html
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

import panel as pn
import pytest

pytestmark = pytest.mark.heavy(4)  # the monitor's views on real run logs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hmdspt.app.monitor import Comparison, Monitor, RunMonitor, dashboard  # noqa: E402
from hmdspt.app.rundata import RunData, compare_runs, emulation_label, list_runs  # noqa: E402
from hmdspt.core.runlog import RunLogWriter, read_events, summarize  # noqa: E402
from scripts.synthetic_runlog import make_log  # noqa: E402
from tests.browser.real_run import real_fit, session_real_logs  # noqa: E402


def _texts(viewable) -> str:
    """All text of a rendered view's panes (Alert/HTML/Markdown objects), joined."""
    out = []
    stack = [viewable]
    while stack:
        v = stack.pop()
        if hasattr(v, "objects"):
            stack.extend(v.objects)
        obj = getattr(v, "object", None)
        if isinstance(obj, str):
            out.append(obj)
    return "\n".join(out)


def _messages(viewable) -> list:
    out, stack = [], [viewable]
    while stack:
        v = stack.pop()
        if hasattr(v, "objects"):
            stack.extend(v.objects)
        if "hm-message" in (getattr(v, "css_classes", None) or []):
            out.append(v)
    return out


@pytest.fixture(scope="session")
def real_logs(tmp_path_factory):
    """{"proportional": log, "equal": log} of two small real fits (read only: copy them)."""
    return session_real_logs(tmp_path_factory)


def _events(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_real_log_has_every_event_type_the_trainer_writes(real_logs):
    """The fixture is what the monitor must read: a real fit's log, every event type."""
    events = _events(real_logs["proportional"])
    kinds = {e["event"] for e in events}
    assert {"run_start", "score", "partition", "round", "run_end"} <= kinds
    start = events[0]
    assert start["event"] == "run_start"
    assert start["config"]["partition"] == "proportional"
    assert start["config"]["emulation"]["method"]  # an emulated local cluster
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "completed"
    assert isinstance(events[-1]["summary"], dict)
    rounds = [e for e in events if e["event"] == "round"]
    per_epoch = [sum(e["epoch"] == k for e in rounds) for k in (1, 2, 3)]
    # 3 epochs x 2 rounds; the first epoch may open with ramp rounds (how many depends on
    # the measured speeds: a round this small may need none).
    assert per_epoch[1:] == [2, 2] and 2 <= per_epoch[0] <= 2 + 5, per_epoch
    # Rounds log a validation score or null (not evaluated that round): both are valid.
    assert all(e["val_score"] is None or isinstance(e["val_score"], float) for e in rounds)
    assert {e["source"] for e in events if e["event"] == "score"} >= {"probe"}


def test_dashboard_builds_for_a_real_log(real_logs):
    path = real_logs["proportional"]
    events = _events(path)
    rounds = [e for e in events if e["event"] == "round"]
    layout = dashboard(path, live=False)
    layout.get_root()  # renders every Bokeh/Panel model: a broken view fails here
    mon = layout.monitor.current
    d = mon.data
    assert d.n_rounds == len(rounds) and d.status == "completed"
    text = _texts(mon.header())
    assert f"rounds: {len(rounds)}" in text
    assert "heterogeneity emulated on one machine" in text
    assert "partition=proportional" in text and "sync=hmdspt" in text
    n_rows = events[0]["dataset"]["n_rows"]  # the trainer writes n_rows
    assert f"{n_rows:,} rows × 20 features" in text
    assert not _messages(mon.header())  # a completed, clean log: no alert
    # Workers in natural order, whatever order run_start listed them in.
    names = sorted(w["name"] for w in events[0]["workers"])
    assert list(mon.idle_src.data["worker"]) == names
    assert list(mon.fig_timeline.y_range.factors) == names[::-1]
    # Idle bars are summarize()'s idle fractions, and the efficiency run_end's summary.
    s = summarize(events)
    for name, pct in zip(mon.idle_src.data["worker"], mon.idle_src.data["idle_pct"]):
        assert pct == pytest.approx(100 * s["workers"][name]["idle_fraction"])
    assert d.summary()["efficiency"] == pytest.approx(events[-1]["summary"]["efficiency"])
    # Loss on every round; validation only where the round has a score.
    assert len(mon.loss_src.data["t"]) == len(rounds)
    n_val = sum(e["val_score"] is not None for e in rounds)
    assert len(mon.val_src.data["t"]) == n_val
    assert mon.fig_val.title.text.startswith("Validation score")
    # Timeline: busy, comm and idle of each worker in each round.
    assert len(mon.seg_src["busy"].data["left"]) == len(rounds) * len(names)
    assert len(mon.rows_share_src.data["xs"]) == len(names)
    assert len(mon.score_share_src.data["xs"]) == len(names)
    # Re-balances (partition events with moves) are marked; the initial partition is not.
    moved = [e for e in events if e["event"] == "partition" and e["moves"]]
    assert mon.marker_src.data["kind"] == ["re-balance"] * len(moved)


def test_the_share_axis_starts_at_zero_so_equal_shares_show_as_lines(real_logs):
    """Equal shares are one value: an axis fitted to them spans only rounding noise."""
    layout = dashboard(real_logs["equal"], live=False)
    layout.get_root()
    mon = layout.monitor.current
    rows = mon.rows_share_src.data["ys"]
    n = len(rows)
    assert n >= 2 and all(y == pytest.approx(1 / n, abs=0.01) for ys in rows for y in ys)
    assert mon.fig_shares.y_range.start == 0


def test_moves_as_lists_and_null_validation_scores(real_logs, tmp_path):
    """A real log rewritten with moves as [src, dst, rows] lists and no validation."""
    lines = []
    for e in _events(real_logs["proportional"]):
        if e["event"] == "partition":
            e["moves"] = [[m["src"], m["dst"], m["rows"]] for m in e["moves"]] or [
                ["worker-1", "worker-0", 7]  # one move at least, in list form
            ]
            e["rows_moved"] = sum(m[2] for m in e["moves"])
        if e["event"] in ("round", "warm_start"):
            e["val_score"] = None
        lines.append(json.dumps(e))
    path = tmp_path / "lists.jsonl"
    path.write_text("\n".join(lines) + "\n")
    mon = RunMonitor(path=str(path))
    pn.Column(mon.panel()).get_root()
    n_parts = sum(e["event"] == "partition" for e in _events(path))
    assert mon.marker_src.data["kind"] == ["re-balance"] * n_parts
    assert all(re.search(r"rows in \d+ moves", label) for label in mon.marker_src.data["label"])
    assert len(mon.val_src.data["t"]) == 0
    assert "none logged" in mon.fig_val.title.text
    other = tmp_path / "other.jsonl"
    shutil.copy(real_logs["equal"], other)
    res = compare_runs(path, other)
    assert res["runs"][0]["best_val_score"] is None and res["target"] is None
    assert res["runs"][0]["final_loss"] is not None


def test_comparison_of_two_real_runs(real_logs, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    for name, src in (
        ("equal.jsonl", real_logs["equal"]),
        ("hmdspt.jsonl", real_logs["proportional"]),
    ):
        shutil.copy(src, folder / name)
    os.utime(folder / "hmdspt.jsonl", (time.time() + 5, time.time() + 5))  # the newest
    res = compare_runs(folder / "hmdspt.jsonl", folder / "equal.jsonl")
    a, b = res["runs"]
    assert (a["partition"], b["partition"]) == ("proportional", "equal")
    for r, name in ((a, "hmdspt.jsonl"), (b, "equal.jsonl")):
        rounds = [e for e in _events(folder / name) if e["event"] == "round"]
        # 3 epochs x 2 rounds, after the ramp rounds (if any) the speeds called for.
        assert r["rounds"] == len(rounds) >= 3 * 2
        assert len(r["loss"]) == len(rounds)
    assert a["emulation"].startswith("heterogeneity emulated on one machine")
    for r in (a, b):
        assert r["status"] == "completed" and 0 < r["efficiency"] <= 1
        assert r["final_loss"] == pytest.approx(r["loss"][-1])
        if r["best_val_score"] is not None:  # both runs score on the same held-out split
            assert res["target"] is not None and len(r["val"]) == len(r["val_t"])
    # The validation curve starts with the warm-started model's score, before round one.
    events = _events(folder / "hmdspt.jsonl")
    (warm,) = [e for e in events if e["event"] == "warm_start"]
    assert warm["val_score"] is not None  # the fit holds out a validation split
    first_round = next(e for e in events if e["event"] == "round")
    assert a["val"][0] == pytest.approx(warm["val_score"])
    assert a["val_t"][0] < first_round["time"] - events[0]["time"]
    # The Compare tab defaults to the newest run against the other partition.
    mon = Monitor(path=str(folder), live=False)
    cmp_ = mon.comparison
    assert (Path(cmp_.run_a).name, Path(cmp_.run_b).name) == ("hmdspt.jsonl", "equal.jsonl")
    view = cmp_.view()
    pn.Column(view).get_root()
    table = view.objects[0].object
    assert "proportional" in table and "equal" in table
    assert "heterogeneity emulated on one machine" in table
    assert "final training loss" in table


def test_dashboard_builds_for_a_synthetic_log(tmp_path):
    run = make_log(tmp_path / "runs" / "a.jsonl", 24, seed=1)
    layout = dashboard(tmp_path / "runs", live=False)
    layout.get_root()  # renders every Bokeh/Panel model: a broken view fails here
    mon = layout.monitor.current
    assert mon.data.n_rounds == 24
    header = _texts(mon.header())
    assert "rounds: 24" in header
    assert "heterogeneity emulated on one machine" in header
    assert run.run_id in header
    # Every chart has data: timeline window, idle bars, loss, validation, shares, markers.
    n_workers = 3
    assert 0 < len(mon.seg_src["busy"].data["left"]) <= mon.timeline_rounds * n_workers
    assert list(mon.idle_src.data["worker"]) == ["w0", "w1", "w2"]
    assert len(mon.loss_src.data["t"]) == 24
    assert len(mon.val_src.data["t"]) == 12  # every 2nd round
    assert len(mon.rows_share_src.data["xs"]) == n_workers
    kinds = set(mon.marker_src.data["kind"])
    assert {"worker lost", "worker joined", "checkpoint"} <= kinds
    # The idle bars are summarize()'s idle fractions.
    s = summarize(read_events(run.path))
    for name, pct in zip(mon.idle_src.data["worker"], mon.idle_src.data["idle_pct"]):
        assert pct == pytest.approx(100 * s["workers"][name]["idle_fraction"])


def test_incremental_summary_equals_summarize_of_the_whole_run(tmp_path):
    path = tmp_path / "live.jsonl"
    run = make_log(path, 10, status=None, seed=2)
    data = RunData(path)
    data.poll()
    for k in (1, 4, 7):
        run.rounds(k)
        data.poll()
    run.end()
    data.poll()
    full = summarize(read_events(path))
    mine = data.summary()
    assert mine["rounds"] == full["rounds"] == 22
    for key in ("wall_s", "fit_wall_s", "ideal_s", "efficiency", "fastest_idle_fraction"):
        assert mine[key] == pytest.approx(full[key])
    assert mine["fastest_worker"] == full["fastest_worker"]
    for name, w in full["workers"].items():
        for key in ("idle_fraction", "utilisation", "mean_speed", "busy_s", "idle_s"):
            assert mine["workers"][name][key] == pytest.approx(w[key])


def test_tail_updates_after_appending_and_reads_only_new_bytes(tmp_path):
    path = tmp_path / "live.jsonl"
    run = make_log(path, 12, status=None, events=False, seed=3)
    mon = RunMonitor(path=str(path), timeline_rounds=5, shares_interval_s=0)
    assert mon.data.n_rounds == 12
    assert "rounds: 12" in _texts(mon.header())
    segments = len(mon.seg_src["busy"].data["left"])
    assert segments == 5 * 3  # the window's rounds only
    revision, tick = mon.revision, mon.tick

    size = path.stat().st_size
    run.rounds(3)
    appended = path.stat().st_size - size
    upd = mon.poll()
    assert upd.bytes_read == appended  # only what was appended, not the whole log
    assert upd.rounds_from == 12
    assert mon.data.n_rounds == 15
    assert "rounds: 15" in _texts(mon.header())
    assert mon.tick == tick + 1 and mon.revision == revision  # patched, not rebuilt
    assert len(mon.loss_src.data["t"]) == 15
    assert len(mon.seg_src["busy"].data["left"]) == 5 * 3  # rolled over
    assert max(mon.seg_src["busy"].data["round"]) == 14
    assert mon.score_share_src.data["xs"][0][-1] == 14  # online scores after round 14

    assert mon.poll().events == 0  # nothing new: nothing read, nothing sent
    run.end()
    mon.poll()
    assert mon.data.status == "completed"


def test_torn_last_line_is_ignored_until_completed(tmp_path):
    path = tmp_path / "torn.jsonl"
    make_log(path, 6, status=None, events=False, seed=4).rounds(1).log.close()
    # Cut the last event in two: the page shows 6 rounds until the rest arrives.
    data = path.read_bytes()
    start = data.rfind(b'{"event":"round"')
    last = data[start : data.index(b"\n", start) + 1]
    path.write_bytes(data[:start] + last[:40])
    mon = RunMonitor(path=str(path))
    assert mon.data.n_rounds == 6
    text = _texts(mon.header())
    assert "rounds: 6" in text
    assert "incomplete (40 bytes)" in text
    with open(path, "ab") as f:
        f.write(last[40:])
    mon.poll()
    assert mon.data.n_rounds == 7 and mon.data.torn_bytes == 0
    assert "incomplete" not in _texts(mon.header())


def test_empty_log_gives_a_message_then_charts_when_events_arrive(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.touch()
    mon = RunMonitor(path=str(path))
    msgs = _messages(mon.header())
    assert len(msgs) == 1 and "is empty" in msgs[0].object
    revision = mon.revision
    make_log(path, 3, status=None, seed=5)
    mon.poll()
    assert mon.revision > revision  # from a message to charts
    assert "rounds: 3" in _texts(mon.header())
    assert mon.charts() is not None


def test_only_a_torn_line_gives_a_message(tmp_path):
    path = tmp_path / "torn_only.jsonl"
    path.write_bytes(b'{"event":"run_start","run_id":"r","ti')
    text = _texts(RunMonitor(path=str(path)).header())
    assert "no complete event yet" in text


def test_failed_run_shows_status_and_reason(tmp_path):
    path = tmp_path / "failed.jsonl"
    make_log(path, 4, status="failed", reason="worker w1 died: <MemoryError>", seed=6)
    mon = RunMonitor(path=str(path))
    msgs = _messages(mon.header())
    assert any("Run failed after 4 rounds" in m.object for m in msgs)
    # Text from the log is escaped: a log is data, never markup.
    assert any("&lt;MemoryError&gt;" in m.object for m in msgs)
    assert "failed" in _texts(mon.header())


def test_a_run_that_has_logged_nothing_for_long_says_its_driver_may_have_stopped(tmp_path):
    # A killed driver writes no run_end: its run showed "running" for good, after the fact.
    hour_ago = time.time() - 3600
    stopped, live = tmp_path / "stopped.jsonl", tmp_path / "live.jsonl"
    make_log(stopped, 3, status=None, seed=7, start_time=hour_ago).log.close()
    os.utime(stopped, (hour_ago + 10, hour_ago + 10))
    note = "its driver may have stopped without writing run_end"
    texts = [m.object for m in _messages(RunMonitor(path=str(stopped)).header())]
    assert any(note in t and re.search(r"No event for \d+ min", t) for t in texts), texts
    make_log(live, 3, status=None, seed=7).log.close()
    assert note not in _texts(RunMonitor(path=str(live)).header())
    ended = tmp_path / "ended.jsonl"
    make_log(ended, 3, seed=7, start_time=hour_ago)
    os.utime(ended, (hour_ago + 10, hour_ago + 10))
    assert note not in _texts(RunMonitor(path=str(ended)).header())


def test_folder_without_logs_and_missing_path_give_messages(tmp_path):
    (tmp_path / "empty_folder").mkdir()
    for path, words in (
        (tmp_path / "empty_folder", "No run logs"),
        (tmp_path / "missing", "no run log or folder"),
    ):
        layout = dashboard(path, live=False)
        layout.get_root()
        view = layout.monitor.run_view()
        assert words in view.object
        assert layout.monitor.comparison.view().object.startswith("Comparing needs two")


def test_new_log_in_the_folder_appears_and_is_selected(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    mon = Monitor(path=str(folder), live=False)
    assert mon.current is None
    make_log(folder / "new.jsonl", 2, seed=7)
    mon.refresh_runs()
    assert mon.run == str(folder / "new.jsonl")
    assert mon.current.data.n_rounds == 2


def test_list_runs_is_newest_first(tmp_path):
    for i, name in enumerate(["b.jsonl", "a.jsonl", "c.jsonl"]):
        make_log(tmp_path / name, 1, seed=i)
        os.utime(tmp_path / name, (time.time() + i, time.time() + i))
    (tmp_path / "notes.txt").write_text("not a log")
    runs = list_runs(tmp_path)
    assert [r.path.name for r in runs] == ["c.jsonl", "a.jsonl", "b.jsonl"]
    assert runs[0].config["partition"] == "proportional" and runs[0].n_workers == 3
    assert [r.path.name for r in list_runs(tmp_path / "a.jsonl")] == ["a.jsonl"]
    with pytest.raises(FileNotFoundError):
        list_runs(tmp_path / "missing")


def test_a_file_with_two_runs_follows_the_last_one(tmp_path):
    path = tmp_path / "two.jsonl"
    make_log(path, 3, run_id="r1", seed=8)
    data = RunData(path)
    data.poll()
    assert data.run_id == "r1" and data.n_rounds == 3
    run = make_log(path, 2, run_id="r2", status=None, seed=9)
    upd = data.poll()
    assert upd.reset and data.run_id == "r2" and data.n_rounds == 2
    assert data.run_ids == ["r1", "r2"]
    run.rounds(1)
    data.poll()
    assert data.summary()["rounds"] == 3
    # A chosen run can still be shown.
    first = RunData(path, run_id="r1")
    first.poll()
    assert first.n_rounds == 3


def _replace(path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it over it, as rsync and scp do."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_log_replaced_by_a_larger_file_is_read_once(real_logs, tmp_path):
    """A synced copy of a log grows by replacement, not by appending: the offset moves
    forward, and the page counted the first half twice."""
    whole = Path(real_logs["proportional"]).read_bytes()
    lines = whole.splitlines(keepends=True)
    path = tmp_path / "synced.jsonl"
    _replace(path, b"".join(lines[: len(lines) // 2]))
    mon = RunMonitor(path=str(path))
    half = mon.data.n_rounds
    assert half > 0
    _replace(path, whole)
    assert mon.poll().reset
    full = summarize(read_events(path))
    mine = mon.data.summary()
    assert mon.data.n_rounds == mine["rounds"] == full["rounds"] > half
    for key in ("wall_s", "efficiency", "fastest_idle_fraction"):
        assert mine[key] == pytest.approx(full[key])
    assert len(mon.loss_src.data["t"]) == full["rounds"]
    assert f"rounds: {full['rounds']}" in _texts(mon.header())
    # Another run synced over it (larger again): that run alone, not "2 runs".
    other = tmp_path / "other.jsonl"
    make_log(other, 30, seed=11, run_id="other")
    assert other.stat().st_size > path.stat().st_size
    _replace(path, other.read_bytes())
    assert mon.poll().reset
    assert mon.data.run_ids == ["other"] and mon.data.n_rounds == 30
    assert "runs; showing" not in _texts(mon.header())


def test_the_timeline_axis_follows_the_rounds_shown_as_old_ones_roll_off(tmp_path):
    path = tmp_path / "live.jsonl"
    run = make_log(path, 4, status=None, events=False, seed=12)
    mon = RunMonitor(path=str(path), timeline_rounds=5)
    for _ in range(4):
        run.rounds(3)
        mon.poll()
    events = read_events(path)
    rounds = [e for e in events if e["event"] == "round"]
    assert len(rounds) == 16

    def start(e):  # a round ends at its event's time and lasted wall_s
        return e["time"] - events[0]["time"] - e["wall_s"]

    assert min(mon.seg_src["busy"].data["left"]) == pytest.approx(start(rounds[-5]))
    x = mon.fig_timeline.x_range
    assert x.start is not None and x.start >= start(rounds[-5]) - 1e-9
    assert x.end == pytest.approx(rounds[-1]["time"] - events[0]["time"])
    assert (x.reset_start, x.reset_end) == (x.start, x.end)  # the reset tool goes back there
    mon.timeline_rounds = 10  # the slider: the window, and the axis with it, widen
    assert x.start == pytest.approx(start(rounds[-10]))


def test_the_share_lines_reach_the_last_round_read_on_every_poll(real_logs, tmp_path):
    """The trainer logs scores only when they change the partition: a re-send of the
    lines on those events alone left them short of the last rounds, run over."""
    lines = Path(real_logs["proportional"]).read_bytes().splitlines(keepends=True)
    first_round = next(i for i, line in enumerate(lines) if b'"event":"round"' in line)
    path = tmp_path / "pieces.jsonl"
    path.write_bytes(b"".join(lines[:first_round]))
    mon = RunMonitor(path=str(path))  # share lines re-sent at most every 5 s (default)
    assert len(mon.rows_share_src.data["xs"]) >= 2
    polls = 0
    for line in lines[first_round:]:
        with open(path, "ab") as f:
            f.write(line)
        upd = mon.poll()
        # Followed from before its first round, the timeline's sources stream from empty.
        for src in mon.seg_src.values():
            assert len({len(column) for column in src.data.values()}) == 1, src.data
        if upd.rounds_from is None:
            continue
        polls += 1
        last = mon.data.round_no.values[-1]
        for src in (mon.rows_share_src, mon.score_share_src):
            assert [float(x[-1]) for x in src.data["xs"]] == [last] * len(src.data["xs"])
    rounds = [e for e in read_events(path) if e["event"] == "round"]
    assert polls == len(rounds) and mon.data.status == "completed"
    for src in (mon.rows_share_src, mon.score_share_src):
        assert {float(x[-1]) for x in src.data["xs"]} == {rounds[-1]["round"]}


def test_emulation_label():
    method = "duty cycle: sleep (k-1) x thread CPU time of each compute chunk"
    # What the trainer writes for local_cluster(speeds=(4, 2, 1)).
    assert emulation_label({"emulation": {"speeds": [4.0, 2.0, 1.0], "method": method}}) == (
        f"heterogeneity emulated on one machine (speeds 4:2:1; {method})"
    )
    assert emulation_label({"emulation": {"speeds": {"a": 2, "b": 1}}}).endswith("(speeds 2:1)")
    # Speeds that are not numbers (e.g. worker names) are left out, the method kept.
    assert emulation_label({"emulation": {"speeds": ["w0", "w1"], "method": method}}) == (
        f"heterogeneity emulated on one machine ({method})"
    )
    assert emulation_label({"emulated_speeds": [4, 2, 1]}).startswith(
        "heterogeneity emulated on one machine (speeds 4:2:1)"
    )
    assert emulation_label({"emulation": {"kind": "duty-cycle"}}) is not None
    assert emulation_label({"emulated_speeds": None}) is None
    assert emulation_label({"partition": "equal"}) is None
    assert emulation_label(None) is None


# --------------------------------------------------------------------------------------
# Comparison on hand-made logs (numbers known exactly)
# --------------------------------------------------------------------------------------


def _hand_log(path, run_id, rounds, *, t0=1000.0, partition="proportional"):
    """rounds: (wall, fast_busy, slow_busy, val) per round; comm 0.1 s for both workers."""
    with RunLogWriter(path, run_id=run_id) as log:
        log.run_start(
            config={"partition": partition, "emulated_speeds": [2, 1]},
            workers=[{"name": n, "address": "", "nthreads": 1, "memory": 0} for n in "fs"],
            dataset={"n_samples": 300, "n_features": 4},
            model={"layers": [4, 2], "n_params": 10},
            timestamp=t0,
        )
        t = t0 + 1.0  # one second of probing before the first round
        for r, (wall, fb, sb, val) in enumerate(rounds):
            t += wall
            workers = {
                "f": {"rows": 200, "steps": 1, "busy_s": fb, "comm_s": 0.1},
                "s": {"rows": 100, "steps": 1, "busy_s": sb, "comm_s": 0.1},
            }
            log.round(r, r, wall, 0.0, 1.0 / (r + 1), val, workers, timestamp=t)
        log.run_end("completed", t - t0, timestamp=t)


def test_comparison_numbers_on_hand_made_logs(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    # A: balanced. fast worker idle 0.1 of 1.2 per round; vals 0.70, 0.88, None, 0.90.
    _hand_log(a, "A", [(1.2, 1.0, 1.0, 0.70), (1.2, 1.0, 1.0, 0.88),
                       (1.2, 1.0, 1.0, None), (1.2, 1.0, 1.0, 0.90)])  # fmt: skip
    # B: equal shares: the fast worker computes 0.5 s of a 2.1 s round (idle 1.5 s).
    _hand_log(b, "B", [(2.1, 0.5, 2.0, 0.60), (2.1, 0.5, 2.0, 0.86),
                       (2.1, 0.5, 2.0, 0.87), (2.1, 0.5, 2.0, None)],
              partition="equal")  # fmt: skip
    res = compare_runs(a, b)
    ra, rb = res["runs"]
    assert res["target_is_default"]
    assert res["target"] == pytest.approx(0.87 - 0.01)  # lower best minus 0.01
    assert ra["fastest_worker"] == rb["fastest_worker"] == "f"
    assert ra["fastest_idle_fraction"] == pytest.approx(0.1 / 1.2)
    assert rb["fastest_idle_fraction"] == pytest.approx(1.5 / 2.1)
    # Time to target: from run_start to the end of the first round at or above 0.86.
    assert ra["time_to_target_s"] == pytest.approx(1.0 + 2 * 1.2)
    assert rb["time_to_target_s"] == pytest.approx(1.0 + 2 * 2.1)
    # Final score: the last one logged (the last round of B has none).
    assert ra["final_val_score"] == 0.90 and rb["final_val_score"] == 0.87
    assert (ra["partition"], rb["partition"]) == ("proportional", "equal")

    explicit = compare_runs(read_events(a), read_events(b), target=0.89)
    assert not explicit["target_is_default"]
    assert explicit["runs"][0]["time_to_target_s"] == pytest.approx(1.0 + 4 * 1.2)
    assert explicit["runs"][1]["time_to_target_s"] is None

    # The Compare tab shows the same numbers.
    mon = Monitor(path=str(tmp_path), live=False)
    cmp_ = mon.comparison
    cmp_.run_a, cmp_.run_b = str(a), str(b)
    html = cmp_.view().objects[0].object
    assert "8.3 %" in html and "71.4 %" in html
    assert "3.4 s" in html and "5.2 s" in html
    assert "0.8600 (default" in html
    cmp_.target = 0.89
    assert "not reached" in cmp_.view().objects[0].object


def test_comparison_without_validation_scores_says_so(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _hand_log(a, "A", [(1.2, 1.0, 1.0, None)])
    _hand_log(b, "B", [(1.2, 1.0, 1.0, 0.5)])
    res = compare_runs(a, b)
    assert res["target"] is None
    assert all(r["time_to_target_s"] is None for r in res["runs"])
    assert math.isclose(res["runs"][1]["final_val_score"], 0.5)


def test_compare_tab_labels_each_runs_emulation_with_its_run(real_logs, tmp_path):
    """One set of labels for both runs called a run on real hardware emulated, and showed
    one of two different emulations."""
    from distributed import Client

    from hmdspt import local_cluster

    plain = tmp_path / "plain.jsonl"  # full-speed workers: nothing emulated
    with local_cluster(n_workers=2, processes=False) as cluster, Client(cluster) as client:
        real_fit(plain, client=client, hidden=(8,), epochs=2, n_samples=2000)
    assert _events(plain)[0]["config"]["emulation"] is None
    emulated = tmp_path / "emulated.jsonl"
    shutil.copy(real_logs["proportional"], emulated)
    hand = tmp_path / "hand.jsonl"
    _hand_log(hand, "H", [(1.2, 1.0, 1.0, 0.5)])  # config: emulated_speeds [2, 1]
    label = html.escape(emulation_label(_events(emulated)[0]["config"]))
    cmp_ = Comparison(list_runs(tmp_path))

    def table(a, b):
        cmp_.run_a, cmp_.run_b = str(a), str(b)
        view = cmp_.view()
        pn.Column(view).get_root()
        return view.objects[0].object

    for a, b, name in ((plain, emulated, "B"), (emulated, plain, "A")):
        text = table(a, b)
        assert text.count("heterogeneity emulated") == 1
        assert f"{name}: {label}" in text
    # Two different emulations: each shown, with its run.
    hand_label = html.escape(emulation_label(_events(hand)[0]["config"]))
    assert hand_label != label
    text = table(emulated, hand)
    assert f"A: {label}" in text and f"B: {hand_label}" in text


def test_monitor_main_refuses_a_missing_path(tmp_path, capsys):
    from hmdspt.app.cli import monitor_main

    assert monitor_main(tmp_path / "missing") == 1
    assert "no run log or folder" in capsys.readouterr().err
    data = tmp_path / "data.csv"  # a data file given by mistake: served, it showed no event
    data.write_text("a,b\n1,2\n")
    assert monitor_main(data) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err == f"hmdspt monitor: error: {data} is not a run log (a .jsonl file) or a folder of them"
    )


def test_monitor_main_that_cannot_listen_says_where_in_one_line(tmp_path, capsys, monkeypatch):
    import socket

    from hmdspt.app.cli import monitor_main

    monkeypatch.setenv("BOKEH_RESOURCES", "server")  # monitor_main sets it for Panel
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert monitor_main(tmp_path, port=port) == 1
    # 192.0.2.1 is a documentation address (RFC 5737): no interface here has it.
    assert monitor_main(tmp_path, address="192.0.2.1") == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"hmdspt monitor: error: cannot listen on 127.0.0.1:{port}: Address already in use",
        "hmdspt monitor: error: cannot listen on 192.0.2.1: Cannot assign requested address",
    ]


def test_odd_but_valid_json_events_do_not_break_the_page(tmp_path):
    # Readers must ignore what they do not know and treat bad numbers as unknown; an event
    # whose lists or objects have the wrong type is skipped and counted (4 here).
    lines = [
        {"event": "run_start", "run_id": "r", "time": 10.0, "workers": "nope", "config": [1]},
        {"event": "score", "run_id": "r", "time": 11.0, "worker": 5, "score": "fast"},
        {"event": "partition", "run_id": "r", "time": 11.5, "rows": [1, 2], "moves": "x"},
        {"event": "round", "run_id": "r", "time": "late", "wall_s": 1.0,
         "workers": {"a": {"busy_s": "?", "comm_s": None, "rows": 3}}},
        {"event": "round", "run_id": "r", "time": 13.0, "wall_s": None, "workers": []},
        {"event": "round", "run_id": "r", "time": 14.0, "wall_s": 1.0, "loss": None,
         "workers": {"a": {"busy_s": 0.5, "comm_s": 0.1, "rows": 3, "idle_s": None}}},
        {"event": "worker_lost", "run_id": "r", "time": 15.0},
        {"event": "checkpoint", "run_id": "r", "time": 15.5, "round": "1", "path": None},
        {"event": "telemetry", "run_id": "r", "time": 16.0, "gpu": 1},
        {"event": "run_end", "run_id": "r", "time": 17.0, "status": None, "reason": 42},
    ]  # fmt: skip
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines) + "[1, 2]\nnot json\n")
    mon = RunMonitor(path=str(path))
    assert mon.data.n_rounds == 2
    assert mon.data.skipped_lines == 2 + 4
    text = _texts(mon.header())
    assert "rounds: 2" in text and "skipped 6 malformed lines/events" in text
    pn.Column(mon.panel()).get_root()  # every chart renders


def test_utilisation_beside_idle_is_the_run_logs_summary(tmp_path):
    """Utilisation bars and the header: live through summarize's definition, then
    run_end's summary (issue 15, point 3)."""
    path = tmp_path / "u.jsonl"
    log = RunLogWriter(path, run_id="U")
    log.run_start(
        config={"partition": "proportional"},
        workers=[{"name": n, "address": "", "nthreads": 1, "memory": 0} for n in "fs"],
        dataset={"n_samples": 300, "n_features": 4},
        model={"layers": [4, 2], "n_params": 10},
        called_at=999.0,  # the user's fit() call, a second before run_start
        timestamp=1000.0,
    )
    for r, t in enumerate((1003.0, 1005.0)):  # two 2 s rounds after 1 s of probing
        workers = {
            "f": {"rows": 200, "steps": 1, "busy_s": 0.5, "comm_s": 0.1},
            "s": {"rows": 100, "steps": 1, "busy_s": 1.5, "comm_s": 0.1},
        }
        log.round(r + 1, 1, 2.0, 0.0, 1.0, None, workers, timestamp=t)
    mon = RunMonitor(path=str(path))
    live = summarize(read_events(path))
    assert live["workers"]["f"]["utilisation"] == pytest.approx(1.0 / 6.0)  # to the last round
    src = mon.idle_src.data
    assert list(src["worker"]) == ["f", "s"]
    for name, pct in zip(src["worker"], src["util_pct"]):
        assert pct == pytest.approx(100 * live["workers"][name]["utilisation"])
    assert mon.data.summary()["fastest_utilisation"] == pytest.approx(live["fastest_utilisation"])
    log.run_end("completed", 8.0, summary=summarize(read_events(path), fit_wall_s=8.0),
                timestamp=1007.0)  # fmt: skip
    log.close()
    mon.poll()
    end = read_events(path)[-1]["summary"]
    for name, pct in zip(mon.idle_src.data["worker"], mon.idle_src.data["util_pct"]):
        assert pct == pytest.approx(100 * end["workers"][name]["utilisation"])
    assert mon.idle_src.data["util_pct"][0] == pytest.approx(100 * 1.0 / 8.0)
    for name, pct in zip(mon.idle_src.data["worker"], mon.idle_src.data["idle_pct"]):
        assert pct == pytest.approx(100 * end["workers"][name]["idle_fraction"])
    text = _texts(mon.header())
    assert "fastest worker f idle 70.0 % · utilisation 12.5 % of the 8.0 s fit" in text
    assert "utilisation" in mon.fig_idle.title.text
    pn.Column(mon.panel()).get_root()  # the chart renders with both bars

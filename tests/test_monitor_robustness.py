"""The monitor against hostile or broken run logs (issue 14, defects 6 and 7).

A run log is data written by whoever can write the folder: one bad line or event must not
take the page down (it is skipped and counted), and no text from a log is ever rendered as
markup (Markdown or HTML), so a log cannot make the browser fetch a URL.

``ServedMonitor`` serves the monitor the way users start it (``python -m hmdspt
monitor``) and reads the page as a browser gets it, over Bokeh's websocket
(``bokeh.client.pull_session``); ``tests/test_security.py`` uses it for real logins.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import panel as pn
import pytest

pytestmark = pytest.mark.heavy(13)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hmdspt.app.monitor import RunMonitor, dashboard  # noqa: E402
from hmdspt.app.rundata import RunData, compare_runs, list_runs  # noqa: E402
from hmdspt.core.runlog import RunLogTail, RunLogWriter, read_events, summarize  # noqa: E402
from tests.ports import free_port  # noqa: E402

BEACON = "http://127.0.0.1:9/beacon.png"  # port 9 (discard): nothing answers there


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


class ServedMonitor:
    """``python -m hmdspt monitor PATH --port N ARGS...`` as a subprocess.

    Started without a shell, so :meth:`stop` signals the server's own PID.
    """

    def __init__(self, path: os.PathLike, *args: str, log_dir: os.PathLike) -> None:
        self.port = free_port()
        self.cmd = [sys.executable, "-m", "hmdspt", "monitor", str(path)]
        self.cmd += ["--port", str(self.port), *args]
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen | None = None

    def stderr(self) -> str:
        return (self.log_dir / "server.err").read_text(errors="replace")

    def __enter__(self) -> ServedMonitor:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, PYTHONPATH=path)
        with open(self.log_dir / "server.out", "wb") as out:
            with open(self.log_dir / "server.err", "wb") as err:
                self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the monitor exited early:\n{self.stderr()}")
            try:
                self.request("GET", "/static/js/bokeh.min.js")
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the monitor did not answer in 60 s:\n{self.stderr()}")

    def request(self, method: str, path: str, body: str | None = None, headers=None):
        """One HTTP request; returns (status, headers as a dict of lists, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            hdrs: dict[str, list[str]] = {}
            for k, v in resp.getheaders():
                hdrs.setdefault(k.lower(), []).append(v)
            return resp.status, hdrs, resp.read()
        finally:
            conn.close()

    def page_texts(self) -> list[str]:
        """The text of every model of the page a browser gets (over the websocket)."""
        from bokeh.client import pull_session

        with pull_session(url=f"http://127.0.0.1:{self.port}/") as session:
            return model_texts(session.document.roots)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def model_texts(roots) -> list[str]:
    """``text`` of every Bokeh/Panel model under ``roots`` (what the browser renders)."""
    out = []
    for root in roots:
        for model in root.references():
            text = getattr(model, "text", None)
            if isinstance(text, str) and text:
                out.append(text)
    return out


def rendered_texts(viewable) -> list[str]:
    """The models' text of a Panel view, as its browser side gets it."""
    return model_texts([viewable.get_root()])


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def markup_pointing_at(texts: list[str], url: str) -> list:
    """Elements of rendered HTML with an attribute naming ``url`` (img src, a href, ...).

    Panel's HTML and Markdown models carry their HTML escaped once (the browser side
    unescapes it and sets it as innerHTML): unescape once, then parse as the browser does.
    """
    hits = []
    for text in texts:
        parser = _Links()
        parser.feed(html.unescape(text))
        hits += [(t, a) for t, a in parser.tags if any(url in (v or "") for v in a.values())]
    return hits


def _good_events(path: Path, run_id: str = "r") -> None:
    """A small valid run: run_start, two rounds, run_end (the real writer)."""
    with RunLogWriter(path, run_id=run_id) as log:
        log.run_start(
            config={"partition": "proportional"},
            workers=[{"name": n, "address": "", "nthreads": 1, "memory": 0} for n in "ab"],
            dataset={"name": "toy", "n_rows": 300, "n_features": 4},
            model={"layers": [4, 8, 2], "n_params": 58},
            timestamp=100.0,
        )
        for r in (1, 2):
            workers = {
                "a": {"rows": 200, "steps": 1, "busy_s": 1.0, "comm_s": 0.1},
                "b": {"rows": 100, "steps": 1, "busy_s": 1.0, "comm_s": 0.1},
            }
            log.round(r, r, 1.2, 0.0, 1.0 / r, 0.5 + r / 10, workers, timestamp=100.0 + r)


def _line(record: dict) -> str:
    return json.dumps(record) + "\n"


_START = {"event": "run_start", "run_id": "r", "time": 100.5, "config": {}, "dataset": {}}
_ROUND = {"event": "round", "run_id": "r", "time": 102.5, "round": 3, "wall_s": 1.0}

# Each a line that must be skipped and counted, appended after two good rounds.
BAD_LINES = {
    "30000 nested brackets": "[" * 30_000 + "]" * 30_000 + "\n",
    "an object nested 200 deep": '{"event": "round", "x": ' + "[" * 200 + "]" * 200 + "}\n",
    "a round whose workers hold strings": _line({**_ROUND, "workers": {"a": "x", "b": "y"}}),
    "a round whose workers is a list": _line({**_ROUND, "workers": ["a", "b"]}),
    "a run_start whose model layers is a number": _line({**_START, "model": {"layers": 5}}),
    "a run_start whose workers is a number": _line({**_START, "workers": 5}),
    "a run_start whose workers hold strings": _line({**_START, "workers": ["a", "b"]}),
    "a run_start whose config is a list": _line({**_START, "config": [1, 2]}),
    "a partition whose rows is a list": _line(
        {"event": "partition", "run_id": "r", "time": 102.6, "round": 2, "rows": [1, 2]}
    ),
    "a score whose worker is an object": _line(
        {"event": "score", "run_id": "r", "time": 102.7, "round": 2, "worker": {"a": 1}}
    ),
    "a run_id that is a list": _line({**_ROUND, "run_id": ["r"], "workers": {}}),
    "a 9 MB line": '{"event": "round", "pad": "' + "x" * (9 << 20) + '"}\n',
}


# --------------------------------------------------------------------------------------
# Defect 6: one malformed run log takes down the monitor page
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_one_malformed_line_or_event_is_skipped_and_counted_not_fatal(tmp_path, case):
    path = tmp_path / "runs" / "bad.jsonl"
    _good_events(path)
    with open(path, "a") as f:
        f.write(BAD_LINES[case])
        f.write(_line({"event": "run_end", "run_id": "r", "time": 103.0, "status": "completed"}))

    events = read_events(path)  # the reader skips it ...
    assert [e["event"] for e in events] == ["run_start", "round", "round", "run_end"]
    assert summarize(events)["rounds"] == 2
    tail = RunLogTail(path)
    assert len(tail.read_new()) == 4 and tail.skipped == 1  # ... and the tail counts it

    # The page is the monitor of the good events, with a plain note about the bad one.
    layout = dashboard(path.parent, live=False)
    layout.get_root()  # renders every model: a broken view fails here
    mon = layout.monitor.current
    assert mon.data.n_rounds == 2 and mon.data.skipped_lines == 1
    text = "\n".join(rendered_texts(mon.panel()))
    assert "rounds: 2" in text
    assert "skipped 1 malformed line/event" in text
    assert "Traceback" not in text
    # The Compare tab reads the same log whole.
    good = tmp_path / "runs" / "good.jsonl"
    _good_events(good, run_id="g")
    assert compare_runs(path, good)["runs"][0]["rounds"] == 2
    pn.Column(layout.monitor.comparison.view()).get_root()


def test_a_huge_unfinished_line_is_not_held_in_memory_by_the_tail(tmp_path):
    path = tmp_path / "huge.jsonl"
    _good_events(path)
    with open(path, "ab") as f:
        f.write(b'{"event": "round", "pad": "' + b"x" * (9 << 20))  # no newline yet
    tail = RunLogTail(path)
    assert len(tail.read_new()) == 3
    assert tail.pending_bytes <= 8 << 20  # the line is already too long to be an event
    with open(path, "ab") as f:
        f.write(b'"}\n' + _line({**_ROUND, "workers": {}}).encode())
    assert [e["round"] for e in tail.read_new()] == [3]
    assert tail.skipped == 1 and tail.pending_bytes == 0


def test_a_malformed_first_line_does_not_break_the_run_list(tmp_path):
    (tmp_path / "deep.jsonl").write_text(BAD_LINES["30000 nested brackets"])
    _good_events(tmp_path / "good.jsonl")
    runs = {r.path.name: r for r in list_runs(tmp_path)}
    assert runs["deep.jsonl"].run_id is None and runs["good.jsonl"].run_id == "r"
    layout = dashboard(tmp_path, run="deep.jsonl", live=False)
    layout.get_root()
    assert "skipped 1 malformed line/event" in "\n".join(rendered_texts(layout))


def test_events_passed_to_compare_runs_are_checked_too(tmp_path):
    _good_events(tmp_path / "a.jsonl")
    events = read_events(tmp_path / "a.jsonl")
    bad = [*events, {"event": "round", "run_id": "r", "time": 103, "wall_s": 1.0,
                     "workers": {"a": "x"}}]  # fmt: skip
    assert compare_runs(bad, events)["runs"][0]["rounds"] == 2


def test_a_run_whose_page_still_fails_shows_one_plain_line(tmp_path, monkeypatch):
    """A failure the checks did not foresee: that run's error as one line, no traceback."""
    _good_events(tmp_path / "a.jsonl")

    def broken_poll(self):
        raise RuntimeError('cannot aggregate\n  File "/usr/lib/python3/x.py", line 1')

    monkeypatch.setattr(RunData, "poll", broken_poll)
    mon = RunMonitor(path=str(tmp_path / "a.jsonl"))
    texts = rendered_texts(mon.panel())
    text = "\n".join(html.unescape(t) for t in texts)
    assert "Traceback" not in text and "x.py" not in text
    (line,) = [t for t in texts if "cannot aggregate" in t]
    assert "a.jsonl" in line and "\n" not in html.unescape(line).strip()


def test_the_served_monitor_shows_a_malformed_log_without_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    _good_events(runs / "bad.jsonl")
    with open(runs / "bad.jsonl", "a") as f:
        f.write(BAD_LINES["a run_start whose workers is a number"])
        f.write(BAD_LINES["30000 nested brackets"])
    with ServedMonitor(runs, log_dir=tmp_path / "server") as srv:
        text = "\n".join(srv.page_texts())
    assert "Traceback" not in text and "site-packages" not in text, text[:2000]
    assert "rounds: 2" in text and "skipped 2 malformed lines/events" in text


# --------------------------------------------------------------------------------------
# Defect 7: Markdown injection in the monitor
# --------------------------------------------------------------------------------------


def hostile_log(path: Path) -> None:
    """A failed run whose reason, worker names, run id and dataset carry markup."""
    # A relative URL is fetched from the app's own server: an origin check alone misses it.
    img, link, rel = f"![s]({BEACON})", f"[click]({BEACON})", "![w](beacon.png)"
    with RunLogWriter(path, run_id=f"run {link}") as log:
        log.run_start(
            config={"partition": img, "sync": f"<img src='{BEACON}'>"},
            workers=[
                {"name": n, "address": "", "nthreads": 1, "memory": 0} for n in ("a", img, rel)
            ],
            dataset={"name": link, "n_rows": 300, "n_features": 4},
            model={"layers": [4, 2], "n_params": 10},
            timestamp=100.0,
        )
        workers = {
            "a": {"rows": 200, "steps": 1, "busy_s": 1.0, "comm_s": 0.1},
            img: {"rows": 100, "steps": 1, "busy_s": 1.0, "comm_s": 0.1},
            rel: {"rows": 100, "steps": 1, "busy_s": 1.0, "comm_s": 0.1},
        }
        log.round(1, 1, 1.2, 0.0, 0.5, 0.6, workers, timestamp=101.0)
        log.worker_lost(img, round=1, reason=img, timestamp=101.5)
        log.worker_lost(rel, round=1, reason=rel, timestamp=101.55)
        log.checkpoint(1, f"<{BEACON}>", timestamp=101.6)
        log.run_end("failed", 2.0, reason=img, timestamp=102.0)


def test_text_from_a_log_is_shown_as_text_never_markdown(tmp_path):
    hostile_log(tmp_path / "hostile.jsonl")
    _good_events(tmp_path / "good.jsonl")
    os.utime(tmp_path / "hostile.jsonl", (time.time() + 60, time.time() + 60))  # newest
    layout = dashboard(tmp_path, live=False)
    mon = layout.monitor.current
    assert mon.data.status == "failed"
    texts = rendered_texts(layout) + rendered_texts(mon.panel())
    texts += rendered_texts(pn.Column(layout.monitor.comparison.view()))
    for url in (BEACON, "beacon.png"):
        assert not markup_pointing_at(texts, url), markup_pointing_at(texts, url)
    # The text is there, as text: the reason reads as it was logged.
    shown = "\n".join(html.unescape(t) for t in texts)
    assert f"Run failed after 1 round: ![s]({BEACON})" in html.unescape(shown)


def test_messages_about_paths_are_text_too(tmp_path):
    # A relative URL (a file name holds no slash): the browser would fetch it from the app.
    folder = tmp_path / "![s](beacon.png)"
    folder.mkdir()
    layout = dashboard(folder, live=False)  # "No run logs in ... yet"
    assert not markup_pointing_at(rendered_texts(layout), "beacon.png")
    layout = dashboard(tmp_path / "[x](beacon.png)", live=False)  # no such folder
    assert not markup_pointing_at(rendered_texts(layout), "beacon.png")

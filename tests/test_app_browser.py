"""The monitor in a real headless Chromium, served by ``panel serve app/monitor.py``.

Follows shared/recipes/browser-tests.md: Debian's /usr/bin/chromium through the Python
playwright package (never ``playwright install``), outside hosts unresolvable, Bokeh and
Panel JS from the app's own server. Without chromium these tests FAIL, they do not skip:
``.ci/run`` must install it. One server serves every test of the module.

The main page test shows the run log of a REAL fit (HMDSPT and the equal-shares baseline
on an emulated local cluster, made once per session by tests/browser/real_run.py). The
live test replays that real log and appends copies of its rounds; synthetic logs
(scripts/synthetic_runlog.py) give the empty, torn and failed cases.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.synthetic_runlog import make_log  # noqa: E402
from tests.browser.harness import (  # noqa: E402
    PanelServer,
    foreign,
    launch_browser,
    record_requests,
    require_chromium,
    wait_rendered,
)
from tests.browser.real_run import session_real_logs  # noqa: E402
from tests.test_monitor_robustness import BEACON, hostile_log  # noqa: E402

pytestmark = [pytest.mark.heavy(23), pytest.mark.timeout(180)]


class ReplayedRun:
    """A copy of a real run log without its ``run_end`` (so "running"), that grows.

    :meth:`rounds` appends copies of the real log's round events with the next round
    numbers and later times, one complete line per write, as the trainer's writer does.
    """

    def __init__(self, source: Path, path: Path) -> None:
        events = [json.loads(line) for line in source.read_text().splitlines()]
        self.path = path
        self.templates = [e for e in events if e["event"] == "round"]
        kept = [e for e in events if e["event"] != "run_end"]
        self.round = max(e["round"] for e in self.templates)
        self.time = kept[-1]["time"]
        path.write_text("".join(json.dumps(e) + "\n" for e in kept))

    @property
    def n_rounds(self) -> int:
        lines = self.path.read_text().splitlines()
        return sum(json.loads(line)["event"] == "round" for line in lines)

    def rounds(self, k: int) -> None:
        with open(self.path, "a") as f:
            for i in range(k):
                e = dict(self.templates[i % len(self.templates)])
                self.round += 1
                self.time += e["wall_s"]
                e.update(round=self.round, time=self.time)
                f.write(json.dumps(e) + "\n")
                f.flush()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder of logs: two real runs, a replayed live one, empty, torn, failed."""
    require_chromium()
    real = session_real_logs(tmp_path_factory)
    folder = tmp_path_factory.mktemp("runs")
    make_log(folder / "equal.jsonl", 20, partition="equal", seed=2)
    (folder / "empty.jsonl").touch()
    make_log(folder / "torn.jsonl", 10, status=None, seed=3).log.close()
    with open(folder / "torn.jsonl", "ab") as f:
        f.write(b'{"event":"round","run_id":"torn","time":17')  # a writer died mid-line
    make_log(
        folder / "failed.jsonl",
        5,
        status="failed",
        reason="worker w2 lost and not replaced",
        seed=4,
    )
    hostile_log(folder / "hostile.jsonl")  # markup in its reason, worker names, run id
    live = ReplayedRun(real["proportional"], folder / "live.jsonl")  # still "running"
    for name, src, ahead in (
        ("real.jsonl", real["proportional"], 7200),
        ("real-equal.jsonl", real["equal"], 3600),
    ):
        (folder / name).write_bytes(src.read_bytes())
        # Newest first: the Compare tab then defaults to real.jsonl against real-equal.
        os.utime(folder / name, (time.time() + ahead, time.time() + ahead))
    yield folder, live


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    with PanelServer(runs[0], tmp_path_factory.mktemp("server")) as srv:
        yield srv


@pytest.fixture(scope="module")
def chromium_browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch_browser(pw)
        yield b
        b.close()


@pytest.fixture
def app_page(chromium_browser, server):
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.urls = record_requests(page)
    yield page
    context.close()
    # Exceptions in periodic callbacks appear only in the server's log.
    assert "Traceback" not in server.stderr(), server.stderr()
    assert not foreign(page.urls, server.origin), foreign(page.urls, server.origin)


def test_page_renders_charts_for_a_real_run_log_made_by_a_real_fit(
    app_page, server, runs, tmp_path
):
    page = app_page
    from playwright.sync_api import expect

    folder, _ = runs
    events = [json.loads(line) for line in (folder / "real.jsonl").read_text().splitlines()]
    n_rounds = sum(e["event"] == "round" for e in events)
    page.goto(f"{server.url}?run=real.jsonl")
    wait_rendered(page)
    expect(page.locator(".hm-rounds")).to_have_text(f"rounds: {n_rounds}", timeout=20_000)
    expect(page.locator(".hm-status")).to_have_text("completed")
    for chart in ("hm-timeline", "hm-idle", "hm-loss", "hm-val", "hm-events", "hm-shares"):
        expect(page.locator(f".{chart} canvas").first).to_be_visible()
    expect(page.locator(".hm-emulated")).to_contain_text("heterogeneity emulated on one machine")
    expect(page.locator(".hm-header")).to_contain_text("partition=proportional")
    expect(page.locator(".hm-message")).to_have_count(0)  # a clean, completed run
    assert any(u.startswith("ws://") for u in page.urls), page.urls
    shot = tmp_path / "real.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000

    # The Compare tab: the real HMDSPT run against the real equal-shares baseline.
    page.get_by_text("Compare", exact=True).click()
    expect(page.locator(".hm-compare-chart canvas").first).to_be_visible(timeout=20_000)
    expect(page.locator(".hm-cmp-a-partition")).to_have_text("proportional")
    expect(page.locator(".hm-cmp-b-partition")).to_have_text("equal")
    expect(page.locator(".hm-compare")).to_contain_text("fastest worker's idle")


def test_page_follows_a_growing_log(app_page, server, runs):
    page = app_page
    from playwright.sync_api import expect

    _, live = runs
    n = live.n_rounds
    page.goto(f"{server.url}?run=live.jsonl&poll_ms=300")
    wait_rendered(page)
    expect(page.locator(".hm-rounds")).to_have_text(f"rounds: {n}", timeout=20_000)
    expect(page.locator(".hm-status")).to_have_text("running")
    expect(page.locator(".hm-timeline canvas").first).to_be_visible()

    live.rounds(3)  # the trainer appends; the page's tail picks it up
    expect(page.locator(".hm-rounds")).to_have_text(f"rounds: {n + 3}", timeout=10_000)
    page.wait_for_timeout(300)  # let the charts draw the streamed rounds


def test_broken_logs_give_readable_pages(app_page, server):
    page = app_page
    from playwright.sync_api import expect

    expected = {
        "empty.jsonl": "is empty: the run has not written its first event yet",
        "torn.jsonl": "The last line of the log is incomplete",
        "failed.jsonl": "Run failed after 5 rounds: worker w2 lost and not replaced",
    }
    for name, text in expected.items():
        page.goto(f"{server.url}?run={name}")
        wait_rendered(page)
        expect(page.locator(".hm-message").first).to_contain_text(text, timeout=15_000)
        if name == "torn.jsonl":  # the complete rounds before the torn line are shown
            expect(page.locator(".hm-rounds")).to_have_text("rounds: 10")
    expect(page.locator(".hm-rounds")).to_have_text("rounds: 5")
    expect(page.locator(".hm-status")).to_have_text("failed")


def test_text_from_a_log_makes_the_browser_fetch_nothing(app_page, server):
    """Markup in a log's reason, worker names and run id is shown as text, never fetched."""
    page = app_page
    from playwright.sync_api import expect

    page.goto(f"{server.url}?run=hostile.jsonl")
    wait_rendered(page)
    expect(page.locator(".hm-message").first).to_contain_text(
        f"Run failed after 1 round: ![s]({BEACON})", timeout=15_000
    )
    expect(page.locator(".hm-header")).to_contain_text("[click](")
    page.get_by_text("Compare", exact=True).click()
    expect(page.locator(".hm-compare")).to_be_visible(timeout=20_000)
    page.wait_for_timeout(500)  # time for any image the page would load
    assert not [u for u in page.urls if "beacon" in u], page.urls

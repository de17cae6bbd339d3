"""The monitor in a real headless Chromium, served by ``panel serve app/monitor.py``.

Follows shared/recipes/browser-tests.md: Debian's /usr/bin/chromium through the Python
playwright package (never ``playwright install``), outside hosts unresolvable, Bokeh and
Panel JS from the app's own server. Without chromium these tests FAIL, they do not skip:
``.ci/run`` must install it. One server serves every test of the module.

The run logs are synthetic (scripts/synthetic_runlog.py, a test fixture) until the trainer
writes real ones.
"""

import os
import sys
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

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder of logs: a live one, an equal-shares baseline, empty, torn, failed."""
    require_chromium()
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
    live = make_log(folder / "live.jsonl", 20, status=None, seed=1)  # still "running"
    yield folder, live
    live.log.close()


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


def test_page_renders_charts_and_follows_the_live_log(app_page, server, runs, tmp_path):
    page = app_page
    from playwright.sync_api import expect

    _, live = runs
    page.goto(f"{server.url}?run=live.jsonl&poll_ms=300")
    wait_rendered(page)
    expect(page.locator(".hm-rounds")).to_have_text("rounds: 20", timeout=20_000)
    for chart in ("hm-timeline", "hm-idle", "hm-loss", "hm-val", "hm-events", "hm-shares"):
        expect(page.locator(f".{chart} canvas").first).to_be_visible()
    expect(page.locator(".hm-emulated")).to_contain_text("heterogeneity emulated on one machine")

    live.rounds(3)  # the trainer appends; the page's tail picks it up
    expect(page.locator(".hm-rounds")).to_have_text("rounds: 23", timeout=10_000)
    assert any(u.startswith("ws://") for u in page.urls), page.urls

    page.wait_for_timeout(300)  # let the charts draw the streamed rounds
    shot = tmp_path / "monitor.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    if os.environ.get("HMDSPT_SAVE_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        (ROOT / "docs" / "monitor.png").write_bytes(shot.read_bytes())


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

"""Save a screenshot of the monitor (docs/monitor.png) from a real headless Chromium.

By default it writes two synthetic run logs (scripts/synthetic_runlog.py, a test fixture:
HMDSPT's proportional shares and the equal-shares baseline, 3 workers emulating 4:2:1),
serves ``app/monitor.py`` on them and saves the Run tab and the Compare tab. Pass
``--runs PATH`` to photograph a folder of real run logs instead.

Run from the repository root (needs /usr/bin/chromium)::

    python scripts/make_screenshot.py [--runs runs/] [--out docs/monitor.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.synthetic_runlog import make_log  # noqa: E402
from tests.browser.harness import PanelServer, launch_browser, wait_rendered  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="folder of run logs (default: synthetic)")
    p.add_argument("--run", help="file name of the log to show (default: the newest)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "monitor.png")
    p.add_argument("--rounds", type=int, default=80, help="rounds of the synthetic logs")
    args = p.parse_args(argv)

    from playwright.sync_api import expect, sync_playwright

    with tempfile.TemporaryDirectory(prefix="hmdspt-shot-") as tmp:
        runs = args.runs
        run = args.run
        if runs is None:
            runs = Path(tmp) / "runs"
            make_log(runs / "equal.jsonl", args.rounds, partition="equal", seed=2)
            make_log(runs / "hmdspt.jsonl", args.rounds, seed=1)
            run = run or "hmdspt.jsonl"
        query = f"?run={run}" if run else ""
        with PanelServer(runs, Path(tmp) / "server") as srv, sync_playwright() as pw:
            browser = launch_browser(pw)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(srv.url + query)
            wait_rendered(page)
            expect(page.locator(".hm-rounds")).to_be_visible(timeout=60_000)
            page.wait_for_timeout(1000)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            page.get_by_text("Compare", exact=True).click()
            expect(page.locator(".hm-compare-chart canvas").first).to_be_visible(timeout=60_000)
            page.wait_for_timeout(500)
            compare = args.out.with_name(args.out.stem + "-compare" + args.out.suffix)
            page.screenshot(path=str(compare), full_page=True)
            browser.close()
        if "Traceback" in srv.stderr():
            print(srv.stderr(), file=sys.stderr)
            return 1
    print(args.out)
    print(compare)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

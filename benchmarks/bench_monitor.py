"""How fast the monitor shows a long run, and what one live update costs.

Writes a synthetic run log (scripts/synthetic_runlog.py; default 64 workers x 5,000 rounds,
~110 MB), then:

1. in-process: the time to read and aggregate the whole log (what a new page does first);
2. in a real headless Chromium (``panel serve app/monitor.py``): the time from navigation to
   a rendered dashboard (Bokeh document idle, timeline drawn, ``rounds: 5000`` shown);
3. one live update after 10 more rounds are appended: in-process, the poll's cost and the
   bytes its tail read (equal to the bytes appended, not the log's size); in the browser,
   the time from the append to ``rounds: 5010`` on the page (includes up to one polling
   period, 250 ms here) and the bytes the server pushed over the websocket for it.

Run from the repository root (needs /usr/bin/chromium, see shared/recipes/browser-tests.md)::

    python benchmarks/bench_monitor.py [--workers 64] [--rounds 5000]

Nothing is asserted; the log's numbers are synthetic.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hmdspt.app.monitor import RunMonitor  # noqa: E402
from scripts.synthetic_runlog import make_log  # noqa: E402
from tests.browser.harness import (  # noqa: E402
    PanelServer,
    foreign,
    launch_browser,
    record_requests,
    wait_rendered,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5000)
    p.add_argument("--append", type=int, default=10, help="rounds appended for the update")
    p.add_argument("--poll-ms", type=int, default=250)
    args = p.parse_args(argv)

    from playwright.sync_api import expect, sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        folder = Path(tmp) / "runs"
        path = folder / "big.jsonl"
        t = time.perf_counter()
        run = make_log(path, args.rounds, args.workers, status=None, n_samples=8000 * args.workers)
        size = path.stat().st_size
        print(f"# monitor benchmark: {args.workers} workers x {args.rounds} rounds (synthetic)")
        print(f"log: {size / 1e6:.1f} MB written in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        mon = RunMonitor(path=str(path))
        print(f"in-process load (read + aggregate the whole log): {time.perf_counter() - t:.2f} s")

        with PanelServer(folder, Path(tmp) / "server") as srv, sync_playwright() as pw:
            browser = launch_browser(pw)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            urls = record_requests(page)
            frames: list[tuple[float, int]] = []
            page.on(
                "websocket",
                lambda ws: ws.on(
                    "framereceived", lambda f: frames.append((time.perf_counter(), len(f)))
                ),
            )
            t = time.perf_counter()
            page.goto(f"{srv.url}?poll_ms={args.poll_ms}", wait_until="commit")
            wait_rendered(page, timeout_ms=180_000)
            expect(page.locator(".hm-rounds")).to_have_text(
                f"rounds: {args.rounds}", timeout=180_000
            )
            expect(page.locator(".hm-timeline canvas").first).to_be_visible()
            load_s = time.perf_counter() - t
            page_ms = page.evaluate("performance.now()")
            print(
                f"browser: navigation to rendered dashboard {load_s:.2f} s "
                f"(page clock {page_ms / 1000:.2f} s), "
                f"websocket bytes received {sum(n for _, n in frames) / 1e6:.2f} MB"
            )

            page.wait_for_timeout(1000)  # settle: no update pending
            before = path.stat().st_size
            t_append = time.perf_counter()
            run.rounds(args.append)
            appended = path.stat().st_size - before
            expect(page.locator(".hm-rounds")).to_have_text(
                f"rounds: {args.rounds + args.append}", timeout=30_000
            )
            latency = time.perf_counter() - t_append
            page.wait_for_timeout(500)
            pushed = sum(n for ts, n in frames if ts >= t_append)
            print(
                f"browser: {args.append} rounds appended ({appended / 1e3:.1f} kB) -> shown "
                f"after {latency * 1000:.0f} ms (poll period {args.poll_ms} ms); "
                f"websocket bytes pushed {pushed / 1e3:.1f} kB"
            )
            bad = foreign(urls, srv.origin)
            browser.close()
        if "Traceback" in srv.stderr():
            print("server log has a Traceback:\n" + srv.stderr())
        if bad:
            print(f"requests to other origins: {bad}")

        mon.poll()  # catch up with the rounds appended for the browser
        before_offset = mon.data.tail.offset
        before = path.stat().st_size
        run.rounds(args.append)
        appended = path.stat().st_size - before
        t = time.perf_counter()
        upd = mon.poll()
        poll_s = time.perf_counter() - t
        print(
            f"in-process live update of {args.append} rounds: {poll_s * 1000:.1f} ms; tail read "
            f"{upd.bytes_read} bytes from offset {before_offset} (appended {appended} bytes, "
            f"log {path.stat().st_size / 1e6:.1f} MB)"
        )
        run.log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

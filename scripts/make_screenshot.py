"""Screenshots of the monitor on REAL runs: docs/monitor.png and docs/monitor-compare.png.

Trains twice on the same generated data set (``make_classification``) on one emulated
heterogeneous local cluster, ``local_cluster(speeds=(4, 2, 1))``: the equal-shares
baseline (``partition="equal"``), then HMDSPT (``partition="proportional"``), each writing
its run log into a folder. Then serves ``app/monitor.py`` on that folder, opens it in
headless Chromium and saves the HMDSPT run's dashboard (``--out``) and the Compare tab
(HMDSPT against equal shares, ``<out>-compare.png``). Both runs take the same number of
epochs, so the comparison is like for like; with the defaults HMDSPT trains ~10 s and the
baseline ~20 s on a 2-core machine (37 s and 70 s on one about 2.2x slower per core,
2026-12-05).

Run from the repository root (needs /usr/bin/chromium; 1-2 min)::

    python scripts/make_screenshot.py [--out docs/monitor.png] [--keep runs/screenshot]
    python scripts/make_screenshot.py --runs runs/     # photograph existing logs instead
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.harness import PanelServer, launch_browser, wait_rendered  # noqa: E402


def train(folder: Path, args: argparse.Namespace) -> None:
    """The baseline and HMDSPT, same data, same cluster; logs ``equal.jsonl``, ``hmdspt.jsonl``."""
    from distributed import Client
    from sklearn.datasets import make_classification
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.estimator import BPNNClassifier
    from hmdspt.parallel.cluster import local_cluster

    X, y = make_classification(
        n_samples=args.samples,
        n_features=40,
        n_informative=24,
        n_redundant=8,
        n_classes=5,
        class_sep=0.8,
        random_state=0,
    )
    speeds = tuple(float(s) for s in args.speeds.split(","))
    hidden = tuple(int(h) for h in args.hidden.split(","))
    folder.mkdir(parents=True, exist_ok=True)
    with local_cluster(speeds=speeds) as cluster, Client(cluster) as client:
        print(f"cluster: {cluster.emulation}", flush=True)
        # The baseline first, so the HMDSPT log is the newest: the page shows it first and
        # the Compare tab puts it in column A.
        for partition, name in (("equal", "equal"), ("proportional", "hmdspt")):
            path = folder / f"{name}.jsonl"
            path.unlink(missing_ok=True)
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                clf = BPNNClassifier(
                    hidden,
                    client=client,
                    max_iter=args.epochs,
                    rounds_per_epoch=args.rounds_per_epoch,
                    partition=partition,
                    early_stopping=True,  # a held-out split, scored during the fit
                    n_iter_no_change=args.epochs + 1,  # ... that never stops it early
                    run_log=str(path),
                    random_state=0,
                ).fit(X, y)
            print(
                f"{name}: {time.perf_counter() - t:.1f} s, {clf.n_iter_} epochs, "
                f"validation score {clf.validation_scores_[-1]:.4f} -> {path}",
                flush=True,
            )


def shoot(runs: Path, run: str | None, out: Path, tmp: Path) -> int:
    """Serve the monitor on ``runs`` and save the Run tab and the Compare tab."""
    from playwright.sync_api import expect, sync_playwright

    query = f"?run={run}" if run else ""
    compare = out.with_name(out.stem + "-compare" + out.suffix)
    with PanelServer(runs, tmp / "server") as srv, sync_playwright() as pw:
        browser = launch_browser(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(srv.url + query)
        wait_rendered(page)
        expect(page.locator(".hm-rounds")).to_be_visible(timeout=60_000)
        expect(page.locator(".hm-shares canvas").first).to_be_visible(timeout=60_000)
        page.wait_for_timeout(1500)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        page.get_by_text("Compare", exact=True).click()
        expect(page.locator(".hm-compare-chart canvas").first).to_be_visible(timeout=60_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(compare), full_page=True)
        browser.close()
    if "Traceback" in srv.stderr():
        print(srv.stderr(), file=sys.stderr)
        return 1
    print(out)
    print(compare)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="photograph this folder of logs (no training)")
    p.add_argument("--run", help="file name of the log to show (default: hmdspt.jsonl)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "monitor.png")
    p.add_argument("--keep", type=Path, help="write the run logs here (default: a temp dir)")
    p.add_argument("--speeds", default="4,2,1", help="emulated speeds (default: 4,2,1)")
    p.add_argument("--samples", type=int, default=200_000, help="rows of the data set")
    p.add_argument("--hidden", default="256,128", help="hidden layer sizes")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds-per-epoch", type=int, default=2)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="hmdspt-shot-") as tmp:
        tmp = Path(tmp)
        runs, run = args.runs, args.run
        if runs is None:
            runs = args.keep or tmp / "runs"
            train(runs, args)
            run = run or "hmdspt.jsonl"
        return shoot(runs, run, args.out, tmp)


if __name__ == "__main__":
    raise SystemExit(main())

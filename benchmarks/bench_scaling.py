"""Scaling: 1 to 4 workers of equal speed, same data and epochs, on the testbed and emulated.

200,000 synthetic rows x 40 features, MLP 40-256-128-10, 3 epochs of one round, after an
untimed warm-up fit on each fresh cluster. On the testbed (``benchmarks/testbed.py``) every
worker has the same CPU quota, 0.4 core by default, enforced by the kernel: 4 workers take
1.6 of the 2 cores, so the workers never share more than they are given and the speed-up
over one worker is the method's own. On the in-code emulation (``local_cluster(speeds=(1,) *
n)``, labelled *emulated*) every worker runs at full speed, so past two workers the processes
share the 2 cores: that shows the overhead of more workers on a fixed machine, not speed-up.
Prints epoch time (Σ round wall / epochs), the fit's wall time from the ``fit()`` call,
the speed-ups over one worker and the parallel efficiency, and charts them in
``benchmarks/out/scaling.png``.
Run: ``python -m benchmarks.bench_scaling [--quick] [--cluster both|testbed|emulated]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.runlog import read_events, summarize
from hmdspt.estimator import BPNNClassifier

from ._common import (
    EMULATED,
    TESTBED,
    add_cluster_arguments,
    chosen_kinds,
    cluster,
    header,
    num,
    print_leftovers,
    testbed_label,
)
from .report import OUT, pyplot, save_figure, shown


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=None, help="default 200,000 (quick 60,000)")
    parser.add_argument("--epochs", type=int, default=None, help="default 3 (quick 2)")
    parser.add_argument(
        "--testbed-cores", type=float, default=0.4, help="every testbed worker's CPU quota"
    )
    parser.add_argument("--quick", action="store_true", help="fewer rows and epochs")
    parser.add_argument("--out", type=Path, default=OUT, help="where scaling.png goes")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    args.rows = args.rows or (60_000 if args.quick else 200_000)
    args.epochs = args.epochs or (2 if args.quick else 3)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header(f"scaling: 1-4 equal workers ({os.cpu_count()} cores): testbed, then emulated")
    X, y = make_classification(args.rows, 40, n_informative=30, n_classes=10, random_state=0)
    rows, labels = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in chosen_kinds(args.cluster):
            labels[kind] = testbed_label(args.period_ms) if kind == TESTBED else EMULATED
            others: set[str] = set()
            for n in (1, 2, 3, 4):
                cores = (args.testbed_cores,) * n if kind == TESTBED else None
                with cluster(kind, (1,) * n, cores=cores, period_ms=args.period_ms) as (
                    client,
                    _,
                    info,
                ):
                    # Untimed: a fresh cluster's first fit pays one-off costs (worker
                    # imports, first transfers).
                    BPNNClassifier((256, 128), client=client, max_iter=1).fit(
                        X[:20_000], y[:20_000]
                    )
                    # (256, 128): an epoch carries about a second of compute on one worker,
                    # so the round's milliseconds of synchronisation do not decide the ratios.
                    clf = BPNNClassifier(
                        (256, 128),
                        client=client,
                        max_iter=args.epochs,
                        rounds_per_epoch=1,
                        random_state=0,
                        run_log=Path(tmp),
                    )
                    start = time.perf_counter()
                    clf.fit(X, y)
                    fit_s = time.perf_counter() - start
                    s = summarize(read_events(clf.run_log_path_))
                    rows.append(
                        {
                            "cluster": kind,
                            "workers": n,
                            "cores": None if cores is None else sum(cores),
                            "epoch_s": s["wall_s"] / args.epochs,
                            "fit_s": fit_s,
                            "efficiency": s["efficiency"],
                            "accuracy": clf.score(X, y),
                        }
                    )
                    if kind == TESTBED:
                        others |= set(info["testbed"].other_groups())
            print(f"\n## {labels[kind]}")
            if kind == TESTBED:
                print(
                    f"every worker {args.testbed_cores:g} core (n workers: n x "
                    f"{args.testbed_cores:g} cores of the {os.cpu_count()})"
                )
            else:
                print(
                    "every worker at full speed; past the core count the worker processes "
                    "share the cores"
                )
            mine = [r for r in rows if r["cluster"] == kind]
            base, base_fit = mine[0]["epoch_s"], mine[0]["fit_s"]
            print(
                f"{'cluster':>9s} {'workers':>7s} {'cores':>6s} {'epoch s':>8s} {'speed-up':>9s} "
                f"{'fit wall s':>10s} {'fit speed-up':>12s} {'efficiency':>11s} "
                f"{'train acc':>10s}"
            )
            for r in mine:
                cores = "-" if r["cores"] is None else f"{r['cores']:.2f}"
                print(
                    f"{kind:>9s} {r['workers']:7d} {cores:>6s} {r['epoch_s']:8.2f} "
                    f"{base / r['epoch_s']:9.2f} {r['fit_s']:10.2f} "
                    f"{base_fit / r['fit_s']:12.2f} {num(r['efficiency']):>11s} "
                    f"{r['accuracy']:10.4f}"
                )
            if others:
                print(
                    f"NOT ALONE: other cpu groups were busy meanwhile: {', '.join(sorted(others))}"
                )
    print_leftovers()
    if rows:
        print(f"chart: {shown(plot(rows, labels, args, args.out / 'scaling.png'))}")
    return rows


def plot(rows: list[dict], labels: dict, args, path: Path) -> Path:
    """Epoch time per worker count, and speed-up over one worker with the efficiency,
    one line per cluster (the testbed's solid, the emulation's dashed)."""
    plt = pyplot()
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    kinds = [k for k in (TESTBED, EMULATED) if any(r["cluster"] == k for r in rows)]
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        mine = [r for r in rows if r["cluster"] == kind]
        n = [r["workers"] for r in mine]
        epoch = [r["epoch_s"] for r in mine]
        style = "-" if kind == TESTBED else "--"
        bars = ax_t.bar([k - 0.4 + width * (i + 0.5) for k in n], epoch, width, label=labels[kind])
        ax_t.bar_label(bars, fmt="%.2f", fontsize=8)
        speedup = [epoch[0] / t for t in epoch]
        ax_s.plot(n, speedup, style, marker="o", label=f"speed-up, {kind}")
        eff = [(k, r["efficiency"]) for k, r in zip(n, mine) if r["efficiency"] is not None]
        if eff:
            ax_s.plot(*zip(*eff), style, marker="s", label=f"parallel efficiency, {kind}")
        for k, v in zip(n, speedup):
            ax_s.annotate(
                f"{v:.2f}",
                (k, v),
                xytext=(0, 7),
                textcoords="offset points",
                ha="center",
                fontsize=8,
            )
    ax_t.set(xlabel="workers", ylabel="seconds per epoch", xticks=[1, 2, 3, 4])
    ax_t.set_title("epoch time", fontsize=10)
    ax_t.legend(fontsize=7)
    ax_s.set(xlabel="workers", xticks=[1, 2, 3, 4], ylim=(0, None))
    ax_s.set_title("speed-up over 1 worker and efficiency", fontsize=10)
    ax_s.legend(fontsize=7)
    for ax in (ax_t, ax_s):
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Scaling on one {os.cpu_count()}-core machine: 1-4 equal workers, {args.rows:,} rows, "
        f"{args.epochs} epochs — testbed: {args.testbed_cores:g} core each (OS-enforced); "
        "emulated: full-speed processes sharing the cores",
        fontsize=9,
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

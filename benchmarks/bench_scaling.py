"""Scaling on this machine: 1 to 4 workers of equal speed, same data and epochs.

200,000 synthetic rows x 40 features, MLP 40-256-128-10, 3 epochs of one round, after an
untimed warm-up fit on each fresh cluster. Two cores: past two workers the processes share
cores, so this shows the overhead of more workers on a fixed machine rather than speed-up.
Prints epoch time and the ratio to one worker, and charts them in
``benchmarks/out/scaling.png``.
Run: ``python -m benchmarks.bench_scaling``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from pathlib import Path

from distributed import Client
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from pipeline.cluster import local_cluster
from pipeline.estimator import BPNNClassifier
from pipeline.runlog import read_events, summarize

from ._common import header, num
from .report import OUT, pyplot, save_figure, shown


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help="where scaling.png goes")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("scaling on this machine: 1-4 workers (2 cores)")
    X, y = make_classification(args.rows, 40, n_informative=30, n_classes=10, random_state=0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 3, 4):
            with local_cluster(speeds=(1,) * n) as cluster, Client(cluster) as client:
                # Untimed: a fresh cluster's first fit pays one-off costs (worker imports,
                # first transfers).
                BPNNClassifier((256, 128), client=client, max_iter=1).fit(X[:20_000], y[:20_000])
                # (256, 128): an epoch carries about a second of compute on one worker, so
                # the round's milliseconds of synchronisation do not decide the ratios.
                clf = BPNNClassifier(
                    (256, 128),
                    client=client,
                    max_iter=args.epochs,
                    rounds_per_epoch=1,
                    random_state=0,
                    run_log=Path(tmp),
                )
                clf.fit(X, y)
                s = summarize(read_events(clf.run_log_path_))
                rows.append(
                    {
                        "workers": n,
                        "epoch_s": s["wall_s"] / args.epochs,
                        "efficiency": s["efficiency"],
                        "accuracy": clf.score(X, y),
                    }
                )
    base = rows[0]["epoch_s"]
    print(
        f"{'workers':>7s} {'epoch s':>8s} {'speed-up':>9s} {'efficiency':>11s} {'train acc':>10s}"
    )
    for r in rows:
        print(
            f"{r['workers']:7d} {r['epoch_s']:8.2f} {base / r['epoch_s']:9.2f} "
            f"{num(r['efficiency']):>11s} {r['accuracy']:10.4f}"
        )
    print(f"chart: {shown(plot(rows, args, args.out / 'scaling.png'))}")
    return rows


def plot(rows: list[dict], args, path: Path) -> Path:
    """Epoch time per worker count, and speed-up over one worker with the efficiency."""
    plt = pyplot()
    n = [r["workers"] for r in rows]
    epoch = [r["epoch_s"] for r in rows]
    speedup = [epoch[0] / t for t in epoch]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    bars = ax_t.bar(n, epoch, color="C0")
    ax_t.bar_label(bars, fmt="%.2f", fontsize=8)
    ax_t.set(xlabel="worker processes", ylabel="seconds per epoch", xticks=n)
    ax_t.set_title("epoch time", fontsize=10)
    ax_s.plot(n, speedup, marker="o", label="speed-up over 1 worker")
    eff = [(k, r["efficiency"]) for k, r in zip(n, rows) if r["efficiency"] is not None]
    if eff:
        ax_s.plot(*zip(*eff), marker="s", label="parallel efficiency (run log)")
    for k, v in zip(n, speedup):
        ax_s.annotate(
            f"{v:.2f}", (k, v), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8
        )
    ax_s.set(xlabel="worker processes", xticks=n, ylim=(0, None))
    ax_s.set_title("speed-up and efficiency", fontsize=10)
    ax_s.legend(fontsize=8)
    for ax in (ax_t, ax_s):
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Scaling on this machine ({os.cpu_count()} cores): 1-{n[-1]} equal-speed worker "
        f"processes, {args.rows:,} rows, {args.epochs} epochs — all on one machine",
        fontsize=10,
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

"""Fastest worker's idle time: equal vs proportional partitioning at several speed mixes.

Heterogeneity is EMULATED on one machine (``local_cluster(speeds=...)``). For every mix the
same HMDSPT fit (300,000 synthetic rows x 40 features, MLP 40-256-128-10, 3 epochs of one
round, after an untimed warm-up fit) runs twice on one cluster, with ``partition="equal"``
and ``"proportional"``; the run logs give the fastest worker's idle fraction and the
parallel efficiency over all rounds (the first epoch's short ramp rounds included).
Writes the numbers to ``benchmarks/out/idle.json`` (the headline figure of
docs/performance.md is drawn from it) and a chart to ``benchmarks/out/idle.png``.
Run: ``python -m benchmarks.bench_idle``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import warnings
from pathlib import Path

from distributed import Client
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from pipeline.cluster import local_cluster
from pipeline.estimator import BPNNClassifier
from pipeline.runlog import read_events, summarize

from ._common import header, num, pct
from .report import OUT, grouped_bars, pyplot, save_figure, shown, write_json

MIXES = ((1, 1, 1), (2, 1, 1), (4, 2, 1), (8, 2, 1))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    # A round must carry enough compute (here about a second on 4:2:1) that the barrier's
    # milliseconds of scheduling noise do not decide the idle fractions.
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help="where idle.json/.png go")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("idle time, equal vs proportional partitioning (heterogeneity emulated)")
    X, y = make_classification(args.rows, 40, n_informative=30, n_classes=10, random_state=0)
    rows = []
    print(
        f"{'speeds':>9s} {'partition':>13s} {'fastest idle %':>15s} {'efficiency':>11s} "
        f"{'Σ round wall s':>15s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for speeds in MIXES:
            with local_cluster(speeds=speeds) as cluster, Client(cluster) as client:
                # Untimed: a fresh cluster's first fit pays one-off costs (worker imports,
                # first transfers) that would land on whichever partition ran first.
                BPNNClassifier((256, 128), client=client, max_iter=1).fit(X[:20_000], y[:20_000])
                for partition in ("equal", "proportional"):
                    clf = BPNNClassifier(
                        (256, 128),
                        client=client,
                        partition=partition,
                        max_iter=args.epochs,
                        rounds_per_epoch=1,
                        batch_size=256,
                        random_state=0,
                        run_log=Path(tmp),
                    )
                    clf.fit(X, y)
                    s = summarize(read_events(clf.run_log_path_))
                    row = {
                        "speeds": ":".join(map(str, speeds)),
                        "partition": partition,
                        "fastest_idle": s["fastest_idle_fraction"],
                        "efficiency": s["efficiency"],
                        "wall": s["wall_s"],
                    }
                    rows.append(row)
                    print(
                        f"{row['speeds']:>9s} {partition:>13s} "
                        f"{pct(row['fastest_idle']):>15s} {num(row['efficiency']):>11s} "
                        f"{row['wall']:15.2f}"
                    )
    data = {
        "benchmark": "idle",
        "measured": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "heterogeneity": "emulated: duty-cycle throttle on one machine",
        "data": {"rows": args.rows, "features": 40, "classes": 10},
        "model": {"hidden_layer_sizes": [128, 64], "epochs": args.epochs, "batch_size": 256},
        "results": rows,
    }
    print(f"data: {shown(write_json(args.out / 'idle.json', data))}")
    print(f"chart: {shown(plot(data, args.out / 'idle.png'))}")
    return rows


def plot(data: dict, path: Path) -> Path:
    """Grouped bars per speed mix: fastest worker's idle % and parallel efficiency."""
    plt = pyplot()
    rows = data["results"]
    mixes = list(dict.fromkeys(r["speeds"] for r in rows))
    by = {(r["speeds"], r["partition"]): r for r in rows}
    fig, (ax_idle, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for ax, key, scale, fmt in (
        (ax_idle, "fastest_idle", 100.0, "{:.1f}"),
        (ax_eff, "efficiency", 1.0, "{:.2f}"),
    ):
        series = {}
        for partition in ("equal", "proportional"):
            values = [by[(m, partition)].get(key) for m in mixes]
            series[partition] = [None if v is None else scale * v for v in values]
        grouped_bars(ax, mixes, series, fmt)
        ax.set_xlabel("worker speeds (emulated)")
        ax.legend(fontsize=8, loc="upper left")
    ax_idle.set(ylabel="fastest worker idle, % of round time", ylim=(0, 100))
    ax_idle.set_title("idle time of the fastest worker", fontsize=10)
    ax_eff.set(ylabel="parallel efficiency", ylim=(0, 1.05))
    ax_eff.set_title("parallel efficiency", fontsize=10)
    fig.suptitle(
        f"Equal vs proportional shares, {data['data']['rows']:,} rows, "
        f"{data['model']['epochs']} epochs — heterogeneity emulated on one "
        f"{data['machine']['cores']}-core machine",
        fontsize=10,
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

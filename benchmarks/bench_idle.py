"""Fastest worker's idle time: equal vs proportional partitioning at several speed mixes.

On two clusters, the OS-enforced testbed first (``benchmarks/testbed.py``: one Dask worker
per cgroup whose CPU quota the kernel enforces; a speed mix becomes quotas by
``benchmarks._common.cores_for``, e.g. 4:2:1 -> 1 / 0.5 / 0.25 core) and then the in-code
emulation (``local_cluster(speeds=...)``, labelled *emulated*). For every mix the same
HMDSPT fit (300,000 synthetic rows x 40 features, MLP 40-256-128-10, 3 epochs of one round,
after an untimed warm-up fit) runs twice on one cluster, with ``partition="equal"`` and
``"proportional"``; the run logs give the fastest worker's idle fraction and the parallel
efficiency over all rounds (the first epoch's short ramp rounds included), and the wall
time is the user's, from the ``fit()`` call to its return (staging and speed probe
included). Writes the numbers to ``benchmarks/out/idle.json`` (the headline figure of
docs/performance.md is drawn from it) and a chart to ``benchmarks/out/idle.png``.
Run: ``python -m benchmarks.bench_idle [--quick] [--cluster both|testbed|emulated]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
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
    pct,
    print_leftovers,
    testbed_label,
)
from .report import OUT, grouped_bars, pyplot, save_figure, shown, write_json

MIXES = ((1, 1, 1), (2, 1, 1), (4, 2, 1), (8, 2, 1))
QUICK_MIXES = ((4, 2, 1),)


def _cores_text(cores) -> str:
    return "/".join(f"{c:.3g}" for c in cores)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    # A round must carry enough compute (here about a second on 4:2:1) that the barrier's
    # milliseconds of scheduling noise do not decide the idle fractions.
    parser.add_argument("--rows", type=int, default=None, help="default 300,000 (quick 100,000)")
    parser.add_argument("--epochs", type=int, default=None, help="default 3 (quick 2)")
    parser.add_argument("--quick", action="store_true", help="4:2:1 only, fewer rows and epochs")
    parser.add_argument("--out", type=Path, default=OUT, help="where idle.json/.png go")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    rows_n = args.rows or (100_000 if args.quick else 300_000)
    epochs = args.epochs or (2 if args.quick else 3)
    mixes = QUICK_MIXES if args.quick else MIXES
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("idle time, equal vs proportional partitioning: testbed, then emulated")
    X, y = make_classification(rows_n, 40, n_informative=30, n_classes=10, random_state=0)
    rows, labels, alone = [], {}, {}
    kinds = chosen_kinds(args.cluster)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            label = testbed_label(args.period_ms) if kind == TESTBED else EMULATED
            labels[kind] = label
            print(f"\n## {label}")
            if kind == TESTBED:
                print(
                    "speed mix -> CPU quotas: the fastest worker 1 core unless the quotas "
                    "would add up to more than the machine less a quarter core for the "
                    "scheduler and the driver; 'cores' below"
                )
            else:
                print(
                    "each worker sleeps after its compute chunks to run at speed/max of one "
                    "core ('cores' below: the share of a core it emulates; all share the "
                    "machine's cores)"
                )
            print(
                f"{'cluster':>9s} {'speeds':>7s} {'cores':>18s} {'partition':>13s} "
                f"{'fastest idle %':>15s} {'efficiency':>11s} {'fit wall s':>11s} "
                f"{'Σ round wall s':>15s}"
            )
            others: set[str] = set()
            for speeds in mixes:
                with cluster(kind, speeds, period_ms=args.period_ms) as (client, _, info):
                    cores = info.get("cores") or tuple(s / max(speeds) for s in speeds)
                    # Untimed: a fresh cluster's first fit pays one-off costs (worker
                    # imports, first transfers) that would land on whichever partition ran
                    # first.
                    BPNNClassifier((256, 128), client=client, max_iter=1).fit(
                        X[:20_000], y[:20_000]
                    )
                    for partition in ("equal", "proportional"):
                        clf = BPNNClassifier(
                            (256, 128),
                            client=client,
                            partition=partition,
                            max_iter=epochs,
                            rounds_per_epoch=1,
                            batch_size=256,
                            random_state=0,
                            run_log=Path(tmp),
                        )
                        start = time.perf_counter()
                        clf.fit(X, y)
                        fit_wall = time.perf_counter() - start
                        s = summarize(read_events(clf.run_log_path_))
                        row = {
                            "cluster": kind,
                            "speeds": ":".join(map(str, speeds)),
                            "cores": list(cores),
                            "partition": partition,
                            "fastest_idle": s["fastest_idle_fraction"],
                            "efficiency": s["efficiency"],
                            "fit_wall": fit_wall,
                            "wall": s["wall_s"],
                        }
                        rows.append(row)
                        print(
                            f"{kind:>9s} {row['speeds']:>7s} {_cores_text(cores):>18s} "
                            f"{partition:>13s} {pct(row['fastest_idle']):>15s} "
                            f"{num(row['efficiency']):>11s} {fit_wall:11.2f} "
                            f"{row['wall']:15.2f}"
                        )
                    if kind == TESTBED:
                        others |= set(info["testbed"].other_groups())
            if others:
                alone[kind] = sorted(others)
                print(f"NOT ALONE: other cpu groups were busy meanwhile: {', '.join(alone[kind])}")
    print_leftovers()
    data = {
        "benchmark": "idle",
        "measured": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "clusters": labels,
        "not_alone": alone,
        "data": {"rows": rows_n, "features": 40, "classes": 10},
        "model": {"hidden_layer_sizes": [256, 128], "epochs": epochs, "batch_size": 256},
        "results": rows,
    }
    print(f"data: {shown(write_json(args.out / 'idle.json', data))}")
    print(f"chart: {shown(plot(data, args.out / 'idle.png'))}")
    return rows


def plot(data: dict, path: Path) -> Path:
    """Per cluster (testbed first), bars per speed mix: fastest worker's idle % and
    parallel efficiency."""
    plt = pyplot()
    kinds = [
        k
        for k in (TESTBED, EMULATED)
        if any(r.get("cluster", EMULATED) == k for r in data["results"])
    ]
    fig, axes = plt.subplots(
        len(kinds), 2, figsize=(11, 4.0 * len(kinds)), layout="constrained", squeeze=False
    )
    for (ax_idle, ax_eff), kind in zip(axes, kinds):
        rows = [r for r in data["results"] if r.get("cluster", EMULATED) == kind]
        mixes = list(dict.fromkeys(r["speeds"] for r in rows))
        by = {(r["speeds"], r["partition"]): r for r in rows}
        label = data.get("clusters", {}).get(kind, kind)
        for ax, key, scale, fmt in (
            (ax_idle, "fastest_idle", 100.0, "{:.1f}"),
            (ax_eff, "efficiency", 1.0, "{:.2f}"),
        ):
            series = {}
            for partition in ("equal", "proportional"):
                values = [by[(m, partition)].get(key) for m in mixes]
                series[partition] = [None if v is None else scale * v for v in values]
            grouped_bars(ax, mixes, series, fmt)
            ax.set_xlabel(f"worker speeds — {label}", fontsize=8)
            ax.legend(fontsize=8, loc="upper left")
        ax_idle.set(ylabel="fastest worker idle, % of round time", ylim=(0, 100))
        ax_idle.set_title(f"idle time of the fastest worker ({kind})", fontsize=10)
        ax_eff.set(ylabel="parallel efficiency", ylim=(0, 1.05))
        ax_eff.set_title(f"parallel efficiency ({kind})", fontsize=10)
    fig.suptitle(
        f"Equal vs proportional shares, {data['data']['rows']:,} rows, "
        f"{data['model']['epochs']} epochs, on one {data['machine']['cores']}-core machine",
        fontsize=10,
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

"""Fastest worker's idle time: equal vs proportional partitioning at several speed mixes.

Heterogeneity is EMULATED on one machine (``local_cluster(speeds=...)``). For every mix the
same HMDSPT fit runs twice on one cluster, with ``partition="equal"`` and
``"proportional"``; the run logs give the fastest worker's idle fraction and the parallel
efficiency. Run: ``python -m benchmarks.bench_idle``.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

from distributed import Client
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from pipeline.cluster import local_cluster
from pipeline.estimator import BPNNClassifier
from pipeline.runlog import read_events, summarize

from ._common import header

MIXES = ((1, 1, 1), (2, 1, 1), (4, 2, 1), (8, 2, 1))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=150_000)
    parser.add_argument("--epochs", type=int, default=3)
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
                for partition in ("equal", "proportional"):
                    clf = BPNNClassifier(
                        (128, 64),
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
                        f"{100 * row['fastest_idle']:15.1f} {row['efficiency']:11.2f} "
                        f"{row['wall']:15.2f}"
                    )
    return rows


if __name__ == "__main__":
    main()

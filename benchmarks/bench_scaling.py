"""Scaling on this machine: 1 to 4 workers of equal speed, same data and epochs.

Two cores: past two workers the processes share cores, so this shows the overhead of
more workers on a fixed machine rather than speed-up. Prints epoch time and the ratio to
one worker. Run: ``python -m benchmarks.bench_scaling``.
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


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("scaling on this machine: 1-4 workers (2 cores)")
    X, y = make_classification(args.rows, 40, n_informative=30, n_classes=10, random_state=0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 3, 4):
            with local_cluster(speeds=(1,) * n) as cluster, Client(cluster) as client:
                clf = BPNNClassifier(
                    (128, 64),
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
            f"{r['efficiency']:11.2f} {r['accuracy']:10.4f}"
        )
    return rows


if __name__ == "__main__":
    main()

"""The fixed cost held at the time a worker measured outside its steps, beside the
regression alone.

A worker's busy time in a round is modelled as ``fixed_s + rows / speed``
(:class:`hmdspt.core.costs.RoundCostModel`). The fit of the two from rounds of different
sizes reads any per-row speed that differs between share sizes as a fixed cost: on the
emulated 4:2:1 cluster a slow worker slower per row in epoch 1's large rounds than in epoch
2's small ones was fitted a fixed cost of 22 ms a round (the same worker measured 1-2 ms
outside its steps in a later fit), and was given rows for 34 ms of busy time in rounds whose others took
52-56 ms. Each round now reports the part of its busy time outside computing the rows
(``outside_steps_s``), and the model holds the fixed cost at or below it.

This runs first fits (``reuse_speeds_s=0``: each probes) of issue 17's jobs on
``local_cluster(speeds=...)`` (heterogeneity EMULATED on one machine), in turns: the
trainer as it is, then the same fit with that time withheld from the cost model in the
driver (the regression alone). Prints per arm each fit's share deviation (the largest
``|row share / speed share - 1|`` in the last round, as :mod:`benchmarks.bench_worth`
checks it), its parallel efficiency from epoch 2 on, its wall time from the call and its
test accuracy. Run: ``python -m benchmarks.bench_fixed_cap`` (``--repeats 4``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from distributed import Client
from sklearn.exceptions import ConvergenceWarning

from hmdspt import BPNNClassifier
from hmdspt.core.costs import RoundCostModel
from hmdspt.core.runlog import read_events, summarize
from hmdspt.parallel.cluster import local_cluster

from ._common import header
from .bench_worth import JOBS, share_deviation

ARMS = ("measured", "regression")


def fit_once(client, data, job_name: str, arm: str) -> dict:
    """One first fit of ``job_name``; ``arm="regression"`` withholds the time outside the steps."""
    X, y, X_test, y_test = data
    observe = RoundCostModel.observe
    if arm == "regression":

        def without_outside_steps(self, worker, rows, busy_s, comm_s=None, outside_steps_s=None):
            observe(self, worker, rows, busy_s, comm_s)

        RoundCostModel.observe = without_outside_steps
    try:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "fit.jsonl"
            clf = BPNNClassifier(
                client=client,
                rounds_per_epoch="auto",
                run_log=log,
                trainer_options={"reuse_speeds_s": 0.0},
                **JOBS[job_name].params(),
            )
            start = time.perf_counter()
            clf.fit(X, y)
            wall = time.perf_counter() - start
            events = read_events(log)
    finally:
        RoundCostModel.observe = observe
    deviation, _, last = share_deviation(events)
    later = [e for e in events if e.get("event") != "round" or e["epoch"] >= 2]
    return {
        "deviation": deviation,
        "efficiency": summarize(later)["efficiency"],
        "wall_s": wall,
        "accuracy": clf.score(X_test, y_test),
        "last_rows": last,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--jobs", nargs="+", choices=list(JOBS), default=["kdd-64-32", "kdd-256-128", "embedded"]
    )
    parser.add_argument("--speeds", default="4:2:1", help="relative speeds, as 4:2:1")
    parser.add_argument("--repeats", type=int, default=4, help="fits of each arm")
    args = parser.parse_args(argv)
    speeds = tuple(float(s) for s in args.speeds.split(":"))
    warnings.simplefilter("ignore", ConvergenceWarning)
    warnings.filterwarnings(
        "ignore", message="this cluster.* is predicted", category=RuntimeWarning
    )
    header(
        f"fixed cost held at the time outside the steps vs the regression alone "
        f"(emulated {args.speeds}, first fits)"
    )
    results: dict = {}
    with local_cluster(speeds=speeds) as cluster, Client(cluster) as client:
        for job_name in args.jobs:
            data = JOBS[job_name].load()
            fit_once(client, data, job_name, ARMS[0])  # untimed: imports, first transfers
            runs = results[job_name] = {arm: [] for arm in ARMS}
            for _ in range(args.repeats):
                for arm in ARMS:
                    runs[arm].append(fit_once(client, data, job_name, arm))
            print(f"\n{job_name}")
            for arm in ARMS:
                rs = runs[arm]
                print(
                    f"  {arm:10s} share dev "
                    + ", ".join(f"{r['deviation']:.2f}" for r in rs)
                    + " | efficiency "
                    + ", ".join(f"{r['efficiency']:.3f}" for r in rs)
                    + " | wall s "
                    + ", ".join(f"{r['wall_s']:.2f}" for r in rs)
                    + " | accuracy "
                    + ", ".join(f"{r['accuracy']:.4f}" for r in rs)
                )
            for key in ("deviation", "efficiency", "wall_s"):
                a, b = (statistics.median(r[key] for r in runs[arm]) for arm in ARMS)
                print(f"  median {key}: measured {a:.3f}, regression {b:.3f}")
    return results


if __name__ == "__main__":
    main()

"""When the probe is skipped: the trainer's rule beside always probing, side by side.

A proportional fit skips its speed probe when one epoch of a worker's equal share, at the
driver's speed, is shorter than the probe's least busy time
(:func:`hmdspt.core.speed.probe_pays`). This measures what the rule buys where it skips:
on ``local_cluster(speeds=(4, 2, 1))`` (heterogeneity EMULATED on one machine), digits and
the smartphone activity windows, the fits of the start-up ablation
(:mod:`benchmarks.bench_ablation`) as first fits on the cluster (``reuse_speeds_s=0``: no
remembered speed replaces the probe), in turns: the rule as the trainer has it, then the
same fit with the rule replaced, in the driver, by one that always lets the probe run.

Prints, per arm, the seconds from the fit call to its first validation score, to a fixed
accuracy and to the fit's end, the final accuracy and the parallel efficiency.
Run: ``python -m benchmarks.bench_probe_rule`` (``--repeats 4`` by default).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from pathlib import Path

from distributed import Client
from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.runlog import read_events
from hmdspt.parallel import placement
from hmdspt.parallel.cluster import local_cluster

from . import bench_ablation as ablation
from ._common import header

#: Test accuracy each job's curve is timed to: a point or so below where its fits end.
TARGETS = {"digits": 0.95, "har-windows": 0.85}


def _always(*args, **kwargs) -> bool:
    return True


def fit_once(client, data, job, job_name: str, always_probe: bool) -> dict:
    """One first fit of ``job``, with the trainer's rule or with the probe always run."""
    rule = placement.probe_pays
    placement.probe_pays = _always if always_probe else rule
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = ablation.run(client, data, job, {"reuse_speeds_s": 0.0}, Path(tmp))
            events = read_events(next(Path(tmp).glob("*.jsonl")))
    finally:
        placement.probe_pays = rule
    curve = result["curve"]
    return {
        "probed": "probe" in result["sources"],
        "first_s": curve[0][0],
        "target_s": next((t for t, v in curve if v >= TARGETS[job_name]), float("nan")),
        "end_s": events[-1]["time"] - events[0]["called_at"],
        "final": result["final"],
        "efficiency": result["efficiency"],
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--repeats", type=int, default=4, help="fits of each arm")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    warnings.simplefilter("ignore", RuntimeWarning)  # "slower than one process alone"
    header("probe rule, local_cluster(4,2,1), heterogeneity emulated")
    results = {}
    with local_cluster(speeds=(4, 2, 1)) as cluster, Client(cluster) as client:
        for job_name in args.jobs:
            job = ablation.JOBS[job_name]
            data = job.load()
            with tempfile.TemporaryDirectory() as tmp:  # untimed: one-off costs
                ablation.run(client, data, job, {}, Path(tmp))
            arms: dict[str, list[dict]] = {"rule": [], "always probe": []}
            for i in range(args.repeats):  # in turns, the arm that goes first alternating
                order = ("rule", "always probe") if i % 2 == 0 else ("always probe", "rule")
                for arm in order:
                    arms[arm].append(
                        fit_once(client, data, job, job_name, always_probe=arm != "rule")
                    )
            print(f"\n{job_name}, time to {TARGETS[job_name]} accuracy, {args.repeats} fits each")
            print(f"{'arm':14s} {'probed':>7s} {'first s':>8s} {'target s':>9s} {'end s':>7s}")
            for arm, fits in arms.items():
                mean = {k: statistics.mean(f[k] for f in fits) for k in fits[0] if k != "probed"}
                probed = sum(f["probed"] for f in fits)
                print(
                    f"{arm:14s} {probed:>4d}/{len(fits):<2d} {mean['first_s']:8.2f} "
                    f"{mean['target_s']:9.2f} {mean['end_s']:7.2f}   final "
                    f"{mean['final']:.4f}, efficiency {mean['efficiency']:.2f}; to target: "
                    + ", ".join(f"{f['target_s']:.2f}" for f in fits)
                )
            rule, probe = (statistics.mean(f["target_s"] for f in arms[a]) for a in arms)
            print(f"time to target, rule / always probe: {rule / probe:.2f}")
            results[job_name] = arms
    return results


if __name__ == "__main__":
    main()

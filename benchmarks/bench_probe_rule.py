"""When the probe is skipped: the trainer's rule beside always probing, side by side.

A proportional fit skips its speed probe when one epoch of a worker's equal share, at the
driver's speed, is shorter than the probe's least busy time
(:func:`hmdspt.core.speed.probe_pays`). This measures what the rule buys where it skips:
on ``local_cluster(speeds=(4, 2, 1))`` (heterogeneity EMULATED on one machine; or with
``--cluster testbed`` the OS-enforced testbed's CPU quotas), digits and the smartphone
activity windows, the fits of the start-up ablation
(:mod:`benchmarks.bench_ablation`) as first fits on the cluster (``reuse_speeds_s=0``: no
remembered speed replaces the probe), in turns: the rule as the trainer has it, then the
same fit with the rule replaced, in the driver, by one that always lets the probe run.

A third arm runs the rule with the plans taking the online scorer's speed of every round
until a worker's cost windows fill, as the trainer did before a fit that skipped the probe
let its first rounds stand in for the probe in the cost model
(``Placement._seed_costs_from_first_rounds``). Prints, per arm, the re-balances per fit,
the seconds from the fit call to its first validation score, to a fixed accuracy and to the
fit's end, the final accuracy and the parallel efficiency.
Run: ``python -m benchmarks.bench_probe_rule`` (``--repeats 4`` by default; ``--cluster
testbed [--period-ms 10]`` on the testbed, as root).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from pathlib import Path

from sklearn.exceptions import ConvergenceWarning

from hmdspt.core.runlog import read_events
from hmdspt.parallel import placement

from . import bench_ablation as ablation
from ._common import (
    TESTBED,
    add_cluster_arguments,
    chosen_kinds,
    cluster,
    header,
    print_leftovers,
    testbed_label,
)

#: Test accuracy each job's curve is timed to: a point or so below where its fits end.
TARGETS = {"digits": 0.95, "har-windows": 0.85}


def _always(*args, **kwargs) -> bool:
    return True


def _no_seed(self, members) -> None:
    return None


#: The arms: the trainer's rule; the rule with the plans taking the online scorer's speed
#: of every round until the cost windows fill (the trainer before its first rounds stood in
#: for the probe in the cost model); the probe always run.
ARMS = ("rule", "rule, unseeded", "always probe")


def fit_once(client, data, job, job_name: str, arm: str) -> dict:
    """One first fit of ``job`` in ``arm`` (one of :data:`ARMS`)."""
    rule, seed = placement.probe_pays, placement.Placement._seed_costs_from_first_rounds
    if arm == "always probe":
        placement.probe_pays = _always
    if arm == "rule, unseeded":
        placement.Placement._seed_costs_from_first_rounds = _no_seed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = ablation.run(client, data, job, {"reuse_speeds_s": 0.0}, Path(tmp))
            events = read_events(next(Path(tmp).glob("*.jsonl")))
    finally:
        placement.probe_pays = rule
        placement.Placement._seed_costs_from_first_rounds = seed
    curve = result["curve"]
    return {
        "probed": "probe" in result["sources"],
        "moves": sum(e["event"] == "partition" for e in events) - 1,
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
    add_cluster_arguments(parser, default="emulated")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    warnings.simplefilter("ignore", RuntimeWarning)  # "slower than one process alone"
    header("probe rule against always probing, speeds 4:2:1")
    results = {}
    for kind in chosen_kinds(args.cluster):
        label = testbed_label(args.period_ms) if kind == TESTBED else "heterogeneity emulated"
        print(f"\n## {label}")
        results[kind] = _run_jobs(kind, args)
        if kind == TESTBED:
            print_leftovers()
    return results


def _run_jobs(kind: str, args) -> dict:
    """Both arms of every job on one cluster of ``kind``."""
    results = {}
    with cluster(kind, (4, 2, 1), period_ms=args.period_ms) as (client, _, _info):
        for job_name in args.jobs:
            job = ablation.JOBS[job_name]
            data = job.load()
            with tempfile.TemporaryDirectory() as tmp:  # untimed: one-off costs
                ablation.run(client, data, job, {}, Path(tmp))
            arms: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for i in range(args.repeats):  # in turns, the arm that goes first rotating
                for arm in ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]:
                    arms[arm].append(fit_once(client, data, job, job_name, arm))
            print(f"\n{job_name}, time to {TARGETS[job_name]} accuracy, {args.repeats} fits each")
            print(
                f"{'arm':16s} {'probed':>7s} {'moves':>6s} {'first s':>8s} {'target s':>9s} "
                f"{'end s':>7s}"
            )
            for arm, fits in arms.items():
                mean = {k: statistics.mean(f[k] for f in fits) for k in fits[0] if k != "probed"}
                probed = sum(f["probed"] for f in fits)
                print(
                    f"{arm:16s} {probed:>4d}/{len(fits):<2d} {mean['moves']:6.1f} "
                    f"{mean['first_s']:8.2f} {mean['target_s']:9.2f} {mean['end_s']:7.2f}   final "
                    f"{mean['final']:.4f}, efficiency {mean['efficiency']:.2f}; to target: "
                    + ", ".join(f"{f['target_s']:.2f}" for f in fits)
                )
            to_target = {a: statistics.mean(f["target_s"] for f in arms[a]) for a in arms}
            for arm in ARMS[:2]:
                ratio = to_target[arm] / to_target["always probe"]
                print(f"time to target, {arm} / always probe: {ratio:.2f}")
            results[job_name] = arms
    return results


if __name__ == "__main__":
    main()

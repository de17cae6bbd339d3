"""The probe's hiccup rule: slow chunks dropped only while rare, beside always dropped.

The adaptive probe times each worker's chunks one by one and drops the hiccups, chunks more
than 3x slower than the median chunk (:func:`hmdspt.core.speed.chunk_speed`). A worker
under a CPU quota runs at full speed until the quota is spent and then waits out the rest
of the scheduling period inside one chunk: those slow chunks are its speed. The trainer
drops slow chunks only while they are at most ``HICCUP_MAX_FRACTION`` (5 %) of the chunks;
the other arm drops every one, as the probe did before. Both arms run in turns on one
cluster: ``--cluster testbed`` (the OS-enforced quotas 1 / 0.5 / 0.25 core, as root) or the
in-code emulation (heterogeneity EMULATED on one machine, speeds 4:2:1), the probe of a
1,600,000-row fit (its row budget, 5 % of an epoch's rows) of the embedded default's model.
Prints each probe's speeds relative to the slowest worker's, the chunks dropped and the
probe's wall time.

Run: ``python -m benchmarks.bench_probe_hiccups --cluster testbed [--period-ms 10]``.
"""

from __future__ import annotations

import argparse
import statistics

from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.scoring import probe_workers

from ._common import (
    TESTBED,
    add_cluster_arguments,
    chosen_kinds,
    cluster,
    header,
    print_leftovers,
    testbed_label,
)

LAYERS = (40, 128, 64, 10)  # the embedded default's model
N_ROWS = 1_600_000
#: The arms: the trainer's rule, and every slow chunk dropped (a fraction no count exceeds).
ARMS = {"rare only (trainer)": 0.05, "every slow chunk": 1.0}


def _set_hiccup_fraction(fraction: float) -> None:
    """Run on every worker: the probe there reads the module's constant when it runs."""
    import hmdspt.core.speed as speed

    speed.HICCUP_MAX_FRACTION = fraction


def probe_once(client, names: dict[str, str], fraction: float) -> dict:
    """One probe of every worker with ``fraction`` as the hiccup rule; the rule restored."""
    client.run(_set_hiccup_fraction, fraction)
    try:
        result = probe_workers(client, LAYERS, n_rows_total=N_ROWS)
    finally:
        client.run(_set_hiccup_fraction, ARMS["rare only (trainer)"])
    order = sorted(result.speeds, key=lambda a: names[a])  # fastest first by name
    return {
        "speeds": [result.speeds[a] for a in order],
        "dropped": [result.details[a]["dropped"] for a in order],
        "wall_s": result.wall_s,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=6, help="probes of each arm")
    add_cluster_arguments(parser, default="testbed")
    args = parser.parse_args(argv)
    header("the probe's hiccup rule, speeds 4:2:1")
    results = {}
    for kind in chosen_kinds(args.cluster):
        label = testbed_label(args.period_ms) if kind == TESTBED else "heterogeneity emulated"
        print(f"\n## {label}")
        with cluster(kind, (4, 2, 1), period_ms=args.period_ms) as (client, _, _info):
            names = {a: w["name"] for a, w in scheduler_workers(client).items()}
            probe_once(client, names, ARMS["rare only (trainer)"])  # untimed: one-off costs
            arms: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for i in range(args.repeats):  # in turns, the arm that goes first alternating
                for arm in list(ARMS)[i % 2 :] + list(ARMS)[: i % 2]:
                    arms[arm].append(probe_once(client, names, ARMS[arm]))
        print("workers in speed order (4:2:1); speeds relative to the slowest worker's")
        for arm, probes in arms.items():
            ratios = [p["speeds"][0] / p["speeds"][-1] for p in probes]
            print(
                f"{arm:20s} fastest / slowest: median {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}); in order in "
                f"{sum(p['speeds'][0] > p['speeds'][1] > p['speeds'][2] for p in probes)}"
                f" of {len(probes)}; chunks dropped "
                f"{sum(sum(p['dropped']) for p in probes)}; probe wall median "
                f"{statistics.median(p['wall_s'] for p in probes):.2f} s"
            )
            for p in probes:
                print("    " + " : ".join(f"{s / p['speeds'][-1]:.2f}" for s in p["speeds"]))
        results[kind] = arms
        if kind == TESTBED:
            print_leftovers()
    return results


if __name__ == "__main__":
    main()

"""How well and how cheaply the probe measures an emulated 4:2:1 cluster.

Prints, for a few probe lengths, the scores the probe measured relative to the slowest
worker (the emulation asks for 4:2:1), how long the probe took, and how much CPU other
processes used meanwhile (the machine may be shared; a busy foreign core distorts the
emulation). Then the time of one full epoch of the same model on ``--rows`` rows on the
fastest worker, so that the probe's cost can be read as a fraction of an epoch.

Run from the repository root::

    python benchmarks/bench_scoring.py [--seconds 1 2 3] [--rows 100000]

Nothing is asserted; results are emulated heterogeneity on one machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distributed import Client  # noqa: E402

from benchmarks._common import busy_cpu_seconds, own_cpu_seconds  # noqa: E402
from pipeline.cluster import local_cluster  # noqa: E402
from pipeline.scoring import score_workers  # noqa: E402


def epoch_task(layer_sizes, n_rows, batch_size, seed=0):
    """One epoch of shuffled Adam mini-batches over synthetic rows; compute seconds.

    Defined here, so pickled by value: fine for one call, not for a per-round task.
    """
    from pipeline.nn import MLP, AdamOptimizer
    from pipeline.worker_tasks import throttled

    rng = np.random.RandomState(seed)
    model = MLP(layer_sizes)
    model.initialize(rng)
    opt = AdamOptimizer(model.n_params)
    X = rng.standard_normal((n_rows, layer_sizes[0])).astype(np.float32)
    Y = np.eye(layer_sizes[-1], dtype=np.float32)[rng.randint(layer_sizes[-1], size=n_rows)]
    order = rng.permutation(n_rows)
    start = time.perf_counter()
    for lo in range(0, n_rows, batch_size * 64):  # chunks of 64 steps under the throttle
        with throttled():
            for s in range(lo, min(lo + batch_size * 64, n_rows), batch_size):
                idx = order[s : s + batch_size]
                model.loss_and_grad(X[idx], Y[idx])
                opt.update(model.params, model.grad)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--layers", type=int, nargs="+", default=[100, 128, 64, 10])
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    layers = tuple(args.layers)

    with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:
        names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
        by_name = {n: a for a, n in names.items()}
        order = sorted(by_name)
        pids = [os.getpid(), *client.run(os.getpid).values()]
        print(f"cluster: {cluster.emulation}")
        print(f"model {layers}, batch {args.batch_size}, {os.cpu_count()} cores")
        print()
        print(
            f"{'probe s':>8} {'wall s':>7}  {' : '.join(order):<30} {'max/min':>8} {'foreign':>8}"
        )
        probe_walls = {}
        for seconds in args.seconds:
            for _ in range(args.repeats):
                busy0, own0 = busy_cpu_seconds(), own_cpu_seconds(pids)
                t0 = time.perf_counter()
                scores = score_workers(client, layers, seconds=seconds, batch_size=args.batch_size)
                wall = time.perf_counter() - t0
                foreign = (busy_cpu_seconds() - busy0 - (own_cpu_seconds(pids) - own0)) / wall
                probe_walls[seconds] = wall
                s = {names[a]: v for a, v in scores.items()}
                slowest = min(s.values())
                rel = " : ".join(f"{s[n] / slowest:.2f}" for n in order)
                print(
                    f"{seconds:8.1f} {wall:7.2f}  {rel:<30} {max(s.values()) / slowest:8.2f} "
                    f"{foreign:7.2f}c"
                )
                fastest_name = max(s, key=s.get)
                fastest_speed = s[fastest_name]

        print()
        epoch_s = client.submit(
            epoch_task,
            layers,
            args.rows,
            args.batch_size,
            workers=[by_name["worker-0"]],
            allow_other_workers=False,
            pure=False,
        ).result()
        print(
            f"one epoch of {args.rows} rows on worker-0 (fastest): {epoch_s:.2f} s compute "
            f"({args.rows / epoch_s:,.0f} samples/s; last probe said {fastest_speed:,.0f} "
            f"on {fastest_name})"
        )
        for seconds, wall in probe_walls.items():
            # Rows from which this probe costs under 10 % of one epoch on the fastest worker.
            rows_10pct = 10 * wall * args.rows / epoch_s
            print(
                f"  a {seconds:g} s probe took {wall:.2f} s = {wall / epoch_s:.0%} of that epoch; "
                f"under 10 % of an epoch from {rows_10pct:,.0f} rows on"
            )
        print("(emulated heterogeneity: 3 worker processes throttled on one machine)")


if __name__ == "__main__":
    main()

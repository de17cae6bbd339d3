"""What the speed probe costs, as a fraction of one epoch, and how well it measures 4:2:1.

Two jobs on an emulated 4:2:1 cluster (``hmdspt.parallel.cluster.local_cluster``, 3 worker
processes, 1 thread each):

- ``synthetic``: 100,000 random rows, MLP 100-128-64-10 (the simulator's reference shape);
- ``kdd``: KDD Cup 99 10 % (494,021 rows, 41 features, 5 categories), MLP 41-64-32-5,
  from ``../shared/datasets/kddcup99_10pct`` (or ``$HMDSPT_DATASETS``);
- ``kdd-large``: the same rows, MLP 41-256-128-5 (the training benchmark's model), where
  one epoch carries seconds of compute.

The probe has a floor (a task round trip plus enough timed chunks for a 5 % measurement,
a few tenths of a second), so it is a small fraction of an epoch only once an epoch takes
seconds; the first two jobs show the floor, the third the regime HMDSPT is for.

For each job, first the wall time of one HMDSPT epoch on the same cluster: a
``BPNNClassifier(client=..., max_iter=2, rounds_per_epoch=1)`` fit with a run log; each
epoch's wall is the sum of its ``round`` events' walls, each timed from broadcast to merged
update (the fit's own probe, staging and warm start are outside it; the first epoch opens
with short ramp rounds), and each round's per-worker
``rows / busy_s`` are the speeds the probe should predict. Then the probes, each repeated:
the adaptive default, the adaptive probe capped by the data set size (``n_rows_total``),
and the fixed 1 s probe the trainer used so far. For each: the scores relative to the
slowest worker, the probe's driver wall time, the rows it trained, its cost as a fraction
of one epoch (wall / epoch wall, and rows / data set rows), and the CPU other processes
used meanwhile (the machine may be shared; a busy foreign core distorts the emulation).

Run from the repository root::

    python benchmarks/bench_scoring.py [--jobs synthetic kdd] [--repeats 2]

Nothing is asserted; results are emulated heterogeneity on one machine.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distributed import Client  # noqa: E402

from benchmarks._common import (  # noqa: E402
    busy_cpu_seconds,
    dataset_path,
    header,
    own_cpu_seconds,
)
from hmdspt.core.runlog import read_events  # noqa: E402
from hmdspt.parallel.client import scheduler_workers  # noqa: E402
from hmdspt.parallel.cluster import local_cluster  # noqa: E402
from hmdspt.parallel.scoring import probe_workers  # noqa: E402

BATCH = 256


@dataclass
class Job:
    """A data set and the model trained on it."""

    name: str
    X: np.ndarray
    y: np.ndarray
    hidden: tuple[int, ...]

    @property
    def layers(self) -> tuple[int, ...]:
        return (self.X.shape[1], *self.hidden, int(self.y.max()) + 1)


def synthetic_job(n_rows: int = 100_000) -> Job:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n_rows, 100), dtype=np.float32)
    return Job("synthetic 100k", X, rng.integers(10, size=n_rows), (128, 64))


def kdd_job(hidden: tuple[int, ...] = (64, 32)) -> Job:
    data = np.load(dataset_path("kddcup99_10pct", "kddcup99_10pct.npz"))
    # Scales span nine orders of magnitude (the data set's README): log, then standardise.
    X = np.log1p(np.maximum(data["X_train"], 0.0))
    X = ((X - X.mean(0)) / np.maximum(X.std(0), 1e-6)).astype(np.float32)
    return Job("KDD Cup 99 10%", X, data["y5_train"], hidden)


JOBS = {
    "synthetic": synthetic_job,
    "kdd": kdd_job,
    # The training benchmark's KDD model: a round carries seconds of compute, the regime
    # HMDSPT is for (docs/design.md, "Benchmark set-up").
    "kdd-large": lambda: kdd_job((256, 128)),
}


def epoch_rounds(client: Client, job: Job) -> list[dict]:
    """``round`` events of a 2-epoch, 1-round-per-epoch HMDSPT fit (one per epoch)."""
    from hmdspt.estimator import BPNNClassifier

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        clf = BPNNClassifier(
            job.hidden,
            batch_size=BATCH,
            max_iter=2,
            random_state=0,
            client=client,
            rounds_per_epoch=1,
            run_log=log,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning: 2 epochs on purpose
            clf.fit(job.X, job.y)
        return [e for e in read_events(log) if e["event"] == "round"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    header("speed probe: cost per epoch and accuracy on an emulated 4:2:1 cluster")
    with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:
        names = {a: w["name"] for a, w in scheduler_workers(client).items()}
        order = sorted(names.values())
        pids = [os.getpid(), *client.run(os.getpid).values()]
        print(f"cluster: {cluster.emulation}; batch {BATCH}")
        for name in args.jobs:
            job = JOBS[name]()
            n = len(job.X)
            rounds = epoch_rounds(client, job)
            # An epoch's wall is the sum of its rounds' (the first epoch opens with ramp
            # rounds, so it has more than one).
            walls = [
                sum(e["wall_s"] for e in rounds if e["epoch"] == epoch)
                for epoch in sorted({e["epoch"] for e in rounds})
            ]
            epoch_s = statistics.mean(walls)
            print()
            print(f"## {job.name}: {n:,} rows, MLP {'-'.join(map(str, job.layers))}")
            print(
                "one HMDSPT epoch (sum of its round walls, 1 round/epoch + ramp rounds "
                f"in the first: {sum(e['epoch'] == 1 for e in rounds) - 1}): "
                + ", ".join(f"{w:.3f}" for w in walls)
                + f" s; mean {epoch_s:.3f} s"
            )
            # What the probe should predict: each worker's own speed in those rounds.
            for e in rounds:
                sp = {w: v["rows"] / v["busy_s"] for w, v in e["workers"].items()}
                low = min(sp.values())
                print(
                    f"  round {e['round']} speeds (rows / busy_s): "
                    + " : ".join(f"{sp[w] / low:.2f}" for w in order)
                    + f" ({', '.join(f'{sp[w]:,.0f}' for w in order)} rows/s)"
                )
            rng = np.random.default_rng(1)
            sample = rng.choice(n, size=min(n, 4096), replace=False)
            X_s = job.X[sample]
            Y_s = np.eye(job.layers[-1], dtype=np.float32)[job.y[sample]]
            probes = [
                ("adaptive", {}),
                ("adaptive, capped", {"n_rows_total": n}),
                ("fixed 1 s", {"seconds": 1.0}),
            ]
            print(
                f"{'probe':<17} {'wall s':>6} {'busy s':>6} {'rows':>9}  "
                f"{' : '.join(order):<28} {'max/min':>7} {'median':>6} {'% epoch':>7} "
                f"{'% rows':>6} {'ideal ep':>8} {'foreign':>7}  stops"
            )
            for label, kwargs in probes:
                for _ in range(args.repeats):
                    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds(pids)
                    t0 = time.perf_counter()
                    r = probe_workers(client, job.layers, batch_size=BATCH, X=X_s, Y=Y_s, **kwargs)
                    wall = time.perf_counter() - t0
                    foreign = (busy_cpu_seconds() - busy0 - (own_cpu_seconds(pids) - own0)) / wall
                    s = {names[a]: v for a, v in r.speeds.items()}
                    slowest = min(s.values())
                    rel = " : ".join(f"{s[w] / slowest:.2f}" for w in order)
                    busy = max(d["busy_s"] for d in r.details.values())
                    stops = "/".join(sorted({d.get("stop", "seconds") for d in r.details.values()}))
                    # The epoch as the probe predicts it: balanced shares, free barrier.
                    ideal = n / sum(r.speeds.values())
                    # The median estimator's max/min, for comparison (adaptive probe only).
                    med = [d.get("median_speed", math.nan) for d in r.details.values()]
                    med_ratio = max(med) / min(med)
                    print(
                        f"{label:<17} {r.wall_s:6.2f} {busy:6.2f} {r.rows:9,}  {rel:<28} "
                        f"{max(s.values()) / slowest:7.2f} {med_ratio:6.2f} "
                        f"{r.wall_s / epoch_s:7.0%} {r.epoch_fraction(n):6.0%} {ideal:7.3f}s "
                        f"{foreign:6.2f}c  {stops}"
                    )
        print()
        print(
            "max/min: the probe's scores (default estimator); median: the median estimator's; "
            "% epoch = probe wall / epoch wall; % rows = probe rows / data set rows; ideal ep = "
            "rows / sum of probe speeds. Emulated heterogeneity: 3 throttled worker processes "
            "on one machine."
        )


if __name__ == "__main__":
    main()

"""Is the cluster worth using? Issue 17's checks, per speed mix and problem size, in one run.

For each speed mix (4:2:1 and 8:2:1) on the in-code emulation (``local_cluster(speeds=...)``,
labelled *emulated*) and, with ``--cluster testbed`` or ``both``, on the OS-enforced testbed
(cgroup CPU quotas, ``benchmarks/testbed.py``), and for each job (digits, the activity
windows, KDD Cup 99 with MLP 41-64-32-5 and 41-256-128-5, ``hmdspt train``'s embedded
default), :func:`hmdspt.compare.run_comparison` fits the job side by side: the in-process
``BPNNClassifier`` (it sets the target, its final accuracy minus 1 point), HMDSPT with its
defaults (proportional shares, rounds sized from measured costs), local averaging on equal
shares and bsp on equal shares (time-boxed: one cluster round trip per mini-batch). Each
line then checks, from HMDSPT's run log:

- **share**: each worker's share of the rows in the last round within 25 % of its share of
  the speeds measured over the fit's regular rounds (epoch 2 on);
- **eff**: where the trainer's own prediction (after epoch 1) says the cluster is worth it
  (predicted speed-up over one process on the fastest worker at least 1), parallel
  efficiency measured over the predicted epochs at least 0.85;
- **pred**: that prediction within 0.1 of the measured efficiency;
- **time**: seconds from ``fit()`` to the target at most local-equal's and at most half of
  bsp-equal's (a bsp run that ends its time box short of the target counts as its box).

Writes ``benchmarks/out/worth.json``. Run: ``python -m benchmarks worth`` or
``python -m benchmarks.bench_worth [--jobs ...] [--mixes 4:2:1 8:2:1] [--cluster ...]``.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sklearn.exceptions import ConvergenceWarning

from hmdspt.compare import RunResult, run_comparison
from hmdspt.core.runlog import read_events, summarize

from ._common import (
    EMULATED,
    TESTBED,
    add_cluster_arguments,
    chosen_kinds,
    cluster,
    header,
    num,
    print_leftovers,
    testbed_label,
)
from .bench_ablation import load_embedded, load_small
from .bench_training import load_har, load_kdd
from .report import OUT, write_json

SHARE_TOLERANCE = 0.25
MIN_EFFICIENCY = 0.85
PREDICTION_TOLERANCE = 0.1
BSP_FACTOR = 0.5
STRATEGIES = ["hmdspt", "local-equal", "bsp-equal"]


@dataclass(frozen=True)
class Job:
    """A data set and the ``BPNNClassifier`` parameters every run of it shares."""

    load: Callable[[], tuple]
    hidden: tuple[int, ...]
    epochs: int
    batch_size: int

    def params(self) -> dict:
        return dict(
            hidden_layer_sizes=self.hidden,
            max_iter=self.epochs,
            batch_size=self.batch_size,
            learning_rate_init=0.001,
            random_state=0,
        )


JOBS = {
    "digits": Job(load_small, (64,), 20, 32),
    "har-windows": Job(load_har, (256, 128), 15, 128),
    "kdd-64-32": Job(load_kdd, (64, 32), 3, 256),
    "kdd-256-128": Job(load_kdd, (256, 128), 3, 256),
    "embedded": Job(load_embedded, (128, 64), 8, 256),
}


def share_deviation(events: list[dict]) -> tuple[float | None, dict, dict]:
    """The largest ``|row share / speed share - 1|`` over the workers of the last round.

    Speeds are each worker's rows over its busy seconds summed over the regular rounds
    (epoch 2 on; every round if the fit had one epoch).
    """
    rounds = [e for e in events if e.get("event") == "round"]
    if not rounds:
        return None, {}, {}
    regular = [e for e in rounds if e["epoch"] >= 2] or rounds
    workers = summarize(regular)["workers"]  # mean_speed: Σ rows / Σ busy
    speeds = {n: w["mean_speed"] for n, w in workers.items() if w["mean_speed"]}
    last = {n: w["rows"] for n, w in rounds[-1]["workers"].items() if n in speeds}
    if not last or not sum(last.values()):
        return None, speeds, last
    total_speed = sum(speeds[n] for n in last)
    total_rows = sum(last.values())
    deviation = max(abs((last[n] / total_rows) / (speeds[n] / total_speed) - 1) for n in last)
    return deviation, speeds, last


def prediction_check(events: list[dict]) -> dict:
    """The trainer's last prediction and the efficiency measured over the epochs it
    predicted (its epoch on)."""
    predictions = [e for e in events if e.get("event") == "prediction"]
    if not predictions:
        return {"predicted": None, "speedup": None, "measured": None, "sync_s": None}
    p = predictions[-1]
    later = [e for e in events if e.get("event") != "round" or e["epoch"] >= p["epoch"]]
    return {
        "predicted": p["efficiency"],
        # Its two parts (docs/design.md, "An honest answer"), to judge each against the fit.
        "model_predicted": p.get("model_efficiency"),
        "measured_before": p.get("measured_efficiency"),
        "speedup": p["speedup"],
        "measured": summarize(later)["efficiency"],
        "from_epoch": p["epoch"],
        "sync_s": p.get("sync_s"),
        "rounds_per_epoch": p.get("rounds_per_epoch"),
    }


def judge(
    results: list[RunResult], target: float, box: float, events: list[dict] | None = None
) -> dict:
    """Issue 17's checks for one job on one cluster (None: not applicable or unknown).

    ``events`` are HMDSPT's run log (default: read from its ``run_log``).
    """
    by_name = {r.name: r for r in results}
    if events is None:
        events = read_events(by_name["hmdspt"].run_log)
    deviation, _, last = share_deviation(events)
    pred = prediction_check(events)
    times = {name: r.seconds_to(target) for name, r in by_name.items()}
    ours, local, bsp = times["hmdspt"], times["local-equal"], times["bsp-equal"]
    bsp_bound = bsp if bsp is not None else max(by_name["bsp-equal"].wall_s, box)
    worth = pred["speedup"] is not None and pred["speedup"] >= 1
    checks = {
        "share": None if deviation is None else deviation <= SHARE_TOLERANCE,
        "eff": (
            None if not worth or pred["measured"] is None else pred["measured"] >= MIN_EFFICIENCY
        ),
        "pred": (
            None
            if pred["predicted"] is None or pred["measured"] is None
            else abs(pred["predicted"] - pred["measured"]) <= PREDICTION_TOLERANCE
        ),
        "time": (
            False
            if ours is None
            else (local is None or ours <= local) and ours <= BSP_FACTOR * bsp_bound
        ),
    }
    return {
        "target": target,
        "share_deviation": deviation,
        "last_round_rows": last,
        **pred,
        "worth": worth,
        "to_target": times,
        "bsp_reached": bsp is not None,
        "final": {name: r.final_accuracy for name, r in by_name.items()},
        "checks": checks,
    }


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def print_line(job: str, j: dict) -> None:
    t, c = j["to_target"], j["checks"]
    bsp = _secs(t["bsp-equal"]) if j["bsp_reached"] else "> box"
    sync = "-" if j["sync_s"] is None else f"{1000 * j['sync_s']:.0f}"
    rounds = j.get("rounds_per_epoch") or "-"
    print(
        f"{job:12s} {num(j['share_deviation']):>9s} {_mark(c['share']):>8s} "
        f"{num(j['speedup']):>8s} {sync:>7s} {rounds:>6} {num(j['predicted']):>8s} "
        f"{num(j['measured']):>8s} {_mark(c['eff']):>6s} {_mark(c['pred']):>7s} "
        f"{_secs(t['hmdspt']):>8s} {_secs(t['local-equal']):>8s} {bsp:>7s} "
        f"{_mark(c['time']):>7s} "
        f"{100 * (j['final']['hmdspt'] - j['final']['bpnn-in-process']):+7.2f}"
    )


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument(
        "--mixes", nargs="+", default=["4:2:1", "8:2:1"], help="relative speeds, as 4:2:1"
    )
    parser.add_argument(
        "--box", type=float, default=60.0, help="time box of each run, seconds (bsp's)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where worth.json goes")
    add_cluster_arguments(parser, default="emulated")
    args = parser.parse_args(argv)
    mixes = [tuple(float(s) for s in m.split(":")) for m in args.mixes]
    warnings.simplefilter("ignore", ConvergenceWarning)
    # The trainer's one-line warning when a cluster is predicted slower: the table's
    # speed-up column says it for every run.
    warnings.filterwarnings(
        "ignore", message="this cluster.* is predicted", category=RuntimeWarning
    )
    header("is the cluster worth using? issue 17's checks per speed mix and problem size")
    data = {}
    lines: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in chosen_kinds(args.cluster):
            label = testbed_label(args.period_ms) if kind == TESTBED else EMULATED
            for speeds in mixes:
                with cluster(kind, speeds, period_ms=args.period_ms) as (client, _, info):
                    mix = ":".join(f"{s:g}" for s in speeds)
                    where = info.get("mapping") or "heterogeneity emulated on one machine"
                    print(f"\n## {label}, speeds {mix} ({where})")
                    judged = {}
                    for job_name in args.jobs:
                        job = JOBS[job_name]
                        if job.load not in data:
                            data[job.load] = job.load()
                        X, y, X_test, y_test = data[job.load]
                        results, target = run_comparison(
                            client,
                            X,
                            y,
                            X_test,
                            y_test,
                            strategies=STRATEGIES,
                            params=job.params(),
                            run_dir=Path(tmp) / kind / mix / job_name,
                            max_seconds=args.box,
                            rounds_per_epoch="auto",
                            echo=lambda line: None,
                        )
                        judged[job_name] = judge(results, target, args.box)
                        took = sum(r.wall_s for r in results)
                        print(f"{job_name}: {len(results)} fits, {took:.0f} s of fit wall time")
                        lines.append(
                            {
                                "cluster": label,
                                "speeds": mix,
                                "job": job_name,
                                **judged[job_name],
                            }  # fmt: skip
                        )
                    _print_table(judged)
                if kind == TESTBED:
                    print_leftovers()
    _print_totals(lines)
    write_json(args.out / "worth.json", lines)
    return lines


def _print_table(judged: dict[str, dict]) -> None:
    print(
        "share dev: largest |row share / speed share - 1| in the last round (<= 0.25); "
        "speed-up: predicted over one process on the fastest worker (>= 1: worth it), "
        "from the synchronisation measured per round (sync ms) and the rounds per epoch; "
        "eff pred / meas: parallel efficiency predicted after epoch 1 and measured from "
        "then on (>= 0.85 where worth it; within 0.1); s to target from fit(); "
        "acc pts: HMDSPT's final accuracy minus the in-process fit's, points; "
        "local= / bsp=: local averaging / bsp on equal shares"
    )
    print(
        f"{'job':12s} {'share dev':>9s} {'share ok':>8s} {'speed-up':>8s} {'sync ms':>7s} "
        f"{'rounds':>6s} {'eff pred':>8s} {'eff meas':>8s} {'eff ok':>6s} {'pred ok':>7s} "
        f"{'s hmdspt':>8s} {'s local=':>8s} {'s bsp=':>7s} {'time ok':>7s} {'acc pts':>7s}"
    )
    for job, j in judged.items():
        print_line(job, j)


def _print_totals(lines: list[dict]) -> None:
    print("\nchecks met, over every cluster, mix and job ('-': not applicable):")
    for check in ("share", "eff", "pred", "time"):
        values = [line["checks"][check] for line in lines]
        met = sum(v is True for v in values)
        judged = sum(v is not None for v in values)
        failed = [
            f"{line['cluster']} {line['speeds']} {line['job']}"
            for line in lines
            if line["checks"][check] is False
        ]
        print(
            f"  {check}: {met} of {judged}" + (f"; not met: {', '.join(failed)}" if failed else "")
        )


if __name__ == "__main__":
    main()

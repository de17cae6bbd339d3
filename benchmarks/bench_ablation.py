"""Ablation: HMDSPT with each mechanism switched off in turn, same cluster and data.

On ``local_cluster(speeds=(4, 2, 1))`` (heterogeneity EMULATED on one machine), KDD Cup 99
(5 categories), the smartphone activity windows, ``hmdspt train``'s embedded default and
digits: the full method, then without proportional partitioning (equal shares), without
the step-normalised merge (plain row-weighted average), without block momentum, probing
the speeds instead of starting from those the workers remember (where the probe pays: a
smaller fit starts from its first round's timings, ``hmdspt.core.speed.probe_pays``;
``benchmarks.bench_probe_rule`` measures that rule), without the warm start,
without the ramp rounds, and with top-k 10 % compression added. Prints time to the target
accuracy (full method's final accuracy minus 1 point) from the fit call, final accuracy,
the fastest worker's idle % and the efficiency for each; a mechanism that does not help
is reported as such. Chart: ``benchmarks/out/ablation.png``.
Run: ``python -m benchmarks.bench_ablation`` (``--variants startup --jobs digits embedded``:
the start-up mechanisms only, issue 17's point 4).
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from distributed import Client
from sklearn.exceptions import ConvergenceWarning

from hmdspt.compare import WARM_UP_ROW_PASSES, WARM_UP_ROWS, held_out_sample
from hmdspt.core.nn import MLP
from hmdspt.core.runlog import read_events, summarize
from hmdspt.parallel.cluster import local_cluster
from hmdspt.parallel.trainer import Trainer, TrainerConfig

from ._common import header, num, pct
from .bench_training import load_har, load_kdd
from .report import OUT, pyplot, save_figure, shown

VARIANTS = {
    "full HMDSPT": {},
    "- proportional partitioning": {"partition": "equal"},
    "- step-normalised merge": {"normalize_steps": False},
    "- block momentum": {"block_momentum": 0.0},
    "- larger local steps": {"local_lr_scale": 1.0},
    "- remembered speeds (probed)": {"reuse_speeds_s": 0.0},
    "- warm start": {"warm_start_rows": 0},
    "- ramp rounds": {"ramp_rounds": 0},
    "+ top-k 10 % compression": {"compression": "topk"},
}


#: The trainer's default: rounds sized from the measured costs.
ROUNDS_PER_EPOCH = "auto"


@dataclass(frozen=True)
class Job:
    """A data set and the fit the variants run on it."""

    load: Callable[[], tuple]
    hidden: tuple[int, ...]
    epochs: int
    batch_size: int


def load_embedded():
    """The embedded default of ``hmdspt train`` (200,000 rows, split as the CLI splits it)."""
    from hmdspt.cli import load_default_dataset

    X_train, X_test, y_train, y_test = load_default_dataset(0)
    return X_train, y_train, X_test, y_test


def load_small():
    """scikit-learn's digits (1,347 training rows): where most users start."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        (X / 16).astype(np.float32), y, test_size=0.25, random_state=0
    )
    return X_train, y_train, X_test, y_test


#: The start-up mechanisms (issue 17, point 4): ``--variants startup`` runs only these.
STARTUP_VARIANTS = (
    "full HMDSPT",
    "- remembered speeds (probed)",
    "- warm start",
    "- ramp rounds",
)

JOBS = {
    # KDD's test accuracy levels off within the first round: time to target there is
    # mostly start-up; HAR converges over many epochs, where the merge mechanisms show.
    "kddcup99": Job(load_kdd, (256, 128), 3, 256),
    "har-windows": Job(load_har, (256, 128), 15, 128),
    "embedded": Job(load_embedded, (128, 64), 8, 256),
    "digits": Job(load_small, (64,), 20, 32),
}


def run(
    client,
    data,
    job: Job,
    overrides: dict,
    run_dir: Path,
    seed: int = 0,
    n_classes: int | None = None,
) -> dict:
    X, y, X_test, y_test = data
    n_classes = int(y.max()) + 1 if n_classes is None else n_classes
    Y = np.eye(n_classes, dtype=np.float32)[y]
    sample = held_out_sample(len(y_test))
    Xs, ys = X_test[sample], y_test[sample]
    model = MLP((X.shape[1], *job.hidden, n_classes), alpha=1e-4)
    model.initialize(np.random.RandomState(seed))
    overrides = {"rounds_per_epoch": ROUNDS_PER_EPOCH, **overrides}
    config = TrainerConfig(seed=seed, run_log=str(run_dir), **overrides)
    trainer = Trainer(
        client, model, dict(solver="adam", learning_rate_init=0.001), job.batch_size, config
    )

    scored = MLP(model.layer_sizes, alpha=1e-4)  # scored beside the training: not `model`

    def evaluate(params: np.ndarray) -> float:
        scored.set_params(params)
        return float((scored.forward(Xs).argmax(1) == ys).mean())

    trainer.fit(X, Y, max_epochs=job.epochs, evaluate=evaluate)
    events = read_events(trainer.run_log_path)
    start = events[0]["called_at"]  # the user's clock: from the fit call, start-up included
    curve = [
        (e["time"] - start, e["val_score"])
        for e in events
        if e["event"] in ("round", "warm_start") and e["val_score"] is not None
    ]
    s = summarize(events)
    return {
        "sources": {e["source"] for e in events if e["event"] == "score" and e["round"] == 0},
        "curve": curve,
        "final": float((model.forward(X_test).argmax(1) == y_test).mean()),
        "idle": s["fastest_idle_fraction"],
        "efficiency": s["efficiency"],
        "bytes": float(
            np.mean(
                [
                    w["bytes_out"]
                    for e in events
                    if e["event"] == "round"
                    for w in e["workers"].values()
                ]
            )
        ),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant")
    parser.add_argument(
        "--variants",
        choices=("all", "startup"),
        default="all",
        help="every variant, or only the start-up mechanisms' (probe, warm start, ramp)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where ablation.png goes")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("ablation, local_cluster(4,2,1), heterogeneity emulated")
    all_results = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_cluster(speeds=(4, 2, 1)) as cluster,
        Client(cluster) as client,
    ):
        for job_name in args.jobs:
            job = JOBS[job_name]
            data = job.load()
            # Untimed: the first fit on a cluster pays one-off costs (worker imports,
            # first transfers) that would land on whichever variant ran first. Sized as
            # the comparison's warm-up, so the workers remember their speeds for this
            # model and every variant, the first included, starts from them, not a probe.
            n = min(len(data[1]), WARM_UP_ROWS)
            warm = Job(job.load, job.hidden, min(25, -(-WARM_UP_ROW_PASSES // n)), job.batch_size)
            n_classes = int(data[1].max()) + 1
            run(client, tuple(a[:n] for a in data), warm, {}, Path(tmp), n_classes=n_classes)
            # Repeats interleaved (every variant once, then again) so that a slow spell of
            # the shared machine does not land on one variant only.
            names = list(VARIANTS) if args.variants == "all" else list(STARTUP_VARIANTS)
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for _ in range(args.repeats):
                for name in names:
                    runs[name].append(run(client, data, job, VARIANTS[name], Path(tmp)))
            results = {name: _combine(rs) for name, rs in runs.items()}
            report(job_name, job, results, args.repeats)
            probed = sorted({n for n, rs in runs.items() for r in rs if "probe" in r["sources"]})
            print(f"starting speeds probed (none remembered) in: {', '.join(probed) or 'no run'}")
            all_results[job_name] = results
    print(f"chart: {shown(plot(all_results, args.out / 'ablation.png'))}")
    return all_results


def _combine(runs: list[dict]) -> dict:
    """One variant's repeats: the means, the first run's curve (for the chart), all runs."""
    mean = {
        key: None if any(r[key] is None for r in runs) else float(np.mean([r[key] for r in runs]))
        for key in ("final", "idle", "efficiency", "bytes")
    }
    return {**mean, "curve": runs[0]["curve"], "runs": runs}


def _time_to(curve, target: float) -> float | None:
    return next((t for t, a in curve if a >= target), None)


def report(job_name: str, job: Job, results: dict, repeats: int) -> None:
    """Print one job's table; a variant's verdict compares it with the full method.

    Time to target is the mean over the repeats (``never`` if any repeat missed it); a
    mechanism "helps" when switching it off costs more than 10 % in time to target or
    half a point of final accuracy, or, for proportional partitioning, whose job it is,
    5 points of the fastest worker's idle time; the run is "better without it" when
    switching it off gains as much (and costs nothing by those measures).
    """
    full = results["full HMDSPT"]
    target = full["final"] - 0.01
    full["target"] = target
    print(
        f"\n## {job_name}: MLP hidden {job.hidden}, {job.epochs} epochs, batch {job.batch_size}, "
        f"rounds per epoch {ROUNDS_PER_EPOCH}, mean of {repeats} interleaved runs; target "
        f"accuracy {target:.4f} (full method's final - 1 point); seconds from the fit call"
    )
    print(
        f"{'variant':30s} {'s to target':>12s} {'final acc':>10s} {'fastest idle %':>15s} "
        f"{'efficiency':>11s} {'bytes/worker/round':>19s}  [s to target of each run]"
    )
    for r in results.values():
        times = [_time_to(run["curve"], target) for run in r["runs"]]
        r["to_target"] = None if None in times else float(np.mean(times))
    full_t = full["to_target"]
    for name, r in results.items():
        t = r["to_target"]
        verdict = ""
        if name.startswith("-") and full_t is not None:
            slower = t is None or t > 1.10 * full_t
            worse = r["final"] < full["final"] - 0.005
            idler = "partitioning" in name and (r["idle"] or 0) > (full["idle"] or 0) + 0.05
            faster = t is not None and t < full_t / 1.10
            better = r["final"] > full["final"] + 0.005
            if slower or worse or idler:
                what = [
                    w for w, on in (("time", slower), ("accuracy", worse), ("idle", idler)) if on
                ]
                verdict = f"  (the mechanism helps: {', '.join(what)})"
            elif faster or better:
                what = [w for w, on in (("time", faster), ("accuracy", better)) if on]
                verdict = f"  (better without it here: {', '.join(what)})"
            else:
                verdict = "  (no measurable contribution here)"
        each = ", ".join(
            "never" if x is None else f"{x:.2f}"
            for x in (_time_to(run["curve"], target) for run in r["runs"])
        )
        print(
            f"{name:30s} {(f'{t:.1f}' if t is not None else 'never'):>12s} "
            f"{r['final']:10.4f} {pct(r['idle']):>15s} {num(r['efficiency']):>11s} "
            f"{r['bytes']:19,.0f}  [{each}]{verdict}"
        )


def plot(all_results: dict, path: Path) -> Path:
    """Per job: accuracy over time per variant, time to the target, fastest worker's idle %."""
    plt = pyplot()
    fig, axes = plt.subplots(
        len(all_results),
        3,
        figsize=(15, 4.4 * len(all_results)),
        gridspec_kw={"width_ratios": [1.3, 1, 1]},
        layout="constrained",
        squeeze=False,
    )
    for (job_name, results), (ax_acc, ax_t, ax_idle) in zip(all_results.items(), axes):
        names = list(results)
        target = results["full HMDSPT"]["target"]
        for i, name in enumerate(names):
            curve = results[name]["curve"]
            if curve:
                ax_acc.plot(*zip(*curve), marker=".", lw=1.2, color=f"C{i}", label=name)
        ax_acc.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.4f}")
        ax_acc.set(xlabel="wall time (s)", ylabel="held-out accuracy")
        ax_acc.set_title(f"{job_name}: accuracy over time", fontsize=10)
        ax_acc.legend(fontsize=7)
        y = np.arange(len(names))
        colors = [f"C{i}" for i in range(len(names))]
        times = [results[n]["to_target"] for n in names]
        bars = ax_t.barh(y, [0.0 if t is None else t for t in times], color=colors)
        ax_t.bar_label(
            bars,
            labels=["never" if t is None else f"{t:.1f}" for t in times],
            padding=3,
            fontsize=8,
        )
        ax_t.set(xlabel="seconds to the target accuracy")
        ax_t.set_title(f"{job_name}: time to target", fontsize=10)
        idle = [results[n]["idle"] for n in names]
        bars = ax_idle.barh(y, [0.0 if v is None else 100 * v for v in idle], color=colors)
        ax_idle.bar_label(bars, labels=[pct(v) for v in idle], padding=3, fontsize=8)
        ax_idle.set(xlabel="fastest worker idle, % of round time", xlim=(0, 100))
        ax_idle.set_title(f"{job_name}: idle time of the fastest worker", fontsize=10)
        for ax in (ax_t, ax_idle):
            ax.set_yticks(y, names if ax is ax_t else [])
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
            ax.margins(x=0.15)
        ax_acc.grid(alpha=0.3)
    fig.suptitle(
        "Ablation on local_cluster(4,2,1) — heterogeneity emulated on one machine", fontsize=10
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

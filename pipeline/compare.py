"""HMDSPT against its baselines on the same cluster and data (``hmdspt compare``).

Every cluster run goes through the same estimator and round loop with a different
``sync`` / ``partition``; scikit-learn's ``MLPClassifier`` and the in-process
``BPNNClassifier`` run in the driver process. Each run scores the same held-out set while
it trains, so the table can say how long each took to reach a common target accuracy:
the in-process ``BPNNClassifier``'s final accuracy minus ``target_drop``. Times are
seconds of training: the time a run spends scoring that held-out set is left out, so
how often a run scores does not change the times it reports (cluster runs score at a
relative resolution of 5 % in time, ``TrainerConfig.eval_resolution``; in-process runs
after every epoch).
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hmdspt.core.prediction import counted, sync_per_round
from hmdspt.core.runlog import new_run_id, read_events, summarize

# scikit-learn and the estimator are imported by the functions that fit: plotting or
# reading a comparison's results needs neither (they take about two CPU-seconds to load).

# name -> (sync, partition); None marks an in-process run.
STRATEGIES: dict[str, tuple[str, str] | None] = {
    "hmdspt": ("hmdspt", "proportional"),
    "hmdspt-equal": ("hmdspt", "equal"),
    "local-equal": ("local", "equal"),
    "bsp-equal": ("bsp", "equal"),
    "bpnn-in-process": None,
    "sklearn-in-process": None,
}


@dataclass
class RunResult:
    """What one run of a comparison measured."""

    name: str
    wall_s: float  # the fit's wall time, scoring the accuracy curve included
    train_s: float  # the same less the time spent scoring the accuracy curve
    final_accuracy: float
    curve: list[tuple[float, float]]  # (seconds of training since the fit began, accuracy)
    epochs: int
    fastest_idle_fraction: float | None = None
    efficiency: float | None = None
    bytes_per_round: float | None = None
    rounds: int = 0
    run_log: str | None = None
    idle_curve: list[tuple[float, float]] = field(default_factory=list)
    final_model: Any = field(default=None, repr=False)

    def seconds_to(self, target: float) -> float | None:
        """First time the held-out accuracy reached ``target`` (None if never)."""
        return next((t for t, acc in self.curve if acc >= target), None)


def _sklearn_run(params: dict, X, y, X_test, y_test, max_seconds: float | None) -> RunResult:
    """scikit-learn's MLPClassifier in one process, scored after every epoch."""
    from sklearn.neural_network import MLPClassifier

    kwargs = {k: v for k, v in params.items() if k in MLPClassifier().get_params()}
    clf = MLPClassifier(**kwargs)
    classes = np.unique(y)
    curve = []
    start = time.perf_counter()
    scoring_s = 0.0  # not training: left out of the curve's times, as BPNNClassifier does
    for _ in range(kwargs.get("max_iter", 200)):
        clf.partial_fit(X, y, classes=classes)  # one epoch, optimizer state kept
        trained_s = time.perf_counter() - start - scoring_s
        scored = time.perf_counter()
        curve.append((trained_s, clf.score(X_test, y_test)))
        scoring_s += time.perf_counter() - scored
        if max_seconds is not None and trained_s >= max_seconds:
            break
    wall = time.perf_counter() - start
    result = RunResult("sklearn-in-process", wall, curve[-1][0], curve[-1][1], curve, len(curve))
    result.final_model = clf
    return result


# Enough rows processed that every worker's regular rounds clear MIN_REMEMBERED_BUSY_S
# with room (docs/design.md, "Benchmark set-up"); the warm-up's epochs stop at 25.
WARM_UP_ROWS = 60_000
WARM_UP_ROW_PASSES = 300_000
# Where a model is so fast that one warm-up fit is too short to be remembered, its totals
# carry on into the next (hmdspt.parallel.worker): at most this many fits, and only when
# that many would add up to a memory on every worker.
WARM_UP_FITS = 4


def _warm_up(client, X, y, params: dict, rounds_per_epoch: int | str) -> None:
    """An untimed short fit on the cluster before the timed runs.

    The first fit on a fresh cluster pays one-off costs (imports on the workers, their first
    large transfers) that would otherwise land on whichever strategy happens to run first.
    It also leaves every worker's speed for this model shape in its memory
    (:func:`hmdspt.parallel.worker.remembered_speed`), as any earlier fit on the cluster
    would: a proportional run then starts from those speeds instead of a probe. For that the
    warm-up holds every class (the output layer is part of the shape), processes about
    ``WARM_UP_ROW_PASSES`` rows, enough regular rounds on every worker to be remembered
    (:data:`hmdspt.parallel.worker.MIN_REMEMBERED_BUSY_S`; where one fit is too short, the
    totals of more fits add up, as long as at most ``WARM_UP_FITS`` fits could get every
    worker there), and uses the timed runs' ``rounds_per_epoch``, so that its rounds are as
    large as the sample allows.
    """
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.core.config import TrainerConfig
    from hmdspt.estimator import BPNNClassifier
    from hmdspt.parallel.worker import (
        MIN_REMEMBERED_BUSY_S,
        model_speed_key,
        remembered_speed,
        unremembered_busy_s,
    )

    y = np.asarray(y)
    rng = np.random.default_rng(0)
    n = min(len(y), WARM_UP_ROWS)
    _, first_of_class = np.unique(y, return_index=True)
    rows = np.union1d(first_of_class, rng.choice(len(y), size=n, replace=False))
    warm = {k: v for k, v in params.items() if k not in ("max_iter", "random_state")}
    epochs = min(25, -(-WARM_UP_ROW_PASSES // len(rows)))
    reuse_s = TrainerConfig().reuse_speeds_s  # what the timed runs will accept
    for fit in range(1, WARM_UP_FITS + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # a short fit on purpose
            warm_up = BPNNClassifier(
                client=client,
                max_iter=epochs,
                random_state=0,
                rounds_per_epoch=rounds_per_epoch,
                **warm,
            ).fit(np.asarray(X)[rows], y[rows])
        _stop_if_interrupted(warm_up)
        key = model_speed_key(warm_up._model, warm_up._batch_size(len(rows)))
        memories = client.run(remembered_speed, key, reuse_s)
        if all(m is not None for m in memories.values()):
            return
        # Fit again only if the fits left could add up to a memory on every worker.
        carried = client.run(unremembered_busy_s, key, workers=[*memories])
        least = min(carried.get(w, 0.0) for w, m in memories.items() if m is None)
        if least * WARM_UP_FITS < MIN_REMEMBERED_BUSY_S * fit:
            return


def _stop_if_interrupted(model) -> None:
    """A fit that Ctrl-C stopped keeps its model, as scikit-learn's do; a comparison stops
    altogether, since a run cut short compares with nothing."""
    if model._interrupted:
        raise KeyboardInterrupt


def held_out_sample(n_rows: int, eval_rows: int = 20_000) -> np.ndarray:
    """Sorted indices of the held-out rows an accuracy curve scores (the same every run)."""
    return np.sort(np.random.default_rng(0).permutation(n_rows)[:eval_rows])


def log_figures(path: str | Path) -> dict[str, Any]:
    """What a :class:`RunResult` takes from a run log.

    Returns a dict of ``fastest_idle_fraction``, ``efficiency``, ``bytes_per_round`` (sum
    over the workers, mean over the rounds), ``rounds`` and ``idle_curve`` (seconds since
    the run began, the fastest worker's idle fraction of each round).
    """
    events = read_events(path)
    summary = summarize(events)
    rounds = [e for e in events if e["event"] == "round"]
    start = next(e["time"] for e in events if e["event"] == "run_start")
    fastest = summary.get("fastest_worker")
    idle_curve = []
    sent = []
    for r in rounds:
        workers = r["workers"]
        sent.append(sum((w.get("bytes_out") or 0) for w in workers.values()))
        if fastest in workers and r["wall_s"]:
            idle_curve.append((r["time"] - start, workers[fastest]["idle_s"] / r["wall_s"]))
    return {
        "fastest_idle_fraction": summary.get("fastest_idle_fraction"),
        "efficiency": summary.get("efficiency"),
        "bytes_per_round": float(np.mean(sent)) if sent else None,
        "rounds": len(rounds),
        "idle_curve": idle_curve,
    }


def check_strategies(names: Sequence[str]) -> list[str]:
    """The comparison's runs by name, each known and named once.

    Raises
    ------
    ValueError
        Naming the first unknown or repeated name: a run's log is named by its strategy,
        so a second run of one would replace the first's.
    """
    names = list(names)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    repeated = [n for i, n in enumerate(names) if n in names[:i]]
    if repeated:
        raise ValueError(f"strategy {repeated[0]!r} named twice; name each run once")
    return names


def new_comparison_dir(parent: str | Path) -> Path:
    """A new folder under ``parent`` for one comparison's run logs and chart, named by
    :func:`hmdspt.core.runlog.new_run_id` (its start time first, so folders sort by
    time): a comparison never replaces or mixes with an earlier one's logs."""
    folder = Path(parent) / new_run_id()
    folder.mkdir(parents=True)
    return folder


def run_comparison(
    client,
    X,
    y,
    X_test,
    y_test,
    *,
    strategies: list[str] | None = None,
    params: dict | None = None,
    run_dir: str | Path = "runs",
    max_seconds: float | None = None,
    rounds_per_epoch: int | str = 1,
    target_drop: float = 0.01,
    eval_rows: int = 20_000,
    echo=None,
) -> tuple[list[RunResult], float]:
    """Run each strategy on the same data; return the results and the target accuracy.

    Parameters
    ----------
    client : distributed.Client
        The cluster for the cluster strategies.
    X, y, X_test, y_test : array-like
        Training data and the held-out set every run scores while it trains.
    strategies : list of str, optional
        Names from :data:`STRATEGIES` (default: all).
    params : dict, optional
        ``BPNNClassifier`` hyper-parameters shared by every run.
    run_dir : path, default="runs"
        Where the cluster runs' logs go (``<run_dir>/<name>.jsonl``); a log of the same
        name there is replaced as its run starts. ``hmdspt compare`` gives each comparison
        a folder of its own (:func:`new_comparison_dir`).
    max_seconds : float, optional
        Time box of each run (needed for ``bsp``: one cluster round trip per mini-batch).
    rounds_per_epoch : int or "auto", default=1
        Rounds per epoch of the delta-merging strategies (``"auto"``: sized from measured
        costs, see :class:`hmdspt.estimator.BPNNClassifier`).
    target_drop : float, default=0.01
        Target accuracy = in-process BPNNClassifier's final accuracy minus this.
    eval_rows : int, default=20000
        The accuracy curves score a fixed random sample of this many held-out rows (the
        same for every run), so scoring does not dominate short rounds; final accuracies
        use the whole held-out set.
    echo : callable, optional
        Progress messages, one line per call: one as each run starts and one as it
        ends (its times and final accuracy). Default: printed at once, even to a pipe.

    Returns
    -------
    results : list of RunResult
    target : float
    """
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.estimator import BPNNClassifier

    if echo is None:
        echo = functools.partial(print, flush=True)
    names = list(STRATEGIES) if strategies is None else check_strategies(strategies)
    if "bpnn-in-process" not in names:
        names.insert(0, "bpnn-in-process")  # it defines the target accuracy
    params = dict(params or {})
    echo("warm-up fit on the cluster (untimed) ...")
    _warm_up(client, X, y, params, rounds_per_epoch)
    sample = held_out_sample(len(y_test), eval_rows)
    X_curve, y_curve = X_test[sample], np.asarray(y_test)[sample]
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ordered = sorted(names, key=lambda n: n != "bpnn-in-process")
        for number, name in enumerate(ordered, 1):
            echo(f"running {name} ({number} of {len(ordered)}) ...")
            if name == "sklearn-in-process":
                result = _sklearn_run(params, X, y, X_curve, y_curve, max_seconds)
                result.final_accuracy = result.final_model.score(X_test, y_test)
                results.append(result)
                echo(_finished_line(result))
                continue
            strategy = STRATEGIES[name]
            # In-process even inside the comparison's own (active) Client.
            cluster_kw: dict[str, Any] = {"client": False}
            log = None
            if strategy is not None:
                log = run_dir / f"{name}.jsonl"
                log.unlink(missing_ok=True)
                cluster_kw = dict(
                    client=client,
                    sync=strategy[0],
                    partition=strategy[1],
                    rounds_per_epoch=rounds_per_epoch,
                    run_log=log,
                )
            clf = BPNNClassifier(max_seconds=max_seconds, **cluster_kw, **params)
            start = time.perf_counter()
            clf.fit(X, y, eval_set=(X_curve, y_curve))
            wall = time.perf_counter() - start
            _stop_if_interrupted(clf)
            result = RunResult(
                name,
                wall,
                # The fit scores eval_set after its last round, so the curve's last time
                # is the fit's training time.
                clf.eval_curve_[-1][0],
                clf.score(X_test, y_test),
                list(clf.eval_curve_),
                clf.n_iter_,
                run_log=None if log is None else str(log),
            )
            if log is not None:
                for key, value in log_figures(log).items():
                    setattr(result, key, value)
            results.append(result)
            echo(_finished_line(result))
    reference = next(r for r in results if r.name == "bpnn-in-process")
    return results, reference.final_accuracy - target_drop


def _seconds(x: float) -> str:
    """Seconds with two decimals below 10 s: with one, a small data set's runs all read
    0.0-0.5 s and the winner seemed to take no time."""
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def _finished_line(result: RunResult) -> str:
    """The line printed as a run ends."""
    rounds = ""
    if result.rounds:
        rounds = f", {counted(result.rounds, 'round')}"
    return (
        f"{result.name}: done in {_seconds(result.wall_s)} s "
        f"({_seconds(result.train_s)} s of training), "
        f"{result.epochs} epoch(s){rounds}, final accuracy {result.final_accuracy:.4f}"
    )


def format_table(results: list[RunResult], target: float) -> str:
    """The comparison as a text table.

    ``wall s`` is each fit's wall time; ``train s`` and ``s to target`` leave out the time
    the fit spent scoring the held-out sample of its accuracy curve.
    """
    head = (
        f"{'run':20s} {'wall s':>7s} {'train s':>8s} {'s to target':>12s} {'fastest idle %':>15s} "
        f"{'efficiency':>11s} {'final acc':>10s} {'epochs':>7s} {'bytes/round':>12s}"
    )
    lines = [f"target accuracy: {target:.4f}", head]
    for r in results:
        to_target = r.seconds_to(target)

        def opt(v, fmt):
            return format(v, fmt) if v is not None else "-"

        lines.append(
            f"{r.name:20s} {_seconds(r.wall_s):>7s} {_seconds(r.train_s):>8s} "
            f"{'-' if to_target is None else _seconds(to_target):>12s} "
            f"{opt(None if r.fastest_idle_fraction is None else 100 * r.fastest_idle_fraction, '15.1f'):>15s} "  # noqa: E501
            f"{opt(r.efficiency, '11.2f'):>11s} {r.final_accuracy:10.4f} {r.epochs:7d} "
            f"{opt(r.bytes_per_round, '12,.0f'):>12s}"
        )
    return "\n".join(lines)


def why_one_process_won(
    results: list[RunResult], n_workers: int, machine_cores: int | None = None
) -> list[str]:
    """Lines saying why an in-process run beat every HMDSPT run, if one did (else none).

    Parameters
    ----------
    results : list of RunResult
        The comparison's runs.
    n_workers : int
        Workers of the cluster.
    machine_cores : int, optional
        Cores of the one machine the workers share (an emulated local cluster); None when
        they have machines of their own.
    """
    cluster = [r for r in results if r.name.startswith("hmdspt") and r.run_log]
    alone = [r for r in results if r.name.endswith("in-process")]
    if not cluster or not alone:
        return []
    best, one = min(cluster, key=lambda r: r.wall_s), min(alone, key=lambda r: r.wall_s)
    if one.wall_s > best.wall_s:
        return []
    if machine_cores is not None:
        why = (
            f"{n_workers} workers sharing this machine's {machine_cores} cores compute "
            "together no faster than one process on them, and every round adds "
            "synchronisation that one process does not pay"
        )
    else:
        why = "every round adds synchronisation that one process does not pay"
    lines = [
        f"why {one.name} won ({_seconds(one.wall_s)} s against {_seconds(best.wall_s)} s): {why}"
    ]
    predicted = [e for e in read_events(best.run_log) if e.get("event") == "prediction"]
    if predicted:
        p = predicted[-1]
        lines.append(
            f"  {best.name} predicted after its first epoch"
            f"{' (heterogeneity emulated)' if p.get('emulated') else ''}: "
            f"speed-up {p['speedup']:.2f}x over "
            f"one process on {p['fastest']} alone, "
            f"{sync_per_round(p['sync_s'], p['rounds_per_epoch'], ' of synchronisation')} "
            "(predicted)"
        )
    return lines


#: The chart's formats, by file suffix (matplotlib's Agg canvas writes each).
CHART_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def chart_format(path: str | Path) -> str:
    """The format :func:`plot` writes to ``path``, from its suffix (none: PNG).

    Raises
    ------
    ValueError
        For any other suffix: the file would hold something its name does not say.
    """
    suffix = Path(path).suffix.lower()
    if not suffix:
        return "png"
    if suffix not in CHART_FORMATS:
        raise ValueError(
            f"{path}: a chart is written as {', '.join(CHART_FORMATS)}; give one of these suffixes"
        )
    return CHART_FORMATS[suffix]


def plot(results: list[RunResult], target: float, path: str | Path, title: str) -> Path:
    """The chart (PNG, PDF or SVG by ``path``'s suffix, :func:`chart_format`): fastest
    worker's idle % against wall time and held-out accuracy against seconds of training
    (scoring not counted), per run.

    Each run has one colour in both panels (in-process runs have no idle curve). The
    figure is a plain :class:`matplotlib.figure.Figure` drawn by the Agg canvas: no
    pyplot state, and the user's backend is left as it is.
    """
    from matplotlib.figure import Figure

    form = chart_format(path)  # before drawing: a wrong name fails at once
    fig = Figure(figsize=(12, 4.5))
    ax_idle, ax_acc = fig.subplots(1, 2)
    for number, r in enumerate(results):
        colour = f"C{number % 10}"  # the default colour cycle, by run, not by panel
        if r.idle_curve:
            t, idle = zip(*r.idle_curve)
            ax_idle.plot(t, 100 * np.asarray(idle), label=r.name, lw=1.2, color=colour)
        if r.curve:
            t, acc = zip(*r.curve)
            ax_acc.plot(t, acc, label=r.name, marker=".", lw=1.2, color=colour)
    ax_idle.set(
        xlabel="wall time (s, from the run log)",
        ylabel="fastest worker idle (% of round)",
        title="idle time of the fastest worker",
        ylim=(0, 100),
    )
    ax_acc.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.3f}")
    ax_acc.set(
        xlabel="seconds of training (scoring not counted)",
        ylabel="held-out accuracy",
        title="accuracy over time",
    )
    for ax in (ax_idle, ax_acc):
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a full disk or an interrupt mid-write leaves the previous chart
    # (or none), never a truncated file under the chart's name.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, dpi=110, format=form)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path

"""Simulated HMDSPT rounds: validation against real 3-worker runs, then 8 to 4,096 workers.

1. **Validation**, on the OS-enforced testbed (``benchmarks/testbed.py``: one Dask worker
   per cgroup with a CPU quota of 1 / 0.5 / 0.25 core, the kernel enforcing it) and, the
   same way, on the in-code emulation (``hmdspt.parallel.cluster.local_cluster(speeds=(4, 2, 1))``,
   labelled *emulated*). Unless ``--log`` names existing run logs, every run of this
   benchmark makes, on each cluster, two FRESH real runs — one with proportional shares, one
   with equal shares, same data, same model, one round per epoch sized so that a
   proportional round carries about a second of compute — and writes their run logs to
   ``benchmarks/out/simulation/`` (not committed). Logs are never reused between runs.

   Each log is split in three: the rounds of the first ``--warmup-epochs`` epochs are
   left out (the first epoch of a run carries one-off costs — each worker builds the
   run's model, optimizer and buffers, the first round follows straight on the probe and
   the warm start — and, with HMDSPT's ramp, short rounds of a different size, so it does
   not stand for the steady state), the next ``--calib`` rounds calibrate the simulator
   (:func:`hmdspt.simulate.calibrate`: per-worker speed, per-worker and shared
   per-round jitter, scheduler overhead, merge rate) and the remaining rounds are
   predicted: :func:`hmdspt.simulate.simulate_run` replays the rows per worker of those
   rounds from the log (the partition the real scorer and policy chose) with the
   calibrated clock, over many seeds, and the mean predicted round time and per-worker
   idle fractions (``Σ idle_i / Σ round wall``, docs/design.md) are compared with the measured
   ones. The prediction runs forward in time: when the machine's other load changes
   between the calibration rounds and the predicted ones, that change is prediction
   error, so the CPU the machine's other processes used during each real run is printed
   beside it.

   **How a prediction is judged** (printed with the results): the round time by its
   relative error, within 15 %. An idle fraction measured at 10 % of the round or more by
   its relative error, within 15 %. Below 10 % a relative error is meaningless (a few
   milliseconds of noise in a one-second round can be a 100 % error), so those are judged
   in absolute terms: within 15 % of the round, i.e. 15 percentage points. Both errors
   are printed for every worker.
2. **Scaling** (simulated). Weak scaling (each worker holds ~1 s of compute at base
   speed) for 8, 64, 512 and 4,096 workers with log-normal speeds (sigma 0.5), speed
   drift, rare stragglers and per-round jitter: equal vs proportional shares, flat vs
   tree merge.
3. **Where the flat merge stops scaling** (simulated): a sweep over n of the driver's
   share of a round (broadcast + gather + merge), flat vs tree.

Plots (matplotlib, Agg) in ``benchmarks/out/``: ``simulation-validation.png``,
``simulation-scaling.png``, ``simulation-driver.png``.

Run from the repository root::

    python -m benchmarks.bench_simulation [--quick] [--cluster both|testbed|emulated]
        [--log RUN.jsonl ...] [--rounds 10]

The scaling and driver parts are simulations with costs measured on this machine
(docs/performance.md), not measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    EMULATED,
    TESTBED,
    add_cluster_arguments,
    busy_cpu_seconds,
    chosen_kinds,
    cluster,
    header,
    own_cpu_seconds,
    print_leftovers,
)
from benchmarks.report import pyplot, save_figure  # noqa: E402
from hmdspt.core.runlog import read_events  # noqa: E402
from hmdspt.simulate import (  # noqa: E402
    DEFAULT_PARAMS_BYTES,
    DEFAULT_ROWS_PER_S,
    Drift,
    Stragglers,
    calibrate,
    simulate_run,
)

OUT = Path(__file__).resolve().parent / "out"
RUN_DIR = OUT / "simulation"
SPEEDS = (4, 2, 1)
TESTBED_CORES = (1.0, 0.5, 0.25)  # SPEEDS as the testbed's CPU quotas
TOLERANCE = 0.15  # relative error allowed (round time; idle fractions >= IDLE_FLOOR)
IDLE_FLOOR = 0.10  # below this measured idle fraction, judge in absolute terms
IDLE_ABS = 0.15  # absolute error allowed there: 15 % of the round (percentage points)
LOAD_NOTE_CORES = 0.1  # say so when other processes' load moved more than this


# ---------------------------------------------------------------------------------------
# 1. validation
# ---------------------------------------------------------------------------------------
class _LoadSampler:
    """Samples, every ``period`` seconds, the CPU seconds of the whole machine and of this
    process tree (driver, scheduler, the cluster's nannies and workers), so that the load
    of the machine's other processes can be told per round afterwards."""

    def __init__(self, period: float = 0.2) -> None:
        import psutil

        me = psutil.Process()
        self.pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
        self.period = period
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.time(), busy_cpu_seconds(), own_cpu_seconds(self.pids)))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> _LoadSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"pids": self.pids, "samples": self.samples}))


def _other_cores(samples: np.ndarray, t0: float, t1: float) -> float:
    """Cores the machine's other processes used on average between unix times t0 and t1."""
    t, machine, own = samples.T
    if t1 <= t0 or t0 < t[0] or t1 > t[-1]:
        return float("nan")
    d_machine = np.interp(t1, t, machine) - np.interp(t0, t, machine)
    d_own = np.interp(t1, t, own) - np.interp(t0, t, own)
    return max(float(d_machine - d_own), 0.0) / (t1 - t0)


def real_runs(
    rows: int,
    features: int,
    hidden: tuple[int, ...],
    epochs: int,
    kind: str = EMULATED,
    period_ms: float = 100.0,
) -> tuple[list[Path], str]:
    """Two fresh runs (proportional, equal) on a 4:2:1 cluster; their logs and its label.

    ``kind`` is ``"testbed"`` (quotas 1 / 0.5 / 0.25 core) or ``"emulated"``. Beside each
    log ``<name>.load.json`` holds the CPU used by the whole machine and by this process
    tree (driver, scheduler, workers) during the fit: the load of the (shared) machine's
    other processes slows the workers unevenly and is the main reason a prediction misses.
    """
    from sklearn.datasets import make_classification
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.estimator import BPNNClassifier

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    X, y = make_classification(
        rows, features, n_informative=features // 2, n_classes=10, random_state=0
    )
    paths = []
    t0 = time.perf_counter()
    cores = TESTBED_CORES if kind == TESTBED else None
    with cluster(kind, SPEEDS, cores=cores, period_ms=period_ms) as (client, label, info):
        where = info.get("mapping") or info.get("emulation")
        print(f"real runs, {label}: {where}; {os.cpu_count()} cores")
        for part in ("proportional", "equal"):
            path = RUN_DIR / f"validation-{kind}-{part}.jsonl"
            path.unlink(missing_ok=True)  # the run log appends: start it afresh
            clf = BPNNClassifier(
                hidden,
                client=client,
                partition=part,
                max_iter=epochs,
                rounds_per_epoch=1,
                batch_size=256,
                random_state=0,
                tol=0.0,
                n_iter_no_change=epochs,  # no early stop: every run has `epochs` epochs
                run_log=str(path),
            )
            t = time.perf_counter()
            with _LoadSampler() as load, warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                clf.fit(X, y)
            load.save(_load_path(path))
            took = time.perf_counter() - t
            others = _other_cores(np.array(load.samples), load.samples[0][0], load.samples[-1][0])
            n_rounds = sum(e["event"] == "round" for e in read_events(path))
            print(
                f"  {part:12s} {epochs} epochs ({n_rounds} rounds) of {rows:,} rows x "
                f"{features} features, "
                f"MLP {features}-{'-'.join(map(str, hidden))}-10: fit {took:.1f} s; other "
                f"processes used {others:.2f} cores meanwhile -> {_rel(path)}"
            )
            paths.append(path)
        if kind == TESTBED and info["testbed"].other_groups():
            print(
                f"  NOT ALONE: other cpu groups busy: {', '.join(info['testbed'].other_groups())}"
            )
    print(f"  real runs took {time.perf_counter() - t0:.1f} s (cluster start included)")
    return paths, label


def _load_path(log: Path) -> Path:
    return Path(log).with_suffix(".load.json")


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_rounds(path: str | Path) -> dict:
    """Per-round, per-worker arrays of a run log's ``round`` events."""
    events = read_events(path)
    start = next(e for e in events if e["event"] == "run_start")
    rounds = sorted((e for e in events if e["event"] == "round"), key=lambda e: e["round"])
    if not rounds:
        raise ValueError(f"{path}: no round events")
    names = sorted(rounds[0]["workers"])
    arr = {
        k: np.array([[r["workers"][w][k] for w in names] for r in rounds], dtype=float)
        for k in ("rows", "busy_s", "comm_s", "idle_s")
    }
    arr["wall_s"] = np.array([r["wall_s"] for r in rounds])
    arr["time"] = np.array([r["time"] for r in rounds])
    arr["epoch"] = np.array([r.get("epoch", 0) for r in rounds])
    arr["merge_s"] = np.array([r["merge_s"] for r in rounds])
    arr["names"] = names
    arr["params_bytes"] = 4 * start["model"]["n_params"]
    arr["n_params"] = start["model"]["n_params"]
    arr["emulation"] = start["config"].get("emulation")
    arr["partition"] = start["config"].get("partition", "?")
    return arr


def _span(a: int, b: int) -> str:
    return f"round {a}" if a == b else f"rounds {a}-{b}"


def _judge_idle(meas: float, pred: float) -> tuple[str, bool]:
    if meas >= IDLE_FLOOR:
        return "relative", abs(pred - meas) / meas <= TOLERANCE
    return "absolute", abs(pred - meas) <= IDLE_ABS


def validate(
    path: str | Path,
    warmup_epochs: int,
    calib: int,
    seeds: int = 200,
    label: str | None = None,
) -> dict:
    """Leave out the first ``warmup_epochs`` epochs of a log, calibrate on the next
    ``calib`` rounds, predict the rest, judge. ``label`` names the cluster the log was
    made on (default: the emulation the log records, else "not emulated")."""
    m = load_rounds(path)
    n = len(m["names"])
    p = m["params_bytes"]
    rows, busy = m["rows"], m["busy_s"]
    n_rounds = len(m["wall_s"])
    warmup = int(np.count_nonzero(m["epoch"] <= warmup_epochs))
    if n_rounds < warmup + calib + 1:
        raise ValueError(
            f"{path}: {n_rounds} rounds; need more than the {warmup} of the first "
            f"{warmup_epochs} epoch(s) + calibration {calib}"
        )
    emu = m["emulation"] or {}
    if label is None:
        speeds_txt = ":".join(f"{s:g}" for s in emu.get("speeds", []))
        label = f"speeds {speeds_txt} emulated on one machine" if emu else "not emulated"
    print(f"\n### {m['partition']} shares ({label}): {_rel(Path(path))}")
    left_out = ""
    if warmup:
        epochs = "epoch 1" if warmup_epochs == 1 else f"epochs 1-{warmup_epochs}"
        left_out = f"{epochs} ({_span(1, warmup)}) left out as warm-up, "
    print(
        f"{n} workers, {label}; {n_rounds} rounds, "
        f"{int(rows[warmup].sum()):,} rows a round after the warm-up, {m['n_params']:,} "
        f"parameters. {left_out}calibrate on {_span(warmup + 1, warmup + calib)}, predict "
        f"{_span(warmup + calib + 1, n_rounds)} (rows per worker replayed from the log, "
        f"{seeds} seeds)"
    )
    c = slice(warmup, warmup + calib)
    cal = calibrate(rows[c], busy[c], m["comm_s"][c], m["merge_s"][c], p, merge="flat")
    net = cal.network
    print(
        "calibrated: speeds "
        + ", ".join(f"{w} {s:,.0f}" for w, s in zip(m["names"], cal.speeds))
        + f" rows/s; jitter per worker {cal.noise:.3f}, shared {cal.common_noise:.3f}; "
        f"task overhead {net.task_overhead_s * 1e3:.1f} ms; merge {net.merge_Bps / 1e9:.2f} GB/s"
    )

    v = slice(warmup + calib, n_rounds)
    load_file = _load_path(Path(path))
    load_shift = None
    if load_file.exists():
        samples = np.array(json.loads(load_file.read_text())["samples"], dtype=float)
        other = np.array([_other_cores(samples, t - w, t) for t, w in zip(m["time"], m["wall_s"])])
        print(
            f"other processes on the machine used {np.nanmean(other[c]):.2f} cores in the "
            f"calibration rounds, {np.nanmean(other[v]):.2f} in the predicted ones (most "
            f"in a round: {np.nanmax(other):.2f}; of {os.cpu_count()} cores)"
        )
        load_shift = (float(np.nanmean(other[c])), float(np.nanmean(other[v])))
    walls, idles = [], []
    for seed in range(seeds):
        sim = simulate_run(
            n,
            speeds=cal.speeds,
            partition="proportional",
            rounds=n_rounds - warmup - calib,
            params_bytes=p,
            network=net,
            noise=cal.noise,
            common_noise=cal.common_noise,
            rows_schedule=rows[v],
            seed=seed,
        )
        walls.append(sim.wall_s.mean())
        idles.append(sim.idle_fraction())
    walls, idles = np.array(walls), np.array(idles)
    pred_wall = float(walls.mean())
    pred_idle = idles.mean(axis=0)
    meas_wall = float(m["wall_s"][v].mean())
    meas_idle = m["idle_s"][v].sum(axis=0) / m["wall_s"][v].sum()
    lo_w, hi_w = np.percentile(walls, [5, 95])
    lo_i, hi_i = np.percentile(idles, [5, 95], axis=0)

    print(
        f"{'':14s} {'measured':>9s} {'predicted':>9s} {'sim 5-95 %':>15s} {'rel err':>8s} "
        f"{'abs err':>8s}  {'judged':>8s}  within 15 %"
    )
    wall_rel = (pred_wall - meas_wall) / meas_wall
    wall_ok = abs(wall_rel) <= TOLERANCE
    print(
        f"{'round s':14s} {meas_wall:9.3f} {pred_wall:9.3f} {lo_w:7.3f}-{hi_w:<7.3f} "
        f"{wall_rel:+8.1%} {'':>8s}  {'relative':>8s}  {'yes' if wall_ok else 'NO'}"
    )
    idle_ok = []
    rules = []
    for i in np.argsort(-cal.speeds):
        rule, ok = _judge_idle(float(meas_idle[i]), float(pred_idle[i]))
        idle_ok.append(ok)
        rules.append(rule)
        rel = (pred_idle[i] - meas_idle[i]) / meas_idle[i] if meas_idle[i] > 0 else float("nan")
        print(
            f"{'idle ' + m['names'][i]:14s} {meas_idle[i]:9.1%} {pred_idle[i]:9.1%} "
            f"{lo_i[i]:6.1%}-{hi_i[i]:<6.1%}  {rel:+8.1%} "
            f"{100 * (pred_idle[i] - meas_idle[i]):+6.1f}pp  {rule:>8s}  "
            f"{'yes' if ok else 'NO'}"
        )
    n_rel = rules.count("relative")
    print(
        f"verdict ({m['partition']}, {label}): round time within 15 %: "
        f"{'yes' if wall_ok else 'NO'} ({100 * wall_rel:+.1f} %); idle fractions within "
        f"15 %: {'yes' if all(idle_ok) else 'NO'} ({sum(idle_ok)}/{len(idle_ok)} workers; "
        f"{n_rel} judged by relative error, {len(rules) - n_rel} by absolute error as "
        f"measured below {100 * IDLE_FLOOR:.0f} %)"
    )
    if load_shift and abs(load_shift[1] - load_shift[0]) > LOAD_NOTE_CORES:
        print(
            f"note: the load of other processes changed from {load_shift[0]:.2f} cores in the "
            f"calibration rounds to {load_shift[1]:.2f} in the predicted ones: those ran on a "
            f"{'busier' if load_shift[1] > load_shift[0] else 'quieter'} machine than the "
            "one calibrated, which the prediction cannot know"
        )
    return {
        "partition": m["partition"],
        "label": label,
        "names": m["names"],
        "meas_wall": meas_wall,
        "pred_wall": pred_wall,
        "meas_idle": meas_idle,
        "pred_idle": pred_idle,
        "wall_ok": wall_ok,
        "idle_ok": all(idle_ok),
    }


def _judging_rule() -> None:
    tol, floor, ab = (f"{100 * x:.0f} %" for x in (TOLERANCE, IDLE_FLOOR, IDLE_ABS))
    print(
        f"Judging: a round time is within {tol} when |predicted - measured| / measured <= "
        f"{tol}. An idle fraction measured at {floor} of the round or more is judged the "
        f"same way (relative error). Below {floor} a relative error is meaningless (a few "
        "milliseconds of noise are a large part of a small fraction), so those are judged "
        f"in absolute terms: within {ab} of the round, i.e. |predicted - measured| <= "
        f"{100 * IDLE_ABS:.0f} percentage points."
    )


# ---------------------------------------------------------------------------------------
# 2. scaling
# ---------------------------------------------------------------------------------------
def scaling(rounds: int, p_straggle: float) -> list[dict]:
    print("\n## scaling (simulated; weak scaling, ~1 s of compute per worker at base speed)")
    print(
        f"log-normal speeds sigma 0.5, drift sigma 0.02/round, stragglers p={p_straggle} x3 for 3 "
        f"rounds, jitter 3 %, {DEFAULT_PARAMS_BYTES} B of parameters, "
        f"{rounds} rounds, default NetworkModel"
    )
    print(
        f"{'n':>5s} {'partition':>12s} {'merge':>5s} {'round s':>8s} {'fast idle':>9s} "
        f"{'effic.':>6s} {'bcast s':>8s} {'merge s':>8s} {'sim s':>6s}"
    )
    t4096 = 0.0
    records = []
    parts = ("proportional",) if p_straggle else ("equal", "proportional")
    for n in (8, 64, 512, 4096):
        for part in parts:
            for merge in ("flat", "tree"):
                res = simulate_run(
                    n,
                    speeds="lognormal",
                    partition=part,
                    merge=merge,
                    n_rows=int(n * DEFAULT_ROWS_PER_S),
                    rounds=rounds,
                    drift=Drift(),
                    stragglers=Stragglers(prob=p_straggle, factor=3.0, duration=3),
                    noise=0.03,
                    seed=1,
                )
                s = res.summary()
                records.append({"n": n, "partition": part, "merge": merge, **s})
                if n == 4096:
                    t4096 = max(t4096, res.elapsed_s)
                print(
                    f"{n:5d} {part:>12s} {merge:>5s} {s['mean_wall_s']:8.3f} "
                    f"{s['fastest_idle_fraction']:9.1%} {s['efficiency']:6.2f} "
                    f"{s['mean_broadcast_s']:8.3f} {s['mean_merge_s']:8.3f} "
                    f"{res.elapsed_s:6.2f}"
                )
    print(f"slowest 4,096-worker simulation ({rounds} rounds): {t4096:.1f} s (target < 60 s)")
    return records


# ---------------------------------------------------------------------------------------
# 3. where the flat merge stops scaling
# ---------------------------------------------------------------------------------------
def merge_limit() -> list[dict]:
    print("\n## driver share of a 1 s round (equal speeds; broadcast + gather + merge)")
    ns = [2**k for k in range(3, 13)]
    first = {}
    records = []
    print(f"{'n':>5s} {'flat s':>8s} {'flat %':>7s} {'tree s':>8s} {'tree %':>7s}")
    for n in ns:
        row = []
        for merge in ("flat", "tree"):
            res = simulate_run(
                n,
                speeds="equal",
                partition="equal",
                merge=merge,
                n_rows=int(n * DEFAULT_ROWS_PER_S),
                rounds=1,
            )
            over = float(res.wall_s[0] - res.busy_s[0].max())
            share = over / float(res.wall_s[0])
            if share > 0.10 and merge not in first:
                first[merge] = n
            row.append((over, share))
            records.append({"n": n, "merge": merge, "driver_s": over, "share": share})
        print(f"{n:5d} {row[0][0]:8.3f} {row[0][1]:7.1%} {row[1][0]:8.3f} {row[1][1]:7.1%}")
    print(
        f"driver share first above 10 %: flat at n = {first.get('flat', '> 4096')}, "
        f"tree at n = {first.get('tree', '> 4096')}"
    )
    f = simulate_run(
        4096,
        speeds="equal",
        partition="equal",
        merge="flat",
        n_rows=int(4096 * DEFAULT_ROWS_PER_S),
        rounds=1,
    )
    t = simulate_run(
        4096,
        speeds="equal",
        partition="equal",
        merge="tree",
        n_rows=int(4096 * DEFAULT_ROWS_PER_S),
        rounds=1,
    )
    print(
        f"at 4,096 workers tree reduction cuts the round from {f.wall_s[0]:.2f} s to "
        f"{t.wall_s[0]:.2f} s (efficiency {f.efficiency[0]:.2f} -> {t.efficiency[0]:.2f})"
    )
    return records


# ---------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------
def plot_validation(results: list[dict], path: Path) -> Path:
    """Measured vs predicted round time and per-worker idle fraction, one row per run."""
    plt = pyplot()
    fig, axes = plt.subplots(
        len(results),
        2,
        figsize=(10, 3.3 * len(results)),
        layout="constrained",
        squeeze=False,
        width_ratios=(1, 2.2),
    )
    for (ax_w, ax_i), r in zip(axes, results):
        bars = ax_w.bar([0, 1], [r["meas_wall"], r["pred_wall"]], color=["tab:blue", "tab:orange"])
        for b in bars:
            ax_w.annotate(
                f"{b.get_height():.2f}",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax_w.set_xticks([0, 1], ["measured", "predicted"])
        ax_w.set_ylabel("mean round time, s")
        rel = (r["pred_wall"] - r["meas_wall"]) / r["meas_wall"]
        where = "testbed" if r.get("label", "").startswith(TESTBED) else "emulated"
        ax_w.set_title(f"{where}, {r['partition']} shares: round time ({rel:+.0%})", fontsize=9)
        x = np.arange(len(r["names"]))
        for k, (label, vals, col) in enumerate(
            (
                ("measured", r["meas_idle"], "tab:blue"),
                ("predicted", r["pred_idle"], "tab:orange"),
            )
        ):
            bb = ax_i.bar(x - 0.2 + 0.4 * k, 100 * np.asarray(vals), 0.4, label=label, color=col)
            for b in bb:
                ax_i.annotate(
                    f"{b.get_height():.1f}",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
        ax_i.set_xticks(x, r["names"])
        ax_i.set_ylabel("idle, % of round time")
        ax_i.set_ylim(0, max(10.0, 115 * max(max(r["meas_idle"]), max(r["pred_idle"]))))
        ax_i.set_title(f"{where}, {r['partition']} shares: idle fraction per worker", fontsize=9)
        ax_i.legend(fontsize=8)
    fig.suptitle(
        "Simulator validation: 3 workers at 4:2:1 (testbed: OS-enforced CPU quotas 1 / 0.5 / "
        "0.25 core; emulated: duty cycle) measured vs simulated (predicted)",
        fontsize=10,
    )
    return save_figure(fig, path)


def plot_scaling(records: list[dict], path: Path) -> Path:
    """Fastest worker's idle fraction and parallel efficiency vs n (log x)."""
    plt = pyplot()
    fig, (ax_i, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    styles = {"equal": "--", "proportional": "-"}
    marks = {"flat": "o", "tree": "s"}
    for part in ("equal", "proportional"):
        for merge in ("flat", "tree"):
            rs = [r for r in records if r["partition"] == part and r["merge"] == merge]
            if not rs:
                continue
            ns = [r["n"] for r in rs]
            kw = dict(linestyle=styles[part], marker=marks[merge], label=f"{part}, {merge}")
            ax_i.plot(ns, [100 * r["fastest_idle_fraction"] for r in rs], **kw)
            ax_e.plot(ns, [r["efficiency"] for r in rs], **kw)
    ticks = sorted({r["n"] for r in records})
    for ax in (ax_i, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
        ax.minorticks_off()
        ax.set_xlabel("workers (simulated)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_i.set(ylabel="fastest worker idle, % of round time", ylim=(0, 100))
    ax_i.set_title("idle time of the fastest worker", fontsize=10)
    ax_e.set(ylabel="parallel efficiency", ylim=(0, 1.05))
    ax_e.set_title("parallel efficiency", fontsize=10)
    fig.suptitle(
        "Weak scaling, simulated: log-normal speeds (sigma 0.5), drift, 3 % jitter, "
        "~1 s of compute per worker",
        fontsize=10,
    )
    return save_figure(fig, path)


def plot_driver(records: list[dict], path: Path) -> Path:
    """The driver's share of a round vs n, flat vs tree merge."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for merge, mk in (("flat", "o"), ("tree", "s")):
        rs = [r for r in records if r["merge"] == merge]
        ax.plot(
            [r["n"] for r in rs], [100 * r["share"] for r in rs], marker=mk, label=f"{merge} merge"
        )
    ax.axhline(10, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["n"] for r in records})
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
    ax.minorticks_off()
    ax.set(xlabel="workers (simulated)", ylabel="broadcast + gather + merge, % of round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "Driver share of a 1 s round, simulated (equal speeds, default network model)",
        fontsize=10,
    )
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--log",
        nargs="+",
        metavar="PATH",
        help="validate these existing run logs (.jsonl) of real runs instead of making two "
        "fresh ones per cluster in benchmarks/out/simulation/",
    )
    ap.add_argument("--quick", action="store_true", help="fresh runs of 45,000 rows and 8 epochs")
    add_cluster_arguments(ap)
    ap.add_argument("--rows", type=int, default=None, help="rows of the fresh real runs")
    ap.add_argument("--features", type=int, default=100, help="features of the fresh runs")
    ap.add_argument(
        "--hidden",
        default="512,256",
        help="hidden layer sizes of the fresh runs (comma separated)",
    )
    ap.add_argument(
        "--epochs", type=int, default=None, help="epochs (one round each) of each fresh run"
    )
    ap.add_argument(
        "--warmup-epochs",
        type=int,
        default=1,
        help="epochs whose rounds are left out before the calibration rounds",
    )
    ap.add_argument("--calib", type=int, default=4, help="rounds used to calibrate")
    ap.add_argument(
        "--stragglers",
        type=float,
        default=0.002,
        help="per-worker per-round straggler chance of the straggler table",
    )
    ap.add_argument("--rounds", type=int, default=10, help="rounds per scaling run")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG")
    args = ap.parse_args(argv)
    args.rows = args.rows or (45_000 if args.quick else 135_000)
    args.epochs = args.epochs or (8 if args.quick else 12)
    t0 = time.perf_counter()

    header("simulator: validation against the testbed and the emulation, then simulated scaling")
    _judging_rule()
    results = []
    if args.log:
        print("\n## validation of existing run logs (predictions simulated)")
        logs = [Path(p) for p in args.log]
        print(f"validating existing logs: {', '.join(map(str, logs))}")
        results = [validate(log, args.warmup_epochs, args.calib) for log in logs]
    else:
        hidden = tuple(int(h) for h in args.hidden.split(","))
        for kind in chosen_kinds(args.cluster):
            where = (
                "the testbed: OS-enforced CPU quotas"
                if kind == TESTBED
                else "heterogeneity emulated on one machine"
            )
            print(
                f"\n## validation against {kind} runs (real runs on {where}; predictions simulated)"
            )
            logs, label = real_runs(
                args.rows, args.features, hidden, args.epochs, kind, args.period_ms
            )
            results += [validate(log, args.warmup_epochs, args.calib, label=label) for log in logs]
        print_leftovers()
    labels = list(dict.fromkeys(r["label"] for r in results))
    print()
    for label in labels:
        ok = [r["wall_ok"] and r["idle_ok"] for r in results if r["label"] == label]
        print(
            f"validation, {label}: {sum(ok)}/{len(ok)} runs with round time and idle "
            "fractions within 15 % (rule above)"
        )

    scale = scaling(args.rounds, 0.0)
    scaling(args.rounds, args.stragglers)
    driver = merge_limit()
    if not args.no_plots:
        written = [
            plot_validation(results, OUT / "simulation-validation.png"),
            plot_scaling(scale, OUT / "simulation-scaling.png"),
            plot_driver(driver, OUT / "simulation-driver.png"),
        ]
        print("\nplots: " + ", ".join(_rel(p) for p in written))
    print(f"\nbenchmark total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

"""Simulated HMDSPT rounds: validation against a real 3-worker run, then 8 to 4,096 workers.

1. **Validation.** Reads the run log (JSON lines) of a real 3-worker emulated run, e.g.::

       python -m pipeline.cli train --speeds 4,2,1 --epochs 4 --rounds-per-epoch 2 \\
           --run-dir /tmp/simval

   (made by this script if ``--log`` is not given and ``/tmp/simval`` holds no log).
   The first ``--calib`` rounds calibrate the simulator: per-worker speed
   ``Σ rows / Σ busy_s``, per-round jitter (spread of ``rows / busy_s``), the scheduler
   overhead (measured minus simulated ``comm_s``) and the merge rate. The remaining rounds
   are predicted with the same rows per worker (replayed from the log), averaged over 50
   seeds, and compared with the measured mean round time and per-worker idle fractions.
2. **Scaling.** Weak scaling (each worker holds ~1 s of compute at base speed) for 8, 64,
   512 and 4,096 workers with log-normal speeds (sigma 0.5), speed drift, rare stragglers
   and per-round jitter: equal vs proportional shares, flat vs tree merge.
3. **Where the flat merge stops scaling**: a sweep over n of the driver's share of a
   round (broadcast + gather + merge), flat vs tree.

Run from the repository root::

    python benchmarks/bench_simulation.py [--log RUN.jsonl] [--rounds 10]

The validation run is heterogeneity emulated on one (shared) machine; the scaling part is
a simulation with DESIGN.md's measured costs, not a measurement.
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.runlog import read_events  # noqa: E402
from pipeline.simulate import (  # noqa: E402
    DEFAULT_PARAMS_BYTES,
    DEFAULT_ROWS_PER_S,
    Drift,
    NetworkModel,
    Stragglers,
    simulate_run,
)


# ---------------------------------------------------------------------------------------
# 1. validation
# ---------------------------------------------------------------------------------------
def _find_log(run_dir: str, part: str) -> str:
    logs = sorted(glob.glob(f"{run_dir}/*.jsonl"))
    if not logs:
        cmd = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "train",
            "--speeds",
            "4,2,1",
            "--epochs",
            "4",
            "--rounds-per-epoch",
            "2",
            "--partition",
            part,
            "--run-dir",
            run_dir,
        ]
        print("making the real run:", " ".join(cmd))
        subprocess.run(cmd, check=True, capture_output=True)
        logs = sorted(glob.glob(f"{run_dir}/*.jsonl"))
    return logs[-1]


def load_rounds(path: str) -> dict:
    """Per-round, per-worker arrays of a run log's ``round`` events."""
    events = read_events(path)
    start = next(e for e in events if e["event"] == "run_start")
    rounds = sorted((e for e in events if e["event"] == "round"), key=lambda e: e["round"])
    names = sorted(rounds[0]["workers"])
    arr = {
        k: np.array([[r["workers"][w][k] for w in names] for r in rounds], dtype=float)
        for k in ("rows", "busy_s", "comm_s", "idle_s")
    }
    arr["wall_s"] = np.array([r["wall_s"] for r in rounds])
    arr["merge_s"] = np.array([r["merge_s"] for r in rounds])
    arr["names"] = names
    arr["params_bytes"] = 4 * start["model"]["n_params"]
    arr["emulation"] = start["config"].get("emulation")
    return arr


def validate(path: str, calib: int, seeds: int = 50) -> None:
    m = load_rounds(path)
    n = len(m["names"])
    p = m["params_bytes"]
    rows, busy = m["rows"], m["busy_s"]
    n_rounds = len(m["wall_s"])
    print(f"## validation: {path}")
    print(
        f"emulated speeds {m['emulation']}, {n} workers, {n_rounds} rounds, "
        f"{p} bytes of parameters; calibrate on rounds 1-{calib}, predict {calib + 1}-"
        f"{n_rounds}"
    )
    c = slice(0, calib)
    speeds = rows[c].sum(axis=0) / busy[c].sum(axis=0)
    jitter = float(np.std(np.log(rows[c] / busy[c] / speeds)))
    base = NetworkModel(task_overhead_s=0.0, merge_Bps=n * p / float(m["merge_s"][c].mean()))
    sim0 = simulate_run(
        n,
        speeds=speeds,
        partition="proportional",
        rounds=calib,
        params_bytes=p,
        network=base,
        rows_schedule=rows[c],
    )
    overhead = max(float(m["comm_s"][c].mean() - sim0.comm_s.mean()), 0.0)
    net = NetworkModel(task_overhead_s=overhead, merge_Bps=base.merge_Bps)
    print(
        "calibrated: speeds "
        + ", ".join(f"{w} {s:,.0f}" for w, s in zip(m["names"], speeds))
        + f" rows/s; jitter {jitter:.3f}; task overhead {overhead * 1e3:.1f} ms; "
        f"merge {net.merge_Bps / 1e9:.2f} GB/s"
    )

    v = slice(calib, n_rounds)
    walls, idles = [], []
    for seed in range(seeds):
        sim = simulate_run(
            n,
            speeds=speeds,
            partition="proportional",
            rounds=n_rounds - calib,
            params_bytes=p,
            network=net,
            noise=jitter,
            rows_schedule=rows[v],
            seed=seed,
        )
        walls.append(sim.wall_s.mean())
        idles.append(sim.idle_fraction())
    pred_wall = float(np.mean(walls))
    pred_idle = np.mean(idles, axis=0)
    meas_wall = float(m["wall_s"][v].mean())
    meas_idle = m["idle_s"][v].sum(axis=0) / m["wall_s"][v].sum()
    print(f"{'':10s} {'measured':>10s} {'predicted':>10s} {'rel err':>8s} {'abs err':>8s}")
    print(
        f"{'round s':10s} {meas_wall:10.4f} {pred_wall:10.4f} "
        f"{(pred_wall - meas_wall) / meas_wall:+8.1%}"
    )
    order = np.argsort(-speeds)
    for i in order:
        rel = (pred_idle[i] - meas_idle[i]) / meas_idle[i] if meas_idle[i] else float("nan")
        print(
            f"{'idle ' + m['names'][i]:10s} {meas_idle[i]:10.1%} {pred_idle[i]:10.1%} "
            f"{rel:+8.1%} {100 * (pred_idle[i] - meas_idle[i]):+7.1f}pp"
        )
    # the same cluster with equal shares (no measurement to compare: a prediction)
    eq = simulate_run(
        n,
        speeds=speeds,
        partition="equal",
        n_rows=int(rows[0].sum()),
        rounds=20,
        params_bytes=p,
        network=net,
        noise=jitter,
    )
    s = eq.summary()
    print(
        f"predicted for equal shares on it: fastest idle {s['fastest_idle_fraction']:.1%}, "
        f"efficiency {s['efficiency']:.2f} (DESIGN prototype: ~72 %, ~0.46)"
    )


# ---------------------------------------------------------------------------------------
# 2. scaling
# ---------------------------------------------------------------------------------------
def scaling(rounds: int, p_straggle: float) -> None:
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
                if n == 4096:
                    t4096 = max(t4096, res.elapsed_s)
                print(
                    f"{n:5d} {part:>12s} {merge:>5s} {s['mean_wall_s']:8.3f} "
                    f"{s['fastest_idle_fraction']:9.1%} {s['efficiency']:6.2f} "
                    f"{s['mean_broadcast_s']:8.3f} {s['mean_merge_s']:8.3f} "
                    f"{res.elapsed_s:6.2f}"
                )
    print(f"slowest 4,096-worker simulation ({rounds} rounds): {t4096:.1f} s (target < 60 s)")


# ---------------------------------------------------------------------------------------
# 3. where the flat merge stops scaling
# ---------------------------------------------------------------------------------------
def merge_limit() -> None:
    print("\n## driver share of a 1 s round (equal speeds; broadcast + gather + merge)")
    ns = [2**k for k in range(3, 13)]
    first = {}
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--log",
        nargs="*",
        help="run logs (.jsonl) of real 3-worker emulated "
        "runs (default: a proportional one in /tmp/simval, an equal one in "
        "/tmp/simval_equal)",
    )
    ap.add_argument(
        "--stragglers",
        type=float,
        default=0.002,
        help="per-worker per-round straggler chance of the straggler table",
    )
    ap.add_argument("--calib", type=int, default=2, help="rounds used to calibrate")
    ap.add_argument("--rounds", type=int, default=10, help="rounds per scaling run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    logs = args.log or [
        _find_log("/tmp/simval", "proportional"),
        _find_log("/tmp/simval_equal", "equal"),
    ]
    for log in logs:
        validate(log, args.calib)
    scaling(args.rounds, 0.0)
    scaling(args.rounds, args.stragglers)
    merge_limit()
    print(f"\nbenchmark total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

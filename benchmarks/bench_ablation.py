"""Ablation: HMDSPT with each mechanism switched off in turn, same cluster and data.

On ``local_cluster(speeds=(4, 2, 1))`` (heterogeneity EMULATED on one machine), KDD Cup 99
(5 categories): the full method, then without proportional partitioning (equal shares),
without the step-normalised merge (plain row-weighted average), without block momentum,
without the warm start, and with top-k 10 % compression added. Prints time to the target
accuracy (full method's final accuracy minus 1 point) and final accuracy for each; a
mechanism that does not help is reported as such. Run: ``python -m benchmarks.bench_ablation``.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
from distributed import Client
from sklearn.exceptions import ConvergenceWarning

from pipeline.cluster import local_cluster
from pipeline.nn import MLP
from pipeline.runlog import read_events, summarize
from pipeline.trainer import Trainer, TrainerConfig

from ._common import header
from .bench_training import load_kdd

VARIANTS = {
    "full HMDSPT": {},
    "- proportional partitioning": {"partition": "equal"},
    "- step-normalised merge": {"normalize_steps": False},
    "- block momentum": {"block_momentum": 0.0},
    "- warm start": {"warm_start_rows": 0},
    "+ top-k 10 % compression": {"compression": "topk"},
}


def run(client, data, overrides: dict, epochs: int, run_dir: Path, seed: int = 0) -> dict:
    X, y, X_test, y_test = data
    n_classes = int(y.max()) + 1
    Y = np.eye(n_classes, dtype=np.float32)[y]
    sample = np.random.default_rng(0).permutation(len(y_test))[:20_000]
    Xs, ys = X_test[sample], y_test[sample]
    model = MLP((X.shape[1], 64, 32, n_classes), alpha=1e-4)
    model.initialize(np.random.RandomState(seed))
    config = TrainerConfig(rounds_per_epoch=2, seed=seed, run_log=str(run_dir), **overrides)
    trainer = Trainer(client, model, dict(solver="adam", learning_rate_init=0.001), 256, config)

    def evaluate() -> float:
        return float((model.forward(Xs).argmax(1) == ys).mean())

    trainer.fit(X, Y, max_epochs=epochs, evaluate=evaluate)
    events = read_events(trainer.run_log_path)
    start = events[0]["time"]
    curve = [
        (e["time"] - start, e["val_score"])
        for e in events
        if e["event"] == "round" and e["val_score"] is not None
    ]
    s = summarize(events)
    return {
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
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("ablation on KDD Cup 99, local_cluster(4,2,1), heterogeneity emulated")
    data = load_kdd()
    results = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_cluster(speeds=(4, 2, 1)) as cluster,
        Client(cluster) as client,
    ):
        for name, overrides in VARIANTS.items():
            results[name] = run(client, data, overrides, args.epochs, Path(tmp))
    target = results["full HMDSPT"]["final"] - 0.01
    print(f"target accuracy {target:.4f} (full method's final accuracy - 1 point)")
    print(
        f"{'variant':30s} {'s to target':>12s} {'final acc':>10s} {'fastest idle %':>15s} "
        f"{'efficiency':>11s} {'bytes/worker/round':>19s}"
    )
    full_t = next((t for t, a in results["full HMDSPT"]["curve"] if a >= target), None)
    for name, r in results.items():
        t = next((t for t, a in r["curve"] if a >= target), None)
        verdict = ""
        if name.startswith("-") and full_t is not None:
            if (
                t is None
                or t > 1.05 * full_t
                or r["final"] < results["full HMDSPT"]["final"] - 0.005
            ):
                verdict = "  (the mechanism helps)"
            else:
                verdict = "  (no measurable contribution here)"
        print(
            f"{name:30s} {(f'{t:.1f}' if t is not None else 'never'):>12s} "
            f"{r['final']:10.4f} {100 * r['idle']:15.1f} {r['efficiency']:11.2f} "
            f"{r['bytes']:19,.0f}{verdict}"
        )
    return results


if __name__ == "__main__":
    main()

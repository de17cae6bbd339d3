"""Communication at link rates of 10 Gbit/s, 1 Gbit/s and 100 Mbit/s: bytes and time per round.

On the testbed (``benchmarks/testbed.py``) every worker sits in its own network namespace
behind a bridge, its link shaped by a ``tc tbf`` token bucket in both directions, and in a
cgroup whose CPU quota the kernel enforces (1 / 0.5 / 0.25 core, the issue's 4:2:1). For each
link rate the same fit runs with each way of exchanging the model:

- ``dense``, ``float16``, ``top-k`` (10 % with error feedback): HMDSPT's delta merge,
  proportional shares, ``rounds_per_epoch`` rounds an epoch;
- ``bsp``: bulk-synchronous SGD (a dense gradient from every worker after every global
  mini-batch, equal shares), time-boxed: its rounds are many and short.

Per method: rounds, bytes a worker sends per round (its payload) and receives (the dense
model), mean round wall time, the driver-side communication time per worker per round
(``comm_s`` of the run log: sending w_t and receiving the payload), the fit's wall time
from the ``fit()`` call (staging over the shaped link and the speed probe included) and the
test accuracy. The same table follows for the in-code emulation (``local_cluster(4, 2, 1)``
over the loopback, links not shaped), labelled *emulated*.

Data: the embedded default data set of ``hmdspt train`` (160,000 x 40 training rows, 10
classes); MLP (128, 64), Adam, batch 256. Each cluster gets an untimed warm-up fit first.
Run: ``python -m benchmarks.bench_comm [--quick] [--rates 10000,1000,100]``. Needs root for
the testbed (without it only the emulated table is printed).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from hmdspt.cli import load_default_dataset
from hmdspt.core.runlog import read_events
from hmdspt.estimator import BPNNClassifier

from ._common import (
    TESTBED,
    add_cluster_arguments,
    chosen_kinds,
    cluster,
    header,
    mapping_text,
    print_leftovers,
)

SPEEDS = (4, 2, 1)
CORES = (1.0, 0.5, 0.25)
RATES_MBIT = (10_000.0, 1_000.0, 100.0)
# name -> the estimator's exchange settings
METHODS = {
    "dense": {"compression": "none"},
    "float16": {"compression": "float16"},
    "top-k": {"compression": "topk"},
    "bsp": {"sync": "bsp", "partition": "equal"},
}


def round_figures(log: Path) -> dict:
    """Per-round means of a run log: rounds, bytes out/in per worker, wall, comm."""
    rounds = [e for e in read_events(log) if e["event"] == "round"]
    workers = [w for e in rounds for w in e["workers"].values()]

    def mean(values) -> float | None:
        values = [v for v in values if v is not None]
        return float(np.mean(values)) if values else None

    return {
        "rounds": len(rounds),
        "bytes_out": mean(w.get("bytes_out") for w in workers),
        "bytes_in": mean(w.get("bytes_in") for w in workers),
        "round_s": mean(e["wall_s"] for e in rounds),
        "comm_s": mean(w.get("comm_s") for w in workers),
    }


def measure(client, data, params: dict, bsp_seconds: float, run_dir: Path) -> list[dict]:
    """Every method's fit on ``client``: its round figures, fit wall and test accuracy."""
    X, y, X_test, y_test = data
    # Untimed: a fresh cluster's first fit pays one-off costs (imports, first transfers).
    BPNNClassifier(client=client, **dict(params, max_iter=1)).fit(X[:20_000], y[:20_000])
    rows = []
    for method, settings in METHODS.items():
        log = run_dir / f"{method}.jsonl"
        log.unlink(missing_ok=True)
        extra = {"max_seconds": bsp_seconds} if method == "bsp" else {}
        clf = BPNNClassifier(client=client, run_log=log, **params, **settings, **extra)
        start = time.perf_counter()
        clf.fit(X, y)
        fit_wall = time.perf_counter() - start
        rows.append(
            {
                "method": method,
                **round_figures(log),
                "fit_s": fit_wall,
                "epochs": clf.n_iter_,
                "accuracy": clf.score(X_test, y_test),
                "dense_bytes": int(clf._model.params.nbytes),
            }
        )
    return rows


def _int(v) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _sec(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def print_table(rows: list[dict], link_mbit: float | None) -> None:
    dense = rows[0]["dense_bytes"]
    wire = (
        f"; the dense model takes {dense * 8 / (link_mbit * 1e6) * 1e3:.2f} ms on the link"
        if link_mbit
        else ""
    )
    print(f"dense model {dense:,} B{wire}")
    print(
        f"{'method':>8s} {'epochs':>6s} {'rounds':>6s} {'B out/worker/round':>19s} "
        f"{'x dense':>7s} {'B in/worker/round':>18s} {'round wall s':>12s} "
        f"{'comm s/round':>12s} {'fit wall s':>10s} {'test acc':>8s}"
    )
    for r in rows:
        ratio = "n/a" if r["bytes_out"] is None else f"{r['bytes_out'] / dense:.3f}"
        print(
            f"{r['method']:>8s} {r['epochs']:6d} {r['rounds']:6d} {_int(r['bytes_out']):>19s} "
            f"{ratio:>7s} {_int(r['bytes_in']):>18s} {_sec(r['round_s']):>12s} "
            f"{_sec(r['comm_s']):>12s} {r['fit_s']:10.2f} {r['accuracy']:8.4f}"
        )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", default=",".join(f"{r:g}" for r in RATES_MBIT), help="link rates, Mbit/s"
    )
    parser.add_argument("--hidden", default="128,64", help="hidden layer sizes")
    parser.add_argument("--epochs", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--rounds-per-epoch", type=int, default=4)
    parser.add_argument("--bsp-seconds", type=float, default=None, help="default 10 (quick 3)")
    parser.add_argument("--quick", action="store_true", help="40,000 rows, 1 epoch, 100 Mbit/s")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    if args.quick and args.rates == parser.get_default("rates"):
        rates = [100.0]
    epochs = args.epochs or (1 if args.quick else 3)
    bsp_seconds = args.bsp_seconds or (3.0 if args.quick else 10.0)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    warnings.simplefilter("ignore", ConvergenceWarning)
    header("communication per round at shaped link rates: testbed, then emulated")
    X, X_test, y, y_test = load_default_dataset()
    if args.quick:
        X, y = X[:40_000], y[:40_000]
    data = (X, y, X_test, y_test)
    params = dict(
        hidden_layer_sizes=hidden,
        max_iter=epochs,
        batch_size=256,
        rounds_per_epoch=args.rounds_per_epoch,
        random_state=0,
        tol=0.0,
        n_iter_no_change=epochs,  # no early stop: every method trains the same epochs
    )
    print(
        f"data: embedded default ({len(X):,} train / {len(X_test):,} test rows x {X.shape[1]}, "
        f"10 classes); MLP {hidden}, Adam, batch 256, {epochs} epoch(s) of "
        f"{args.rounds_per_epoch} rounds after the ramp rounds; bsp: time box {bsp_seconds:g} s"
        " of training, equal shares"
    )
    print(
        "B out: a worker's payload per round (delta, compressed; bsp: its gradient); B in: "
        "the dense model it receives; comm s: the driver-side time per worker per round to "
        "send w_t and receive the payload; fit wall: from the fit() call to its return"
    )
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in chosen_kinds(args.cluster, link=True):
            for rate in rates if kind == TESTBED else [None]:
                with cluster(
                    kind, SPEEDS, cores=CORES, period_ms=args.period_ms, link_mbit=rate
                ) as (client, label, info):
                    print(f"\n## {label}")
                    if kind == TESTBED:
                        tb = info["testbed"]
                        print(mapping_text(SPEEDS, CORES))
                        link = tb.measure_link(0, megabytes=min(rate * 0.5 / 8, 64.0))
                        print(
                            f"link measured over TCP: driver -> {link['slot']} "
                            f"{link['to_slot_mbit']:.0f} Mbit/s, back "
                            f"{link['from_slot_mbit']:.0f} Mbit/s ({link['megabytes']:g} MB)"
                        )
                    else:
                        print(f"{info['emulation']}; loopback, links not shaped")
                    run_dir = Path(tmp) / f"{kind}-{rate}"
                    run_dir.mkdir()
                    rows = measure(client, data, params, bsp_seconds, run_dir)
                    print_table(rows, rate)
                    if kind == TESTBED and tb.other_groups():
                        print(f"NOT ALONE: other cpu groups busy: {', '.join(tb.other_groups())}")
                    results[label] = rows
    print_leftovers()
    return results


if __name__ == "__main__":
    main()

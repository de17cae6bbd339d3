"""Is a worker's loop inside the rounds as fast as the same loop alone? (issue 17, point 6)

On the testbed (OS-enforced CPU quotas, ``benchmarks/testbed.py``; needs root), one HMDSPT
fit of the embedded default (MLP and batch as ``python -m benchmarks peers``), then the same
loop again on the same Dask workers without the rest of the fit: the worker's own
:func:`hmdspt.parallel.worker.round_task` over a shard of the size the fit gave it, in the
fit's rounds per epoch, two epochs, with nothing between the rounds but the task round trip.

- **in the fit**: each worker's ``rows / busy_s`` over the regular rounds of epochs 2 on
  (the run log; ``busy_s`` is measured inside the round task, as here);
- **alone**: one worker runs the loop while the others wait;
- **together**: every worker runs its loop at once (the slots' contention, no rounds);
- **alone, cache-sized**: the same loop over 16,384 rows, the testbed ceiling's loop, whose
  rows stay in the cache (the "same loop alone" the issue compared with).

The ratios in-the-fit / alone and in-the-fit / together say whether the rounds cost the
loop speed beyond what sharing the machine costs. Nothing is asserted.

Run from the repository root as root::

    python -m benchmarks loop   (or python -m benchmarks.bench_loop [--mixes ...])
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from benchmarks import testbed
from benchmarks.bench_peers import BATCH, HIDDEN, LEARNING_RATE

#: rows of the testbed ceiling's loop (``benchmarks.testbed._train_step``)
CACHE_ROWS = 16_384


def loop_speed(
    n_rows: int, layer_sizes: tuple[int, ...], rounds_per_epoch: int, epochs: int = 2, seed: int = 0
) -> dict:
    """On a worker: ``round_task`` over a synthetic shard of ``n_rows`` rows, round after
    round; rows and busy seconds summed over the rounds (the first epoch's first round,
    which builds the run state, is left out)."""
    from hmdspt.core.nn import MLP
    from hmdspt.core.shard import Shard
    from hmdspt.parallel.worker import RoundSpec, drop_run_state, round_task

    rng = np.random.default_rng(seed)
    n_in, n_out = layer_sizes[0], layer_sizes[-1]
    shard = Shard(
        X=rng.standard_normal((n_rows, n_in), dtype=np.float32),
        y=np.eye(n_out, dtype=np.float32)[rng.integers(0, n_out, n_rows)],
        row_ids=np.arange(n_rows, dtype=np.int64),
    )
    model = MLP(layer_sizes)
    model.initialize(np.random.RandomState(seed))
    params = model.params.copy()
    run_id = f"bench-loop-{uuid.uuid4().hex[:8]}"
    rows = busy = 0.0
    round_index = 0
    try:
        for _ in range(epochs):
            for left in range(rounds_per_epoch, 0, -1):
                spec = RoundSpec(
                    run_id=run_id,
                    layer_sizes=tuple(layer_sizes),
                    hidden_activation="relu",
                    out_activation="softmax",
                    alpha=0.0001,
                    dtype="float32",
                    optimizer={"solver": "adam", "learning_rate_init": LEARNING_RATE},
                    batch_size=BATCH,
                    mode="delta",
                    new_epoch=left == rounds_per_epoch,
                    rounds_left=left,
                    learning_rate=LEARNING_RATE,
                    seed=seed,
                    round=round_index,
                    quiet_workers=True,  # as a fit's rounds run by default
                )
                result = round_task(shard, params, spec)
                if round_index:
                    rows += result["rows"]
                    busy += result["busy_s"]
                round_index += 1
    finally:
        from distributed import get_worker

        drop_run_state(run_id, get_worker())
    return {"rows": rows, "busy_s": busy, "speed": rows / busy if busy else float("nan")}


def fit_speeds(client, epochs: int, work: Path) -> tuple[dict, dict, int]:
    """One fit of the embedded default: per worker its rows in the last round's shares,
    its speed over the regular rounds of epochs >= 2, and the rounds per epoch."""
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.cli import load_default_dataset
    from hmdspt.core.runlog import read_events
    from hmdspt.estimator import BPNNClassifier

    X, _, y, _ = load_default_dataset()
    log = work / f"fit-{time.monotonic_ns()}.jsonl"
    clf = BPNNClassifier(
        hidden_layer_sizes=HIDDEN,
        batch_size=BATCH,
        learning_rate_init=LEARNING_RATE,
        max_iter=epochs,
        random_state=0,
        client=client,
        run_log=log,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    rounds = [e for e in read_events(log) if e["event"] == "round" and e["epoch"] >= 2]
    rows: dict[str, float] = {}
    busy: dict[str, float] = {}
    for event in rounds:
        for name, w in event["workers"].items():
            rows[name] = rows.get(name, 0.0) + w["rows"]
            busy[name] = busy.get(name, 0.0) + w["busy_s"]
    shares = {n: int(v["rows"]) for n, v in clf.training_report_.items()}
    per_epoch = round(len(rounds) / max(epochs - 1, 1))
    return shares, {n: rows[n] / busy[n] for n in rows if busy[n]}, per_epoch


def measure(
    cores: tuple[float, ...], period_ms: float, epochs: int, repeats: int, pin: bool = False
) -> None:
    """One testbed of ``cores`` at ``period_ms``: ``repeats`` fits and their loops; a table
    (``pin``: each slot on CPUs of its own, :func:`benchmarks.testbed.pin_slots`)."""
    from distributed import Client

    layer_sizes = (40, *HIDDEN, 10)
    mix = "/".join(f"{c:g}" for c in cores)
    print(f"\n### {mix} core, CFS period {period_ms:g} ms{', pinned' if pin else ''}")
    table: dict[str, dict[str, list[float]]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        testbed.Testbed(cores, period_ms=period_ms, prefix="hmdspt-bench-loop", pin=pin) as tb,
        Client(tb.start_dask(nthreads=1)) as client,
    ):
        by_name = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        for repeat in range(repeats):
            shares, in_fit, rpe = fit_speeds(client, epochs, Path(tmp))

            def run(name: str, n_rows: int, rpe: int = rpe) -> object:
                return client.submit(
                    loop_speed,
                    n_rows,
                    layer_sizes,
                    rpe,
                    workers=[by_name[name]],
                    allow_other_workers=False,
                    pure=False,
                )

            alone = {n: run(n, shares[n]).result()["speed"] for n in shares}
            futures = {n: run(n, shares[n]) for n in shares}
            together = {n: f.result()["speed"] for n, f in futures.items()}
            cached = {n: run(n, CACHE_ROWS).result()["speed"] for n in shares}
            for name in sorted(shares):
                row = table.setdefault(name, {})
                for key, value in (
                    ("rows", shares[name]),
                    ("fit", in_fit[name]),
                    ("alone", alone[name]),
                    ("together", together[name]),
                    ("cached", cached[name]),
                ):
                    row.setdefault(key, []).append(value)
            print(f"fit {repeat + 1}: {rpe} rounds per epoch")
    print(
        f"{'worker':10} {'rows':>8} {'in fit':>9} {'alone':>9} {'together':>9} "
        f"{'cache-sized':>11} {'fit/alone':>9} {'fit/together':>12}"
    )
    for name in sorted(table):
        med = {k: statistics.median(v) for k, v in table[name].items()}
        print(
            f"{name:10} {med['rows']:8.0f} {med['fit']:9.0f} {med['alone']:9.0f} "
            f"{med['together']:9.0f} {med['cached']:11.0f} {med['fit'] / med['alone']:9.2f} "
            f"{med['fit'] / med['together']:12.2f}"
        )
    print(f"(medians over {repeats} fits; rows/s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mixes",
        default="1;1,0.25;1,0.5,0.25",
        help="quota per slot of each testbed, ';' between testbeds",
    )
    parser.add_argument("--periods", default="100,10", help="CFS periods in ms")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of each fit")
    parser.add_argument("--repeats", type=int, default=2, help="fits per testbed")
    parser.add_argument(
        "--pin", action="store_true", help="each slot on CPUs of its own (as separate machines)"
    )
    args = parser.parse_args(argv)
    reason = testbed.unavailable_reason()
    if reason:
        raise SystemExit(f"bench_loop: {reason}")
    print(
        f"Testbed (OS-enforced CPU quotas); embedded default, MLP {HIDDEN}, batch {BATCH}, "
        f"{args.epochs} epochs; rows/s from the busy seconds measured inside round_task."
    )
    for period in (float(p) for p in args.periods.split(",")):
        for mix in args.mixes.split(";"):
            cores = tuple(float(c) for c in mix.split(","))
            measure(cores, period, args.epochs, args.repeats, pin=args.pin)


if __name__ == "__main__":
    main()

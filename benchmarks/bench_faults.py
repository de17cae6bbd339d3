"""Fault injection: fits that lose, slow down or gain a worker mid-fit keep every row.

``python -m benchmarks.bench_faults [--fits 20] [--reference 3] [--seed 0]``

Each faulted fit runs on a fresh emulated cluster (``local_cluster(speeds=(2, 1, 1))``)
and meets one random fault at a random round (both seeded):

- ``kill``: a random worker is SIGKILLed (its nanny restarts it, so it also re-joins);
- ``slow``: a random worker's emulated slowdown is multiplied by 4 (``set_slowdown``);
- ``join``: ``cluster.scale(n + 1)`` adds an (unthrottled) worker.

The trainer records which rows each worker processed (``record_row_ids=True``), so the
benchmark counts, per fit, rows never processed in the final epoch (lost; must be 0) and
rows processed more than once in an epoch that no re-staging disturbed (duplicated; must
be 0; an epoch in which a lost worker's rows were re-staged from the source is exempt,
see ``Trainer._disturbed_epochs``). Undisturbed fits with the same data and seed give the
reference accuracy. Heterogeneity is EMULATED on one machine.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

FAULTS = ("kill", "slow", "join")
SPEEDS = (2, 1, 1)


@dataclass
class FitResult:
    """What one fit measured."""

    fault: str
    at_round: int | None
    completed: bool
    accuracy: float = float("nan")
    seconds: float = 0.0
    rows_lost: int = 0
    rows_duplicated: int = 0
    disturbed_epochs: list[int] = field(default_factory=list)
    fault_applied: bool = False
    error: str | None = None


def make_data(n_rows: int, seed: int) -> tuple[np.ndarray, ...]:
    """A 3-class problem split 80/20 into train and test, float32 features."""
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n_rows, n_features=20, n_informative=12, n_classes=3, random_state=seed
    )
    X = X.astype(np.float32)
    cut = int(0.8 * n_rows)
    return X[:cut], y[:cut], X[cut:], y[cut:]


def _rounds_logged(log: Path) -> int:
    from pipeline.runlog import read_events

    if not log.exists():
        return 0
    return sum(e["event"] == "round" for e in read_events(log))


def run_fit(
    data: tuple[np.ndarray, ...],
    fault: str,
    at_round: int | None,
    rng: np.random.Generator,
    epochs: int,
    rounds_per_epoch: int,
    workdir: Path,
    timeout: float = 120.0,
) -> FitResult:
    """One fit on a fresh cluster, with ``fault`` (or "none") once ``at_round`` rounds ran.

    A fit still running after ``timeout`` seconds counts as hung: the stacks of every
    thread go to stderr and the client is closed, which ends the fit with an error.
    """
    from distributed import Client

    from pipeline.cluster import local_cluster
    from pipeline.nn import MLP
    from pipeline.trainer import Trainer, TrainerConfig
    from pipeline.worker_tasks import set_slowdown

    X, y, X_test, y_test = data
    Y = np.eye(3, dtype=np.float32)[y]
    log = workdir / f"{fault}-{at_round}-{time.monotonic_ns()}.jsonl"
    result = FitResult(fault, at_round, completed=False)
    victim_index = int(rng.integers(len(SPEEDS)))
    start = time.perf_counter()
    with local_cluster(speeds=SPEEDS) as cluster, Client(cluster) as client:
        names = sorted(cluster.workers)
        victim_name = names[victim_index]

        def inject() -> None:
            if fault == "kill":
                process = cluster.workers[victim_name].process.process
                os.kill(process.pid, signal.SIGKILL)
            elif fault == "slow":
                address = cluster.workers[victim_name].worker_address
                k = cluster.emulation.slowdowns[victim_name]
                set_slowdown(client, address, 4.0 * k)
            elif fault == "join":
                cluster.scale(len(SPEEDS) + 1)
            result.fault_applied = True

        def abort() -> None:
            result.error = f"hung: still running after {timeout:g} s (stacks on stderr)"
            print(f"--- {fault} at round {at_round}: {result.error}", file=sys.stderr)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            client.close()

        def watch() -> None:
            """Inject the fault once ``at_round`` rounds ran; abort a fit that hangs."""
            deadline = time.monotonic() + timeout
            while not done.is_set():
                if fault != "none" and not result.fault_applied:
                    if _rounds_logged(log) >= at_round:
                        inject()
                if time.monotonic() > deadline:
                    abort()
                    return
                done.wait(0.05)

        done = threading.Event()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        model = MLP((X.shape[1], 64, 3))
        model.initialize(np.random.RandomState(0))
        config = TrainerConfig(
            rounds_per_epoch=rounds_per_epoch,
            record_row_ids=True,
            run_log=str(log),
            probe_seconds=0.3,
            seed=0,
        )
        trainer = Trainer(client, model, dict(solver="adam", learning_rate_init=0.003), 128, config)

        try:
            trainer.fit(X, Y, max_epochs=epochs)
            result.completed = True
        except Exception as exc:  # counted, and shown, as a failed fit
            result.error = result.error or f"{type(exc).__name__}: {exc}"
        finally:
            done.set()
            watcher.join()
    result.seconds = time.perf_counter() - start
    if result.completed:
        result.accuracy = float((model.forward(X_test).argmax(1) == y_test).mean())
        disturbed = set(trainer._disturbed_epochs)
        result.disturbed_epochs = sorted(disturbed)
        last = max(trainer.rows_seen)
        result.rows_lost = int((trainer.rows_seen[last] == 0).sum())
        result.rows_duplicated = int(
            sum((seen > 1).sum() for e, seen in trainer.rows_seen.items() if e not in disturbed)
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=20, help="faulted fits (default: 20)")
    parser.add_argument("--reference", type=int, default=3, help="undisturbed fits (default 3)")
    parser.add_argument("--rows", type=int, default=40000, help="rows of the data set")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds before a fit counts as hung (default: 120)",
    )
    parser.add_argument("--rounds-per-epoch", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the faults and their rounds")
    args = parser.parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    from benchmarks._common import header

    header(f"fault injection: {args.fits} faulted + {args.reference} undisturbed fits")
    print(f"cluster: local_cluster(speeds={SPEEDS}) (EMULATED heterogeneity), fresh per fit")
    data = make_data(args.rows, args.seed)
    rng = np.random.default_rng(args.seed)
    total_rounds = args.epochs * args.rounds_per_epoch
    plan = [("none", None)] * args.reference + [
        (str(rng.choice(FAULTS)), int(rng.integers(2, max(3, total_rounds - 2))))
        for _ in range(args.fits)
    ]
    results: list[FitResult] = []
    with TemporaryDirectory() as tmp:
        for i, (fault, at_round) in enumerate(plan, 1):
            r = run_fit(data, fault, at_round, rng, args.epochs, args.rounds_per_epoch, Path(tmp))
            results.append(r)
            status = "ok" if r.completed else f"FAILED ({r.error})"
            print(
                f"fit {i:2d}/{len(plan)}: {fault:<4} at round {at_round!s:>4}  {status}  "
                f"acc {r.accuracy:.4f}  lost {r.rows_lost}  dup {r.rows_duplicated}  "
                f"disturbed epochs {r.disturbed_epochs}  {r.seconds:.1f} s",
                flush=True,
            )
    ref = [r.accuracy for r in results if r.fault == "none" and r.completed]
    faulted = [r for r in results if r.fault != "none"]
    done = [r for r in faulted if r.completed]
    ref_mean = float(np.mean(ref)) if ref else float("nan")
    print()
    print(
        f"fits completed:   {len(done)}/{len(faulted)} faulted, {len(ref)}/{args.reference} "
        "undisturbed"
    )
    for fault in FAULTS:
        n = sum(r.fault == fault for r in faulted)
        ok = sum(r.fault == fault for r in done)
        print(f"  {fault:<5} {ok}/{n} completed")
    print(
        f"rows lost:        {sum(r.rows_lost for r in results)} (rows never processed in "
        "the final epoch, all fits; must be 0)"
    )
    print(
        f"rows duplicated:  {sum(r.rows_duplicated for r in results)} (processed twice in an "
        "undisturbed epoch; must be 0)"
    )
    if ref and done:
        diffs = np.array([r.accuracy - ref_mean for r in done])
        print(
            f"accuracy:         undisturbed {ref_mean:.4f} (spread {np.ptp(ref):.4f} over "
            f"{len(ref)} fits); faulted {np.mean([r.accuracy for r in done]):.4f}, "
            f"difference to undisturbed min {diffs.min():+.4f} max {diffs.max():+.4f}"
        )
    ok = len(done) == len(faulted) and not any(r.rows_lost or r.rows_duplicated for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Workers that are threads of the driver's process: the fit's BLAS limit and none, side by side.

A Dask cluster started with ``processes=False`` (``Client(processes=False)``,
``LocalCluster(processes=False)``) runs its workers as threads of the user's process, where
each BLAS call starts a thread per core (distributed gives only the worker *processes* it
starts one). A fit on two or more such workers now holds BLAS at ``cores // workers``
threads (:func:`hmdspt.parallel.client.blas_limit_for_own_workers`). This fits
``BPNNClassifier(client=...)`` on two worker threads (no emulated speeds: the threads are
alike), in turns with the limit and with it replaced by nothing, on a quiet machine and
with one core kept busy by another process (as on a shared machine, or beside a second
test process), and prints the seconds of ``fit()`` (median and range), the test accuracy
and the ratio of the medians. Run: ``python -m benchmarks.bench_threads`` (``--repeats 3``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
import warnings

from distributed import Client, LocalCluster
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_info

from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel import scoring, trainer

from . import bench_ablation as ablation
from ._common import header

ARMS = ("BLAS limited", "no limit")
SETTINGS = ("quiet", "one core busy elsewhere")
JOBS = ("embedded", "digits")


@contextlib.contextmanager
def _no_limit(client):
    yield None


@contextlib.contextmanager
def _busy_core(on: bool):
    """A process spinning on one core while the block runs (when ``on``)."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def fit_once(client, data, job, arm: str) -> tuple[float, float]:
    """Seconds of one ``fit()`` in ``arm`` and the model's test accuracy."""
    X_train, y_train, X_test, y_test = data
    # The fit's limit and its probe's (a probe runs only where no speed is remembered).
    holders = (trainer, scoring)
    limits = [holder.blas_limit_for_own_workers for holder in holders]
    if arm == "no limit":
        for holder in holders:
            holder.blas_limit_for_own_workers = _no_limit
    try:
        model = BPNNClassifier(
            job.hidden,
            client=client,
            max_iter=job.epochs,
            batch_size=job.batch_size,
            early_stopping=False,
            n_iter_no_change=job.epochs + 1,
            random_state=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            # Digits on two alike threads is predicted slower than one alone, as it is.
            warnings.filterwarnings("ignore", "this cluster is predicted", RuntimeWarning)
            start = time.perf_counter()
            model.fit(X_train, y_train)
            seconds = time.perf_counter() - start
    finally:
        for holder, limit in zip(holders, limits):
            holder.blas_limit_for_own_workers = limit
    return seconds, float(model.score(X_test, y_test))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    args = parser.parse_args(argv)
    header("Workers as threads of the driver's process: BLAS limited in the fit, and not")
    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"BLAS threads of this process outside a fit: {blas}")
    results: dict = {}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        for job_name in args.jobs:
            job = ablation.JOBS[job_name]
            data = job.load()
            fit_once(client, data, job, ARMS[0])  # untimed: imports and first-call costs
            for setting in SETTINGS:
                times: dict[str, list[float]] = {arm: [] for arm in ARMS}
                scores: dict[str, list[float]] = {arm: [] for arm in ARMS}
                with _busy_core(setting != "quiet"):
                    for _ in range(args.repeats):
                        for arm in ARMS:  # in turns
                            seconds, score = fit_once(client, data, job, arm)
                            times[arm].append(seconds)
                            scores[arm].append(score)
                print(
                    f"\n{job_name}, MLP {job.hidden}, {job.epochs} epochs, batch "
                    f"{job.batch_size}, 2 worker threads, {setting}:"
                )
                print(f"  {'arm':<14} {'fit s, median':>14} {'range':>14} {'accuracy':>18}")
                for arm in ARMS:
                    t, s = times[arm], scores[arm]
                    print(
                        f"  {arm:<14} {statistics.median(t):>14.2f} "
                        f"{min(t):>6.2f}-{max(t):<7.2f} {min(s):>8.4f}-{max(s):.4f}"
                    )
                ratio = statistics.median(times["no limit"]) / statistics.median(
                    times["BLAS limited"]
                )
                print(f"  no limit / limited, medians: {ratio:.2f}")
                results[(job_name, setting)] = {"times": times, "scores": scores}
    return results


if __name__ == "__main__":
    main()

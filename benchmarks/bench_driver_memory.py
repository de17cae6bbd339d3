"""Driver memory of a cluster fit on a Dask DataFrame read from a parquet folder.

The data (default 4,000,000 rows x 40 float32 features and an int64 label in 16 files,
about 650 MB) is written by a separate process, so this driver never held it. The
driver then reads the folder with ``dask.dataframe.read_parquet`` and calls
``BPNNClassifier(client=client).fit(ddf.drop(columns="label"), ddf["label"])`` on a
3-worker ``LocalCluster`` (process workers, 1 thread each; no emulated speeds: memory,
not speed, is measured).

Driver memory is the RSS high-water during ``fit`` minus the RSS just before it (a
2 ms RSS sampler and ``ru_maxrss``, as ``bench_staging`` measures it); the driver process
also hosts the scheduler, which is counted. The ratio printed is that growth over the
data's size in memory (rows x (features x 4 + 8) bytes).

The same fit with ``early_stopping=True`` is measured alike (its validation rows are split,
persisted and scored on the workers). Then the same folder through the command line:
``hmdspt train --data FOLDER --target label`` on its emulated 3-worker cluster, whose
driver process's peak RSS (sampled from ``/proc`` every 20 ms: the CLI runs the scheduler
too, its workers are other processes)
is set against the same command on a folder of 1 % of the rows: the difference is what
the data cost the driver.

Run: ``python -m benchmarks.bench_driver_memory [--rows N] [--epochs E]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.bench_staging import PeakSampler, _maxrss, _rss

FEATURES = 40
FILES = 16


def write_folder(out: Path, rows: int, seed: int = 0) -> None:
    """``FILES`` parquet files of ``rows`` rows in all (run in a separate process)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((FEATURES, 3)).astype(np.float32)
    per_file = -(-rows // FILES)
    for i in range(FILES):
        n = min(per_file, rows - i * per_file)
        X = rng.standard_normal((n, FEATURES), dtype=np.float32)
        label = (X @ weights + 0.5 * rng.standard_normal((n, 3))).argmax(1).astype(np.int64)
        frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(FEATURES)]).assign(label=label)
        frame.to_parquet(out / f"part-{i:02d}.parquet", row_group_size=65_536)


def cli_peak_rss(folder: Path, epochs: int) -> tuple[int, float]:
    """Peak RSS in bytes and wall seconds of ``hmdspt train --data folder`` (a child).

    The child's own RSS, sampled every 20 ms from ``/proc``: its rusage would also count
    its worker processes, which it waits for.
    """
    import os

    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "hmdspt", "train", "--data", str(folder), "--target", "label"]
        + ["--epochs", str(epochs), "--hidden", "32", "--run-dir", str(folder.parent / "runs")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    page, peak = os.sysconf("SC_PAGE_SIZE"), 0
    while child.poll() is None:
        try:
            with open(f"/proc/{child.pid}/statm") as f:
                peak = max(peak, int(f.read().split()[1]) * page)
        except (OSError, ValueError, IndexError):  # it just ended
            pass
        time.sleep(0.02)
    if child.returncode:
        raise RuntimeError(f"hmdspt train exited {child.returncode}")
    return peak, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows of the data set")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of the fit")
    args = parser.parse_args(argv)

    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    from hmdspt import BPNNClassifier

    with tempfile.TemporaryDirectory(prefix="hmdspt-drivermem-") as tmp:
        folder = Path(tmp) / "rows"
        folder.mkdir()
        code = (
            "import sys; from pathlib import Path; "
            "from benchmarks.bench_driver_memory import write_folder; "
            f"write_folder(Path({str(folder)!r}), {args.rows})"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        on_disk = sum(f.stat().st_size for f in folder.iterdir())
        in_memory = args.rows * (FEATURES * 4 + 8)
        with (
            LocalCluster(
                n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            ddf = dd.read_parquet(str(folder))

            def measured_fit(**params):
                """(RSS before, peak RSS, wall s, model) of one fit of the folder."""
                model = BPNNClassifier(
                    (32,), max_iter=args.epochs, batch_size=512, random_state=0, **params
                )
                model.set_params(client=client)
                before, maxrss_before = _rss(), _maxrss()
                start = time.perf_counter()
                with warnings.catch_warnings(), PeakSampler() as sampler:
                    warnings.simplefilter("ignore")
                    model.fit(ddf.drop(columns="label"), ddf["label"])
                wall = time.perf_counter() - start
                peak = sampler.peak
                if _maxrss() > maxrss_before:
                    peak = max(peak, _maxrss())
                return before, peak, wall, model

            before, peak, wall, model = measured_fit()
            rows = {n: r["rows"] for n, r in model.training_report_.items()}
            # The validation rows are split, persisted and scored on the workers.
            es_before, es_peak, es_wall, _ = measured_fit(early_stopping=True)
        small = Path(tmp) / "small"
        small.mkdir()
        code = (
            "from pathlib import Path; from benchmarks.bench_driver_memory import write_folder; "
            f"write_folder(Path({str(small)!r}), {args.rows // 100})"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        small_peak, small_wall = cli_peak_rss(small, args.epochs)
        cli_peak, cli_wall = cli_peak_rss(folder, args.epochs)
    growth = peak - before
    print(
        f"data: {args.rows:,} rows x {FEATURES} float32 + int64 label in {FILES} parquet "
        f"files, {on_disk / 1e6:.0f} MB on disk, {in_memory / 1e6:.0f} MB in memory"
    )
    print(f"fit: {args.epochs} epoch(s) on 3 process workers in {wall:.1f} s; rows {rows}")
    print(
        f"driver RSS: {before / 1e6:.0f} MB before the fit, peak {peak / 1e6:.0f} MB; "
        f"growth {growth / 1e6:.1f} MB = {growth / in_memory:.1%} of the data in memory"
    )
    es_growth = es_peak - es_before
    print(
        f"the same with early_stopping=True ({es_wall:.1f} s): growth {es_growth / 1e6:.1f} MB"
        f" = {es_growth / in_memory:.1%} of the data in memory"
    )
    cli_growth = cli_peak - small_peak
    print(
        f"hmdspt train --data FOLDER: driver peak RSS {cli_peak / 1e6:.0f} MB ({cli_wall:.1f} s)"
        f" against {small_peak / 1e6:.0f} MB on 1 % of the rows ({small_wall:.1f} s): "
        f"{cli_growth / 1e6:.1f} MB = {cli_growth / in_memory:.1%} of the data in memory"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

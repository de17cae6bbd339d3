"""Staging KDD Cup 99 (494,021 rows) onto 3 workers: seconds and driver peak memory.

Cases, each in a fresh driver process so that one case's memory high-water mark cannot
hide another's:

- ``numpy``: the driver loads the arrays and stages them from memory (it cuts each
  worker's rows and sends them straight to the worker);
- ``parquet``: the data set written beforehand as parquet (by a separate process);
  each worker reads its own rows, the driver reads metadata only;
- ``npz``: the compressed ``.npz`` as shipped; each worker streams the members.

Driver memory is the RSS high-water during ``stage`` minus the RSS just before it: the
larger of ``resource.getrusage().ru_maxrss`` (if it rose during staging) and the maximum
of a 2 ms RSS sampler, so neither a brief spike nor an earlier, higher high-water mark
(loading the npz) hides the figure. The driver process also hosts the scheduler, which
is counted. Worker memory is each worker's RSS after staging.

The cluster is ``hmdspt.parallel.cluster.local_cluster(speeds=(4, 2, 1))`` (process workers, 1
thread each) when available, else a plain ``LocalCluster``; shares are 4:2:1 either way.
The speed emulation throttles training compute only, not staging.

Run: ``python benchmarks/bench_staging.py [--data PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# _common.SHARED_DATASETS' rule, spelt out: the measured cases run this file as a script.
DEFAULT_DATA = (
    Path(
        os.environ.get(
            "HMDSPT_DATASETS", Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
        )
    )
    / "kddcup99_10pct"
    / "kddcup99_10pct.npz"
)
ROW_GROUP = 65_536  # rows per parquet row group: bounds what a worker holds while reading
SPEEDS = (4, 2, 1)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class PeakSampler:
    """Maximum RSS of this process seen every ``interval`` seconds while active."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def write_parquet(npz: Path, out_dir: Path) -> None:
    """Write X_train (41 float32 columns) and y5_train as parquet (runs in a subprocess)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    with np.load(npz) as z:
        X, y, names = z["X_train"], z["y5_train"], [str(n) for n in z["feature_names"]]
    table = pa.table({**{n: X[:, j] for j, n in enumerate(names)}, "category": y})
    pq.write_table(table, out_dir / "kdd_train.parquet", row_group_size=ROW_GROUP)


def start_cluster():
    try:
        from hmdspt.parallel.cluster import local_cluster
    except ImportError:  # the emulated cluster helper is optional here
        from distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=len(SPEEDS),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
        )
        return cluster, None
    return local_cluster(speeds=SPEEDS), "hmdspt.parallel.cluster.local_cluster"


def shares(client, n_rows: int) -> dict[str, int]:
    """Rows per worker address in proportion 4:2:1 (workers ordered by name)."""
    from hmdspt.parallel.client import scheduler_workers

    info = scheduler_workers(client)
    addrs = sorted(info, key=lambda a: str(info[a]["name"]))
    counts = [n_rows * s // sum(SPEEDS) for s in SPEEDS]
    counts[0] += n_rows - sum(counts)
    return dict(zip(addrs, counts))


def _worker_rss():
    import psutil

    return psutil.Process().memory_info().rss


def run_case(case: str, data: Path, parquet_dir: Path) -> dict:
    import numpy as np
    from distributed import Client

    from hmdspt.parallel.client import scheduler_workers
    from hmdspt.parallel.shards import stage

    cluster, helper = start_cluster()
    with cluster, Client(cluster) as client:
        if case == "numpy":
            with np.load(data) as z:
                X, y = z["X_train"], z["y5_train"]
            source, kwargs, n_rows = (X, y), {}, len(X)
        elif case == "parquet":
            import pyarrow.parquet as pq

            path = parquet_dir / "kdd_train.parquet"
            n_rows = pq.ParquetFile(path).metadata.num_rows
            source, kwargs = (path,), {"target": "category"}
        else:
            source, kwargs, n_rows = (data,), {"x_key": "X_train", "target": "y5_train"}, 494_021
        counts = shares(client, n_rows)
        client.run(lambda: None)  # warm up the workers' connections
        rss_before, maxrss_before = _rss(), _maxrss()
        with PeakSampler() as sampler:
            t0 = time.perf_counter()
            staged = stage(client, *source, counts=counts, seed=0, **kwargs)
            seconds = time.perf_counter() - t0
        maxrss_after = _maxrss()
        peak = sampler.peak
        if maxrss_after > maxrss_before:  # the high-water mark rose during staging
            peak = max(peak, maxrss_after)
        assert staged.n_rows == n_rows and staged.counts == counts
        worker_rss = client.run(_worker_rss)
        names = {a: w["name"] for a, w in scheduler_workers(client).items()}
        return {
            "case": case,
            "cluster": helper or "LocalCluster",
            "seconds": seconds,
            "driver_peak_delta": peak - rss_before,
            "driver_rss_before": rss_before,
            "counts": {names[a]: c for a, c in counts.items()},
            "worker_rss": {names[a]: r for a, r in worker_rss.items()},
            "n_features": staged.n_features,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--case", choices=["numpy", "parquet", "npz"], help=argparse.SUPPRESS)
    parser.add_argument("--parquet-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write-parquet", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    if args.write_parquet:
        write_parquet(args.data, args.write_parquet)
        return
    if args.case:
        print(json.dumps(run_case(args.case, args.data, args.parquet_dir)))
        return

    from hmdspt.parallel.readers import _npz_meta

    # Header-only read: this orchestrating process never loads the arrays either.
    meta = _npz_meta(str(args.data), "X_train", "y5_train")
    shape = (meta["n_rows"], meta["n_features"])
    nbytes = meta["n_rows"] * (meta["n_features"] * 4 + 8)
    mb = 1e6
    print(f"data: {args.data.name}: X_train {shape} float32 + y5_train int64")
    print(f"in-memory size {nbytes / mb:.1f} MB; npz file {args.data.stat().st_size / mb:.1f} MB")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cmd = [sys.executable, __file__, "--data", str(args.data)]
        subprocess.run([*cmd, "--write-parquet", str(tmp)], check=True, env=env)
        size = (tmp / "kdd_train.parquet").stat().st_size
        print(f"parquet file {size / mb:.1f} MB (row groups of {ROW_GROUP} rows)")
        print(f"{'case':<8} {'seconds':>8} {'driver peak':>12}  worker RSS after (MB)")
        for case in ("numpy", "parquet", "npz"):
            out = subprocess.run(
                [*cmd, "--case", case, "--parquet-dir", str(tmp)],
                check=True,
                env=env,
                capture_output=True,
                text=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            workers = ", ".join(
                f"{n} ({r['counts'][n]} rows) {r['worker_rss'][n] / mb:.0f}"
                for n in sorted(r["counts"])
            )
            print(f"{case:<8} {r['seconds']:8.2f} {r['driver_peak_delta'] / mb:9.1f} MB  {workers}")
        print(f"cluster: {r['cluster']}, 3 process workers, 1 thread each, shares 4:2:1")
        print(
            "driver peak = RSS high-water during stage() minus RSS just before "
            "(ru_maxrss and a 2 ms sampler); the driver also hosts the scheduler"
        )


if __name__ == "__main__":
    main()

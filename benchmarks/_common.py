"""Helpers shared by the benchmarks: environment header, dataset paths, timing."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

SHARED_DATASETS = Path(
    os.environ.get("HMDSPT_DATASETS", Path(__file__).resolve().parents[2] / "shared" / "datasets")
)


def dataset_path(*parts: str) -> Path:
    """Path of a file under ``../shared/datasets`` (or ``$HMDSPT_DATASETS``), checked."""
    path = SHARED_DATASETS.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: the real data sets live in ../shared/datasets "
            "(or set HMDSPT_DATASETS)"
        )
    return path


def header(title: str) -> None:
    """Print what was measured where: machine, versions, BLAS threads."""
    import sklearn
    from threadpoolctl import threadpool_info

    blas = ", ".join(
        f"{i['internal_api']} {i.get('version')} ({i['num_threads']} threads)"
        for i in threadpool_info()
    )
    print(f"# {title}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}, numpy {np.__version__}, scikit-learn "
        f"{sklearn.__version__}; BLAS: {blas}"
    )


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy (hypervisor steal counts as busy)."""
    import psutil

    t = psutil.cpu_times()
    # Linux counts guest time inside user time already.
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal - t.guest - t.guest_nice


def own_cpu_seconds(pids) -> float:
    """CPU seconds used so far by the processes ``pids`` (gone ones count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, ``n/a`` when missing."""
    return "n/a" if value is None else f"{100 * value:.1f}"


def num(value: float | None) -> str:
    """A number with two decimals, ``n/a`` when missing."""
    return "n/a" if value is None else f"{value:.2f}"

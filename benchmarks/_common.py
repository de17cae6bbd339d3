"""Helpers shared by the benchmarks: environment header, dataset paths, timing, and the
cluster a benchmark runs on (the OS-enforced testbed or the in-code emulation)."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# -- the cluster a benchmark runs on ----------------------------------------------------

EMULATED = "emulated"
TESTBED = "testbed"
KINDS = (TESTBED, EMULATED)  # the testbed first: its figures lead
#: Cores of the machine kept for the scheduler and the driver when a testbed is laid out.
DRIVER_CORES = 0.25
#: The CFS period of the testbed unless a benchmark is told otherwise (the kernel's default).
PERIOD_MS = 100.0
_MADE: list = []  # every Testbed this process made (for the leftovers check)


def testbed_label(period_ms: float = PERIOD_MS, link_mbit: float | None = None) -> str:
    """``testbed (OS-enforced CPU quotas, CFS period P ms[, links R Mbit/s])``."""
    link = "" if link_mbit is None else f", links {link_mbit:g} Mbit/s (tc tbf)"
    return f"testbed (OS-enforced CPU quotas, CFS period {period_ms:g} ms{link})"


def core_budget() -> float:
    """Cores a testbed's slots may take together: the machine's less the driver's share."""
    return max(float(os.cpu_count() or 1) - DRIVER_CORES, DRIVER_CORES)


def cores_for(speeds, budget: float | None = None) -> tuple[float, ...]:
    """The CPU quotas that stand for relative ``speeds`` on this machine.

    The fastest worker gets one core unless the quotas would then add up to more than
    ``budget`` (default :func:`core_budget`); then all are scaled down to fit it. So
    4:2:1 is 1 / 0.5 / 0.25 core on two cores, 2:1:1 is 0.875 / 0.4375 / 0.4375.
    """
    speeds = [float(s) for s in speeds]
    budget = core_budget() if budget is None else float(budget)
    scale = min(1.0 / max(speeds), budget / sum(speeds))
    return tuple(round(s * scale, 4) for s in speeds)


def mapping_text(speeds, cores) -> str:
    """``speeds 4:2:1 -> quotas 1 / 0.5 / 0.25 core`` and why."""
    return (
        f"speeds {':'.join(f'{s:g}' for s in speeds)} -> quotas "
        f"{' / '.join(f'{c:g}' for c in cores)} core (the fastest at most 1 core, all "
        f"together at most {core_budget():g} of the {os.cpu_count()} cores; the rest is "
        "the scheduler's and the driver's)"
    )


def add_cluster_arguments(parser, default: str = "both") -> None:
    """``--cluster {both,testbed,emulated}`` and ``--period-ms`` on a benchmark's parser."""
    parser.add_argument(
        "--cluster",
        choices=("both", *KINDS),
        default=default,
        help="the OS-enforced testbed (needs root), the in-code emulation, or both "
        f"(default {default}; the testbed first)",
    )
    parser.add_argument(
        "--period-ms", type=float, default=PERIOD_MS, help="the testbed's CFS period"
    )


def chosen_kinds(choice: str, link: bool = False) -> list[str]:
    """The cluster kinds to run, testbed first; a testbed that cannot start here is
    left out with one line saying why."""
    kinds = list(KINDS) if choice == "both" else [choice]
    if TESTBED in kinds:
        from .testbed import unavailable_reason

        reason = unavailable_reason(link=link)
        if reason:
            print(f"{TESTBED}: not run: {reason}")
            kinds.remove(TESTBED)
    return kinds


@contextlib.contextmanager
def cluster(
    kind: str,
    speeds=None,
    *,
    cores=None,
    period_ms: float = PERIOD_MS,
    link_mbit: float | None = None,
) -> Iterator[tuple[Any, str, dict]]:
    """A Dask client on the in-code emulation or on the OS-enforced testbed.

    Parameters
    ----------
    kind : {"emulated", "testbed"}
        ``"emulated"``: ``hmdspt.parallel.cluster.local_cluster(speeds=speeds)`` (each worker
        sleeps after its compute chunks). ``"testbed"``: a
        :class:`benchmarks.testbed.Testbed` with one Dask worker per slot, the kernel
        enforcing the quotas.
    speeds : sequence of float, optional
        Relative speeds; on the testbed mapped to quotas by :func:`cores_for`.
    cores : sequence of float, optional
        The testbed's quotas as given (instead of ``speeds``).
    period_ms, link_mbit : float
        The testbed's CFS period and, if given, the rate of every slot's shaped link.

    Yields
    ------
    (client, label, info)
        ``label`` is ``"emulated"`` or :func:`testbed_label`; ``info`` has ``kind``,
        ``speeds``, ``cores`` (testbed), ``mapping`` (one line saying how speeds became
        quotas, testbed), ``workers`` (names, in the order of the speeds), ``testbed``
        (the Testbed) and, after the block, ``left`` (what of it is left: nothing when
        the teardown was clean).
    """
    from distributed import Client

    if kind == EMULATED:
        from hmdspt.parallel.cluster import local_cluster

        with local_cluster(speeds=speeds) as emulated, Client(emulated) as client:
            info = {
                "kind": EMULATED,
                "speeds": tuple(speeds),
                "workers": list(emulated.emulation.speeds),
                "emulation": str(emulated.emulation),
            }
            yield client, EMULATED, info
        return
    if kind != TESTBED:
        raise ValueError(f"kind must be {EMULATED!r} or {TESTBED!r}, got {kind!r}")
    from .testbed import Testbed, cleanup_stale

    if not _MADE:
        cleanup_stale()  # parts of killed earlier runs (dead owners only)
    if cores is None:
        cores = cores_for(speeds)
    tb = Testbed(cores, period_ms=period_ms, link_mbit=link_mbit)
    _MADE.append(tb)
    info = {
        "kind": TESTBED,
        "speeds": tuple(speeds) if speeds is not None else tuple(cores),
        "cores": tuple(cores),
        "mapping": mapping_text(speeds, cores) if speeds is not None else "",
        "testbed": tb,
    }
    try:
        with tb:
            info["workers"] = [slot.name for slot in tb.slots]
            with Client(tb.start_dask()) as client:
                yield client, testbed_label(tb.period_ms, link_mbit), info
    finally:
        info["left"] = {k: v for k, v in tb.leftovers().items() if v}


def testbed_leftovers() -> dict[str, list]:
    """What of every testbed this process made is still there (empty: nothing)."""
    left: dict[str, list] = {}
    for tb in _MADE:
        for kind, items in tb.leftovers().items():
            left.setdefault(kind, []).extend(items)
    return {kind: items for kind, items in left.items() if items}


def print_leftovers() -> dict[str, list]:
    """One line: what this benchmark's testbeds left (cgroups, namespaces, links, PIDs)."""
    if not _MADE:
        return {}
    from .testbed import leftovers

    left = testbed_leftovers()
    others = {kind: items for kind, items in leftovers().items() if items}
    print(
        f"testbed leftovers after this benchmark ({len(_MADE)} testbed(s)): "
        f"{left or 'none (no cgroup, namespace, link or process left)'}"
        + (f"; other live testbeds on the machine: {others}" if others and not left else "")
    )
    return left

"""Fixtures shared by several test modules."""

from __future__ import annotations

import fcntl
import gc
import getpass
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

# Worker processes fork from a server that has distributed and numpy imported, instead of
# each spawning a fresh interpreter (distributed's own suite does the same). Set before
# dask is imported so that the subprocesses the tests start (the CLI) inherit it.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "forkserver")
# Hypothesis keeps its example database and its cache of source constants in ./.hypothesis,
# the folder the tests are run from, by default. The tests write nothing into the user's
# folders, so it goes to the temporary folder (kept between runs: a failing example replays).
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY",
    str(Path(tempfile.gettempdir()) / f"hmdspt-tests-{getpass.getuser()}" / "hypothesis"),
)

# One BLAS thread in each test process and in the processes the tests start: three test
# processes share two cores, and an OpenBLAS thread that waits for a core spins. Measured
# here with two busy loops beside them, the two divergence tests of test_trainer_faults
# took 12.4 CPU seconds with two BLAS threads and 7.8 with one (collection included).
for _blas_threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")

import pytest  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from tests.clusters import FREE_PORTS  # noqa: E402
from tests.requires import missing  # noqa: E402

threadpool_limits(limits=1, user_api="blas")  # numpy may be loaded already (plugins)


# ----------------------------------------------------------------------------------
# Tests run in three processes (pytest-xdist, ``-n 3`` in pyproject.toml); the part of a
# test whose assertions read measured speeds or times runs with the machine to itself.
# ----------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "heavy(seconds): a module that takes seconds in all (processes, subprocesses, a "
        "browser, a kernel, many cluster fits), about that many in a run of the suite here; "
        "the longest are handed out first, so the run does not end on one of them",
    )


def _module_seconds(item: pytest.Item) -> float:
    """About how long the item's module takes, from its ``heavy`` mark (0 without one)."""
    mark = item.get_closest_marker("heavy")
    return 0.0 if mark is None else float(mark.args[0] if mark.args else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first. pytest-xdist hands out whole modules in this order (``--dist
    loadscope --no-loadscope-reorder``): a run that ends on short tests keeps every test
    process busy to the end, where one long module last leaves the others idle. The
    seconds only order the modules; a stale figure costs a little time, never a result."""
    items.sort(key=lambda item: -_module_seconds(item))  # stable: a module stays together


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built. The imported libraries' objects (about 320,000 measured:
    scikit-learn, Dask, Bokeh, Panel, hypothesis) live until the process ends; frozen, the
    collector's full passes during the tests and at exit no longer walk them again."""
    gc.freeze()


class MachineLock:
    """A readers-writer lock between the test processes of one pytest-xdist run.

    Every test holds it shared; a block run alone (:func:`machine_alone`) holds it
    exclusively. The gate lock lets a waiting block in before tests that ask later, so it
    is not starved by a worker that keeps starting short tests.
    """

    def __init__(self, folder: Path) -> None:
        self._gate = open(folder / "hmdspt-tests.gate", "a")
        self._tests = open(folder / "hmdspt-tests.lock", "a")
        self.alone: bool | None = None  # how it is held: None, not held

    def acquire(self, alone: bool) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        except BaseException:  # a test timeout while waiting: the gate must not stay shut
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            raise
        if not alone:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.alone = alone

    def release(self) -> None:
        if self.alone is None:
            return
        fcntl.flock(self._tests, fcntl.LOCK_UN)
        if self.alone:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.alone = None

    @contextmanager
    def alone_within(self) -> Iterator[None]:
        """Run a block of a test that holds the lock shared with no other test beside it.

        The shared lock goes first: two tests that both wait to run alone would otherwise
        each hold what the other waits for.
        """
        self.release()
        self.acquire(alone=True)
        try:
            yield
        finally:
            self.release()
            self.acquire(alone=False)  # the rest of the test holds it shared again


_machine_lock: MachineLock | None = None


@pytest.fixture(scope="session")
def machine_alone():
    """A context manager: its block runs with no other test beside it, for a test or a
    module fixture whose assertions read the speeds or times the OS gives it. Only that
    block: a cluster's start-up around it need not keep the other test processes waiting."""
    return nullcontext if _machine_lock is None else _machine_lock.alone_within


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    global _machine_lock
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing runs beside it
        yield
        return
    if _machine_lock is None:
        # The workers' base folders share this parent, which pytest keeps and rotates.
        _machine_lock = MachineLock(item.config._tmp_path_factory.getbasetemp().parent)
    _machine_lock.acquire(alone=False)
    try:
        yield
    finally:
        _machine_lock.release()


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A real 8 KiB file system (tmpfs) mounted for the test: a disk that fills up."""
    if os.geteuid() != 0:
        missing("mounting a small tmpfs (a real full disk) needs root")
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        # A handle left open makes a plain umount fail (EBUSY); detach it then.
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="module")
def client():
    """A client of an in-process cluster of two one-thread workers, for a module's tests
    (a module that needs another cluster defines its own ``client``)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler for the test, as a user's process has (a test process
    of pytest-xdist has another, and one that imported dask-jobqueue has sys.exit())."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


@pytest.fixture
def advice_on():
    """numpy's transparent huge page advice on for the test, as in a user's fresh
    interpreter on Linux; the test process's own setting back after."""
    from hmdspt.core.process import numpy_huge_page_switch

    switch = numpy_huge_page_switch()
    before = switch(True)
    yield
    switch(before)
